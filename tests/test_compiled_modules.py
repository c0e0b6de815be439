"""The hot pure-Python modules compiled as they are (agentsim/compiled.py, setup.py): the
install builds them, a run uses them, they give the .py's results to the last bit, and a
build that no longer matches its .py is never imported."""
from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentsim import compiled
from agentsim.compiled import COMPILED, PURE_ENV, RECORD, _SourceWhenStale, source_digest, use_compiled

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(os.environ.get(PURE_ENV, "") not in ("", "0"), reason="pure-Python run asked for")
def test_the_install_built_every_listed_module_and_a_run_imports_the_build():
    for name in COMPILED:
        mod = importlib.import_module(name)
        assert compiled.is_compiled(mod), f"{name} imported from {mod.__file__}: run `pip install -e .`"
        so = Path(mod.__file__)
        assert Path(str(so) + RECORD).read_text().strip() == source_digest(so.parent / f"{name.rpartition('.')[2]}.py")


def _fake_module(tmp_path: Path, source: str, built_from: str | None) -> None:
    """A folder with mod.py and a stand-in for its build from `built_from` (None: a build
    with no record). The finder only reads names and records, never loads the stand-in."""
    (tmp_path / "mod.py").write_text(source)
    so = tmp_path / ("mod" + importlib.machinery.EXTENSION_SUFFIXES[0])
    so.write_bytes(b"not loaded by these tests")
    if built_from is not None:
        Path(str(so) + RECORD).write_text(hashlib.sha256(built_from.encode()).hexdigest() + "\n")


def test_a_build_is_used_only_while_it_matches_its_source(tmp_path, monkeypatch):
    monkeypatch.delenv(PURE_ENV, raising=False)
    src = "X = 1\n"
    _fake_module(tmp_path, src, src)
    assert use_compiled(tmp_path, "mod")
    (tmp_path / "mod.py").write_text("X = 2\n")  # the source edited after the build
    assert not use_compiled(tmp_path, "mod")
    monkeypatch.setenv(PURE_ENV, "1")
    (tmp_path / "mod.py").write_text(src)
    assert not use_compiled(tmp_path, "mod")


def test_a_build_without_a_record_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.delenv(PURE_ENV, raising=False)
    _fake_module(tmp_path, "X = 1\n", None)
    assert not use_compiled(tmp_path, "mod")
    assert not use_compiled(tmp_path / "nowhere", "mod")  # nothing built: Python's own import


def test_the_finder_hands_a_stale_module_its_source(tmp_path, monkeypatch):
    monkeypatch.delenv(PURE_ENV, raising=False)
    monkeypatch.setattr(compiled, "COMPILED", ("pkg.mod",))
    _fake_module(tmp_path, "X = 2\n", "X = 1\n")
    spec = _SourceWhenStale.find_spec("pkg.mod", [str(tmp_path)])
    assert spec is not None and spec.origin == str(tmp_path / "mod.py")
    assert _SourceWhenStale.find_spec("pkg.other", [str(tmp_path)]) is None  # not listed: Python's own finder
    (tmp_path / "mod.py").write_text("X = 1\n")
    assert _SourceWhenStale.find_spec("pkg.mod", [str(tmp_path)]) is None  # matches: Python's own finder takes the .so


# The .py modules are the reference: the same golden runs, imported from source in a fresh
# process, give the stored results (tests/test_golden_runs.py runs them compiled).
PURE_RUNS = ["vllm", "continuum", "infercept_offload", "contextserve_replicas4_session", "segments_radix_cache_aware"]
_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import importlib
from agentsim.compiled import COMPILED, is_compiled
from tests.test_golden_runs import GOLDEN, golden_run, same_as_golden
out = {"compiled": [m for m in COMPILED if is_compiled(importlib.import_module(m))], "same": {}}
for name in sys.argv[3:]:
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    out["same"][name] = same_as_golden(json.loads(json.dumps(golden_run(name, Path(sys.argv[2])))), want)
print(json.dumps(out))
"""


def test_the_source_modules_reproduce_the_golden_runs(tmp_path):
    env = {**os.environ, PURE_ENV: "1"}
    r = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), str(tmp_path), *PURE_RUNS], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["compiled"] == []  # every listed module came from its .py
    assert got["same"] == {name: True for name in PURE_RUNS}
