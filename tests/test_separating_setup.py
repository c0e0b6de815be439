"""benchmarks/separating_setup.py: the simulator's predicted separation of policies over a
grid of small CPU-engine set-ups, largest gain first."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import separating_setup  # noqa: E402


def test_grid_rows_sorted_by_predicted_gain(capsys):
    rows = separating_setup.main(["--programs", "4,6", "--jps", "2", "--blocks", "40", "--max-tool-s", "4",
                                  "--target", "rebuild-priced-ttl", "--others", "continuum,vllm"])
    assert [(r["programs"], r["blocks"]) for r in rows] and {r["programs"] for r in rows} == {4, 6} and {r["blocks"] for r in rows} == {40}
    gains = [r["gain"] for r in rows]
    assert gains == sorted(gains, reverse=True)
    for r in rows:  # the gain is over the better of the others, from the printed means
        best = min(r["continuum"], r["vllm"])
        assert r["best_other"] == ("continuum" if r["continuum"] <= r["vllm"] else "vllm")
        assert r["gain"] == pytest.approx(1 - r["rebuild-priced-ttl"] / best)
        assert r["makespan_s"] > 0
    out = capsys.readouterr().out
    assert out.count("\n| 4 | 2 | 40 | 4 | ") + out.count("\n| 6 | 2 | 40 | 4 | ") == 2
