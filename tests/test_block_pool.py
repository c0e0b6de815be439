import pytest

from sim.kv.block_pool import BlockPool


def test_allocate_pops_head_and_free_appends_reversed():
    pool = BlockPool(6, 16)
    a = pool.allocate(3)
    assert a == [0, 1, 2] and pool.num_free == 3
    for i, b in enumerate(a):
        pool.cache(b, ("p", i))
    pool.free(a)
    # freed in reverse: the request's last block sits nearest the head, evicted first
    assert list(pool.free_queue) == [3, 4, 5, 2, 1, 0]
    pool.check()


def test_uncached_blocks_are_reused_before_cached_ones():
    pool = BlockPool(6, 16)
    a = pool.allocate(3)
    pool.cache(a[0], ("p", 0))
    pool.cache(a[1], ("p", 1))  # a[2] is a partial block: no content to keep
    pool.free(a)
    assert list(pool.free_queue) == [2, 3, 4, 5, 1, 0]
    assert pool.allocate(1) == [2] and pool.evictions == 0
    pool.check()


def test_prefix_hit_touch_and_eviction_order():
    pool = BlockPool(4, 16)
    a = pool.allocate(3)
    for i, b in enumerate(a):
        pool.cache(b, ("p", i))
    pool.free(a)
    assert pool.lookup([("p", 0), ("p", 1), ("p", 2), ("p", 3)]) == a  # all three still cached after free
    # allocating 2 pops block 3 (never used) then block 2 = the program's LAST block
    b = pool.allocate(2)
    assert b == [3, 2] and pool.evictions == 1
    assert pool.lookup([("p", 0), ("p", 1), ("p", 2)]) == [0, 1]  # prefix survives
    hit = pool.lookup([("p", 0), ("p", 1)])
    pool.touch(hit)
    assert pool.num_free == 0 and pool.ref_cnt[0] == 1
    pool.check()


def test_ref_counts_shared_blocks():
    pool = BlockPool(4, 16)
    a = pool.allocate(1)
    pool.cache(a[0], ("<shared>", 0))
    pool.touch(a)  # a second request hits the shared block
    assert pool.ref_cnt[a[0]] == 2
    pool.free(a)
    assert pool.num_free == 3  # still held by one request
    pool.free(a)
    assert pool.num_free == 4 and pool.lookup([("<shared>", 0)]) == a
    pool.check()


def test_allocate_fails_whole_and_double_free_is_caught():
    pool = BlockPool(2, 16)
    assert pool.allocate(3) is None and pool.num_free == 2
    a = pool.allocate(1)
    pool.free(a)
    with pytest.raises(AssertionError):
        pool.free(a)
