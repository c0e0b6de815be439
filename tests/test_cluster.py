"""Clusters of replicas behind routers: stickiness, balance, conservation (every call
finishes exactly once across replicas, no leaks), exact stretches, bad input."""
import json

import numpy as np
import pandas as pd
import pytest

from conftest import linear_profile, make_trace, random_trace, simulate
from sim.cli import main
from sim.cluster.router import make_router
from sim.run.config import SimConfig, build_run
from agentsim.errors import InputError


def run(trace, arrivals, policy="vllm", replicas=2, router="round_robin", ff=True, offload=None, async_=False, **prof):
    p = linear_profile(**{"blocks": 400, **prof})
    return simulate(trace, policy, p, arrivals, fast_forward=ff, replicas=replicas, router=router, offload=offload,
                    async_scheduling=async_)


def trace_and_arrivals(seed=0, n=24):
    rng = np.random.default_rng(seed)
    return random_trace(rng, n), np.sort(rng.uniform(0, 6, n))


def test_session_router_is_sticky_and_spreads_programs():
    tr, arr = trace_and_arrivals()
    t = run(tr, arr, router="session", replicas=3).turns
    homes = t.groupby("program_id")["replica"].nunique()
    assert (homes == 1).all()
    assert t.groupby("program_id")["replica"].first().nunique() == 3


def test_prefix_router_follows_the_programs_cache():
    # ample memory: nothing is evicted, so a program's later turns find its blocks
    # only where it ran before -> sticky without being told
    tr, arr = trace_and_arrivals(1)
    t = run(tr, arr, router="prefix", replicas=2, blocks=4000).turns
    assert (t.groupby("program_id")["replica"].nunique() == 1).all()
    assert t["replica"].nunique() == 2


class _Eng:  # what the cache-aware router reads of a replica (sim/replica/base.py): its queues
    def __init__(self, active):
        self.active = active

    def waiting_calls(self):
        return self.active

    def running_calls(self):
        return 0


def _call(pid, tokens, arrival=0.0, task="t"):
    from policies.base import Request
    from sim.replica.call import Call
    from sim.kv.content import ContentKeys

    c = ContentKeys(16)
    c.append(task, tokens)
    c.append_output(1)
    return Call(req=Request(f"{pid}#0", pid, 0, arrival, arrival, tokens), seq_no=0, prompt_len=tokens, max_output=1,
                content=c)


def test_cache_aware_router_hand_worked():
    r = make_router("cache_aware")
    two = [_Eng(0), _Eng(0)]
    assert r.route(_call("a", 160), two) == 0                 # nothing cached anywhere: least loaded, lowest index
    assert r.route(_call("b", 160, task="u"), [_Eng(1), _Eng(0)]) == 1  # a different prompt: least loaded
    # a's prompt again (10 blocks matched on replica 0) while replica 0 is busier: affinity wins ...
    assert r.route(_call("c", 160), [_Eng(5), _Eng(0)]) == 0
    # ... unless the match is 30% of the prompt or less: 10 of 40 blocks -> least loaded
    long = _call("d", 640)  # same first 160 tokens (same segment id), then more of it
    assert r.route(long, [_Eng(5), _Eng(0)]) == 1
    # ... or the load is imbalanced: 70 - 0 > 64 and 70 > 1.5 x 0
    fresh = make_router("cache_aware")
    fresh.route(_call("a", 160), two)  # replica 0 has the prompt
    assert fresh.route(_call("f", 160), [_Eng(60), _Eng(0)]) == 0  # 60 - 0 <= 64: balanced, affinity
    assert fresh.route(_call("e", 160), [_Eng(70), _Eng(0)]) == 1
    # eviction every 120 s keeps each tree's most recent max_tree_tokens
    small = make_router("cache_aware")
    small.max_tree_tokens = 160
    small.route(_call("g", 160), two)
    small.route(_call("h", 160, arrival=1.0, task="u"), [_Eng(0), _Eng(9)])  # replica 0 holds both prompts
    small.route(_call("i", 16, arrival=200.0, task="v"), two)  # past 120 s: cut to the last 10 blocks ("u")
    assert small._match(0, _call("x", 160, task="u").content.prefix(10)) == 10
    assert small._match(0, _call("y", 160).content.prefix(10)) == 0


class _CacheAwareByTheLetter:
    """The cache-aware router's trees as SGLang keeps them, by the letter: a prompt's keys
    moved to the most recent end one by one, the match a scan from the first key."""

    def __init__(self, keep_tokens, interval):
        self.trees, self.keep_tokens, self.interval, self.evicted_at = [{}, {}], keep_tokens, interval, 0.0

    def route(self, call, engines):
        if call.req.arrival - self.evicted_at >= self.interval:
            keep = self.keep_tokens // call.block_size
            self.trees = [dict.fromkeys(list(t)[len(t) - keep:]) if len(t) > keep else t for t in self.trees]
            self.evicted_at = call.req.arrival
        keys = call.content.prefix(call.prompt_len // call.block_size)
        loads = [e.waiting_calls() for e in engines]
        i = min(range(2), key=lambda r: (loads[r], r))
        if not (max(loads) - min(loads) > 64 and max(loads) > 1.5 * min(loads)):
            match = [next((n for n, k in enumerate(keys) if k not in t), len(keys)) for t in self.trees]
            best = min(range(2), key=lambda r: (-match[r], loads[r], r))
            if match[best] * call.block_size > 0.3 * call.prompt_len:
                i = best
        for k in keys:
            self.trees[i].pop(k, None)
            self.trees[i][k] = None
        return i


def test_cache_aware_router_decides_as_its_trees_by_the_letter():
    """The binary-search match and the routed-at counts give every decision the plain
    scan and move-to-end give, before and after evictions cut the trees (not then
    prefix-closed: a prompt's oldest keys, its first blocks, go first)."""
    rng = np.random.default_rng(3)
    r = make_router("cache_aware", {"max_tree_tokens": 16 * 60, "eviction_interval": 5.0})
    ref = _CacheAwareByTheLetter(16 * 60, 5.0)
    decisions = []
    for n in range(400):
        call = _call(f"p{n}", 16 * int(rng.integers(1, 50)), arrival=n * 0.25, task=f"t{rng.integers(6)}")
        engines = [_Eng(int(rng.integers(0, 100))), _Eng(int(rng.integers(0, 100)))]
        got = r.route(call, engines)
        assert got == ref.route(call, engines), n
        assert [set(t) for t in r.trees] == [set(t) for t in ref.trees], n
        decisions.append(got)
    assert any(r._pruned) and 0.2 < np.mean(decisions) < 0.8  # cut trees, and both replicas chosen


def test_round_robin_alternates_per_call():
    tr = make_trace([[(50, 2, "ls", 0.35), (10, 2, None, None)], [(60, 2, "ls", 0.7), (10, 2, None, None)]])
    t = run(tr, [0.0, 0.1], router="round_robin").turns.sort_values("arrival")
    assert t["replica"].tolist() == [0, 1, 0, 1]


def test_least_loaded_picks_the_emptier_replica():
    # three programs at once: 0 -> r0, 1 -> r1 (r0 has one call), 2 -> r0 (tie, lowest index)
    tr = make_trace([[(50, 20, None, None)]] * 3)
    t = run(tr, [0.0, 0.0, 0.0], router="least_loaded").turns
    assert t.sort_values("program_id")["replica"].tolist() == [0, 1, 0]


@pytest.mark.parametrize("policy", ["vllm", "continuum", "infercept", "continuum-offload", "autellix"])
@pytest.mark.parametrize("router", ["round_robin", "least_loaded", "session", "prefix", "cache_aware"])
def test_conservation_across_replicas(policy, router):
    # execute itself checks: every (program, turn) finished once, nothing left
    # waiting/running/pinned/held, every pool and tier consistent.
    tr, arr = trace_and_arrivals(2, 18)
    res = run(tr, arr, policy=policy, router=router, replicas=3, blocks=150, offload="cpu:1MiB@0.05", budget=256)
    assert len(res.turns) == len(tr) and not res.turns.duplicated(["program_id", "turn"]).any()
    per = res.summary["per_replica"]
    assert sum(r["calls"] for r in per) == len(tr) and len(per) == 3
    assert res.summary["steps"] == sum(r["steps"] for r in per)
    assert set(res.kv_usage["replica"]) <= {0, 1, 2}


def test_one_replica_is_the_plain_engine():
    tr, arr = trace_and_arrivals(3)
    p = linear_profile(blocks=150)
    plain = simulate(tr, "continuum", p, arr).summary
    one = run(tr, arr, policy="continuum", replicas=1, router=None, blocks=150).summary
    assert one == plain
    with pytest.raises(InputError, match="--router applies only with --replicas 2 or more"):  # it would choose nothing
        build_run(SimConfig.model_validate({"workload": {"programs": 2}, "cluster": {"router": "prefix"}}))


@pytest.mark.parametrize("policy, offload", [("continuum", None), ("continuum-offload", "cpu:2MiB@0.0005")])
def test_stretches_exact_with_replicas_and_moved_pins(policy, offload):
    # round robin moves programs between replicas, so pins are released as 'moved'
    # (a slow PCIe link keeps reloads dear, so Continuum still pins with offload on)
    tr, arr = trace_and_arrivals(4, 20)
    kw = dict(policy=policy, router="round_robin", replicas=2, blocks=150, c2=1e-6, c4=1e-5, offload=offload)
    fast, slow = run(tr, arr, **kw), run(tr, arr, ff=False, **kw)
    assert fast.summary["pins_moved"] > 0
    assert fast.summary["steps"] == slow.summary["steps"]
    np.testing.assert_allclose(fast.turns["finish"], slow.turns["finish"], rtol=1e-9)
    for k in ("preemptions", "pins_hit", "pins_expired", "pins_victim", "pins_moved", "prefill_tokens_cached",
              "offload_loaded_tokens", "offload_bytes"):
        assert fast.summary[k] == slow.summary[k], k
    assert (fast.turns["replica"] == slow.turns["replica"]).all()


def test_deterministic_with_replicas():
    tr, arr = trace_and_arrivals(5)
    a = run(tr, arr, policy="continuum", router="least_loaded", replicas=3).summary
    b = run(tr, arr, policy="continuum", router="least_loaded", replicas=3).summary
    assert a == b


def test_bad_router_and_replicas():
    with pytest.raises(InputError, match="not a router"):
        make_router("nope")
    tr, arr = trace_and_arrivals()
    with pytest.raises(InputError, match="'cluster.replicas' is 0"):
        run(tr, arr, replicas=0)


@pytest.mark.parametrize("argv, fragment", [
    (["--offload", "cpu:abc"], "size 'abc' is not a size"),
    (["--router", "nope"], "is not a router"),
    (["--replicas", "0"], "'--replicas' is 0"),
    (["--replicas", "2", "--router", "cache_aware", "--router-arg", "threshold=0.5"], "router cache_aware has no parameter 'threshold'"),
    (["--replicas", "2", "--router", "cache_aware", "--router-arg", "balance_abs=1.5"], "balance_abs='1.5' is not a whole number"),
    (["--router-arg", "cache_threshold"], "--router-arg 'cache_threshold' is not K=V"),
])
def test_cli_bad_cluster_flags_are_one_line(argv, fragment, capsys):
    code = main(["run", "--programs", "2", "--no-progress"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1


def test_cli_cluster_run(capsys):
    assert main(["run", "--trace", "swebench", "--programs", "6", "--jps", "0.5", "--num-gpu-blocks", "4000",
                 "--replicas", "2", "--router", "session", "--offload", "cpu:20GiB", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "replicas / router" in out and "CPU hit ratio" in out


def test_router_parameters_reach_the_router_from_the_config_and_the_cli(tmp_path, capsys):
    from sim.run.config import SimConfig, build_run

    cfg = SimConfig.model_validate({"workload": {"programs": 2}, "cluster": {
        "replicas": 2, "router": "cache_aware", "router_args": {"cache_threshold": 0.9, "balance_abs": "8"}}})
    run = build_run(cfg)
    assert (run.router.cache_threshold, run.router.balance_abs, run.router.balance_rel) == (0.9, 8, 1.5)
    assert run.config.cluster.router_args == {"cache_threshold": 0.9, "balance_abs": 8}  # resolved: typed
    # --router-arg on the command line lands in the written config, which reruns the same
    assert main(["run", "--programs", "4", "--jps", "0.5", "--replicas", "2", "--router", "cache_aware",
                 "--router-arg", "cache_threshold=0.9", "--no-progress", "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["cluster"]["router_args"] == {"cache_threshold": 0.9}
    assert build_run(SimConfig.model_validate(written)).router.cache_threshold == 0.9


def test_stretches_end_on_the_same_float_as_steps_so_replicas_see_events_in_the_same_order():
    # found by `make fuzz`: a decode stretch summed its step times in closed form, a few
    # ulps off step-by-step; two calls then finished in the other order and round robin
    # sent their next turns to the other replicas (1.0802 s instead of 1.0538 s)
    p = [(11, 6, "cat", 0.0), (247, 37, None, None)]
    tr = make_trace([p, p])
    kw = dict(replicas=2, router="round_robin", blocks=30, budget=16, seqs=1, c2=1e-6, c4=1e-5)
    fast, step = (run(tr, [0.0, 0.0], ff=ff, **kw).turns for ff in (True, False))
    assert fast[["replica", "finish", "exec_time"]].values.tolist() == step[["replica", "finish", "exec_time"]].values.tolist()
    assert fast["finish"].max() == pytest.approx(1.053783)


def _exact_with_stretches(monkeypatch, tr, arrivals, replica, **kw):
    """The run's turns with stretches, after checking that `replica` ran one and that
    step-by-step gives the same turns to the last bit."""
    seen = _stretches(monkeypatch)
    fast = run(tr, arrivals, **kw).turns
    assert any(r == replica and n > 1 for r, n in seen)
    pd.testing.assert_frame_equal(fast, run(tr, arrivals, ff=False, **kw).turns, check_exact=True)
    return fast


SAME_INSTANT = make_trace([[(17, 1, "ls", 0.0), (11, 12, None, None)], [(15, 6, "ls", 0.0), (6, 11, None, None)],
                           [(15, 6, "ls", 0.0), (6, 11, None, None)], [(3, 8, None, None)]])


@pytest.mark.parametrize("async_", [False, True])
def test_step_ends_of_one_instant_reach_the_router_in_replica_order(monkeypatch, async_):
    # found by `make fuzz`: p001 and p002 (identical) decode on replicas 1 and 2 and finish
    # at the same instant; their 0 s tools send both next turns at once. SimPy ordered the
    # two step ends by creation, and p000's next turn cut replica 1's stretch, so with
    # stretches replica 2's end was older and round robin sent p002's turn first
    # (p001#1 to replica 0, not 2). Step ends of one instant now fire in replica order.
    kw = dict(replicas=3, blocks=10, budget=16, seqs=1, c2=1e-6, c4=1e-5, async_=async_)
    # replica 1 ran a stretch (cut by p000#1)
    fast = _exact_with_stretches(monkeypatch, SAME_INSTANT, [0.0] * 4, 1, **kw).set_index(["program_id", "turn"])
    assert fast.loc[("p001", 0), "finish"] == fast.loc[("p002", 0), "finish"]  # the tie
    assert (fast.loc[("p001", 1), "replica"], fast.loc[("p002", 1), "replica"]) == (2, 0)


@pytest.mark.parametrize("async_", [False, True])
def test_a_call_from_a_later_replicas_step_end_waits_for_the_step_that_began_at_that_instant(monkeypatch, async_):
    # found by the same search: p000 and p001 prefill alike, so replica 0's decode steps
    # end where replica 1's do; p001 finishes at 0.081085 and its 0 s tool sends p001#1
    # to replica 0 at that instant. Step-by-step replica 0's step end came first (replica
    # order), so the call waited for the step begun then; the stretch let it in at once
    # (scheduled 0.081085, p000 finished 0.126834 instead of 0.092415).
    tr = make_trace([[(25, 6, None, None)], [(25, 5, "ls", 0.0), (3, 6, None, None)]])
    kw = dict(blocks=30, budget=64, seqs=2, c2=1e-6, c4=1e-5, async_=async_)
    fast = _exact_with_stretches(monkeypatch, tr, [0.0, 0.0], 0, **kw)
    assert fast[["program_id", "replica", "scheduled"]].values.tolist() == [["p000", 0, 0.0], ["p001", 1, 0.0],
                                                                             ["p001", 0, 0.092415]]


@pytest.mark.parametrize("async_", [False, True])
def test_a_call_landing_where_an_asynchronous_stretch_begins(monkeypatch, async_):
    # The same race where the stretch's first step begins: asynchronously a stretch is
    # planned to start at the end of the step in flight ahead of it, and step-by-step that
    # step's end (replica 0) fires before replica 1's, so a call sent then finds the
    # stretch's first step in flight and its second scheduled (p001#1 scheduled 0.044561).
    tr = make_trace([[(12, 8, None, None)], [(12, 2, "ls", 0.0), (3, 7, None, None)]])
    kw = dict(blocks=35, seqs=2, c2=1e-6, c4=1e-5, async_=async_)
    fast = _exact_with_stretches(monkeypatch, tr, [0.0, 0.0], 0, **kw)
    assert fast["scheduled"].tolist() == pytest.approx([0.0, 0.0, 0.044561])


@pytest.mark.parametrize("async_", [False, True])
def test_routers_read_the_state_step_by_step_would_show(monkeypatch, async_):
    # A long decode on replica 0; a second program arrives mid-decode and the router
    # reads every replica's used blocks at that instant: a decode stretch must not hide
    # the blocks its earlier steps allocated (found by the property tests as a 6 ms
    # difference between fast-forward and step-by-step with 2 replicas). Asynchronously
    # step-by-step has allocated one step more (the step scheduled ahead).
    from sim.replica.base import Replica

    tr = make_trace([[(20, 400, None, None)], [(40, 8, None, None)]])
    seen = {}
    for ff in (True, False):
        reads, load = [], Replica.load
        monkeypatch.setattr(Replica, "load", lambda e, reads=reads, load=load: reads.append(load(e)) or reads[-1])
        run(tr, [0.0, 1.3], router="least_loaded", ff=ff, blocks=200, async_=async_)
        monkeypatch.setattr(Replica, "load", load)
        seen[ff] = reads
    assert seen[True] == seen[False]
    # at 1.3 s (~118 decode steps of 11 ms) replica 0 holds (20 + 118) / 16 -> 9 blocks, not its first 2
    assert seen[True][-2] == (1, 9)


def test_a_stretch_ends_on_a_float_no_timeout_delay_reaches():
    # found by `make fuzz` once stretches had to match step-by-step to the last bit: the
    # stretch from 0.0984... to 0.356524 crosses a power of two, where now + delay rounds
    # to even and no delay lands on 0.356524; SimPy's timeout ended one ulp early
    # (0.35652399999999995)
    tr = make_trace([[(55, 23, None, None)]])
    kw = dict(replicas=1, blocks=30, budget=16, seqs=1, c2=1e-6, c4=1e-5)
    fast, step = (run(tr, [0.0], ff=ff, **kw).turns for ff in (True, False))
    assert fast["finish"].tolist() == step["finish"].tolist() == [0.356524]


def _stretches(monkeypatch):
    """Records the (replica, steps) of every batch of steps the engine ran as one
    (after any cut short by a call that reached the replica mid-stretch)."""
    from sim.simpy_replica.engine import SimpyReplica

    seen, orig = [], SimpyReplica._account

    def record(self, now, dts, scheduled):
        seen.append((self.index, len(dts)))
        return orig(self, now, dts, scheduled)
    monkeypatch.setattr(SimpyReplica, "_account", record)
    return seen


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("router, own", [("session", True), ("round_robin", True), ("cache_aware", True),
                                         ("least_loaded", True), ("prefix", False)])
def test_replicas_on_their_own_clocks_behind_routers_that_read_only_load(monkeypatch, router, own, async_):
    # replica 0: one long decode; replica 1: a program whose many short turns (prefill
    # steps, tool returns) land while it runs. A router that reads only queue lengths and
    # used blocks leaves replica 0 on its own clock: its decode is one stretch up to its
    # last step, cut only where a call lands on it; the prefix router reads the prefix
    # cache, which a stretch updates only at its end, so replica 0 stops at every event.
    chatty = [(20, 1, "ls", 0.01)] * 30 + [(20, 1, None, None)]
    tr = make_trace([[(20, 400, None, None)], chatty])
    seen = _stretches(monkeypatch)
    kw = dict(router=router, replicas=2, blocks=200, async_=async_)
    fast = run(tr, [0.0, 0.0], **kw)
    long = [n for r, n in seen if r == 0]
    assert (max(long) > 300) == own, long
    step = run(tr, [0.0, 0.0], ff=False, **kw)  # and exactly what step-by-step gives
    pd.testing.assert_frame_equal(fast.turns, step.turns, check_exact=True)
    pd.testing.assert_frame_equal(fast.kv_usage, step.kv_usage, check_exact=True)
    assert fast.summary == step.summary


@pytest.mark.parametrize("async_", [False, True])
def test_a_first_arrival_routed_elsewhere_neither_cuts_a_stretch_nor_reads_it_stale(monkeypatch, async_):
    # p0 decodes alone on replica 0 from t=0 (2 blocks when its stretch begins, 7 by
    # t=1); p1 starts on replica 1 at t=0.8 (4 blocks). At t=1 p2 arrives: one call runs
    # on each replica, so the router's tie-break is used blocks, and step by step replica
    # 1 holds fewer. Replica 0's stretch allocates its blocks only at its end, so the
    # router must be told what step-by-step would show (SimpyReplica.used_blocks), not the pool.
    tr = make_trace([[(16, 400, None, None)], [(48, 400, None, None)], [(16, 5, None, None)]])
    seen = _stretches(monkeypatch)
    kw = dict(router="session", replicas=2, async_=async_)
    fast = run(tr, [0.0, 0.8, 1.0], **kw)
    assert fast.turns.set_index("program_id")["replica"].to_dict() == {"p000": 0, "p001": 1, "p002": 1}
    # p0's decode: one stretch, uncut by p1 and p2 (asynchronously it begins behind the
    # first decode step, in flight, and leaves the last token's step out)
    assert max(n for r, n in seen if r == 0) >= (398 if async_ else 399)
    step = run(tr, [0.0, 0.8, 1.0], ff=False, **kw)
    pd.testing.assert_frame_equal(fast.turns, step.turns, check_exact=True)
    pd.testing.assert_frame_equal(fast.kv_usage, step.kv_usage, check_exact=True)
    assert fast.summary == step.summary
