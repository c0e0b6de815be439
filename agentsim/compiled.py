"""Hot pure-Python modules that the install also compiles, as they are, with Cython.

`setup.py` builds each module in COMPILED from its own .py (no types added: about 1.2x on
the event loop, results to the last bit) and writes beside the .so the SHA-256 of the
source it was built from (`<so>.sha256`). The .py stays the reference. The finder below
(installed by `sim/__init__.py` and `policies/__init__.py`) lets Python's default import
take the .so only while it matches its .py, so an edit to a policy or to the scheduler
takes effect at once, without a rebuild (it just runs uncompiled until the next
`pip install -e .`). AGENTSIM_PURE_PYTHON=1 imports every one of them from source (for a
profiler that should see inside them, or to compare). Stdlib only: runs inside vLLM.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

COMPILED = (
    "policies.base", "policies.pins", "policies.continuum",
    "sim.replica.call", "sim.replica.clock", "sim.kv.content", "sim.hardware.stretch", "sim.hardware.profile", "sim.replica.policy_host", "sim.simpy_replica.scheduler", "sim.simpy_replica.engine",
    "sim.cluster.cluster", "sim.cluster.router", "sim.run.workload", "sim.run.metrics", "sim.run.simulate", "sim.kv.radix_cache",
    "sim.kv.tiers",
)
PURE_ENV = "AGENTSIM_PURE_PYTHON"
RECORD = ".sha256"  # suffix of the record beside a module's .so


def source_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def compiled_file(directory: Path, name: str) -> Path | None:
    """The module's extension file in `directory`, if built."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        so = directory / (name + suffix)
        if so.is_file():
            return so
    return None


def use_compiled(directory: Path, name: str) -> bool:
    """True when `name`'s .so in `directory` was built from the .py there now."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False
    so, py = compiled_file(directory, name), directory / f"{name}.py"
    if so is None:
        return False
    if not py.is_file():
        return True  # an install that ships no source: nothing it could be stale against
    record = Path(str(so) + RECORD)
    return record.is_file() and record.read_text().strip() == source_digest(py)


class _SourceWhenStale:
    """A meta-path finder: for a module of COMPILED whose .so is absent, stale or turned
    off, the .py (Python's own finder would prefer any .so); otherwise Python's own."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname not in COMPILED or not path:
            return None
        name = fullname.rpartition(".")[2]
        for d in map(Path, path):
            py = d / f"{name}.py"
            if py.is_file() or compiled_file(d, name) is not None:
                if use_compiled(d, name):
                    return None
                return importlib.util.spec_from_file_location(fullname, py) if py.is_file() else None
        return None


def install() -> None:
    if _SourceWhenStale not in sys.meta_path:
        sys.meta_path.insert(0, _SourceWhenStale)


def is_compiled(module) -> bool:
    return not str(getattr(module, "__file__", "")).endswith(".py")
