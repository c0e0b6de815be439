"""GPU KV block pool with prefix caching, shaped like vLLM v1's BlockPool.

Why this shape:
- A block is either in use (ref_cnt > 0) or in the *free queue*. A freed block keeps
  its cached content (its key stays in `cached`) until allocation pops it from the
  queue head and reuses it — so "free" and "evictable cached" are the same list, and
  the free count already includes every evictable cached block, as in vLLM.
- The free queue is ordered: allocation pops from the head, freeing appends to the
  tail. A request's blocks are freed in reverse order, so its *last* block is evicted
  first and its prefix survives longest (what makes prefix hits likely). Blocks with
  no content go to the head instead, to be reused before any cached block is evicted.
- A cache hit on a block sitting in the free queue takes it out of the queue (touch).
- Keys are chained from content as vLLM's block hashes are (sim/kv/content.py): equal
  keys, equal tokens up to the block's end.
- A key computed twice (two calls prefilling the same content in different steps) is
  held by both blocks, as vLLM 0.32's BlockHashToBlockMap keeps every copy: a hit takes
  the earliest copy still cached, an evicted copy hands the key to the next, and a freed
  copy holds content (it joins the tail). `cached` maps a key to the copy that serves
  hits, `dups` to the later copies in order.

Why the queue is a list of runs: a call's blocks move together (freed together, taken
by one prefix hit, popped by one allocation), and a Python loop over each of its
hundreds of blocks was half the simulator's time. The queue is a deque of runs, each an
array of blocks freed together, in queue order; every queue entry carries a stamp, and
an entry is live while its block's stamp is still that one. A touch only restamps the
block (its old entry goes stale, skipped when allocation reaches it); a free appends
one run; an allocation slices the head run. Ref counts and stamps are numpy arrays, so
the per-block work left is vectorised; only evictions and new keys touch Python dicts
block by block (once per block filled, once per block evicted). The order is exactly
the old per-block OrderedDict's: tests/test_block_pool_diff.py drives both with random
operations and compares them.

`BlockPool` is the compiled pool (sim/kv/_block_pool.pyx, built by the install step: the same
object with vLLM's linked free queue in C, several times faster); this file's
`PyBlockPool` is its reference in tests.

Every list of blocks passed in holds distinct blocks (a context holds a block once).
"""
from __future__ import annotations

from collections import deque
from typing import Hashable

import numpy as np

_STALE = -1  # the stamp of a block with no live queue entry (in use)


def block_array(blocks: list[int]) -> np.ndarray:
    return np.fromiter(blocks, np.intp, len(blocks))


def drop_refs(ref_cnt: np.ndarray, blocks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """One reference fewer on each of `blocks` (distinct, non-empty): (the blocks as an
    array, the references each has left). Both cache models free through it."""
    a = block_array(blocks)
    left = ref_cnt[a] - 1
    assert left.min() >= 0, f"block {blocks[int(np.argmin(left))]} freed twice"
    ref_cnt[a] = left
    return a, left


class PyBlockPool:
    """The pool in Python and numpy: the reference for sim/kv/_block_pool.pyx, and what runs
    where the extension is not built."""

    _compact_slack = 1024  # stale queue entries tolerated beyond the live ones (tests lower it)
    _memo_max = 4096  # owners whose last prefix hit is remembered

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_cnt = np.zeros(num_blocks, np.int64)
        self.key: list[Hashable | None] = [None] * num_blocks
        self._keyed = np.zeros(num_blocks, bool)  # key[b] is not None, as an array
        self.cached: dict[Hashable, int] = {}  # key -> block id, for full blocks only
        self.dups: dict[Hashable, list[int]] = {}  # key -> later copies holding it, in order
        self.evictions = 0  # cached blocks whose content was dropped by reuse
        # the free queue: runs [blocks, stamp of blocks[0], first unconsumed index]
        self._runs: deque[list] = deque()
        self._stamp = np.full(num_blocks, _STALE, np.int64)  # block -> stamp of its live entry
        self._next_stamp = 0
        self._num_free = 0
        self._entries = 0  # unconsumed entries in all runs, live or stale
        self._epoch = 0  # allocations that evicted something so far
        self._evicted_at = np.zeros(num_blocks, np.int64)  # block -> epoch of its last eviction
        self._memo: dict[Hashable, tuple[list[int], np.ndarray, int]] = {}  # owner -> (hit, as array, epoch)
        self._last_hit: tuple[list[int], np.ndarray] = ([], np.empty(0, np.intp))  # lookup's last answer, as array
        self._push(np.arange(num_blocks, dtype=np.intp), left=False)

    @property
    def num_free(self) -> int:
        """Blocks allocatable now: truly free plus evictable cached ones."""
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.num_blocks - self._num_free

    def _live(self, blocks: np.ndarray, s: int, i: int, j: int) -> np.ndarray:
        """Which of entries i..j-1 of a run (first stamp s) are live."""
        return self._stamp[blocks[i:j]] == np.arange(s + i, s + j)

    @property
    def free_queue(self) -> list[int]:
        """The free queue, head first (tests and check(); O(queue))."""
        parts = [b[i:][self._live(b, s, i, len(b))] for b, s, i in self._runs]
        return np.concatenate(parts).tolist() if parts else []

    def _push(self, blocks: np.ndarray, left: bool) -> None:
        """Add a run of blocks (queue order, an array the pool owns) at the head or the tail."""
        s = self._next_stamp
        self._next_stamp += len(blocks)
        self._stamp[blocks] = np.arange(s, s + len(blocks))
        (self._runs.appendleft if left else self._runs.append)([blocks, s, 0])
        self._num_free += len(blocks)
        self._entries += len(blocks)

    def _compact(self) -> None:
        """Drop stale entries once they outnumber live ones (keeps memory and the head scan O(live))."""
        live = np.array(self.free_queue, np.intp)
        self._runs.clear()
        self._num_free = self._entries = 0
        if len(live):
            self._push(live, left=False)

    def lookup(self, keys: list[Hashable], owner: Hashable | None = None) -> list[int]:
        """Longest run of leading keys that are cached (the request's prefix hit).

        `owner` names an append-only chain of keys (a program's ContentKeys): `keys[i]` is
        the same in every lookup by that owner. Its last hit is remembered; a key leaves
        `cached` only when its block is evicted, so the remembered blocks up to the first
        one evicted since still hold their keys, and only the keys past them are looked up:
        a program's next call pays for its new blocks, not for its whole context."""
        if owner is None:
            return self._scan(keys, [])
        memo = self._memo.pop(owner, None)
        hit, arr = [], None
        if memo is not None:
            old, arr, epoch = memo
            if epoch == self._epoch:  # nothing evicted since: every remembered block still holds its key
                m = min(len(old), len(keys))
            else:
                gone = self._evicted_at[arr] > epoch
                m = min(int(gone.argmax()) if gone.any() else len(old), len(keys))
            hit, arr = old[:m], arr[:m]
        n_known = len(hit)
        hit = self._scan(keys, hit)
        if len(hit) > n_known:
            tail = block_array(hit[n_known:])
            arr = tail if arr is None or not len(arr) else np.concatenate([arr, tail])
        elif arr is None:
            arr = np.empty(0, np.intp)
        self._memo[owner] = (hit[:], arr, self._epoch)
        self._last_hit = (hit, arr)  # count_ref of this hit (the scheduler asks next) reuses its array
        if len(self._memo) > self._memo_max:
            del self._memo[next(iter(self._memo))]  # the least recently looked-up owner
        return hit

    def _scan(self, keys: list[Hashable], hit: list[int]) -> list[int]:
        """Extend `hit` (blocks of keys[:len(hit)]) by the cached keys that follow it."""
        get = self.cached.get
        i, step = len(hit), 16  # look ahead in growing strides: a miss usually comes late, if at all
        while i < len(keys):
            got = list(map(get, keys[i:i + step]))
            if None in got:
                hit += got[:got.index(None)]
                break
            hit += got
            i += step
            step *= 2
        return hit

    def count_ref(self, blocks: list[int], refs: int) -> int:
        """How many of `blocks` have exactly `refs` references."""
        if not blocks:
            return 0
        hit, arr = self._last_hit
        a = arr if blocks is hit and len(arr) == len(blocks) else block_array(blocks)
        return int(np.count_nonzero(self.ref_cnt[a] == refs))

    def evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` sit in the free queue (a hit on them stops them being allocatable)."""
        return self.count_ref(blocks, 0)

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks (a prefix hit), pulling free ones out of the queue."""
        if not blocks:
            return
        a = block_array(blocks)
        refs = self.ref_cnt[a]
        out = a[refs == 0]
        if len(out):
            self._stamp[out] = _STALE  # their entries go stale
            self._num_free -= len(out)
            if self._entries > 2 * self._num_free + self._compact_slack:
                self._compact()
        self.ref_cnt[a] = refs + 1

    def allocate(self, n: int) -> list[int] | None:
        """Pop n blocks from the free-queue head, evicting their cached content; None if short."""
        if n > self._num_free:
            return None
        if n <= 4:
            return self._allocate_few(n) if n else []
        parts, got, runs = [], 0, self._runs
        window = n
        while got < n:
            run = runs[0]
            blocks, s, i = run
            j = min(len(blocks), i + window)
            live = self._live(blocks, s, i, j)
            if live.all() and j - i <= n - got:
                parts.append(blocks[i:j])
                got += j - i
            else:  # stale entries here: take live ones up to n, scanning ahead in growing windows
                idx = np.flatnonzero(live)[: n - got]
                if len(idx) == n - got:
                    j = i + int(idx[-1]) + 1
                parts.append(blocks[i:j][live[: j - i]])
                got += len(parts[-1])
                window *= 2
            self._entries -= j - i
            if j == len(blocks):
                runs.popleft()
            else:
                run[2] = j
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        evicted = out[self._keyed[out]]
        if len(evicted):
            key = self.key
            for b in evicted.tolist():
                self._uncache(b, key[b])
                key[b] = None
            self._keyed[evicted] = False
            self._epoch += 1
            self._evicted_at[evicted] = self._epoch
            self.evictions += len(evicted)
        self.ref_cnt[out] = 1
        self._num_free -= n
        return out.tolist()

    def _allocate_few(self, n: int) -> list[int]:
        """allocate() for a handful of blocks (decode steps): block by block beats numpy's per-call cost."""
        out, st, runs = [], self._stamp, self._runs
        while len(out) < n:
            run = runs[0]
            blocks, s, i = run
            b = int(blocks[i])
            if st[b] == s + i:
                out.append(b)
            self._entries -= 1
            if i + 1 == len(blocks):
                runs.popleft()
            else:
                run[2] = i + 1
        key, keyed = self.key, self._keyed
        for b in out:
            if keyed[b]:
                self._uncache(b, key[b])
                key[b] = None
                keyed[b] = False
                self._epoch += 1
                self._evicted_at[b] = self._epoch
                self.evictions += 1
            self.ref_cnt[b] = 1
        self._num_free -= n
        return out

    def _uncache(self, b: int, k: Hashable) -> None:
        """Block b, holding key k, is evicted: the key passes to its next copy, if any."""
        cached, dups = self.cached, self.dups
        if cached[k] == b:
            more = dups.get(k)
            if more:
                cached[k] = more.pop(0)
                if not more:
                    del dups[k]
            else:
                del cached[k]
        else:
            more = dups[k]
            more.remove(b)
            if not more:
                del dups[k]

    def cache(self, block: int, key: Hashable) -> None:
        """Mark a newly full block as holding `key` (a later copy of a cached key too, as
        vLLM keeps every copy: it serves hits once the earlier copies are evicted)."""
        if self.key[block] is None:
            self.key[block] = key
            self._keyed[block] = True
            if key in self.cached:
                self.dups.setdefault(key, []).append(block)
            else:
                self.cached[key] = block

    def cache_many(self, blocks: list[int], keys: list[Hashable], parent: Hashable | None = None) -> None:
        """cache(b, k) for each pair in order; vectorised when no block or key is taken yet.
        `parent` (the key before keys[0]) is the radix cache's tree edge; vLLM's pool needs none."""
        new = dict(zip(keys, blocks))
        if len(blocks) < 8 or len(new) < len(blocks) or not self.cached.keys().isdisjoint(new):
            for b, k in zip(blocks, keys):
                self.cache(b, k)
            return
        a = block_array(blocks)
        if self._keyed[a].any():
            for b, k in zip(blocks, keys):
                self.cache(b, k)
            return
        key = self.key
        for b, k in zip(blocks, keys):
            key[b] = k
        self.cached.update(new)
        self._keyed[a] = True

    def free(self, blocks: list[int]) -> None:
        """Drop one reference each; blocks reaching zero join the tail, last block first.
        A block holding no cached content (a partial last block) goes to the head
        instead, to be reused before any cached block is evicted (vLLM 0.32 does so)."""
        if not blocks:
            return
        a, left = drop_refs(self.ref_cnt, blocks)
        zero = a[left == 0]
        if not len(zero):
            return
        keyed = self._keyed[zero]
        if keyed.all():
            self._push(zero[::-1], left=False)
            return
        if keyed.any():
            self._push(zero[keyed][::-1], left=False)
        # processed last first, each to the head: they end up in their original order
        self._push(zero[~keyed], left=True)

    def check(self) -> None:
        """Invariants (used by tests and at the end of every run): no leaks, consistent maps.
        Vectorised: it runs once per run over the whole pool (26K blocks on an H100)."""
        queue = self.free_queue
        in_queue = np.zeros(self.num_blocks, bool)
        in_queue[queue] = True
        assert int(in_queue.sum()) == len(queue) == self._num_free, "free queue holds a block twice or miscounts"
        assert self._entries == sum(len(b) - i for b, _, i in self._runs), "queue entry count"
        bad = np.flatnonzero((self.ref_cnt < 0) | ((self.ref_cnt == 0) != in_queue))
        assert not len(bad), f"block {bad[0]}: ref_cnt {self.ref_cnt[bad[0]]} vs free queue"
        keyed = np.fromiter((k is not None for k in self.key), bool, self.num_blocks)
        bad = np.flatnonzero(keyed != self._keyed)
        assert not len(bad), f"block {bad[0]}: keyed flag"
        assert int(keyed.sum()) == len(self.cached) + sum(map(len, self.dups.values())), \
            "a cached key maps to a block that holds another"
        for k, b in self.cached.items():  # with the count above: each keyed block's key maps back to it
            assert self.key[b] == k, f"cached key {k} -> block {b} holds {self.key[b]}"
        for k, bs in self.dups.items():
            assert k in self.cached and all(self.key[b] == k for b in bs), f"copies of key {k}: {bs}"


try:
    from sim.kv._block_pool import BlockPool
except ImportError:  # a source checkout that was never installed: the reference runs
    BlockPool = PyBlockPool
