"""The public spec tables shipped in sim/hardware/specs (GPUs, models, prices, the roofline
fit), by file name, the key their names are matched by, and a GPU or model found by name or alias."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from agentsim.errors import InputError

SPEC_DIR = Path(__file__).parent / "specs"


def spec_key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", str(name).lower())


def spec_table(name: str) -> dict:
    return json.loads((SPEC_DIR / name).read_text())


@lru_cache(maxsize=None)
def _lookup(kind: str, name: str) -> tuple[str, dict]:
    table = spec_table(f"{kind}s.json")[f"{kind}s"]
    want = spec_key(name)
    if kind == "gpu":  # as CUDA names it ("NVIDIA H200", "NVIDIA A100-SXM4-80GB") or its full name
        want = want.removeprefix("nvidia")
    for canon, spec in table.items():
        names = {spec_key(canon), *(spec_key(a) for a in spec.get("aliases", ()))}
        if kind == "gpu":
            names.add(spec_key(spec["full_name"]).removeprefix("nvidia"))
        if want in names:
            return canon, spec
    raise InputError(f"unknown {kind} {name!r}; known: {', '.join(table)}")


def find_gpu(name: str) -> tuple[str, dict]:
    return _lookup("gpu", name)


def find_model(name: str) -> tuple[str, dict]:
    return _lookup("model", name)
