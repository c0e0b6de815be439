"""The compiled parts are exactly four Cython extensions (setup.py), each with a Python
reference that runs where it is not built (the differential tests beside each reference
hold the two to the same results); nothing is compiled as it is, and no import hook is left."""
from __future__ import annotations

import ast
import importlib.machinery
import runpy
from pathlib import Path

import Cython.Build
import setuptools

ROOT = Path(__file__).resolve().parents[1]
PYX = {"policies._samples", "sim.kv._block_pool", "sim.hardware._steps", "sim.kv._content"}
PACKAGES = ("agentsim", "sim", "calibrate", "policies", "traces", "benchmarks", "tests")


def _setup_call(monkeypatch) -> dict:
    """setup.py run with cythonize and setup recorded, not run: what it would build."""
    seen: dict = {}
    monkeypatch.setattr(Cython.Build, "cythonize", lambda exts, **kw: list(exts))
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    runpy.run_path(str(ROOT / "setup.py"))
    return seen


def test_setup_builds_exactly_the_four_pyx_extensions_with_the_stock_build_step(monkeypatch):
    kw = _setup_call(monkeypatch)
    assert set(kw) == {"ext_modules"}  # no cmdclass: setuptools' own build_ext
    exts = {e.name: e.sources for e in kw["ext_modules"]}
    assert set(exts) == PYX and len(kw["ext_modules"]) == len(PYX)
    for name, sources in exts.items():
        assert sources == [name.replace(".", "/") + ".pyx"] and (ROOT / sources[0]).is_file()
        assert "-ffp-contract=off" in next(e for e in kw["ext_modules"] if e.name == name).extra_compile_args


def _modules() -> dict[str, ast.Module]:
    files = [ROOT / "setup.py"] + [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in files}


def _fallback_imports(tree: ast.Module) -> set[str]:
    """Modules imported inside a `try` whose handler catches ImportError."""
    out = set()
    for n in ast.walk(tree):
        if not isinstance(n, ast.Try):
            continue
        caught = {e.id for h in n.handlers for e in (h.type, *getattr(h.type, "elts", ())) if isinstance(e, ast.Name)}
        if "ImportError" in caught:
            out |= {s.module for s in n.body if isinstance(s, ast.ImportFrom) and s.module}
    return out


def test_each_extension_falls_back_to_its_python_reference_where_it_is_not_built():
    fallbacks = set().union(*(_fallback_imports(t) for p, t in _modules().items() if not p.startswith("tests/")))
    assert PYX <= fallbacks, PYX - fallbacks


def test_nothing_imports_the_removed_compile_hook():
    assert not (ROOT / "agentsim" / "compiled.py").exists()
    importers = []
    for path, tree in _modules().items():
        for n in ast.walk(tree):
            names = ({a.name for a in n.names} if isinstance(n, ast.Import) else
                     {n.module, *(f"{n.module}.{a.name}" for a in n.names)} if isinstance(n, ast.ImportFrom) and n.module else set())
            if "agentsim.compiled" in names:
                importers.append(path)
    assert importers == []


def test_no_file_a_user_runs_or_reads_names_the_hooks_variable():
    shipped = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
               *(ROOT / p for p in _modules() if not p.startswith("tests/"))]
    assert [str(f.relative_to(ROOT)) for f in shipped if "AGENTSIM_PURE_" + "PYTHON" in f.read_text()] == []


def test_no_leftover_build_of_a_python_module_shadows_its_source():
    """Python's import prefers an extension file to the .py beside it: a build left by an
    older install (which compiled more modules) would run stale code. Only the four may exist."""
    stray = []
    for pkg in PACKAGES[:5]:
        for f in (ROOT / pkg).rglob("*.*"):
            suffix = next((x for x in importlib.machinery.EXTENSION_SUFFIXES if f.name.endswith(x)), None)
            if suffix and str(f.relative_to(ROOT))[: -len(suffix)].replace("/", ".") not in PYX:
                stray.append(str(f.relative_to(ROOT)))
    assert stray == [], ("delete these leftover builds (`find sim policies -name '*.so' ! -name '_*' -delete`): "
                         + ", ".join(sorted(stray)))
