"""GPU KV cache as SGLang's radix tree (`--cache radix`), behind BlockPool's interface.

What SGLang does (python/sglang/srt/mem_cache/radix_cache.py, RadixCache: match_prefix,
insert, evict, inc_lock_ref/dec_lock_ref; the eviction trigger is evict_from_tree_cache in
python/sglang/srt/mem_cache/common.py; read at sgl-project/sglang 006b0e3d):
- Cached KV is a radix tree of token sequences; a node holds a run of tokens and their KV
  slots. `match_prefix` walks from the root as far as the key matches, sets every node it
  passes to the current time (`last_access_time`), and splits a node the match ends
  inside, so the hit ends at a node boundary (the split-off rest keeps the new time too).
- A request locks its last matched node with `inc_lock_ref`, which counts up every node
  on the path to the root; `dec_lock_ref` counts them down. A node with lock_ref > 0 is
  protected; the rest is `evictable_size`, and "free" for admission is the allocator's
  free slots plus the evictable ones.
- `insert` (at each prefill chunk, `cache_unfinished_req`, and when a request finishes,
  `cache_finished_req`) adds the new tail as a new node, refreshes the access time of the
  path, and frees the request's own copy of whatever was already in the tree: the tree
  keeps one copy of each prefix.
- `evict(n)` frees whole LEAF nodes that no one locks, oldest `last_access_time` first
  (the default "lru" strategy); a parent whose last child goes becomes a leaf and joins
  the candidates. An interior node is never evicted before its children. A leaf goes
  whole, so an eviction can free more than it was asked for.

Unlike vLLM's BlockPool (sim/kv/block_pool.py): there every freed block joins one LRU free
queue and any of them, a prefix's middle included, can be evicted, leaving its cached
descendants unreachable; here only leaves go, so a cached prefix stays whole while any
of its continuations is cached.

Granularity: SGLang's default page_size is 1 (a token-granular tree). This model is at
BLOCK granularity, as SGLang with page_size = block_size (SGLang then matches only whole
pages): the simulator's scheduler (sim/simpy_replica/scheduler.py, shared with vLLM's model) counts
hits, allocations and KV memory in blocks, and content is named by chained per-block keys
(sim/kv/content.py), one key per full block. What that changes against page_size 1: a
partial last block is never shared or cached (two contexts that diverge inside a block
share only the full blocks before it, and recompute the rest), and a context's last
block holds up to block_size - 1 unused slots. The pool is the same size as vLLM's
(num_gpu_blocks - 1 blocks), so a run compares the eviction rules, not capacities.

How the tree is kept: one tree node per cached block (its parent is the block holding
the previous key of the context that cached it); `_node_start` marks where SGLang's
compressed nodes begin, so an eviction frees a leaf block and its ancestors up to its
node's start, as SGLang frees a whole leaf node. Nodes begin at the root, where the tree
branches, and where a lookup's hit ended (SGLang's split). SGLang also begins a node at
each insert (each prefill chunk, and a finished request's output); here a holder that
extends its own leaf extends that node, so a node is a call's whole new suffix (its
prompt past the hit, and its output) and eviction frees it in one piece where SGLang
could stop after the output node.

Locks are per block, as the scheduler holds them: a call or a pin references every block
of its context (touch/allocate/free), which is SGLang's inc/dec_lock_ref on the path, so
pinning a context locks its node path. A block whose content the tree already holds
(two calls computed the same prefix at once) is not inserted: it becomes an alias of the
tree's block, and its references lock that block; its memory is released when its holder
frees it (SGLang frees it at insert time, which the scheduler's block lists cannot
express). Other differences, each small: access times are a counter of pool operations
(the order is what LRU needs); a freed block's path gets the time of the free (SGLang's
insert at finish), and a pin's release frees, so a released pin counts as recently used,
as vLLM's pool appends it to its free queue's tail; full blocks join the tree as they
fill, decode ones included (SGLang inserts decode tokens at the finish; only the same
program's next call could hit them before, and it cannot start earlier).
The `prefix` router (sim/cluster/router.py) probes replicas through the scheduler's lookup, so
with this cache a probe refreshes the probed prefix, as a match_prefix would.

Free blocks (no content, no holder) are a FIFO; allocation takes them before anything is
evicted, as SGLang's allocator does.

How much is evicted: SGLang's allocator, short of free slots, calls `evict(n)` with the
whole request n (in decode, a page per running request), not the shortfall. The
scheduler here is vLLM's, whose allocations are not SGLang's requests, so that amount
could not be reproduced anyway; the model evicts the shortfall (still whole leaf nodes).
That also keeps a decode stretch (several steps' blocks allocated at once,
sim/simpy_replica/engine.py) exactly equal to its steps one by one: evicting LRU leaf nodes until the
free blocks cover the total is what the steps do in turn.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Hashable

import numpy as np

from sim.kv.block_pool import block_array, drop_refs
from sim.kv.content import held_prefix

_ROOT = -1  # parent of a block at the start of a context
_NONE = -2  # "no block": a parent missing from the tree


class RadixCache:
    _heap_slack = 1024  # stale heap entries tolerated beyond the evictable blocks

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_cnt = np.zeros(num_blocks, np.int64)  # holders of each block (calls, pins), as BlockPool's
        self.key: list[Hashable | None] = [None] * num_blocks  # a tree block's key, else None
        self.cached: dict[Hashable, int] = {}  # key -> tree block
        self.evictions = 0  # tree blocks whose content was dropped
        self._in_tree = np.zeros(num_blocks, bool)
        self._lock = np.zeros(num_blocks, np.int64)  # tree block: its holders plus its aliases' holders
        self._alias = np.full(num_blocks, _NONE, np.intp)  # held duplicate block -> the tree block it copies
        # per-block state read one block at a time is kept in lists (a numpy scalar costs more)
        self._parent: list[int] = [_ROOT] * num_blocks
        self._children: list[list[int]] = [[] for _ in range(num_blocks)]
        self._nchild = np.zeros(num_blocks, np.int64)  # len(_children[b]), as an array
        self._node_start: list[bool] = [False] * num_blocks  # first block of an SGLang node
        self._split_after: list[bool] = [False] * num_blocks  # a lookup's hit ended here: a new child starts a node
        self._atime = np.zeros(num_blocks, np.int64)  # last access (a counter of operations)
        self._tick = 0
        self._heap: list[tuple[int, int, int]] = []  # (access time, push order, block): evictable-leaf candidates
        self._pushes = 0
        self._free: deque[int] = deque(range(num_blocks))  # no content, no holder
        self._evictable = 0  # tree blocks no one locks

    # --- counts ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks allocatable now: free ones plus the unlocked tree blocks (evictable_size)."""
        return len(self._free) + self._evictable

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def count_ref(self, blocks: list[int], refs: int) -> int:
        """How many of `blocks` have exactly `refs` holders."""
        return int(np.count_nonzero(self.ref_cnt[block_array(blocks)] == refs)) if blocks else 0

    def evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` count in num_free now (a hit on them stops them counting)."""
        if not blocks:
            return 0
        a = block_array(blocks)
        t = self._in_tree[a]
        return int(np.count_nonzero(np.where(t, self._lock[a], self.ref_cnt[a]) == 0))

    # --- the eviction heap ------------------------------------------------------------------
    def _is_candidate(self, b: int) -> bool:
        """An evictable leaf: in the tree, unlocked, no children."""
        return bool(self._in_tree[b]) and self._lock[b] == 0 and self._nchild[b] == 0

    def _push(self, b: int) -> None:
        self._pushes += 1
        heapq.heappush(self._heap, (int(self._atime[b]), self._pushes, b))
        if len(self._heap) > 2 * self._evictable + self._heap_slack:
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        """Drop stale entries (in place: evict() holds the list)."""
        live = {}
        for t, s, b in self._heap:
            if self._is_candidate(b) and self._atime[b] == t and b not in live:
                live[b] = (t, s, b)
        self._heap[:] = live.values()
        heapq.heapify(self._heap)

    def _push_candidates(self, unlocked: np.ndarray) -> None:
        """Push the leaves among unlocked tree blocks."""
        for b in unlocked[self._nchild[unlocked] == 0].tolist():
            self._push(b)

    # --- lookup -----------------------------------------------------------------------------
    def lookup(self, keys: list[Hashable], owner: Hashable | None = None) -> list[int]:
        """match_prefix: the tree blocks of the longest cached prefix of `keys` (chained,
        so a cached key's whole prefix is cached: a binary search finds the end). Refreshes
        the access time of the path, and splits the node the hit ends inside. `owner` is
        accepted for BlockPool's interface and unused."""
        cached = self.cached
        lo = held_prefix(keys, cached)
        if lo == 0:
            return []
        hit = list(map(cached.__getitem__, keys[:lo]))
        self._tick += 1
        self._atime[block_array(hit)] = self._tick
        last = hit[-1]
        kids = self._children[last]
        if len(kids) == 1 and not self._node_start[kids[0]]:
            # the hit ends inside a node: split it; the rest keeps the new access time
            c = kids[0]
            self._node_start[c] = True
            while True:
                self._atime[c] = self._tick
                nxt = self._children[c]
                if len(nxt) != 1 or self._node_start[nxt[0]]:
                    break
                c = nxt[0]
            if self._is_candidate(c):
                self._push(c)
        elif not kids:
            self._split_after[last] = True
            if self._is_candidate(last):
                self._push(last)
        return hit

    # --- references -------------------------------------------------------------------------
    def _targets(self, a: np.ndarray) -> np.ndarray:
        """The tree blocks whose locks the references to blocks `a` count in."""
        al = self._alias[a]
        return np.concatenate([a[self._in_tree[a]], al[al >= 0]])

    def touch(self, blocks: list[int]) -> None:
        """A holder takes a reference on blocks (a prefix hit): inc_lock_ref on the path."""
        if not blocks:
            return
        a = block_array(blocks)
        idle = a[(self.ref_cnt[a] == 0) & ~self._in_tree[a]]
        if len(idle):  # a free block taken without allocate() (tests do it)
            gone = set(idle.tolist())
            self._free = deque(b for b in self._free if b not in gone)
        self.ref_cnt[a] += 1
        t = self._targets(a)
        self._evictable -= int(np.count_nonzero(self._lock[t] == 0))
        np.add.at(self._lock, t, 1)

    def free(self, blocks: list[int]) -> None:
        """Drop one reference each (dec_lock_ref). The tree blocks' path gets the current
        access time (SGLang inserts a finished request, refreshing its path); blocks no
        one holds that the tree does not hold join the free blocks."""
        if not blocks:
            return
        a, left = drop_refs(self.ref_cnt, blocks)
        t = self._targets(a)
        np.add.at(self._lock, t, -1)
        self._tick += 1
        self._atime[t] = self._tick
        unlocked = np.unique(t[self._lock[t] == 0])
        self._evictable += len(unlocked)
        gone = a[(left == 0) & ~self._in_tree[a]]
        if len(gone):
            self._alias[gone] = _NONE
            self._free.extend(gone.tolist())
        # every unlocked leaf among them is a candidate now (a new time, or newly unlocked)
        self._push_candidates(unlocked)

    # --- allocation and eviction --------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """n free blocks for a holder (ref 1 each), evicting first if the free ones are
        short; None if even evicting everything unlocked would not give n."""
        if n > self.num_free:
            return None
        if len(self._free) < n:
            self.evict(n - len(self._free))  # the shortfall (see the module docstring)
        free = self._free
        out = [free.popleft() for _ in range(n)]
        if out:
            self.ref_cnt[block_array(out)] = 1
        return out

    def evict(self, n: int) -> int:
        """Free at least n blocks of unlocked leaf nodes, least recently used first (a
        leaf node goes whole); fewer only if nothing unlocked is left. Returns how many."""
        got = 0
        heap = self._heap
        while got < n and heap:
            t, _, b = heapq.heappop(heap)
            if not self._is_candidate(b) or self._atime[b] != t:
                continue  # stale: locked, gained a child, re-timed or evicted since
            chain = self._leaf_node(b)
            p = self._parent[chain[-1]]
            self._remove(chain)
            got += len(chain)
            if p != _ROOT and self._is_candidate(p):
                self._push(p)
        return got

    def _leaf_node(self, b: int) -> list[int]:
        """Leaf block b, then its node's blocks above it that go with it: up to the node's
        start, stopping below a parent that is locked or keeps another child."""
        # Below a node's start each block is its parent's only child (a branch starts a node
        # at every child), so the walk to the start reads lists; the locks are read at once.
        parent, start = self._parent, self._node_start
        chain = [b]
        while not start[b]:
            b = parent[b]
            if b == _ROOT:
                break
            chain.append(b)
        if len(chain) > 1:
            locked = np.flatnonzero(self._lock[block_array(chain[1:])])
            if len(locked):
                del chain[1 + int(locked[0]):]
        return chain

    def _remove(self, chain: list[int]) -> None:
        """Drop a leaf node's blocks (from _leaf_node: each block's parent is the next, whose
        only child it is) from the tree; they join the free blocks in that order."""
        top = chain[-1]
        p = self._parent[top]
        if p != _ROOT:
            self._children[p].remove(top)
            self._nchild[p] -= 1
        cached, key, parent, children = self.cached, self.key, self._parent, self._children
        start, split = self._node_start, self._split_after
        for b in chain:
            del cached[key[b]]
            key[b] = None
            children[b] = []
            parent[b] = _ROOT
            start[b] = split[b] = False
        a = block_array(chain)
        self._nchild[a] = 0
        self._in_tree[a] = False
        self._evictable -= len(chain)
        self.evictions += len(chain)
        self._free.extend(chain)

    # --- insertion ----------------------------------------------------------------------------
    def cache(self, block: int, key: Hashable, parent: Hashable | None = None) -> None:
        """Insert one full block: `key` follows the block keyed `parent` (None: a context's first)."""
        self.cache_many([block], [key], parent)

    def cache_many(self, blocks: list[int], keys: list[Hashable], parent: Hashable | None = None) -> None:
        """insert: blocks[i] holds keys[i], a context's next full blocks after the one keyed
        `parent` (None: from the context's start). A key the tree holds already makes the
        block an alias of the tree's copy; a parent missing from the tree (cannot happen
        while the holder holds its prefix) leaves the blocks out."""
        if not blocks:
            return
        self._tick += 1
        cached = self.cached
        p = _ROOT if parent is None else cached.get(parent, _NONE)
        i, n = 0, len(blocks)
        while i < n and p != _NONE and keys[i] in cached:  # the part the tree holds already
            p = self._insert(blocks[i], keys[i], p)
            i += 1
        if i + 1 < n and p != _NONE and self._extends_freshly(blocks[i:], keys[i:]):
            # keys[i:] are new to the tree: blocks[i] joins under p, the rest as one chain under it
            p = self._insert(blocks[i], keys[i], p)
            if p != _NONE:
                self._append_chain(p, blocks[i + 1:], keys[i + 1:])
            return
        for b, k in zip(blocks[i:], keys[i:]):
            if p == _NONE:
                return
            p = self._insert(b, k, p)

    def _extends_freshly(self, blocks: list[int], keys: list[Hashable]) -> bool:
        """True when _insert would put each of `blocks` in the tree as a new block below
        the one before: distinct held blocks, none in the tree or an alias, distinct keys
        none of which is cached."""
        a = block_array(blocks)
        if (self._in_tree[a] | (self._alias[a] >= 0) | (self.ref_cnt[a] == 0)).any():
            return False
        cached = self.cached
        return len(set(blocks)) == len(blocks) and len(set(keys)) == len(keys) and cached.keys().isdisjoint(keys)

    def _append_chain(self, p: int, blocks: list[int], keys: list[Hashable]) -> None:
        """_insert of each block in turn below the one before, p (new, childless) first:
        none starts a node, all are held (locked), so none is an eviction candidate."""
        cached, key, parent, children, start = self.cached, self.key, self._parent, self._children, self._node_start
        for b, k in zip(blocks, keys):
            key[b] = k
            cached[k] = b
            parent[b] = p
            children[p] = [b]
            start[b] = False
            p = b
        a = block_array(blocks)
        self._nchild[self._parent[blocks[0]]] = 1
        self._nchild[a[:-1]] = 1
        self._in_tree[a] = True
        self._atime[a] = self._tick
        self._lock[a] = self.ref_cnt[a]

    def _insert(self, b: int, k: Hashable, p: int) -> int:
        x = self.cached.get(k)
        if x is not None:
            if x != b and not self._in_tree[b] and self._alias[b] < 0 and self.ref_cnt[b] > 0:
                self._alias[b] = x  # SGLang would free b and hand its holder x
                if self._lock[x] == 0:
                    self._evictable -= 1
                self._lock[x] += self.ref_cnt[b]
            return x
        if self._in_tree[b] or self._alias[b] >= 0:
            return _NONE  # b holds other content already: not this context's block
        if self.ref_cnt[b] == 0:  # a free block cached directly (tests): it leaves the free list
            self._free.remove(b)
        self.key[b] = k
        self.cached[k] = b
        self._in_tree[b] = True
        self._parent[b] = p
        self._atime[b] = self._tick
        self._lock[b] = self.ref_cnt[b]
        if p == _ROOT:
            self._node_start[b] = True
        else:
            kids = self._children[p]
            if kids:  # a branch: every child of p starts a node (SGLang splits there)
                for c in kids:
                    self._node_start[c] = True
                self._node_start[b] = True
            else:
                self._node_start[b] = bool(self._split_after[p])
            kids.append(b)
            self._nchild[p] += 1
        if self._lock[b] == 0:
            self._evictable += 1
            self._push(b)
        return b

    # --- invariants ---------------------------------------------------------------------------
    def check(self) -> None:
        """Invariants (tests and the end of every run): no leaks, a consistent tree and locks."""
        free = list(self._free)
        fs = set(free)
        assert len(fs) == len(free), "a block is free twice"
        alias_refs = np.zeros(self.num_blocks, np.int64)
        for b in range(self.num_blocks):
            r = int(self.ref_cnt[b])
            assert r >= 0, f"block {b}: ref_cnt {r}"
            if self._in_tree[b]:
                assert b not in fs, f"tree block {b} is also free"
                assert self.cached.get(self.key[b]) == b, f"block {b}: key maps elsewhere"
                assert self._alias[b] < 0, f"tree block {b} is an alias"
                p = int(self._parent[b])
                assert p == _ROOT or (self._in_tree[p] and b in self._children[p]), f"block {b}: parent {p} not in the tree"
                assert p != _ROOT or self._node_start[b], f"block {b}: a root child must start a node"
                assert self._node_start[b] or len(self._children[p]) == 1, f"block {b}: inside a node, not an only child"
            else:
                assert self.key[b] is None and not self._children[b], f"block {b} off the tree keeps tree state"
                assert (r == 0) == (b in fs), f"block {b}: ref_cnt {r} vs free list"
                a = int(self._alias[b])
                if a >= 0:
                    assert r > 0 and self._in_tree[a], f"alias {b} -> {a} not held or not in the tree"
                    alias_refs[a] += r
            assert self._nchild[b] == len(self._children[b]), f"block {b}: child count"
            for c in self._children[b]:
                assert self._parent[c] == b and self._in_tree[c], f"block {b}: child {c} inconsistent"
        assert len(self.cached) == int(self._in_tree.sum()), "cached map vs tree blocks"
        tree = np.flatnonzero(self._in_tree)
        assert (self._lock[tree] == self.ref_cnt[tree] + alias_refs[tree]).all(), "lock counts"
        assert self._evictable == int(np.count_nonzero(self._lock[tree] == 0)), "evictable count"
        for b in tree.tolist():
            p = int(self._parent[b])
            assert self._lock[b] == 0 or p == _ROOT or self._lock[p] > 0, f"block {b} locked under an unlocked parent {p}"
        live = {(t, b) for t, _, b in self._heap}
        for b in tree.tolist():
            if self._is_candidate(b):
                assert (int(self._atime[b]), b) in live, f"evictable leaf {b} has no heap entry"
