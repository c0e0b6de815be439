"""The KV cache seam (sim/kv/protocol.py): the block pool (compiled and pure), and the radix
tree implement the protocol, and behave alike on what the scheduler relies on."""
import pytest

from sim.kv.block_pool import BlockPool, PyBlockPool
from sim.kv.protocol import KVCache
from sim.kv.radix_cache import RadixCache

CACHES = [BlockPool, PyBlockPool, RadixCache]


@pytest.mark.parametrize("cls", CACHES, ids=lambda c: c.__name__)
def test_each_cache_implements_the_protocol_and_its_contract(cls):
    c = cls(10, 16)
    assert isinstance(c, KVCache) and (c.num_blocks, c.block_size) == (10, 16)
    a = c.allocate(3)
    assert len(set(a)) == 3 and (c.num_free, c.num_used) == (7, 3)
    assert c.allocate(8) is None and c.num_free == 7  # refused whole, nothing taken
    c.cache_many(a, ["k0", "k1", "k2"])
    assert [c.key[b] for b in a] == ["k0", "k1", "k2"]
    c.free(a)  # no holder: still cached, allocatable by eviction
    assert c.num_free == 10 and c.count_ref(a, 0) == 3
    hit = c.lookup(["k0", "k1", "kX"])
    assert hit == a[:2] and c.evictable(hit) == 2
    c.touch(hit)  # the caller holds its hit
    assert c.count_ref(hit, 1) == 2 and c.num_free == 8 and c.evictable(hit) == 0
    rest = c.allocate(8)  # evicts the unheld cached block, never the held ones
    assert rest is not None and not set(rest) & set(hit) and c.num_free == 0
    assert c.lookup(["k0", "k1"]) == hit
    c.free(rest)
    c.free(hit)
    c.check()
    assert c.num_free == 10


def test_a_class_missing_a_member_is_not_a_cache():
    class Partial:
        num_blocks, block_size, key = 1, 16, [None]

        def allocate(self, n):
            return None

    assert not isinstance(Partial(), KVCache)
