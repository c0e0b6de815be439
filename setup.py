"""The compiled parts (pyproject.toml holds everything else). FP contraction is off so
that a*b - c is rounded twice, as numpy and Python round it: the compiled code must give
the reference's results to the last bit.

Two kinds: extensions written for Cython (.pyx, each with a Python reference beside it),
and hot pure-Python modules compiled as they are (agentsim/compiled.py), each built with
a record of the source it came from, so that a stale build is never imported."""
import sys
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentsim.compiled import COMPILED, RECORD, source_digest  # noqa: E402  (stdlib only)

FLAGS = ["-O2", "-ffp-contract=off"]


def _source(module: str) -> str:
    return module.replace(".", "/") + ".py"


class BuildWithRecords(build_ext):
    """build_ext that writes, beside each compiled pure-Python module (in the build folder
    and, for an in-place or editable build, beside its source), its source's digest."""

    def _records(self) -> list[tuple[Path, str]]:
        out = []
        for ext in self.extensions:
            if ext.name in COMPILED:
                so = self.get_ext_filename(ext.name)  # e.g. sim/engine.cpython-311-x86_64-linux-gnu.so
                out.append((Path(self.build_lib) / (so + RECORD), ext.name))
                if self.inplace:
                    out.append((Path(_source(ext.name)).parent / (Path(so).name + RECORD), ext.name))
        return out

    def run(self):
        super().run()
        for record, module in self._records():
            if record.with_suffix("").is_file():
                record.write_text(source_digest(_source(module)) + "\n")

    def get_outputs(self):
        return super().get_outputs() + [str(r) for r, _ in self._records() if r.is_relative_to(self.build_lib)]


pyx = [Extension(name, [name.replace(".", "/") + ".pyx"], extra_compile_args=FLAGS)
       for name in ("policies._samples", "sim.kv._block_pool", "sim.hardware._steps", "sim.kv._content")]
pure = cythonize([Extension(m, [_source(m)], extra_compile_args=FLAGS) for m in COMPILED], language_level=3,
                 # annotations are hints here, not C types: Cython would reject a str Enum passed as `str`
                 compiler_directives={"annotation_typing": False})
setup(ext_modules=cythonize(pyx, language_level=3) + pure, cmdclass={"build_ext": BuildWithRecords})
