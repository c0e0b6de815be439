"""continuum-static, program-fcfs, autellix, oracle rules."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.autellix import AutellixPolicy
from policies.base import FREE, Policy, Request, Retention
from policies.oracle import OraclePolicy
from policies.program_fcfs import ProgramFCFSPolicy
from policies.registry import POLICIES, make_policy
from policies.static import ContinuumStaticPolicy


from conftest import FakeView  # noqa: E402



def req(pid="p", turn=1, arrival=0.0, prog_arrival=0.0, tokens=2200, tool="a", last=False, preempted=False,
        exec_time=0.0, true=None):
    r = Request(f"{pid}-{turn}", pid, turn, arrival, prog_arrival, tokens, 0, last, tool, preempted, exec_time)
    r.true_tool_duration = true
    return r


def test_registry_names():
    assert set(POLICIES) >= {"vllm", "continuum", "continuum-static", "program-fcfs", "autellix", "oracle"}
    assert make_policy("autellix", beta="4").beta == 4.0


# --- continuum-static -----------------------------------------------------------------
def test_static_pin_rules():
    p = ContinuumStaticPolicy()
    v = FakeView()
    assert p.on_finish(req(pid="a", tool="new"), 0.0, v) == Retention("pin", 2.0)  # never seen: mean 0
    assert p.on_finish(req(pid="b", tool=None), 0.0, v) == FREE  # no tool parsed
    p.record_tool_time("ok", 1.0)
    p.record_tool_time("ok", 3.0)  # mean 2.0 <= 2.0 -> pin 2.0
    assert p.on_finish(req(pid="c", tool="ok"), 0.0, v) == Retention("pin", 2.0)
    p.record_tool_time("slow", 1.0)
    p.record_tool_time("slow", 4.0)  # mean 2.5 -> free
    assert p.on_finish(req(pid="d", tool="slow"), 0.0, v) == FREE
    assert p.on_finish(req(pid="e", tool="ok", last=True), 0.0, v) == FREE
    assert sorted(p.pins) == ["a", "c"] and p.ttls["new"] == [2.0]


def test_static_tool_time_from_arrivals():
    p = ContinuumStaticPolicy()
    v = FakeView()
    p.on_finish(req(pid="x", turn=0, tool="sleep"), 0.0, v)
    p.on_arrival(req(pid="x", turn=1, arrival=5.0), 5.0)
    assert p.mean("sleep") == 5.0
    assert p.on_finish(req(pid="y", turn=0, tool="sleep"), 6.0, v) == FREE


def test_static_order_and_victims():
    p = ContinuumStaticPolicy()
    v = FakeView(blocks={"pin1": 3, "pin2": 3})
    p.on_finish(req(pid="pin1", turn=0, prog_arrival=5.0, tool="t"), 0.0, v)  # expiry 2.0
    p.on_finish(req(pid="pin2", turn=0, prog_arrival=1.0, tool="t"), 1.0, v)  # expiry 3.0
    rs = [req(pid="old", prog_arrival=0.5), req(pid="pin1", prog_arrival=5.0),
          req(pid="mid", prog_arrival=3.0, preempted=True)]
    assert [r.program_id for r in sorted(rs, key=lambda r: p.order_key(r, 1.5, v))] == ["pin1", "old", "mid"]
    assert p.unpin_victims(2, v) == ["pin2"]  # latest end time first
    running = [req(pid="a", prog_arrival=1.0), req(pid="b", prog_arrival=3.0, last=True), req(pid="c", prog_arrival=2.0)]
    assert p.preemption_victim(running, v).program_id == "c"  # latest non-last-step
    assert [r.program_id for r in p.preemption_order(running, v)] == ["c", "a", "b"]


@pytest.mark.parametrize("name", ["continuum-static", "rebuild-priced-ttl"])
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0, 7.5]), st.booleans()), max_size=9))
def test_static_preemption_order_is_its_victims_one_by_one(name, calls):
    """The one-sort preemption_order (what the vLLM adapter asks each step) equals asking
    preemption_victim again on what is left (the base definition), ties included."""
    p, v = make_policy(name), FakeView()
    running = [req(pid=f"p{i}", prog_arrival=a, last=last) for i, (a, last) in enumerate(calls)]
    assert p.preemption_order(running, v) == Policy.preemption_order(p, running, v)


# --- program-fcfs ------------------------------------------------------------------------
def test_program_fcfs_order_and_no_pins():
    p = ProgramFCFSPolicy()
    v = FakeView()
    rs = [req(pid="late", turn=0, arrival=1.0, prog_arrival=1.0), req(pid="early", turn=5, arrival=9.0, prog_arrival=0.0),
          req(pid="pre", arrival=9.5, prog_arrival=4.0, preempted=True)]
    assert [r.program_id for r in sorted(rs, key=lambda r: p.order_key(r, 10.0, v))] == ["pre", "early", "late"]
    assert p.on_finish(req(tokens=10**6), 0.0, v) == FREE and not p.pins


# --- autellix --------------------------------------------------------------------------------
def finish(p, pid, exec_time, now=0.0, turn=0):
    r = req(pid=pid, turn=turn, arrival=now, exec_time=exec_time)
    p.on_arrival(r, now)
    p.on_schedule(r, now)
    return p.on_finish(r, now, FakeView())


def test_autellix_levels():
    p = AutellixPolicy()
    assert [p.level_of(s) for s in (0, 0.019, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 0.64, 100)] == [0, 0, 1, 1, 2, 3, 4, 5, 6, 6]
    assert len(p.bounds) == 7  # K = 7 queues


def test_autellix_queue_by_attained_service_then_fcfs():
    p = AutellixPolicy()
    v = FakeView()
    assert finish(p, "heavy", 0.5) == FREE and not p.pins  # service 0.5 -> Q6
    finish(p, "light", 0.03)  # service 0.03 -> Q2
    # waits kept short: with beta = 8 and service in tens of ms, a wait of
    # 8 x service already promotes (tested below)
    calls = [req(pid="heavy", arrival=2.9), req(pid="light", arrival=2.999),
             req(pid="new", turn=0, arrival=3.0), req(pid="new2", turn=0, arrival=2.95)]
    for r in calls:
        p.on_arrival(r, r.arrival)
    keys = {r.program_id: p.order_key(r, 3.0, v) for r in calls}
    assert keys["heavy"][0] == 5 and keys["light"][0] == 1 and keys["new"][0] == 0
    assert [r.program_id for r in sorted(calls, key=lambda r: p.order_key(r, 3.0, v))] == ["new2", "new", "light", "heavy"]


def test_autellix_snapshot_taken_at_arrival():
    p = AutellixPolicy()
    v = FakeView()
    r = req(pid="x", arrival=0.0)
    p.on_arrival(r, 0.0)  # service 0 at arrival
    p.service["x"] = 1.0  # later service does not move an already-arrived call
    assert p.order_key(r, 0.1, v)[0] == 0


def test_autellix_anti_starvation():
    p = AutellixPolicy(beta=8.0)
    v = FakeView()
    finish(p, "x", 1.0, now=0.0)  # service 1.0 (Q7), program wait 0
    r = req(pid="x", turn=1, arrival=10.0)
    p.on_arrival(r, 10.0)
    assert p.order_key(r, 17.9, v)[0] == 6  # (0 + 7.9) / 1.0 < 8
    assert p.order_key(r, 18.0, v)[0] == 0  # 8 / 1 >= 8 -> Q1
    assert p.order_key(r, 18.1, v)[0] == 0  # stays promoted
    p.on_schedule(r, 19.0)
    assert p.wait["x"] == 0.0  # counters reset
    r.exec_time = 0.2
    assert p.on_finish(r, 20.0, v) == FREE and p.service["x"] == pytest.approx(1.2)


def test_autellix_program_wait_accumulates():
    p = AutellixPolicy(beta=8.0)
    v = FakeView()
    r0 = req(pid="x", turn=0, arrival=0.0, exec_time=0.5)
    p.on_arrival(r0, 0.0)
    p.on_schedule(r0, 3.0)  # waited 3 s
    p.on_finish(r0, 3.5, v)
    r1 = req(pid="x", turn=1, arrival=4.0)
    p.on_arrival(r1, 4.0)
    assert p.order_key(r1, 4.9, v)[0] == 5  # (3 + 0.9) / 0.5 = 7.8 < 8
    assert p.order_key(r1, 5.0, v)[0] == 0  # (3 + 1) / 0.5 = 8


def test_autellix_should_demote():
    p = AutellixPolicy()
    v = FakeView()
    finish(p, "x", 0.03)  # Q2 = [0.02, 0.04)
    r = req(pid="x", turn=1, arrival=1.0)
    p.on_arrival(r, 1.0)
    assert p.order_key(r, 1.0, v)[0] == 1
    r.exec_time = 0.009
    assert not p.should_demote(r, 1.1)
    r.exec_time = 0.011  # 0.041 >= 0.04
    assert p.should_demote(r, 1.1)
    r.preempted = True
    assert p.order_key(r, 1.2, v)[0] == 2  # re-enters one queue lower
    assert not p.should_demote(r, 1.3)


# --- oracle ------------------------------------------------------------------------------
def test_oracle_pin_decisions():
    p = OraclePolicy()
    assert p.epsilon == 1.0  # outlives the arrival's delivery at the end of the step in progress
    v = FakeView()  # T = 0 -> benefit = prefill 2.2 s
    assert p.on_finish(req(pid="a", true=1.0), 0.0, v) == Retention("pin", 1.0 + p.epsilon)
    assert p.on_finish(req(pid="b", true=3.0), 0.0, v) == FREE
    assert p.on_finish(req(pid="c", true=2.2), 0.0, v) == FREE  # benefit must exceed the cost
    # with T = 5 s (η = 1) the benefit is 7.2 -> 3 s pays
    p.on_schedule(req(pid="z", turn=1, arrival=0.0), 5.0)
    assert p.on_finish(req(pid="d", true=3.0), 0.0, v) == Retention("pin", 3.0 + p.epsilon)
    # no true duration: continuum's cold start, ln(T + PR) = ln 7.2
    r = p.on_finish(req(pid="e", true=None), 0.0, v)
    assert r.action == "pin" and r.ttl == pytest.approx(math.log(7.2))
    assert p.on_finish(req(pid="f", true=0.1, last=True), 0.0, v) == FREE


def test_oracle_orders_like_continuum():
    p = OraclePolicy()
    v = FakeView()
    p.on_finish(req(pid="pinned", turn=0, prog_arrival=5.0, true=1.0), 0.0, v)
    rs = [req(pid="old", prog_arrival=1.0), req(pid="pinned", prog_arrival=5.0)]
    assert [r.program_id for r in sorted(rs, key=lambda r: p.order_key(r, 0.5, v))] == ["pinned", "old"]


# --- the no-deadlock rule in the simulator's scheduler ---------------------------------------
def _blocked_head(policy, running: bool):
    """20 usable blocks: program "p" pinned on 8, optionally a running call on 5, and a
    waiting head that needs 13 (7 free while the call runs, 12 when it does not)."""
    from policies.base import Pin
    from sim.replica.call import Call
    from sim.hardware.engine_config import EngineConfig
    from sim.simpy_replica.scheduler import Scheduler

    s = Scheduler(EngineConfig(num_gpu_blocks=21, block_size=16), policy)
    s.hold_pin("p", s.pool.allocate(8), 0.0)
    policy.pins["p"] = Pin(expiry=100.0, program_arrival=5.0, since=0.0, tool="t")  # arrived after the head
    if running:
        r = Call(req=req(pid="r", turn=0, prog_arrival=0.0, tokens=70), seq_no=0, prompt_len=70, max_output=50)
        s.waiting.append(r)
        s.complete(s.schedule(0.0), 0.1)
        assert s.running == [r] and len(r.blocks) == 5
    head = Call(req=req(pid="h", turn=0, arrival=1.0, prog_arrival=1.0, tokens=200), seq_no=1, prompt_len=200, max_output=5)
    s.waiting.append(head)
    s.schedule(1.0)
    return s, head


@pytest.mark.parametrize("name", ["continuum", "continuum-static", "oracle"])
def test_continuum_family_unpins_for_the_queue_head_only_in_a_deadlock(name):
    # §5.2's rule exists for deadlock (pins filling the pool, nothing running); the
    # authors' fork unpins only when len(self.running) == 0. While a call runs the head
    # waits and the pin stays (its TTL, not the queue, bounds it).
    s, head = _blocked_head(make_policy(name), running=True)
    assert "p" in s.pins and head in s.waiting and s.policy.pin_outcomes["victim"] == 0
    s, head = _blocked_head(make_policy(name), running=False)  # deadlock: the pin goes
    assert "p" not in s.pins and head in s.running and s.policy.pin_outcomes["victim"] == 1
    # the other reading (drop pins while calls run if that lets the head in) on request
    s, head = _blocked_head(make_policy(name, unpin_while_running="1"), running=True)
    assert "p" not in s.pins and head in s.running and s.policy.pin_outcomes["victim"] == 1


def test_finish_stats_are_the_papers_T_and_M():
    from policies.base import Request
    from sim.replica.policy_host import FinishStats

    st = FinishStats(window=2)
    assert st.queue_delay() == 0.0 and st.avg_request_blocks() == 1.0  # nothing seen yet

    def req(turn):
        return Request("r", "p", turn, 0.0, 0.0, 10)

    st.record(req(0), 9.0, 4)  # a first call's delay is not T's (it had no cache to lose)
    st.record(req(1), 1.0, 6)
    st.record(req(2), None, 8)  # never scheduled: counts for M only
    st.record(req(3), 3.0, 2)
    st.record(req(4), 5.0, 10)  # window 2: T over the last two delays
    assert st.queue_delay() == 4.0
    assert st.avg_request_blocks() == 6.0


def test_autellix_order_key_is_its_level_then_arrival():
    """order_key inlines level() (the hot path of every step's sort): on random states the
    same key and the same promotions as level() on a twin policy."""
    import random
    from policies.autellix import AutellixPolicy
    rng = random.Random(3)
    a, b = AutellixPolicy(), AutellixPolicy()
    reqs = []
    for i in range(300):
        pid = f"p{rng.randrange(20)}"
        r = Request(f"r{i}", pid, 0, rng.uniform(0, 50), 0.0, 10, exec_time=rng.choice([0.0, rng.uniform(0, 1)]))
        waited = rng.uniform(0, 2) if i % 3 else 0.0
        for pol in (a, b):
            pol.on_arrival(r, r.arrival)
            pol.wait[pid] += waited
        reqs.append(r)
    for step in range(5):
        now = 50 + 10 * step
        for r in reqs:
            assert a.order_key(r, now, None) == (b.level(r, now), r.arrival, r.req_id)
    assert a.promoted == b.promoted and a.promoted and a.queued_at == b.queued_at
    # the edges: service on a bound is in the queue it opens; a wait of exactly beta x service starves
    c = AutellixPolicy()
    on_bound = Request("e1", "q1", 0, 1.0, 1.0, 10, exec_time=0.02)
    starved = Request("e2", "q2", 0, 1.0, 1.0, 10, exec_time=0.5)
    for r in (on_bound, starved):
        c.on_arrival(r, r.arrival)
    c.wait["q2"] = 8.0 * 0.5
    assert c.order_key(on_bound, 1.0, None)[0] == 1 and c.order_key(starved, 1.0, None)[0] == 0


def test_autellix_order_stays_fixed_until_the_first_promotion():
    """order_fixed_until (where the engine ends a decode stretch behind a blocked queue): no
    key changes at any time before it, and the first promotion comes soon after it."""
    import copy
    import random
    rng = random.Random(5)
    for _ in range(200):
        p = AutellixPolicy(beta=rng.choice([1.0, 2.0, 8.0]))
        reqs = []
        for i in range(rng.randrange(1, 6)):
            pid = f"p{i}"
            r = Request(f"r{i}", pid, 1, rng.uniform(0, 20), 0.0, 10, exec_time=rng.choice([0.0, rng.uniform(0, 1)]))
            p.on_arrival(r, r.arrival)
            p.snapshot[r.req_id] = rng.choice([0.0, rng.uniform(0, 2)])
            p.wait[pid] = rng.uniform(0, 5)
            reqs.append(r)
        now = 20.0
        keys = [p.order_key(r, now, None) for r in reqs]
        t = p.order_fixed_until(now, reqs)
        if math.isinf(t):  # nothing can be promoted: every call is promoted or has no service
            assert all(r.req_id in p.promoted or p.snapshot[r.req_id] + r.exec_time == 0 for r in reqs)
            continue
        for x in [now + (t - now) * f for f in (0.0, 0.5, 0.999999)] + [math.nextafter(t, -math.inf)]:
            if x >= now:
                q = copy.deepcopy(p)
                assert [q.order_key(r, x, None) for r in reqs] == keys
        q = copy.deepcopy(p)
        for r in reqs:
            q.order_key(r, max(now, t + 1e-6), None)
        assert len(q.promoted) > len(p.promoted)  # a promotion just after it
