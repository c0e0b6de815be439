"""benchmarks/replay_step_error.py: the step model against a validation run's real steps."""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import replay_step_error as rse  # noqa: E402

from sim.profile import load_profile  # noqa: E402


def _steps(prof, rng) -> pd.DataFrame:
    """Steps (prefill-bearing and decode-only) timed exactly as the profile prices them."""
    rows = []
    for _ in range(40):
        seqs = int(rng.integers(1, 8))
        tokens = seqs if rng.random() < 0.5 else seqs + int(rng.integers(1, 3000))
        k = float(rng.integers(tokens, 8000))
        rows.append({"tokens": tokens, "seqs": seqs, "sum_qk": tokens * k / 2, "sum_k": k, "sum_qc": tokens * k / 4})
    df = pd.DataFrame(rows)
    df["seconds"] = [prof.step_time(r.tokens, r.seqs, r.sum_qk, r.sum_k, r.sum_qc) for r in df.itertuples()]
    return df


def test_the_calibrations_rule_reproduces_its_own_prices_and_the_median_is_slower(tmp_path, capsys, monkeypatch):
    shipped = load_profile("cpu-micro-llama")  # written by `sim calibrate`: fitted on the minimum of repeats
    (tmp_path / "profile.json").write_text(json.dumps(shipped.raw))
    _steps(shipped, np.random.default_rng(0)).to_parquet(tmp_path / "real_steps_vllm_0.parquet")
    raw = shipped.raw
    steps = pd.read_parquet(tmp_path / "real_steps_vllm_0.parquet")
    at_min = rse.errors(rse.refit(raw, "min"), steps)
    assert all(abs(v) < 1e-9 for v in at_min.values()), at_min
    at_median = rse.errors(rse.refit(raw, "median"), steps)
    assert at_median["all"] > 0.02  # repeats' medians are slower than their minima
    monkeypatch.setattr(sys, "argv", ["replay_step_error.py", str(tmp_path)])
    rse.main()
    out = capsys.readouterr().out
    assert "median over min" in out and "vllm_0" in out and out.count("\n") == 4


def test_a_directory_without_a_run_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["replay_step_error.py", str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        rse.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
