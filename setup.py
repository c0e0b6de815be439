"""The compiled parts (pyproject.toml holds everything else): four Cython extensions, each
with a Python reference beside it that runs where the extension is not built and that
tests hold it to. FP contraction is off so that a*b - c is rounded twice, as numpy and
Python round it: the compiled code must give the reference's results to the last bit."""
from Cython.Build import cythonize
from setuptools import Extension, setup

FLAGS = ["-O2", "-ffp-contract=off"]
PYX = ("policies._samples", "sim.kv._block_pool", "sim.hardware._steps", "sim.kv._content")

setup(ext_modules=cythonize([Extension(name, [name.replace(".", "/") + ".pyx"], extra_compile_args=FLAGS) for name in PYX],
                            language_level=3))
