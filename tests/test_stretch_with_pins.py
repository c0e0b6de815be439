"""Decode stretches while pins are held and the queue waits (sim/simpy_replica/engine.py
_steady, _next_event): a policy that keeps its pins while calls run (unpin_while_running
False) changes none mid-stretch but by expiry, and a pin whose TTL ran out while its
program's call waits stays until that call is admitted. Such stretches happen, and give
step-by-step's results to the last bit, synchronously and asynchronously."""
import numpy as np
import pandas as pd
import pytest

import sim.simpy_replica.engine as engine
from conftest import linear_profile, random_trace, simulate


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("policy", ["continuum", "continuum-static", "rebuild-priced-ttl"])
def test_stretches_with_pins_held_match_step_by_step(policy, async_scheduling, monkeypatch):
    seen = []  # per stretch of more than one step begun with pins held and calls waiting: a pin's TTL ran out

    def recording(name):
        orig = getattr(engine.SimpyReplica, name)

        def wrapped(self, scheduled, dt0, start, *a):
            dts = orig(self, scheduled, dt0, start, *a)
            if len(dts) > 1 and self.sched.waiting and self.policy.pins:
                seen.append(any(p.expiry <= self.env.now for p in self.policy.pins.values()))
            return dts
        monkeypatch.setattr(engine.SimpyReplica, name, wrapped)

    recording("_stretch")
    recording("_stretch_async")
    rng = np.random.default_rng(7)
    tr, arr = random_trace(rng, 40), np.sort(rng.uniform(0, 4, 40))
    prof = linear_profile(blocks=200, c2=1e-6, c4=1e-5)
    fast = simulate(tr, policy, prof, arr, async_scheduling=async_scheduling)
    assert fast.summary["peak_kv_usage"] == 1.0  # the queue waits on memory
    assert any(seen) and not all(seen)  # stretches with pins held, some with an expired pin its program keeps
    slow = simulate(tr, policy, prof, arr, fast_forward=False, async_scheduling=async_scheduling)
    pd.testing.assert_frame_equal(fast.turns, slow.turns, check_exact=True)
    pd.testing.assert_frame_equal(fast.kv_usage, slow.kv_usage, check_exact=True)
    assert fast.summary == slow.summary


# (policy, its arguments): pins dropped by a per-step review (InferCept), by the no-deadlock
# rule while calls run (unpin_while_running True), or an order that moves with time (Autellix)
BEHIND_A_BLOCKED_HEAD = [("infercept", {}), ("client-ttl-pin", {"ttl_mode": "fixed", "ttl": 1.0}),
                         ("continuum", {"unpin_while_running": True}), ("autellix", {"beta": 2.0})]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("policy,args", BEHIND_A_BLOCKED_HEAD, ids=[p for p, _ in BEHIND_A_BLOCKED_HEAD])
def test_stretches_behind_a_blocked_head_match_step_by_step(policy, args, async_scheduling, monkeypatch):
    """Policies that may drop pins or reorder the queue at any step get stretches while
    the head waits on memory where they say nothing changes (review_steady, the
    no-deadlock rule declining for good: pins_hold, order_fixed_until), and those
    stretches give step-by-step's results to the last bit."""
    from policies.registry import make_policy

    seen = []  # per stretch of more than one step begun with calls waiting: pins were held

    def recording(name):
        orig = getattr(engine.SimpyReplica, name)

        def wrapped(self, scheduled, dt0, start, *a):
            dts = orig(self, scheduled, dt0, start, *a)
            if len(dts) > 1 and self.sched.waiting:
                seen.append(bool(self.policy.pins))
            return dts
        monkeypatch.setattr(engine.SimpyReplica, name, wrapped)

    recording("_stretch")
    recording("_stretch_async")
    prof = linear_profile(blocks=200, c2=1e-6, c4=1e-5)
    # seeds on which a stretch through a promotion, or a pin the rule drops, would show
    for seed in (0, 1, 4):
        rng = np.random.default_rng(seed)
        tr, arr = random_trace(rng, 60), np.sort(rng.uniform(0, 3, 60))
        fast = simulate(tr, make_policy(policy, **args), prof, arr, async_scheduling=async_scheduling)
        assert fast.summary["peak_kv_usage"] == 1.0  # the queue waits on memory
        slow = simulate(tr, make_policy(policy, **args), prof, arr, fast_forward=False, async_scheduling=async_scheduling)
        pd.testing.assert_frame_equal(fast.turns, slow.turns, check_exact=True)
        pd.testing.assert_frame_equal(fast.kv_usage, slow.kv_usage, check_exact=True)
        assert fast.summary == slow.summary
    assert seen and (policy == "autellix" or any(seen))  # stretches behind a blocked head (with pins held)
