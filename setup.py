"""The compiled parts (pyproject.toml holds everything else). FP contraction is off so
that a*b - c is rounded twice, as numpy and Python round it: the compiled code must give
the reference's results to the last bit."""
from Cython.Build import cythonize
from setuptools import Extension, setup

FLAGS = ["-O2", "-ffp-contract=off"]

setup(ext_modules=cythonize(
    [Extension("policies._samples", ["policies/_samples.pyx"], extra_compile_args=FLAGS),
     Extension("sim._block_pool", ["sim/_block_pool.pyx"], extra_compile_args=FLAGS),
     Extension("sim._steps", ["sim/_steps.pyx"], extra_compile_args=FLAGS),
     Extension("sim._content", ["sim/_content.pyx"], extra_compile_args=FLAGS)],
    language_level=3,
))
