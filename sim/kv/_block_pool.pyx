# cython: language_level=3, wraparound=False, initializedcheck=False
"""Compiled BlockPool: sim/kv/block_pool.py's PyBlockPool (the reference, and what runs where
this is not built) with the free queue as vLLM keeps it, a doubly linked list of blocks.

Why: the pool's work is per block (a call's whole context is freed, touched or looked up
at every call), and in Python even the run-based, numpy-vectorised pool was half the
event loop (issue 20). In C a block costs a few nanoseconds, so the queue needs no runs,
stamps or compaction: touch unlinks, free links at the tail (or the head for a block with
no content), allocate pops the head. Keys stay Python objects (`key`, `cached`), as the
CPU tier and the tests read them. tests/test_block_pool_diff.py drives this, the Python
pool and the per-block reference with the same random operations.
"""
import numpy as np


# block -> its id as an int object, made once and shared by every pool: every list of
# blocks (a call's, a pin's, the cache's values) holds these instead of a new int per
# allocation, so reading or counting blocks touches one compact array of objects (all
# replicas' pools alike), not ones scattered in memory. It grows to the largest pool made
# in the process (a GPU's tens of thousands of blocks: about 1 MB)
cdef list _IDS = []


cdef class BlockPool:
    cdef readonly Py_ssize_t num_blocks, block_size
    cdef readonly object ref_cnt  # numpy int64 per block: holders (calls, pins)
    cdef readonly list key  # block -> its cached key, or None
    cdef list _ids  # _IDS: block -> its id as an int object
    cdef readonly dict cached  # key -> block id, for full blocks only (the copy that serves hits)
    cdef readonly dict dups  # key -> later copies holding it, in order (sim/kv/block_pool.py)
    cdef public long long evictions  # cached blocks whose content was dropped by reuse
    cdef public Py_ssize_t _memo_max  # owners whose last prefix hit is remembered
    cdef long long[::1] _ref
    cdef long long[::1] _prev, _next  # the free queue; index num_blocks is its sentinel
    cdef long long[::1] _evicted_at  # block -> epoch of its last eviction
    cdef Py_ssize_t _num_free
    cdef long long _epoch  # allocations that evicted something so far
    cdef dict _memo  # owner -> (its last hit, the epoch then)

    def __init__(self, Py_ssize_t num_blocks, Py_ssize_t block_size):
        cdef Py_ssize_t b, n = num_blocks
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_cnt = np.zeros(n, np.int64)
        self._ref = self.ref_cnt
        self.key = [None] * n
        if len(_IDS) < n:
            _IDS.extend(range(len(_IDS), n))
        self._ids = _IDS
        self.cached = {}
        self.dups = {}
        self.evictions = 0
        self._memo_max = 4096
        self._evicted_at = np.zeros(n, np.int64)
        self._memo = {}
        self._epoch = 0
        # every block free, in id order
        self._prev = np.empty(n + 1, np.int64)
        self._next = np.empty(n + 1, np.int64)
        for b in range(n + 1):
            self._next[b] = b + 1 if b < n else 0
            self._prev[b] = b - 1 if b > 0 else n
        if n == 0:
            self._next[0] = self._prev[0] = 0
        self._num_free = n

    @property
    def num_free(self):
        """Blocks allocatable now: truly free plus evictable cached ones."""
        return self._num_free

    @property
    def num_used(self):
        return self.num_blocks - self._num_free

    @property
    def free_queue(self):
        """The free queue, head first (tests and check(); O(queue))."""
        cdef Py_ssize_t s = self.num_blocks, b = self._next[s]
        cdef list out = []
        while b != s:
            out.append(b)
            b = self._next[b]
        return out

    # --- the linked list ---------------------------------------------------------------
    cdef inline void _unlink(self, Py_ssize_t b):
        cdef Py_ssize_t p = self._prev[b], q = self._next[b]
        self._next[p] = q
        self._prev[q] = p

    cdef inline void _link_after(self, Py_ssize_t p, Py_ssize_t b):
        cdef Py_ssize_t q = self._next[p]
        self._prev[b] = p
        self._next[b] = q
        self._next[p] = b
        self._prev[q] = b

    # --- the pool ----------------------------------------------------------------------
    def lookup(self, keys, owner=None):
        """Longest run of leading keys that are cached (the request's prefix hit).

        `owner` names an append-only chain of keys (a program's ContentKeys): its last hit
        is remembered, and only the blocks evicted since and the keys past them are
        looked at again (as PyBlockPool.lookup)."""
        cdef list hit
        cdef tuple old
        cdef Py_ssize_t m, nk = len(keys)
        cdef long long epoch
        if owner is None:
            return self._scan(keys, [])
        memo = self._memo.pop(owner, None)
        if memo is None:
            hit = []
        else:
            old, epoch = memo
            m = 0
            while m < len(old) and m < nk and self._evicted_at[<Py_ssize_t>old[m]] <= epoch:
                m += 1
            hit = list(old[:m])
        hit = self._scan(keys, hit)
        # a tuple, not a list: a tuple of ints leaves the garbage collector's lists at its
        # first collection, a list would be traversed by every one for as long as it is kept
        self._memo[owner] = (tuple(hit), self._epoch)
        if len(self._memo) > self._memo_max:
            del self._memo[next(iter(self._memo))]  # the least recently looked-up owner
        return hit

    cdef list _scan(self, keys, list hit):
        cdef Py_ssize_t i, n = len(keys)
        cdef dict cached = self.cached
        for i in range(len(hit), n):
            b = cached.get(keys[i])
            if b is None:
                break
            hit.append(b)
        return hit

    def count_ref(self, blocks, long long refs):
        """How many of `blocks` have exactly `refs` references."""
        cdef Py_ssize_t c = 0, b
        for b in blocks:
            c += self._ref[b] == refs
        return c

    def evictable(self, blocks):
        """How many of `blocks` sit in the free queue (a hit on them stops them being allocatable)."""
        return self.count_ref(blocks, 0)

    def touch(self, blocks):
        """Take a reference on cached blocks (a prefix hit), pulling free ones out of the queue."""
        cdef Py_ssize_t b
        for b in blocks:
            if self._ref[b] == 0:
                self._unlink(b)
                self._num_free -= 1
            self._ref[b] += 1

    def allocate(self, Py_ssize_t n):
        """Pop n blocks from the free-queue head, evicting their cached content; None if short."""
        if n > self._num_free:
            return None
        cdef Py_ssize_t i, b, s = self.num_blocks
        cdef list out = [None] * n, key = self.key, ids = self._ids
        cdef bint evicted = False
        for i in range(n):
            b = self._next[s]
            self._unlink(b)
            k = key[b]
            if k is not None:
                if not evicted:
                    evicted = True
                    self._epoch += 1
                self._uncache(b, k)
                key[b] = None
                self._evicted_at[b] = self._epoch
                self.evictions += 1
            self._ref[b] = 1
            out[i] = ids[b]
        self._num_free -= n
        return out

    cdef inline void _uncache(self, Py_ssize_t b, k):
        """Block b, holding key k, is evicted: the key passes to its next copy, if any."""
        cdef dict cached = self.cached, dups = self.dups
        cdef list more = dups.get(k) if dups else None
        if more is None:  # the one block holding k (the usual case: one dict operation)
            del cached[k]
        elif cached[k] == b:
            cached[k] = more.pop(0)
            if not more:
                del dups[k]
        else:
            more = dups[k]
            more.remove(b)
            if not more:
                del dups[k]

    def cache(self, Py_ssize_t block, key):
        """Mark a newly full block as holding `key` (a later copy of a cached key too, as
        vLLM keeps every copy: it serves hits once the earlier copies are evicted)."""
        self.cache_many((block,), (key,))

    def cache_many(self, blocks, keys, parent=None):
        """cache(b, k) for each pair in order. `parent` (the key before keys[0]) is the
        radix cache's tree edge; vLLM's pool needs none."""
        cdef Py_ssize_t i
        cdef list key = self.key
        cdef dict cached = self.cached, dups = self.dups
        for b, k in zip(blocks, keys):
            i = b
            if key[i] is None:
                key[i] = k
                if cached.setdefault(k, b) is not b:  # k was cached already: b is a later copy
                    dups.setdefault(k, []).append(b)

    def free(self, blocks):
        """Drop one reference each; blocks reaching zero join the tail, last block first.
        A block holding no cached content (a partial last block) goes to the head
        instead, to be reused before any cached block is evicted (vLLM 0.32 does so)."""
        cdef Py_ssize_t b, i, n, s = self.num_blocks
        cdef list bl = blocks if type(blocks) is list else list(blocks)
        cdef list key = self.key
        n = len(bl)
        for i in range(n):  # nothing changes if any block is not held
            b = bl[i]
            if self._ref[b] <= 0:
                raise AssertionError(f"block {b} freed twice")
        for i in range(n - 1, -1, -1):
            b = bl[i]
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._num_free += 1
                if key[b] is None:
                    self._link_after(s, b)  # head
                else:
                    self._link_after(self._prev[s], b)  # tail

    def check(self):
        """Invariants (used by tests and at the end of every run): no leaks, consistent maps."""
        cdef Py_ssize_t s = self.num_blocks, b, p = s, count = 0
        seen = np.zeros(s, bool)
        b = self._next[s]
        while b != s:
            assert 0 <= b < s and not seen[b] and self._prev[b] == p, f"free queue broken at block {b}"
            seen[b] = True
            p, b, count = b, self._next[b], count + 1
        assert self._prev[s] == p and count == self._num_free, "free queue holds a block twice or miscounts"
        ref = self.ref_cnt
        bad = np.flatnonzero((ref < 0) | ((ref == 0) != seen))
        assert not len(bad), f"block {bad[0]}: ref_cnt {ref[bad[0]]} vs free queue"
        keyed = sum(k is not None for k in self.key)
        assert keyed == len(self.cached) + sum(map(len, self.dups.values())), "a cached key maps to a block that holds another"
        for k, b in self.cached.items():  # with the count above: each keyed block's key maps back to it
            assert self.key[b] == k, f"cached key {k} -> block {b} holds {self.key[b]}"
        for k, bs in self.dups.items():
            assert k in self.cached and all(self.key[b] == k for b in bs), f"copies of key {k}: {bs}"
