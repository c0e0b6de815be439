"""The paper's direction on a small slice of the bundled SWE-bench trace under memory
pressure (default profile, 4,000 KV blocks, 80 programs, JPS 0.25): program-level FCFS
beats vLLM's request FCFS, pinning beats no pinning, and Continuum beats vLLM."""
import pytest

from policies.registry import make_policy
from sim.profile import load_profile
from sim.simulate import arrivals_for, engine_config, run_simulation
from traces.schema import read_trace


@pytest.fixture(scope="module")
def mean_jct():
    trace, _ = read_trace("swebench")
    keep = trace["program_id"].drop_duplicates().iloc[:80]
    trace = trace[trace["program_id"].isin(keep)]
    prof = load_profile()
    cfg = engine_config(prof, num_gpu_blocks=4000)
    arrivals = arrivals_for(trace, 0.25, 0)
    return {p: run_simulation(trace, make_policy(p), prof, cfg, arrivals).summary["mean_jct"]
            for p in ("vllm", "program-fcfs", "continuum-static", "continuum")}


def test_continuum_beats_vllm(mean_jct):
    assert mean_jct["continuum"] < 0.8 * mean_jct["vllm"]


def test_ablation_directions(mean_jct):
    assert mean_jct["program-fcfs"] < mean_jct["vllm"]
    assert mean_jct["continuum-static"] < mean_jct["program-fcfs"]
    assert mean_jct["continuum"] < mean_jct["program-fcfs"]
