"""Soft KV retention: a priority (0-100) and an optional duration on cached blocks, as
vLLM's retention API (RFC #37003, PR #38514) and TensorRT-LLM's
TokenRangeRetentionConfig describe it, plus SGLang #27970's priority that decays after
`retention_seconds`.

Semantics (both engines, through this one `Retainer`):
- A block gets a spec (priority, the time its duration ends, an optional half-life)
  when a finished call asks for soft retention; the spec stays with the block's content
  until it is evicted. The newest spec wins.
- A freed block whose spec is still live waits in the *retained set* instead of the free
  queue. It still counts as free (an allocation may evict it, unlike a hard pin), and a
  prefix hit takes it out of the set as it takes a block out of the queue.
- The evictor takes the free queue first (blocks with no retention, LRU order), then
  retained blocks by ascending priority, in the order they were freed within a priority.
- Lazy expiry: on each allocation, retained blocks whose duration has passed revert to
  default priority and join the free queue's tail (TensorRT-LLM re-queues a block whose
  priority changes the same way), in the order their durations ended.
- Decay (half_life set): when the duration ends the priority halves, and again every
  half_life seconds, in whole numbers; at 0 the block reverts to default. A geometric
  decay is the usual ageing of a cache priority (an exponential moving weight), and a
  whole-number law changes the order only at known instants, which the engines can stop
  a decode stretch at (`next_change`), so both engines evict identically.

Priorities are ranked above "no retention": a priority-0 block with a live duration is
evicted after every unretained block and before any priority-1 block.
"""
from __future__ import annotations

import heapq
import math
from typing import Hashable, Iterable

from agentsim.errors import InputError

MAX_PRIORITY = 100


def _steps(until: float, half_life: float, now: float) -> int:
    """How many of the decay's change points until + j * half_life (j = 0, 1, ...) are
    <= now (now >= until), computed as those points are, so no rounding can disagree."""
    j = int((now - until) // half_life)
    while until + (j + 1) * half_life <= now:
        j += 1
    while j > 0 and until + j * half_life > now:
        j -= 1
    return j + 1


def level_at(priority: int, until: float, half_life: float | None, now: float) -> int:
    """A spec's priority at `now`; -1 once it reverted to default (expired)."""
    if now < until:
        return priority
    if half_life is None:
        return -1
    level = priority >> _steps(until, half_life, now)
    return level if level > 0 else -1


def next_change(priority: int, until: float, half_life: float | None, now: float) -> float:
    """The first instant after `now` at which level_at changes (inf: never)."""
    if now < until:
        return until
    if half_life is None or level_at(priority, until, half_life, now) < 0:
        return math.inf
    return until + _steps(until, half_life, now) * half_life


def reverted_at(priority: int, until: float, half_life: float | None) -> float:
    """When a spec reverts to default: its duration's end, or with decay the change point
    at which the halved priority reaches 0."""
    return until if half_life is None else until + max(0, priority.bit_length() - 1) * half_life


class Retainer:
    """The retained set and specs of one pool, over hashable block handles (ints in the
    simulator's pool, vLLM's block ids in the vLLM engine).

    Blocks freed together with one spec (a call's blocks) form a *run*: consecutive stamps,
    hence adjacent in the evictor's (level, stamp) order, and one level and change time
    while retained (a retained block's spec cannot change: nothing holds it). The heaps
    hold one entry per run, (key, first stamp, base stamp, blocks) with block i of the
    run at stamp base + i, instead of one per block; a block taken out of the set since, or
    of another level, is skipped when its run's entry comes up."""

    __slots__ = ("spec", "retained", "_heap", "_order", "_stamp", "evicted", "expired")

    def __init__(self) -> None:
        self.spec: dict[Hashable, tuple[int, float, float | None]] = {}  # block -> (priority, until, half_life)
        self.retained: dict[Hashable, list] = {}  # free retained block -> [level, stamp, change time]
        self._heap: list[tuple] = []  # runs by (change time, first stamp); stale blocks skipped
        # the evictor's order: runs by (level, first stamp); a block that left the set or
        # changed level since is stale and skipped (no scan of the whole set per eviction)
        self._order: list[tuple] = []
        self._stamp = 0
        self.evicted = 0  # retained blocks evicted under pressure (before their retention ended)
        self.expired = 0  # retained blocks that reverted to default while free

    def __len__(self) -> int:
        return len(self.retained)

    def __contains__(self, b: Hashable) -> bool:
        return b in self.retained

    def set(self, blocks: Iterable[Hashable], priority: int, until: float, half_life: float | None) -> None:
        s = (int(priority), float(until), half_life)
        spec = self.spec
        for b in blocks:
            spec[b] = s

    def kept(self, blocks: list, now: float) -> list:
        """Those of `blocks` (each with a spec), about to be freed at `now`, that go to the retained
        set (their spec is live), in order; the ended specs dropped. Both engines ask per list: a
        call's blocks share one spec, whose level is computed once."""
        spec, out, last, live = self.spec, [], None, False
        for b in blocks:
            s = spec[b]
            if s is not last:
                last, live = s, level_at(*s, now) >= 0
            if live:
                out.append(b)
            else:
                del spec[b]
        return out

    def add(self, b: Hashable, now: float) -> None:
        """Block b (kept at `now`) is free now: into the retained set, after those before it."""
        self.add_many((b,), now)

    def add_many(self, blocks, now: float) -> None:
        """add(b, now) for each of `blocks` in order, a run per stretch of one spec."""
        spec, retained = self.spec, self.retained
        n, i = len(blocks), 0
        while i < n:
            s = spec[blocks[i]]
            j = i + 1
            while j < n and spec[blocks[j]] is s:
                j += 1
            run = tuple(blocks[i:j])
            level, change = level_at(*s, now), next_change(*s, now)
            base = self._stamp + 1
            self._stamp += j - i
            for k, b in enumerate(run, base):
                retained[b] = [level, k, change]
            if change < math.inf:
                heapq.heappush(self._heap, (change, base, base, run))
            heapq.heappush(self._order, (level, base, base, run))
            i = j
        if len(self._order) > 2 * len(retained) + 1024:
            self._compact()

    def _compact(self) -> None:
        self._order = [(r[0], r[1], r[1], (b,)) for b, r in self.retained.items()]
        heapq.heapify(self._order)

    def take(self, b: Hashable) -> None:
        """A prefix hit holds block b again: out of the retained set (its spec stays)."""
        del self.retained[b]

    def forget(self, blocks: Iterable[Hashable]) -> None:
        """These blocks were evicted (reused): their specs go."""
        spec = self.spec
        for b in blocks:
            spec.pop(b, None)

    def expire(self, now: float) -> list[Hashable]:
        """Lazy expiry at an allocation: update the levels whose change time has come;
        the retained blocks that reverted to default, in the order their retention ended
        (then the order they were freed), leave the set (for the free queue's tail)."""
        heap, retained, spec, out = self._heap, self.retained, self.spec, []
        while heap and heap[0][0] <= now:
            _, first, base, run = heapq.heappop(heap)
            live = [(k, b) for k, b in enumerate(run[first - base:], first)
                    if (r := retained.get(b)) is not None and r[1] == k]
            if not live:
                continue  # every block taken or re-added since
            s = spec[live[0][1]]  # the run's spec: one level for all its blocks
            level = level_at(*s, now)
            if level < 0:
                at = reverted_at(*s)
                for k, b in live:
                    out.append((at, k, b))
                    del retained[b]
                    del spec[b]
                continue
            change = next_change(*s, now)
            moved = level != retained[live[0][1]][0]
            for k, b in live:
                r = retained[b]
                r[0], r[2] = level, change
            k0 = live[0][0]
            if moved:
                heapq.heappush(self._order, (level, k0, base, run))
            heapq.heappush(heap, (change, k0, base, run))
        out.sort()
        self.expired += len(out)
        return [b for _, _, b in out]

    def pick(self, n: int) -> list[Hashable]:
        """The n retained blocks to evict, in eviction order (lowest level, then first
        freed), taken out of the set with their specs."""
        retained, order, spec, chosen = self.retained, self._order, self.spec, []
        while len(chosen) < n:
            level, first, base, run = heapq.heappop(order)
            for i in range(first - base, len(run)):
                b = run[i]
                r = retained.get(b)
                if r is None or r[1] != base + i or r[0] != level:
                    continue  # stale: taken, re-added or decayed since
                if len(chosen) == n:  # the rest of the run stays in the order
                    heapq.heappush(order, (level, base + i, base, run))
                    break
                del retained[b]
                del spec[b]
                chosen.append(b)
        self.evicted += len(chosen)
        return chosen

    def next_change(self) -> float:
        """The next instant the evictor's order may change by time alone: the first heap
        entry with a block still retained since it was pushed (stale ones at the top are
        dropped here, as expire would skip them; one left deeper only makes it early)."""
        heap, retained = self._heap, self.retained
        while heap:
            _, first, base, run = heap[0]
            for k, b in enumerate(run[first - base:], first):
                r = retained.get(b)
                if r is not None and r[1] == k:
                    return heap[0][0]
            heapq.heappop(heap)
        return math.inf


class RetainingPool:
    """The simulator's block pool (sim/kv/block_pool.py, either form) with a retained set,
    through the pool's public methods only. A retained block keeps one reference (the
    set's), so it is in no free queue; `num_free` and `evictable` count it as free, as
    vLLM counts a block with no holder. `now` is set by the scheduler: the schedule time
    during a step's (or a decode stretch's) allocations, the free time when it frees."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.retainer = Retainer()
        self.now = 0.0
        self.num_blocks, self.block_size = pool.num_blocks, pool.block_size

    def __getattr__(self, name):  # key, cached, dups, evictions, free_queue, ...: the pool's
        return getattr(self.pool, name)

    @property
    def num_free(self) -> int:
        return self.pool.num_free + len(self.retainer.retained)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def retain(self, blocks: list[int], priority: int, until: float, half_life: float | None) -> None:
        self.retainer.set(blocks, priority, until, half_life)

    def lookup(self, keys, owner=None):
        return self.pool.lookup(keys, owner)

    def cache_many(self, blocks, keys, parent=None) -> None:
        self.pool.cache_many(blocks, keys, parent)

    def count_ref(self, blocks: list[int], refs: int) -> int:
        n = self.pool.count_ref(blocks, refs)
        if self.retainer.retained and refs in (0, 1):
            k = sum(1 for b in blocks if b in self.retainer.retained)
            n += k if refs == 0 else -k
        return n

    def evictable(self, blocks: list[int]) -> int:
        return self.count_ref(blocks, 0)

    def touch(self, blocks: list[int]) -> None:
        retained = self.retainer.retained
        if retained:
            held = {b for b in blocks if b in retained}
            if held:
                for b in held:
                    self.retainer.take(b)  # the set's reference becomes the hit's
                blocks = [b for b in blocks if b not in held]
        self.pool.touch(blocks)

    def free(self, blocks: list[int]) -> None:
        """As the pool's free; a block no one else holds whose spec is live (and that holds
        content) joins the retained set instead, last block first as the queue takes them."""
        r, pool = self.retainer, self.pool
        if r.spec:
            key, now, spec, ref = pool.key, self.now, r.spec, pool.ref_cnt
            keep = r.kept([b for b in reversed(blocks) if b in spec and key[b] is not None and ref[b] == 1], now)
            if keep:
                r.add_many(keep, now)
                kept = set(keep)
                blocks = [b for b in blocks if b not in kept]
        pool.free(blocks)

    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        r, pool = self.retainer, self.pool
        if n and r.next_change() <= self.now:
            expired = r.expire(self.now)
            if expired:
                pool.free(expired[::-1])  # their references drop: to the tail, in this order
        if n <= pool.num_free:
            out = pool.allocate(n)
        else:
            out = pool.allocate(pool.num_free)
            chosen = r.pick(n - len(out))
            pool.free(chosen[::-1])  # the queue is empty: they become it, in eviction order
            out = out + pool.allocate(len(chosen))
        if r.spec and out:
            r.forget(out)
        return out

    def next_change(self) -> float:
        return self.retainer.next_change()

    def check(self) -> None:
        self.pool.check()
        for b in self.retainer.retained:
            assert self.pool.count_ref([b], 1) == 1 and self.pool.key[b] is not None, f"retained block {b}"


def retain(sched, blocks: list[int], retention, now: float) -> None:
    """A finished call's soft retention (policies.base Action.RETAIN) on the simulator's
    scheduler `sched`: its pool gets a retained set the first time (a run that never
    retains keeps the plain pool), then the blocks get the spec."""
    if sched.cfg.cache == "radix":
        refuse_radix()
    if type(sched.pool) is not RetainingPool:
        sched.pool = RetainingPool(sched.pool)
    sched.pool.retain(blocks, retention.priority, now + retention.ttl, retention.half_life)


def refuse_radix() -> None:
    raise InputError("soft retention (a soft policy, or a trace's kv_priority/kv_ttl_s hints) needs --cache vllm: "
                     "the radix cache (SGLang's) has no retention priorities here")
