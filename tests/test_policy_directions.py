"""The paper's directions on small slices of the bundled traces under memory pressure
(default profile, 80 programs).

SWE-bench (4,000 KV blocks, JPS 0.25): program-level FCFS beats vLLM's request FCFS,
pinning beats no pinning, and Continuum beats vLLM. Continuum vs the fork's fixed 2 s
pin is not asserted here: on this trace the fork's rule is as good or better (README,
"Policy table"), because nearly all tool calls are far shorter than 2 s and the slow
ones (pytest, pip) are the ones the fork frees.

BFCL (12,000 KV blocks, JPS 0.2): the paper's whole ablation order, vLLM > program
FCFS > fixed pin (continuum-static) > Continuum, and the oracle (Continuum's cost
model told each tool's true duration) best. Tools of 1-5 s and long contexts are where
a learned TTL pays over a fixed 2 s pin. Re-measured on the bundle with the paper's
Fig. 5 tails (fetch_url sigma 1.45, cd 3.1): the order held for seeds 0-2 at JPS 0.15
and 0.2, each step by 12-31% (oracle over Continuum by 3-27%). Since arrivals reach the
scheduler only between steps (as in vLLM), seed 0 at JPS 0.2, the case asserted: 26%,
26%, 23%, and the oracle 4% below Continuum (its pins now keep a 1 s slack past the
tool's end; with the old exact TTL every arrival landing mid-step missed its pin). On the SWE-bench cut Continuum stays 6-16% behind
the fixed pin (seeds 0-2), so no SWE-bench order test.
"""
import pytest

from conftest import simulate
from sim.hardware.profile import load_profile
from sim.run.simulate import arrivals_for
from traces.schema import read_trace


def _mean_jct(trace_name, programs, blocks, jps, policies):
    trace, _ = read_trace(trace_name)
    keep = trace["program_id"].drop_duplicates().iloc[:programs]
    trace = trace[trace["program_id"].isin(keep)]
    prof = load_profile("llama3.1-8b-a100-80gb")  # the orders below were measured on it (README tables)
    arrivals = arrivals_for(trace, jps, 0)
    return {p: simulate(trace, p, prof, arrivals, num_gpu_blocks=blocks).summary["mean_jct"] for p in policies}


@pytest.fixture(scope="module")
def mean_jct():
    return _mean_jct("swebench", 80, 4000, 0.25, ("vllm", "program-fcfs", "continuum-static", "continuum"))


@pytest.fixture(scope="module")
def bfcl_jct():
    return _mean_jct("bfcl", 80, 12000, 0.2, ("vllm", "program-fcfs", "continuum-static", "continuum", "oracle"))


def test_continuum_beats_vllm(mean_jct):
    assert mean_jct["continuum"] < 0.8 * mean_jct["vllm"]


def test_ablation_directions(mean_jct):
    assert mean_jct["program-fcfs"] < mean_jct["vllm"]
    assert mean_jct["continuum-static"] < mean_jct["program-fcfs"]
    assert mean_jct["continuum"] < mean_jct["program-fcfs"]


def test_bfcl_paper_ablation_order(bfcl_jct):
    j = bfcl_jct
    assert j["program-fcfs"] < 0.9 * j["vllm"]
    assert j["continuum-static"] < 0.9 * j["program-fcfs"]
    assert j["continuum"] < 0.95 * j["continuum-static"]
    assert j["oracle"] < j["continuum"]  # perfect duration prediction only helps here
