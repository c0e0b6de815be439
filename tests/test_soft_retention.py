"""Soft retention (sim/kv/retention.py, sim/vllm_replica/retention.py): the evictor's order
on the pool itself, soft against hard under pressure, client hints from a trace or
extra_args, and the policies on top (policies/soft.py)."""
import math

import numpy as np
import pandas as pd
import pytest

from agentsim.errors import InputError
from conftest import linear_profile, random_trace, simulate
from policies.base import Action, Retention, RetentionHint
from policies.registry import make_policy, PolicyError
from sim.kv.block_pool import PyBlockPool
from sim.kv.retention import RetainingPool, level_at, next_change
from sim.replica.job_meta import parse_hint
from traces.schema import validate


def pool_with(n=16):
    """A retaining pool whose blocks 0..n-1 hold keys k0.. (each was a one-block call)."""
    p = RetainingPool(PyBlockPool(n, 16))
    blocks = p.allocate(n)
    p.cache_many(blocks, [f"k{b}" for b in blocks])
    return p, blocks


def free_one(p, b, now, spec=None):
    p.now = now
    if spec is not None:
        p.retain([b], *spec)
    p.free([b])


def test_unretained_lru_first_then_ascending_priority_lru_within():
    p, _ = pool_with(8)
    # freed in this order: 0 (prio 50), 1 (none), 2 (prio 10), 3 (none), 4 (prio 50), 5 (prio 10)
    for t, (b, prio) in enumerate([(0, 50), (1, None), (2, 10), (3, None), (4, 50), (5, 10)]):
        free_one(p, b, float(t), None if prio is None else (prio, math.inf, None))
    assert p.num_free == 6 and len(p.retainer) == 4
    assert p.evictable([0, 1, 2, 6]) == 3  # retained blocks count as free, as vLLM's ref_cnt 0
    p.now = 10.0
    assert [p.allocate(1)[0] for _ in range(6)] == [1, 3, 2, 5, 0, 4]
    assert p.retainer.evicted == 4 and p.key[2] is None  # evicted: content gone
    assert p.allocate(1) is None
    p.check()


def test_a_hit_takes_a_retained_block_back_and_keeps_its_spec():
    p, _ = pool_with(4)
    free_one(p, 0, 0.0, (90, 100.0, None))
    free_one(p, 1, 0.0)
    assert p.lookup(["k0"]) == [0]
    p.touch([0])
    assert len(p.retainer) == 0 and p.num_free == 1 and 0 in p.retainer.spec
    free_one(p, 0, 5.0)  # freed again (no new spec): still retained, the spec is the block's
    assert len(p.retainer) == 1
    p.now = 6.0
    assert p.allocate(2) == [1, 0]
    p.check()


def test_lazy_expiry_sends_expired_blocks_to_the_queue_tail_in_expiry_order():
    p, _ = pool_with(8)
    free_one(p, 0, 0.0, (80, 5.0, None))  # ends at 5
    free_one(p, 1, 0.0, (80, 3.0, None))  # ends at 3
    free_one(p, 2, 1.0, (20, 100.0, None))
    free_one(p, 3, 2.0)
    free_one(p, 4, 9.0)  # unretained, freed after both expired but before the evictor looked
    p.now = 10.0
    # expired ones join the tail when the evictor looks (after 3 and 4), then priority 20
    assert p.allocate(5) == [3, 4, 1, 0, 2]
    assert p.retainer.expired == 2 and p.retainer.evicted == 1
    p.check()


def test_a_block_freed_after_its_duration_is_plain():
    p, _ = pool_with(4)
    p.retain([0], 60, 2.0, None)
    free_one(p, 0, 3.0)
    assert len(p.retainer) == 0 and 0 not in p.retainer.spec


def test_decaying_priority_halves_after_the_duration():
    assert [level_at(80, 10.0, 2.0, t) for t in (9.9, 10.0, 11.9, 12.0, 14.0, 20.0, 30.0)] == [80, 40, 40, 20, 10, 1, -1]
    assert [next_change(80, 10.0, 2.0, t) for t in (0.0, 10.0, 13.0)] == [10.0, 12.0, 14.0]
    assert level_at(80, 10.0, None, 10.0) == -1 and next_change(80, 10.0, None, 10.0) == math.inf
    p, _ = pool_with(4)
    free_one(p, 0, 0.0, (80, 1.0, 1.0))  # 40 from t=1, 20 from t=2, 10 from t=3
    free_one(p, 1, 0.0, (30, math.inf, None))
    p.now = 1.5
    assert p.allocate(1) == [1]  # 30 < 40
    free_one(p, 2, 1.6, (30, math.inf, None))  # (block 1 lost its content: it would be plain)
    assert p.next_change() == 2.0  # when the decaying block's level next changes (a stretch stops there)
    p.now = 2.5
    assert p.allocate(1) == [0]  # 20 < 30 now
    p.check()


def test_soft_retention_is_evicted_under_pressure_a_pin_is_not():
    soft, _ = pool_with(4)
    for b in range(4):
        free_one(soft, b, 0.0, (100, math.inf, None))
    assert soft.allocate(4) == [0, 1, 2, 3]  # a full pool of retained blocks still serves
    hard, blocks = pool_with(4)  # the same blocks held by a pin: referenced, never free
    assert hard.num_free == 0 and hard.allocate(1) is None


def test_retaining_pool_and_vllms_retaining_block_pool_evict_alike():
    """Random frees (with and without specs, decaying too), hits and allocations at
    advancing times on both pools: the same blocks come back in the same order."""
    pytest.importorskip("vllm")
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    from sim.vllm_replica.retention import install

    rng = np.random.default_rng(7)
    n = 40
    now = [0.0]
    sim = RetainingPool(PyBlockPool(n, 16))
    real = install(BlockPool(n + 1, True, 16), lambda: now[0])  # + vLLM's null block (id 0)
    held: list[list[int]] = []  # per live call: its blocks (sim ids; vLLM's are id + 1)
    key_no = 0
    for _ in range(400):
        now[0] += float(rng.exponential(0.5))
        sim.now = now[0]
        op = rng.random()
        if op < 0.45 and sim.num_free:
            k = int(rng.integers(1, min(6, sim.num_free) + 1))
            a, b = sim.allocate(k), [x.block_id - 1 for x in real.get_new_blocks(k)]
            assert a == b
            keys = [f"h{key_no + i}" for i in range(k)]
            key_no += k
            sim.cache_many(a, keys)
            for i, h in zip(a, keys):
                real._insert_block_hash(make_block_hash_with_group_id(h.encode(), 0), real.blocks[i + 1], 16)
            held.append(a)
        elif op < 0.85 and held:
            a = held.pop(int(rng.integers(len(held))))
            if rng.random() < 0.6:
                spec = (int(rng.integers(0, 101)), now[0] + float(rng.exponential(2.0)),
                        None if rng.random() < 0.5 else float(rng.exponential(1.0)) + 0.01)
                sim.retain(a, *spec)
                real.retainer.set([i + 1 for i in a], *spec)
            sim.free(a)
            real.free_blocks([real.blocks[i + 1] for i in reversed(a)])
        elif held or sim.num_free:  # a hit on free blocks (retained or queued) that still hold content
            cand = [b for b in range(n) if sim.key[b] is not None and sim.count_ref([b], 0)][:3]
            if cand:
                sim.touch(cand)
                real.touch([real.blocks[i + 1] for i in cand])
                held.append(cand)
        assert sim.num_free == real.get_num_free_blocks()
        assert sorted(sim.retainer.retained) == sorted(i - 1 for i in real.retainer.retained)
    assert sim.retainer.evicted > 0 and sim.retainer.expired > 0
    sim.check()


def test_parse_hint_reads_the_envelope_and_never_raises():
    assert parse_hint({"priority": 80, "ttl": "5m", "session": "s1"}) == (RetentionHint(80, 300.0, "s1"), [])
    assert parse_hint({"ttl": 3})[0] == RetentionHint(50, 3.0, None)
    assert parse_hint({"session": "s"}) == (None, [])
    assert parse_hint({"priority": 101})[0] is None and parse_hint({"ttl": "soon"})[1]
    assert parse_hint("x")[0] is None


def _hinted(trace, priority=90, ttl=None):
    trace = trace.copy()
    last = trace.groupby("program_id")["turn"].transform("max") == trace["turn"]
    trace["kv_priority"] = np.where(last, np.nan, priority).astype(float)
    trace["kv_ttl_s"] = np.nan if ttl is None else float(ttl)
    trace["kv_session"] = trace["program_id"]
    return validate(trace)


def test_trace_hint_columns_are_checked():
    trace = random_trace(np.random.default_rng(1), 3)
    trace["kv_priority"] = 101
    with pytest.raises(InputError, match="field 'kv_priority' is 101; give a whole number 0-100"):
        validate(trace)
    trace["kv_priority"] = np.nan
    trace["kv_ttl_s"] = -1.0
    with pytest.raises(InputError, match="field 'kv_ttl_s' is -1.0"):
        validate(trace)


def test_hints_read_from_a_trace_change_retention_in_both_engines_alike():
    """vLLM's default policy honours the client's hints: with them, calls hit KV that
    the plain run evicted; the vLLM engine reads them from each request's extra_args."""
    pytest.importorskip("vllm")
    prof = linear_profile(c2=1e-7, blocks=200)
    plain = random_trace(np.random.default_rng(3), 24)
    arrivals = np.cumsum(np.random.default_rng(4).exponential(0.3, 24))
    cols = ["program_id", "turn", "scheduled", "first_token", "finish", "cached_tokens", "preemptions"]
    base = simulate(plain, "vllm", prof, arrivals).turns
    rows = {e: simulate(_hinted(plain), "vllm", prof, arrivals, scheduler=e).turns[cols] for e in ("simpy", "vllm")}
    assert rows["simpy"].equals(rows["vllm"])
    assert rows["simpy"]["cached_tokens"].sum() > base["cached_tokens"].sum()


def test_radix_cache_refuses_soft_retention():
    prof = linear_profile(blocks=120)
    trace = random_trace(np.random.default_rng(3), 4)
    with pytest.raises(InputError, match="needs --cache vllm"):
        simulate(trace, "client-ttl", prof, np.zeros(4), cache="radix")
    with pytest.raises(InputError, match="needs --cache vllm"):
        simulate(_hinted(trace), "vllm", prof, np.zeros(4), cache="radix")


def test_policy_parameters_are_checked():
    with pytest.raises(PolicyError, match="ttl_mode"):
        make_policy("client-ttl", ttl_mode="median")
    with pytest.raises(PolicyError, match="tool_ttls"):
        make_policy("client-ttl", tool_ttls="pytest:30")
    with pytest.raises(PolicyError, match="priority"):
        make_policy("client-ttl", priority=101)
    assert make_policy("client-ttl", tool_ttls="pytest=30, sed=0.5").tool_ttls == {"pytest": 30.0, "sed": 0.5}


class _View:
    block_size, num_gpu_blocks = 16, 1000

    def prefill_reload_time(self, tokens):
        return 0.01 * tokens  # 10 s for the 1,000-token context: worth pinning for


def _req(tool="pytest", turn=1):
    from policies.base import Request

    return Request("r", "p", turn, 0.0, 0.0, 1000, tool=tool)


def test_client_ttl_modes_and_its_pin_twin():
    fixed = make_policy("client-ttl", ttl_mode="fixed", ttl=3.0, priority=70)
    assert fixed.on_finish(_req(), 0.0, _View()) == Retention(Action.RETAIN, 3.0, 70)
    per_tool = make_policy("client-ttl", ttl_mode="tool", tool_ttls="pytest=30", ttl=1.0)
    assert per_tool.retention(_req(), 0.0, _View()).ttl == 30.0 and per_tool.retention(_req("ls"), 0.0, _View()).ttl == 1.0
    learned = make_policy("client-ttl", quantile=0.9, min_samples=5, ttl=1.5)
    assert learned.retention(_req(), 0.0, _View()).ttl == 1.5  # nothing learned yet
    gaps = np.random.default_rng(0).lognormal(math.log(4.0), 0.5, 400)
    for g in gaps:
        learned.record_tool_time("pytest", float(g))
    ttl = learned.retention(_req(), 0.0, _View()).ttl
    assert ttl == pytest.approx(4.0 * math.exp(1.2816 * 0.5), rel=0.08)  # the fit's 90th percentile
    assert ttl == pytest.approx(np.quantile(gaps, 0.9), rel=0.1)
    pin = make_policy("client-ttl-pin", quantile=0.9, min_samples=5)
    for g in gaps:
        pin.record_tool_time("pytest", float(g))
    assert pin.on_finish(_req(), 0.0, _View()) == Retention(Action.PIN, ttl) and "p" in pin.pins


def test_continuum_soft_keeps_continuums_ttl_with_the_chance_it_is_used_as_priority():
    soft, hard = make_policy("continuum-soft", K=10), make_policy("continuum", K=10)
    for t in np.random.default_rng(1).exponential(2.0, 50):
        soft.record_tool_time("pytest", float(t))
        hard.record_tool_time("pytest", float(t))
    s, h = soft.retention(_req(), 0.0, _View()), hard.retention(_req(), 0.0, _View())
    assert h.action == Action.PIN and s.action == Action.RETAIN and s.ttl == h.ttl > 0
    durations = soft.samples["pytest"].values
    assert s.priority == round(100 * np.mean(durations <= s.ttl))
    assert not soft.pins


@pytest.mark.parametrize("policy", ["client-ttl", "continuum-soft"])
def test_soft_policies_retain_and_are_evicted_under_pressure(policy):
    """On a pool too small to keep every paused program, the soft policy's retained
    blocks are evicted (no pins, no pin victims), and retention changes what hits."""
    trace = random_trace(np.random.default_rng(3), 24)
    arrivals = np.cumsum(np.random.default_rng(4).exponential(0.3, 24))
    pol = make_policy(policy)
    res = simulate(trace, pol, linear_profile(c2=1e-7, blocks=120), arrivals)
    assert pol.decisions["retained"] > 0 and not pol.pin_outcomes
    assert res.summary["retention"]["evicted"] > 0 and res.summary["decisions"]["retained"] > 0
    prof = linear_profile(c2=1e-7, blocks=200)
    soft, plain = simulate(trace, policy, prof, arrivals), simulate(trace, "vllm", prof, arrivals)
    assert soft.turns["cached_tokens"].sum() > plain.turns["cached_tokens"].sum()
    assert "retention" not in plain.summary


@pytest.mark.skipif(__import__("sim.kv.block_pool", fromlist=["BlockPool"]).BlockPool is PyBlockPool,
                    reason="the compiled pool is not built here (pure Python checkout)")
def test_retaining_pool_over_the_compiled_pool_is_the_same():
    """RetainingPool uses only the pool's public methods: over the compiled pool it frees,
    evicts and expires exactly as over the reference."""
    from sim.kv.block_pool import BlockPool

    rng = np.random.default_rng(11)
    pools = [RetainingPool(PyBlockPool(40, 16)), RetainingPool(BlockPool(40, 16))]
    held, t, kn = [], 0.0, 0
    for _ in range(2000):
        t += float(rng.exponential(0.5))
        for p in pools:
            p.now = t
        op = rng.random()
        if op < 0.45 and pools[0].num_free:
            k = int(rng.integers(1, min(6, pools[0].num_free) + 1))
            a, b = (p.allocate(k) for p in pools)
            assert a == b
            keys = [f"h{kn + i}" for i in range(k)]
            kn += k
            for p in pools:
                p.cache_many(a, keys)
            held.append(a)
        elif op < 0.85 and held:
            a = held.pop(int(rng.integers(len(held))))
            if rng.random() < 0.6:
                spec = (int(rng.integers(0, 101)), t + float(rng.exponential(2.0)),
                        None if rng.random() < 0.5 else float(rng.exponential(1.0)) + 0.01)
                for p in pools:
                    p.retain(a, *spec)
            for p in pools:
                p.free(a)
        assert pools[0].num_free == pools[1].num_free and pools[0].free_queue == pools[1].free_queue
    assert pools[0].retainer.evicted == pools[1].retainer.evicted > 0
    for p in pools:
        p.check()


# ---- the evictor's rules, one test each, on both engines' pools ------------------------------
# What they follow (vLLM PR #38514's block_pool.get_new_blocks and priority_eviction_queue):
# the LRU free queue first, then retained blocks by ascending priority, oldest freed first
# within one; expired retention is released at the next allocation to the queue's tail; a
# block whose retention ended before it was freed joins the queue as any other.

class _SimEngine:
    def __init__(self, n):
        self.p = RetainingPool(PyBlockPool(n, 16))
        self.p.cache_many(self.p.allocate(n), [f"k{b}" for b in range(n)])

    def free(self, b, now, spec=None):
        free_one(self.p, b, now, spec)

    def allocate(self, k, now):
        self.p.now = now
        return self.p.allocate(k)

    def hit(self, b, now):
        self.p.now = now
        assert self.p.lookup([f"k{b}"]) == [b]
        self.p.touch([b])

    def retained(self):
        return sorted(self.p.retainer.retained)


class _VllmEngine:
    """vLLM's own BlockPool as the twin installs it (block b here is vLLM's b + 1: its null block is 0)."""

    def __init__(self, n):
        pytest.importorskip("vllm")
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

        from sim.vllm_replica.retention import install
        self.t = 0.0
        self.p = install(BlockPool(n + 1, True, 16), lambda: self.t)
        self.hashes = {}
        for blk in self.p.get_new_blocks(n):
            h = make_block_hash_with_group_id(f"k{blk.block_id - 1}".encode(), 0)
            self.hashes[blk.block_id - 1] = h
            self.p._insert_block_hash(h, blk, 16)

    def free(self, b, now, spec=None):
        self.t = now
        if spec is not None:
            self.p.retainer.set([b + 1], *spec)
        self.p.free_blocks([self.p.blocks[b + 1]])

    def allocate(self, k, now):
        self.t = now
        return [x.block_id - 1 for x in self.p.get_new_blocks(k)]

    def hit(self, b, now):
        self.t = now
        assert self.p.cached_block_hash_to_block.get_one_block(self.hashes[b]) is self.p.blocks[b + 1]
        self.p.touch([self.p.blocks[b + 1]])

    def retained(self):
        return sorted(i - 1 for i in self.p.retainer.retained)


ENGINES = {"simulator": _SimEngine, "vllm": _VllmEngine}


@pytest.mark.parametrize("engine", ENGINES)
def test_rule_every_unretained_block_goes_before_any_retained_one_even_priority_0(engine):
    e = ENGINES[engine](4)
    e.free(0, 0.0, (0, math.inf, None))
    e.free(1, 1.0)
    e.free(2, 2.0, (0, math.inf, None))
    e.free(3, 3.0)
    assert e.allocate(4, 4.0) == [1, 3, 0, 2]


@pytest.mark.parametrize("engine", ENGINES)
def test_rule_retained_blocks_by_ascending_priority_then_oldest_freed(engine):
    e = ENGINES[engine](5)
    for t, (b, prio) in enumerate([(0, 70), (1, 20), (2, 70), (3, 20), (4, 45)]):
        e.free(b, float(t), (prio, math.inf, None))
    assert e.allocate(5, 9.0) == [1, 3, 4, 0, 2]


@pytest.mark.parametrize("engine", ENGINES)
def test_rule_expired_retention_joins_the_queue_tail_at_the_next_allocation(engine):
    e = ENGINES[engine](4)
    e.free(0, 0.0, (90, 2.0, None))  # ends at 2
    e.free(1, 0.0, (90, 1.0, None))  # ends at 1
    e.free(2, 3.0)                   # unretained, freed after both ended, before any allocation
    e.free(3, 3.5, (10, math.inf, None))
    assert e.retained() == [0, 1, 3]  # nothing looked at the clock yet
    assert e.allocate(4, 4.0) == [2, 1, 0, 3]  # after 2 (queued earlier), in the order they ended


@pytest.mark.parametrize("engine", ENGINES)
def test_rule_a_block_freed_after_its_retention_ended_is_plain(engine):
    e = ENGINES[engine](3)
    e.free(0, 0.0, (10, math.inf, None))
    e.free(1, 5.0, (90, 4.0, None))  # already over when freed: the queue, as freed
    e.free(2, 6.0)
    assert e.retained() == [0]
    assert e.allocate(3, 7.0) == [1, 2, 0]


@pytest.mark.parametrize("engine", ENGINES)
def test_rule_a_hit_takes_a_retained_block_and_its_spec_stays_for_the_next_free(engine):
    e = ENGINES[engine](3)
    e.free(0, 0.0, (50, 100.0, None))
    e.free(1, 0.0)
    e.hit(0, 1.0)
    assert e.retained() == []
    e.free(0, 2.0)  # no new spec: the block's own brings it back to the retained set
    e.free(2, 3.0)
    assert e.retained() == [0] and e.allocate(3, 4.0) == [1, 2, 0]


def test_runs_of_blocks_evict_and_expire_as_blocks_one_by_one():
    """The retained set keeps a call's blocks as one run per heap (Retainer.add_many): on
    random frees, hits, evictions and expiries (with decay) it gives what one heap entry
    per block gives (add, one block at a time)."""
    from sim.kv.retention import Retainer

    rng = np.random.default_rng(2)
    for _ in range(30):
        runs, single = Retainer(), Retainer()
        free, now, seen = list(range(200)), 0.0, []
        rng.shuffle(free)
        for _ in range(300):
            now += float(rng.exponential(0.3))
            op = rng.integers(4)
            if op == 0 and len(free) > 8:  # a call's blocks (two specs at times) are freed
                k = int(rng.integers(1, 9))
                blocks, free = free[:k], free[k:]
                cut = int(rng.integers(0, k + 1))
                for part in (blocks[:cut], blocks[cut:]):
                    spec = (int(rng.integers(0, 101)), now + float(rng.exponential(2.0)),
                            None if rng.random() < 0.5 else float(rng.uniform(0.2, 2.0)))
                    for r in (runs, single):
                        r.set(part, *spec)
                kept = runs.kept(blocks, now)
                assert kept == [b for b in blocks if single.kept([b], now)]  # one spec read per block
                runs.add_many(kept, now)
                for b in kept:
                    single.add(b, now)
                free += [b for b in blocks if b not in kept]
            elif op == 1 and len(single):  # a prefix hit takes one
                b = sorted(single.retained)[int(rng.integers(len(single)))]
                runs.take(b)
                single.take(b)
                free.append(b)
            elif op == 2 and len(single):  # an allocation evicts some
                n = int(rng.integers(1, len(single) + 1))
                got = runs.pick(n)
                assert got == single.pick(n)
                seen.append(len(got))
                free += got
            else:  # lazy expiry
                if runs.next_change() <= now or single.next_change() <= now:
                    got = runs.expire(now)
                    assert got == single.expire(now)
                    free += got
            assert runs.retained == single.retained and runs.spec == single.spec
        assert (runs.evicted, runs.expired) == (single.evicted, single.expired)
    assert sum(seen) > 100
