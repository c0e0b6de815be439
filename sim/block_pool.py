"""GPU KV block pool with prefix caching, shaped like vLLM v1's BlockPool.

Why this shape:
- A block is either in use (ref_cnt > 0) or in the *free queue*. A freed block keeps
  its cached content (its key stays in `cached`) until allocation pops it from the
  queue head and reuses it — so "free" and "evictable cached" are the same list, and
  the free count already includes every evictable cached block, as in vLLM.
- The free queue is ordered: allocation pops from the head, freeing appends to the
  tail. A request's blocks are freed in reverse order, so its *last* block is evicted
  first and its prefix survives longest (what makes prefix hits likely).
- A cache hit on a block sitting in the free queue takes it out of the queue
  (touch); an OrderedDict gives O(1) head pop, tail append and removal from the middle.
- Keys replace vLLM's content hashes: a program's context is append-only, so block i
  of program p always holds the same tokens and is identified by (p, i); blocks of a
  prefix shared by all programs (system prompt) are keyed ("<shared>", i).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_cnt = [0] * num_blocks
        self.key: list[Hashable | None] = [None] * num_blocks
        self.cached: dict[Hashable, int] = {}  # key -> block id, for full blocks only
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.evictions = 0  # cached blocks whose content was dropped by reuse

    @property
    def num_free(self) -> int:
        """Blocks allocatable now: truly free plus evictable cached ones."""
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def lookup(self, keys: list[Hashable]) -> list[int]:
        """Longest run of leading keys that are cached (the request's prefix hit)."""
        hit = []
        for k in keys:
            b = self.cached.get(k)
            if b is None:
                break
            hit.append(b)
        return hit

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks (a prefix hit), pulling free ones out of the queue."""
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """Pop n blocks from the free-queue head, evicting their cached content; None if short."""
        if n > len(self.free_queue):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free_queue.popitem(last=False)
            k = self.key[b]
            if k is not None:
                # Only drop the map entry if it still points here (keys are unique per block).
                if self.cached.get(k) == b:
                    del self.cached[k]
                self.key[b] = None
                self.evictions += 1
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def cache(self, block: int, key: Hashable) -> None:
        """Mark a newly full block as holding `key` (first writer wins, as in vLLM)."""
        if self.key[block] is None and key not in self.cached:
            self.key[block] = key
            self.cached[key] = block

    def free(self, blocks: list[int]) -> None:
        """Drop one reference each; blocks reaching zero join the tail, last block first.
        A block holding no cached content (a partial last block) goes to the head
        instead, to be reused before any cached block is evicted (vLLM 0.32 does so)."""
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            assert self.ref_cnt[b] >= 0, f"block {b} freed twice"
            if self.ref_cnt[b] == 0:
                self.free_queue[b] = None
                if self.key[b] is None:
                    self.free_queue.move_to_end(b, last=False)

    def check(self) -> None:
        """Invariants (used by tests and at the end of every run): no leaks, consistent maps."""
        in_queue = set(self.free_queue)
        for b in range(self.num_blocks):
            assert (self.ref_cnt[b] == 0) == (b in in_queue), f"block {b}: ref_cnt {self.ref_cnt[b]} vs free queue"
        for k, b in self.cached.items():
            assert self.key[b] == k, f"cached key {k} -> block {b} holds {self.key[b]}"
