"""benchmarks/gemm_power_table.py: a gemm_power.py record as a table, against the collector's own setting."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gemm_power_table as gt  # noqa: E402

RECORD = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "h200-2026-11-29" / "gemm_power.json"


def _case(m, fill, collector, sustained, bursts):
    mk = lambda s: {"s": s, "tflops": 1.0 / s, "clocks": None}  # noqa: E731
    return {"gemm": "qkv", "m": m, "n": 6144, "k": 4096, "fill": fill,
            "collector": mk(collector), "sustained": mk(sustained), "bursts_50pct": mk(bursts)}


def test_ratios_are_against_empty_weights_in_short_replays_for_compute_bound_rows():
    rec = {"device": "G", "torch": "t", "seconds": 1, "rows": [
        _case(16, "empty", 1.0, 1.0, 1.0), _case(16, "randn", 3.0, 3.0, 3.0),  # memory-bound: left out
        _case(1024, "empty", 2.0, 2.2, 1.8), _case(1024, "randn", 2.4, 2.8, 2.0),
        _case(8192, "empty", 4.0, 4.0, 4.0), _case(8192, "randn", 4.4, 5.2, 4.0)]}
    q = gt.ratios(rec)
    assert q["collector", "empty"] == (1.0, 1.0)
    assert q["collector", "randn"] == pytest.approx((1.1, 1.2))
    assert q["sustained", "randn"] == pytest.approx((1.3, 1.4))
    assert q["bursts_50pct", "randn"] == pytest.approx((1.0, 1.0))
    text = gt.table(rec, "cmd")
    assert "| qkv 4096->6144 | 1,024 | randn | 0 (x1.20) |" in text and "randn x1.10-1.20" in text


def test_fp8_rows_are_judged_against_fp8_empty_weights_and_named_by_dtype():
    fp8 = lambda *a: {**_case(*a), "dtype": "fp8"}  # noqa: E731
    rec = {"device": "G", "torch": "t", "seconds": 1, "rows": [
        _case(1024, "empty", 2.0, 2.0, 2.0), _case(1024, "randn_x0.02", 2.4, 2.4, 2.4),
        fp8(1024, "empty", 1.0, 1.0, 1.0), fp8(1024, "randn_x0.02", 1.5, 1.5, 1.5)]}
    q = gt.ratios(rec)
    assert q["collector", "randn_x0.02"] == pytest.approx((1.2, 1.2))
    assert q["collector", "fp8 randn_x0.02"] == pytest.approx((1.5, 1.5)) and q["collector", "fp8 empty"] == (1.0, 1.0)
    assert "| qkv 4096->6144 | 1,024 | fp8 randn_x0.02 | 1 (x1.50) |" in gt.table(rec, "cmd")


def test_the_recorded_h200_run_shows_real_weights_dearer():
    q = gt.ratios(json.loads(RECORD.read_text()))
    lo, hi = q["collector", "randn_x0.02"]
    assert 1.05 < lo <= hi < 1.3  # trained-scale values cost more than the collector's zeros, at its duty
    assert q["sustained", "randn_x0.02"][0] > hi  # and more again sustained at the power limit


@pytest.mark.parametrize("text, says", [("{", "not JSON"), ('{"rows": []}', "not a benchmarks/gpu/gemm_power.py record")])
def test_a_bad_record_is_one_line(tmp_path, capsys, text, says):
    f = tmp_path / "r.json"
    f.write_text(text)
    assert gt.main(["--record", str(f)]) == 2
    assert gt.main(["--record", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and says in err[0] and "cannot read it" in err[1] and all(e.startswith("error: --record ") for e in err)
