"""The seam between a replica's scheduler and its GPU KV cache: what the scheduler, an
offload tier and the run checks ask of the cache. Two caches implement it, chosen by
`engine.cache`: vLLM's prefix-caching block pool (sim/kv/block_pool.py, a free queue and a
hash table of full blocks) and SGLang's radix tree (sim/kv/radix_cache.py). A new cache
model implements this and is wired in Scheduler.__init__."""
from __future__ import annotations

from typing import Hashable, Protocol, runtime_checkable


@runtime_checkable
class KVCache(Protocol):
    num_blocks: int
    block_size: int
    key: list  # block id -> the content key it caches, or None

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (free, or cached and held by nobody)."""

    @property
    def num_used(self) -> int: ...

    def lookup(self, keys: list[Hashable], owner: Hashable | None = None) -> list[int]:
        """The cached blocks of the longest prefix of `keys` (a prefix hit); not yet held."""

    def count_ref(self, blocks: list[int], refs: int) -> int:
        """How many of `blocks` exactly `refs` holders reference."""

    def evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` (a hit) an allocation would otherwise be free to evict."""

    def touch(self, blocks: list[int]) -> None:
        """Hold `blocks` (a hit the caller now uses): one reference more each."""

    def allocate(self, n: int) -> list[int] | None:
        """n blocks, evicting cached ones as needed; None (and nothing taken) if fewer are free."""

    def cache_many(self, blocks: list[int], keys: list[Hashable], parent: Hashable | None = None) -> None:
        """`blocks` now hold the full blocks of `keys` (after `parent`): later lookups hit them."""

    def free(self, blocks: list[int]) -> None:
        """One reference fewer on each of `blocks`; a block no one holds keeps its content until evicted."""

    def check(self) -> None:
        """Raise if the cache's books do not balance (a run's end check)."""
