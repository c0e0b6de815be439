"""benchmarks/seed_ranking.py: the target's real and predicted gains per arrival seed, read
from `sim validate` reports (here written by hand; --reuse runs no engine)."""
import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
from benchmarks import seed_ranking  # noqa: E402
from agentsim.errors import InputError  # noqa: E402


def _row(real: float, unscaled: float, scaled: float, clock: float) -> dict:
    return {"real": {"mean_jct": real}, "sim": {"mean_jct": scaled}, "sim_unscaled_mean_jct": unscaled,
            "time_scale": clock}


REPORTS = {  # seed -> policy -> (real, sim unscaled, sim scaled, the run's clock factor)
    0: {"t": (9.0, 8.0, 8.5, 0.75), "a": (10.0, 10.0, 10.0, 1.0), "b": (12.0, 9.0, 9.0, 1.5)},
    3: {"t": (11.0, 10.0, 10.0, 1.0), "a": (10.5, 12.5, 11.0, 0.875), "b": (11.0, 8.0, 8.0, 1.25)},
}


def _write(tmp_path: Path) -> None:
    for seed, pols in REPORTS.items():
        d = tmp_path / f"s{seed}"
        d.mkdir()
        (d / "report.json").write_text(json.dumps({"policies": {p: _row(*v) for p, v in pols.items()}}))


def test_gains_per_seed_and_agreement(tmp_path):
    _write(tmp_path)
    # --max-tool-s 0: no tool time, so "real / clock" is real / the clock factor
    text = seed_ranking.main(["--seeds", "0,3", "--target", "t", "--others", "a,b", "--out", str(tmp_path), "--reuse",
                              "--max-tool-s", "0"])
    reports = {s: json.loads((tmp_path / f"s{s}" / "report.json").read_text()) for s in (0, 3)}
    g = seed_ranking.gains(reports, "t", ["a", "b"])
    assert g["a"]["real"] == pytest.approx({0: 0.1, 3: 1 - 11 / 10.5})
    assert g["a"]["sim unscaled"] == pytest.approx({0: 0.2, 3: 0.2})
    assert g["b"]["real"] == pytest.approx({0: 0.25, 3: 0.0})
    assert g["b"]["sim scaled"] == pytest.approx({0: 1 - 8.5 / 9, 3: -0.25})
    # divided by each run's clock factor: t 12 / a 10 / b 8 in seed 0, t 11 / a 12 / b 8.8 in seed 3
    assert g["a"]["real / clock"] == pytest.approx({0: -0.2, 3: 1 - 11 / 12})
    assert g["b"]["real / clock"] == pytest.approx({0: -0.5, 3: -0.25})
    # a pair's order is "gain > 0" or not. Real vs scaled: t-a agree in seed 0 only (seed 3:
    # real -4.8%, scaled +9.1%), t-b in both (seed 3: real 0, scaled -25%) ...
    assert "by real is the order by sim scaled: t vs a 1 of 2, t vs b 2 of 2" in text
    # ... real / clock vs unscaled: t-a in seed 3 only, t-b in seed 3 only
    assert "by real / clock is the order by sim unscaled: t vs a 1 of 2, t vs b 1 of 2" in text
    assert "| a | real | +10.0% | -4.8% | +2.6% | 1 of 2 |" in text
    assert "| 0 | 9.0 \\| 12.0 \\| 8.0 \\| 8.5 | 10.0 \\| 10.0 \\| 10.0 \\| 10.0 | 12.0 \\| 8.0 \\| 9.0 \\| 9.0 |" in text


def test_a_report_without_the_policy_is_one_clear_error(tmp_path, capsys):
    _write(tmp_path)
    with pytest.raises(InputError, match="seed 0: the report has no row for c"):
        seed_ranking.main(["--seeds", "0", "--target", "t", "--others", "a,c", "--out", str(tmp_path), "--reuse"])


def test_tool_time_is_not_rescaled_by_the_clock():
    """A program's tool waits are wall-clock sleeps: only its time in the engine is put on the
    profile's clock."""
    trace = pd.DataFrame({"program_id": ["p", "p", "p", "q", "q"], "turn": [0, 1, 2, 0, 1],
                          "tool_duration_s": [1.0, 2.0, 9.0, 3.0, 7.0]})  # last turns' tools never run
    assert seed_ranking.mean_tool_s(trace) == pytest.approx((3.0 + 3.0) / 2)
    m = seed_ranking.mean_jcts({"policies": {"t": _row(13.0, 1.0, 1.0, 0.5)}}, tool_s=3.0)
    assert m["t"]["real / clock"] == pytest.approx(3.0 + 10.0 / 0.5)
