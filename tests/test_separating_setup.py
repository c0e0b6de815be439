"""benchmarks/separating_setup.py: the simulator's predicted separation of policies over a
grid of small CPU-engine set-ups, largest gain first."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from benchmarks import separating_setup  # noqa: E402


def test_grid_rows_sorted_by_predicted_gain(capsys):
    rows = separating_setup.main(["--programs", "4,6", "--jps", "2", "--blocks", "40", "--max-tool-s", "4",
                                  "--target", "rebuild-priced-ttl", "--others", "continuum,vllm", "--seeds", "0"])
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


def test_several_seeds_rank_by_the_worst_seed(capsys):
    """Each set-up is simulated under every seed; its rank is the worst seed's gain, and the
    means printed are over seeds (checked against one-seed runs of the same grid)."""
    args = ["--programs", "6", "--jps", "2,4", "--blocks", "40", "--max-tool-s", "4",
            "--target", "rebuild-priced-ttl", "--others", "continuum,vllm"]
    rows = separating_setup.main([*args, "--seeds", "0,1,2"])
    single = {s: {r["jps"]: r for r in separating_setup.main([*args, "--seeds", str(s)])} for s in (0, 1, 2)}
    assert len(rows) == 2
    assert len({single[s][2.0]["rebuild-priced-ttl"] for s in (0, 1, 2)}) > 1  # the seed moves the arrivals
    for r in rows:
        assert list(r["gains"]) == [0, 1, 2]
        for s, g in r["gains"].items():
            assert g == pytest.approx(single[s][r["jps"]]["gain"])
        assert r["gain"] == min(r["gains"].values())
        for p in ("rebuild-priced-ttl", "continuum", "vllm"):
            assert r[p] == pytest.approx(sum(single[s][r["jps"]][p] for s in (0, 1, 2)) / 3)
    assert rows[0]["gain"] >= rows[1]["gain"]
    assert "worst seed's gain" in capsys.readouterr().out
