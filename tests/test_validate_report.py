"""The validation report's arithmetic, without an engine: rankings over separable pairs,
the clock scale, late arrivals, refusals."""
import numpy as np
import pandas as pd
import pytest

from types import SimpleNamespace

from calibrate.validate import SHAPES, check_policies, fit_trace
from calibrate.validate_report import (CLOCK_BAND, CLOCKS, clock_band, clock_scale, compare_policy, late_arrivals,
                                       probe_ratios, rank)
from tests.conftest import linear_profile
from agentsim.errors import InputError
from traces.schema import read_trace


def _row(real, spread, sim):
    return {"real": {"mean_jct": real, "spread": spread}, "sim": {"mean_jct": sim}}


def test_rank_counts_only_pairs_beyond_twice_the_noise():
    rows = {"a": _row(10.0, 0.02, 9.0), "b": _row(20.0, 0.02, 21.0), "c": _row(20.5, 0.02, 19.0)}
    r = rank(rows)
    pairs = {tuple(p["pair"]): p["sim_agrees"] for p in r["separable_pairs"]}
    assert pairs == {("a", "b"): True, ("a", "c"): True}  # b vs c: 0.5 s gap < 2 x 0.41 s noise
    assert r["kendall_tau"] == 1.0 and r["ranking_real"] == ["a", "b", "c"] and not r["ranking_agrees"]
    rows["a"] = _row(10.0, 0.02, 25.0)  # the simulator now puts a last
    assert rank(rows)["kendall_tau"] == -1.0


def test_a_gap_within_the_clock_band_is_not_separable_however_close_the_repeats():
    # two repeats that agree (spread 0.1%) do not make a 2.5% gap separable: the simulated
    # side's clock is placed only to CLOCK_BAND
    rows = {"continuum-static": _row(37.42, 0.001, 34.86), "continuum": _row(36.51, 0.001, 36.25)}
    assert rank(rows)["separable_pairs"] == []
    rows["continuum"] = _row(37.42 * (1 - 2.2 * CLOCK_BAND), 0.001, 36.25)  # beyond twice the band: judged
    assert [p["sim_agrees"] for p in rank(rows)["separable_pairs"]] == [False]


def test_clock_scale_is_measured_over_predicted():
    prof = linear_profile(c0=0.01, c1=0.001)
    rows = [{"seconds": 2 * (0.01 + 0.001 * n), "features": {"tokens": n, "seqs": 1, "sum_qk": n * n, "sum_k": n,
                                                             "sum_q_cached": 0}} for n in (100, 500)]
    assert clock_scale(rows, prof) == pytest.approx(2.0)


def _clock_rows(scale: float) -> list[dict]:
    """A clock probe set read `scale` times linear_profile()'s prediction (0.01 + 0.001 n)."""
    return [{"kind": "prefill", "new": n, "prefix": 0, "batch": 1, "seconds": scale * (0.01 + 0.001 * n),
             "features": {"tokens": n, "seqs": 1, "sum_qk": n * n, "sum_k": n, "sum_q_cached": 0}} for n in (100, 500)]


def test_the_report_keeps_each_clock_probe_over_its_prediction():
    rows = _clock_rows(0.9)
    rows[1]["seconds"] *= 1.1
    assert probe_ratios(rows, linear_profile()) == {"prefill 100+0 x1": 0.9, "prefill 500+0 x1": 0.99}


def test_a_repeat_is_simulated_on_a_band_of_clocks_around_its_probes():
    b = clock_band(1.0, 1.0)  # probes that agree: +-CLOCK_BAND around them
    assert len(b) == CLOCKS and b[CLOCKS // 2] == pytest.approx(1.0)
    assert b[0] == pytest.approx(1 - CLOCK_BAND) and b[-1] == pytest.approx(1 + CLOCK_BAND)
    w = clock_band(0.90, 1.00)  # probes wider apart than the band: the band spans them
    assert (w[0], w[-1]) == pytest.approx((0.90, 1.00)) and w[CLOCKS // 2] == pytest.approx(0.95)
    assert np.all(np.diff(w) > 0)


def _sim(jct: dict) -> SimpleNamespace:
    """A simulation's result as compare_policy reads it: per-program JCTs and a summary."""
    s = {"mean_jct": float(np.mean(list(jct.values()))), "p90_jct": 0.0, "cache_hit_ratio": 0.5, "peak_kv_usage": 1.0,
         "mean_kv_usage": 0.5, "preemptions": 0}
    return SimpleNamespace(summary=s, programs=pd.DataFrame({"program_id": list(jct), "jct": list(jct.values())}))


def test_simulated_figures_are_means_over_every_clock_of_every_repeat():
    turns = pd.DataFrame({"cached_tokens": [0], "prompt_tokens": [10], "late_s": [0.0], "late_step_s": [0.0],
                          "late_rest_s": [0.0]})
    steps = pd.DataFrame({"tokens": [10], "seqs": [1], "sum_qk": [100.0], "sum_k": [10.0], "sum_qc": [0.0],
                          "seconds": [0.1]})
    info = {"peak_kv_usage": 1.0, "mean_kv_usage_per_step": 0.5, "preemptions": 0, "wall_s": 1.0, "time_scale": 1.0,
            "scale_before": 1.0, "scale_after": 1.0, "steps": steps, "clock_before": _clock_rows(0.9),
            "clock_after": _clock_rows(1.0)}
    runs = [(turns, pd.DataFrame({"program_id": ["p", "q"], "jct": [10.0, 10.0]}), info)] * 2
    bands = [[_sim({"p": 8.0, "q": 8.0}), _sim({"p": 12.0, "q": 12.0})], [_sim({"p": 10.0, "q": 14.0})]]
    row = compare_policy(runs, bands, [[_sim({"p": 9.0, "q": 9.0})]], linear_profile())
    assert row["sim"]["mean_jct"] == pytest.approx((8 + 12 + 12) / 3)  # every clock weighs alike
    assert row["sim"]["mean_jct_clocks"] == [8.0, 12.0]
    assert row["mean_jct_error"] == pytest.approx((32 / 3 - 10) / 10)
    assert row["program_jct_mape"] == pytest.approx((0.2 + 0.2 + 0.2) / 3)
    assert row["sim_unscaled_mean_jct"] == 9.0
    assert row["clock_probe_runs"][1] == {"before": {"prefill 100+0 x1": 0.9, "prefill 500+0 x1": 0.9},
                                          "after": {"prefill 100+0 x1": 1.0, "prefill 500+0 x1": 1.0}}


def test_late_arrival_splits_the_step_in_progress_from_the_rest():
    t0 = 100.0
    steps = pd.DataFrame({"start": [t0 + 0.0, t0 + 1.0], "seconds": [0.5, 0.5]})
    turns = pd.DataFrame({"program_id": ["p", "p"], "turn": [0, 1], "arrival": [0.2, 0.9]})
    arrived = {"p#0-abcd1234": t0 + 0.502, "p#1-ffff0000": t0 + 0.901}  # vLLM's id suffix
    out = late_arrivals(turns, arrived, t0, steps)
    np.testing.assert_allclose(out["late_step_s"], [0.3, 0.0])  # due mid-step / between steps
    np.testing.assert_allclose(out["late_rest_s"], [0.002, 0.001], atol=1e-9)


def test_non_runnable_and_unknown_policies_are_refused_with_a_reason():
    with pytest.raises(InputError, match="thunderagent.*cannot run inside vLLM: a proxy"):
        check_policies(["vllm", "thunderagent"], {})
    with pytest.raises(Exception, match="unknown policy"):
        check_policies(["nope"], {})
    with pytest.raises(InputError, match="distinct"):
        check_policies(["vllm", "vllm"], {})


def test_shapes_cut_as_documented():
    bfcl = SHAPES["bfcl"]
    full, cut = read_trace("bfcl")[0], bfcl.cut(read_trace("bfcl")[0])
    assert cut["program_id"].nunique() == bfcl.programs and cut["turn"].max() < bfcl.max_turns
    ctx = (cut["new_input_tokens"] + cut["output_tokens"]).groupby(cut["program_id"]).sum()
    assert ctx.max() <= bfcl.max_context
    first = full[full["program_id"] == cut["program_id"].iloc[0]].set_index("turn")["tool_duration_s"]
    scaled = cut[cut["program_id"] == cut["program_id"].iloc[0]].set_index("turn")["tool_duration_s"]
    t = scaled.index[0]
    assert scaled[t] == pytest.approx(min(first[t] * 0.15, bfcl.max_tool_s))
    assert fit_trace(full, programs=2, tool_scale=0.5)["tool_duration_s"].sum() < \
        fit_trace(full, programs=2)["tool_duration_s"].sum()


def test_the_clock_sensitivity_table_in_the_docs_is_what_its_command_prints():
    """docs/reference/validation.md's band table comes from benchmarks/clock_sensitivity.py (pure
    simulation, so the same figures on any machine)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    from benchmarks import clock_sensitivity

    page = (root / "docs" / "reference" / "validation.md").read_text()
    flags, body = re.search(r"<!-- clock_sensitivity: (.*?) -->\n(.*?)<!-- end clock_sensitivity -->", page, re.S).groups()
    printed = clock_sensitivity.main(flags.split())
    assert printed.strip() == body.strip()
    assert "| 1.00 | " in printed and "band" in printed


def test_a_cpu_profile_is_judged_on_an_engine_of_its_own_dtype(monkeypatch):
    """calibrate/validate.py engine_dtype_of: the engine a CPU profile is judged on runs the dtype the
    profile's engine ran (cpu-micro-llama: float32 on an AVX2 EPYC), whatever this CPU's default
    (bfloat16 where it has native bf16); nothing to say where they agree, nor on a GPU."""
    from calibrate import engine
    from calibrate.validate import engine_dtype_of
    from sim.hardware.profile import load_profile

    micro, tiny = load_profile("cpu-micro-llama"), load_profile("cpu-tiny-llama")
    assert (micro.model["dtype"], tiny.model["dtype"]) == ("float32", "bfloat16")
    for native in (True, False):
        monkeypatch.setattr(engine, "cpu_has_native_bf16", lambda: native)
        assert engine_dtype_of(micro, "cpu") == ({"dtype": "float32"} if native else {})
        assert engine_dtype_of(tiny, "cpu") == ({} if native else {"dtype": "bfloat16"})
    assert engine_dtype_of(load_profile("llama3.1-8b-h100"), "cuda") == {}
