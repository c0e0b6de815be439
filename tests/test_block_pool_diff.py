"""The block pool (sim/kv/block_pool.py, runs of blocks, per-block work in C) against the
per-block pool it replaced, kept here verbatim as `ReferencePool`: the same random
operation sequences, every return value and the whole state (queue order, keys, ref
counts, cached map, evictions) compared after each operation. Then whole simulator
runs with a pool that does every operation on both and compares them."""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Hashable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import linear_profile, random_trace
from sim.kv.block_pool import BlockPool, PyBlockPool

EXAMPLES = int(os.environ.get("AGENTSIM_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class ReferencePool:
    """sim/kv/block_pool.py as of commit eff1eb4: one OrderedDict entry and one Python step per block;
    since the twin check, a key computed twice is held by every copy, as vLLM 0.32 keeps them
    (`dups`: the later copies in order; an evicted copy hands the key to the next)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_cnt = [0] * num_blocks
        self.key: list[Hashable | None] = [None] * num_blocks
        self.cached: dict[Hashable, int] = {}
        self.dups: dict[Hashable, list[int]] = {}
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def lookup(self, keys):
        hit = []
        for k in keys:
            b = self.cached.get(k)
            if b is None:
                break
            hit.append(b)
        return hit

    def touch(self, blocks):
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1

    def allocate(self, n):
        if n > len(self.free_queue):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free_queue.popitem(last=False)
            k = self.key[b]
            if k is not None:
                copies = [self.cached[k]] + self.dups.pop(k, [])
                copies.remove(b)
                if copies:
                    self.cached[k] = copies[0]
                    if copies[1:]:
                        self.dups[k] = copies[1:]
                else:
                    del self.cached[k]
                self.key[b] = None
                self.evictions += 1
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def cache(self, block, key):
        if self.key[block] is None:
            self.key[block] = key
            if key in self.cached:
                self.dups.setdefault(key, []).append(block)
            else:
                self.cached[key] = block

    def free(self, blocks):
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            assert self.ref_cnt[b] >= 0, f"block {b} freed twice"
            if self.ref_cnt[b] == 0:
                self.free_queue[b] = None
                if self.key[b] is None:
                    self.free_queue.move_to_end(b, last=False)


def same_state(new: BlockPool, ref: ReferencePool) -> None:
    n = ref.num_blocks
    assert new.free_queue == list(ref.free_queue)
    assert [new.ref_cnt[b] for b in range(n)] == ref.ref_cnt
    assert [new.key[b] for b in range(n)] == ref.key
    assert new.cached == ref.cached
    assert new.dups == ref.dups
    assert (new.num_free, new.num_used, new.evictions) == (ref.num_free, ref.num_used, ref.evictions)
    new.check()


def _evictable(ref: ReferencePool, blocks) -> int:
    return sum(1 for b in blocks if ref.ref_cnt[b] == 0)  # what the scheduler computed before


@st.composite
def pool_runs(draw):
    # compaction of stale queue entries: at every touch, often, never; owners whose hit is remembered
    return draw(st.integers(1, 48)), draw(st.sampled_from([-10**6, 0, 1024])), draw(st.sampled_from([1, 4096]))


@pytest.mark.parametrize("cls", [PyBlockPool, BlockPool], ids=["python", "installed"])
@SETTINGS
@given(setup=pool_runs(), data=st.data())
def test_random_operations_match_reference(cls, setup, data):
    """Calls that hold lists of distinct blocks (shared through prefix hits), programs whose
    keys are chained like sim/kv/content.py's (a few shared leading keys, so hits cross
    programs), partial last blocks left uncached, first-writer conflicts on cache."""
    num_blocks, slack, memo = setup
    new, ref = cls(num_blocks, 16), ReferencePool(num_blocks, 16)
    new._memo_max = memo
    if cls is PyBlockPool:
        new._compact_slack = slack
    held: list[list[int]] = []  # each call's blocks, in context order
    progs = [[("shared", i) for i in range(3)] + [(p, i) for i in range(3, 40)] for p in range(4)]
    for _ in range(data.draw(st.integers(1, 120))):
        op = data.draw(st.sampled_from(["alloc", "alloc", "hit", "cache", "cache_many", "free", "free", "free_hit"]))
        if op == "alloc":
            n = data.draw(st.integers(0, num_blocks + 2))
            got = new.allocate(n)
            assert got == ref.allocate(n)
            if got:
                held.append(got)
        elif op == "hit":
            p = data.draw(st.integers(0, 3))
            keys = progs[p][: data.draw(st.integers(0, 40))]
            hit = new.lookup(keys, data.draw(st.sampled_from([None, p])))  # owner p: its chain of keys
            assert hit == ref.lookup(keys)
            assert new.evictable(hit) == _evictable(ref, hit)
            extra = data.draw(st.integers(0, 3))  # the hit plus new blocks, as _try_allocate takes them
            if extra <= new.num_free - new.evictable(hit):
                new.touch(hit), ref.touch(hit)
                more = new.allocate(extra)
                assert more == ref.allocate(extra)
                if hit + more:
                    held.append(hit + more)
        elif op in ("cache", "cache_many") and held:
            blocks = held[data.draw(st.integers(0, len(held) - 1))]
            p, start = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 37))
            upto = data.draw(st.integers(0, len(blocks)))  # blocks past `upto` stay partial (uncached)
            keys = progs[p][start:start + upto]
            if data.draw(st.booleans()):  # keys repeated within the batch too
                keys = data.draw(st.lists(st.sampled_from([("x", 0), ("x", 1), ("shared", 0)]), min_size=upto, max_size=upto))
            pairs = list(zip(blocks, keys))
            if op == "cache":
                for b, k in pairs:
                    new.cache(b, k), ref.cache(b, k)
            else:
                new.cache_many([b for b, _ in pairs], [k for _, k in pairs])
                for b, k in pairs:
                    ref.cache(b, k)
        elif op in ("free", "free_hit") and held:
            blocks = held.pop(data.draw(st.integers(0, len(held) - 1)))
            if op == "free_hit":  # a pin freed in pieces, as a call's blocks are when shared
                cut = data.draw(st.integers(0, len(blocks)))
                new.free(blocks[:cut]), ref.free(blocks[:cut])
                blocks = blocks[cut:]
            new.free(blocks), ref.free(blocks)
        same_state(new, ref)
    for blocks in held:
        new.free(blocks), ref.free(blocks)
    same_state(new, ref)
    assert new.num_free == num_blocks


@pytest.mark.parametrize("cls", [PyBlockPool, BlockPool], ids=["python", "installed"])
def test_double_free_raises_and_changes_nothing(cls):
    pool = cls(4, 16)
    a = pool.allocate(2)
    pool.free(a)
    before = (pool.free_queue, list(pool.ref_cnt))
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free(a)
    assert (pool.free_queue, list(pool.ref_cnt)) == before


@pytest.mark.parametrize("cls", [PyBlockPool, BlockPool], ids=["python", "installed"])
def test_a_block_outside_the_pool_is_an_index_error(cls):
    """The compiled pool checks bounds as Python does (no memory read past its arrays)."""
    pool = cls(4, 16)
    for op in (lambda: pool.cache(4, "x"), lambda: pool.touch([9]), lambda: pool.free([4]), lambda: pool.count_ref([4], 0)):
        with pytest.raises(IndexError):
            op()
    pool.check()


def test_cache_many_keeps_every_copy():
    """Duplicate keys in one batch, a key another block holds, a block already keyed:
    cache_many falls back to cache() in order; the first writer serves hits and later
    copies hold the key too (vLLM 0.32's BlockHashToBlockMap), taking over in order when
    it is evicted."""
    new, ref = BlockPool(8, 16), ReferencePool(8, 16)
    a = new.allocate(6)
    ref.allocate(6)
    for pool in (new, ref):
        pool.cache(a[0], "x")
    batches = [(a[1:3], ["y", "y"]), (a[3:5], ["x", "z"]), (a[0:2], ["w", "v"]), (a[5:6], ["u"])]
    for blocks, keys in batches:
        new.cache_many(blocks, keys)
        for b, k in zip(blocks, keys):
            ref.cache(b, k)
        same_state(new, ref)
    assert new.key[a[2]] == "y" and new.cached["y"] == a[1] and new.dups == {"y": [a[2]], "x": [a[3]]}
    for pool in (new, ref):  # evict the first writers of x and y: their copies serve the keys
        pool.free([a[0]])
        pool.free([a[1]])
        pool.free(list(a[2:]))
        pool.allocate(4)  # the two never-used blocks, then a[0] and a[1]
    same_state(new, ref)
    assert new.lookup(["x"]) == [a[3]] and new.lookup(["y"]) == [a[2]]


def test_the_install_step_built_the_compiled_pool():
    """`pip install` builds sim/kv/_block_pool.pyx (setup.py); the simulator uses it."""
    from sim.kv import _block_pool
    import sim.simpy_replica.scheduler
    assert BlockPool is _block_pool.BlockPool is sim.simpy_replica.scheduler.BlockPool


# --- whole simulator runs: every pool operation checked against the reference ---

class CheckedPool:
    """A pool of class `cls`, with a ReferencePool alongside doing every operation; results
    and state compared. Everything else (num_free, key, ...) is read from the pool."""

    def __init__(self, cls, num_blocks: int, block_size: int) -> None:
        self.pool, self.ref, self.ops = cls(num_blocks, block_size), ReferencePool(num_blocks, block_size), 0
        if cls is PyBlockPool:
            self.pool._compact_slack = 0  # compact whenever stale entries outnumber live ones

    def __getattr__(self, name):
        return getattr(self.pool, name)

    def _both(self, name, *args):
        got = getattr(self.pool, name)(*args)
        assert got == getattr(self.ref, name)(*args), name
        same_state(self.pool, self.ref)
        self.ops += 1
        return got

    def lookup(self, keys, owner=None):
        got = self.pool.lookup(keys, owner)
        assert got == self.ref.lookup(keys)
        self.ops += 1
        return got

    def touch(self, blocks):
        return self._both("touch", blocks)

    def allocate(self, n):
        return self._both("allocate", n)

    def cache(self, block, key):
        return self._both("cache", block, key)

    def free(self, blocks):
        return self._both("free", blocks)

    def evictable(self, blocks):
        got = self.pool.evictable(blocks)
        assert got == _evictable(self.ref, blocks)
        return got

    def cache_many(self, blocks, keys, parent=None):
        self.pool.cache_many(blocks, keys, parent)
        for b, k in zip(blocks, keys):
            self.ref.cache(b, k)
        same_state(self.pool, self.ref)
        self.ops += 1


@pytest.mark.parametrize("cls", [PyBlockPool, BlockPool], ids=["python", "installed"])
@pytest.mark.parametrize("seed,policy,blocks,replicas,offload", [
    (0, "vllm", 120, 1, None),
    (1, "continuum", 120, 1, None),
    (2, "infercept", 150, 2, "cpu:1MiB@0.05"),
    (3, "static-ttl", 130, 1, None),
])
def test_simulator_runs_match_reference(monkeypatch, cls, seed, policy, blocks, replicas, offload):
    import sim.simpy_replica.scheduler
    from conftest import simulate

    pools = []

    def make(num_blocks, block_size):
        pools.append(CheckedPool(cls, num_blocks, block_size))
        return pools[-1]

    monkeypatch.setattr(sim.simpy_replica.scheduler, "BlockPool", make)
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, 12)
    arrivals = np.sort(rng.uniform(0, 3, trace["program_id"].nunique()))
    prof = linear_profile(blocks=blocks, budget=256, seqs=8, c2=1e-6, c4=1e-5)
    simulate(trace, policy, prof, arrivals, replicas=replicas, offload=offload)
    assert len(pools) == replicas and sum(p.ops for p in pools) > 200
    assert max(p.evictions for p in pools) > 0  # the pool was contended
