"""The public spec tables shipped in sim/hardware/specs (GPUs, models, prices, the roofline
fit), by file name, and the key their names are matched by."""
from __future__ import annotations

import json
import re
from pathlib import Path

SPEC_DIR = Path(__file__).parent / "specs"


def spec_key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", str(name).lower())


def spec_table(name: str) -> dict:
    return json.loads((SPEC_DIR / name).read_text())
