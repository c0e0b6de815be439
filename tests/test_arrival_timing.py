"""vLLM's engine core takes new requests only between steps: a call that arrives while a
step runs reaches the scheduler (and its program's pin) when that step ends."""
import numpy as np
import pytest

from policies.registry import make_policy
from sim.run.simulate import engine_config
from tests.conftest import linear_profile, make_trace, simulate


def _run(pin_seconds: float):
    # A: 32-token prompt, 1 output token, then a 0.5 s tool; B arrives at 0.1 s with a
    # 2,000-token prompt whose single prefill step (2.01 s) covers A's tool end (0.542 s).
    trace = make_trace([[(32, 1, "ls", 0.5), (16, 1, None, None)], [(2000, 1, None, None)]])
    prof = linear_profile(c0=0.01, c1=0.001)
    pol = make_policy("continuum-static", threshold=10.0, pin_seconds=pin_seconds)
    res = simulate(trace, pol, prof, np.array([0.0, 0.1]))
    a1 = res.turns.set_index(["program_id", "turn"]).loc[("p000", 1)]
    return res, a1


def test_arrival_mid_step_waits_for_the_step_end_and_misses_a_shorter_pin():
    res, a1 = _run(pin_seconds=0.7)  # pin ends at 0.742 s, inside B's step (0.1 .. 2.11 s)
    assert res.summary["pins_expired"] == 1 and res.summary["pins_hit"] == 0
    assert a1["arrival"] == pytest.approx(0.542)  # its JCT still counts from the tool's end
    assert a1["scheduled"] == pytest.approx(2.11)  # admitted at the step boundary


def test_a_pin_that_outlives_the_step_is_hit():
    res, a1 = _run(pin_seconds=3.0)
    assert res.summary["pins_hit"] == 1 and res.summary["pins_expired"] == 0
    assert a1["cached_tokens"] == 32 and a1["scheduled"] == pytest.approx(2.11)


def test_usage_divides_by_the_usable_blocks_as_the_vllm_adapter_does():
    """One block total on both sides: vLLM's pool keeps one of num_gpu_blocks as its null
    block, and sim/vllm_replica/scheduler.py divides by num_gpu_blocks - 1; so does the
    simulator, and a full pool reads 100%, not (n-1)/n."""
    from sim.simpy_replica.engine import SimpyReplica

    trace = make_trace([[(16 * 9 - 1, 2, None, None)]])  # 143 + 1 tokens: 9 blocks of 16
    prof = linear_profile(blocks=10)
    res = simulate(trace, "vllm", prof, np.array([0.0]))
    assert res.summary["peak_kv_usage"] == pytest.approx(1.0)
    assert SimpyReplica.num_blocks.fget(type("E", (), {"cfg": engine_config(prof)})()) == 9
