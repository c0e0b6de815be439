"""benchmarks/replay_step_error.py: the step model against a validation run's real steps."""
import json
import sys

import numpy as np
import pandas as pd
import pytest

from benchmarks import replay_step_error as rse  # noqa: E402

from sim.hardware.profile import load_profile  # noqa: E402


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


def test_the_calibrations_rule_reproduces_its_own_prices_and_the_minimum_is_faster(tmp_path, capsys, monkeypatch):
    shipped = load_profile("cpu-micro-llama")  # written by `sim calibrate`: fitted on the median of repeats
    (tmp_path / "profile.json").write_text(json.dumps(shipped.raw))
    _steps(shipped, np.random.default_rng(0)).to_parquet(tmp_path / "real_steps_vllm_0.parquet")
    raw = shipped.raw
    steps = pd.read_parquet(tmp_path / "real_steps_vllm_0.parquet")
    at_median = rse.errors(rse.refit(raw, "median"), steps)
    assert all(abs(v) < 1e-9 for v in at_median.values()), at_median
    at_min = rse.errors(rse.refit(raw, "min"), steps)
    assert at_min["all"] < -0.02  # repeats' minima are faster than their medians
    monkeypatch.setattr(sys, "argv", ["replay_step_error.py", str(tmp_path)])
    rse.main()
    out = capsys.readouterr().out
    assert "median over min" in out and "vllm_0" in out and "mean JCTs not re-simulated" in out


def test_mean_jct_is_resimulated_on_each_refit(tmp_path):
    from calibrate.validate import SHAPES, sim_run
    from sim.run.simulate import arrivals_for
    from traces.schema import read_trace

    shipped = load_profile("cpu-micro-llama")
    shape_dir = tmp_path / "swebench"
    shape_dir.mkdir()
    engine = {"num_gpu_blocks": 48, "block_size": 128, "max_num_batched_tokens": 4096, "max_num_seqs": 256,
              "max_model_len": 4096, "enable_chunked_prefill": True}
    report = {"policies": {"vllm": {"real": {"mean_jct": 10.0}}, "continuum": {"real": {"mean_jct": 5.0}}},
              "setup": {"seed": 0, "engine": engine, "policy_args": {}}}
    (shape_dir / "report.json").write_text(json.dumps(report))
    table = rse.verdicts(shape_dir, {"median": shipped, "min": rse.refit(shipped.raw, "min")}).set_index("policy")
    shape = SHAPES["swebench"]
    trace = shape.cut(read_trace(shape.trace)[0])
    direct = sim_run(trace, arrivals_for(trace, shape.jps, 0), "continuum", shipped, engine).summary["mean_jct"]
    assert table.loc["continuum", "sim_median"] == round(direct, 2)
    assert table.loc["continuum", "error_median_%"] == round(100 * (direct / 5.0 - 1), 1)
    assert (table["sim_min"] < table["sim_median"]).all()


def test_a_directory_without_a_run_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["replay_step_error.py", str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        rse.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
