"""SGLang's radix-tree prefix cache (`--cache radix`, sim/kv/radix_cache.py): hand-worked
matching and leaf-LRU eviction, a case where it and vLLM's block pool evict different
blocks, random operations under its invariants, whole `sim run`s on the bundled swebench
trace, and bad input."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.run.simulate as simulate
from sim.kv.block_pool import BlockPool
from sim.cli import main
from sim.kv.radix_cache import RadixCache


def hold(pool, keys, parent=None):
    """A holder computing a context of full blocks `keys` after its prefix hit: look up,
    touch the hit, allocate the rest and cache it (the scheduler's order). Its blocks."""
    hit = pool.lookup(keys)
    pool.touch(hit)
    new = pool.allocate(len(keys) - len(hit))
    assert new is not None
    pool.cache_many(new, keys[len(hit):], keys[len(hit) - 1] if hit else parent)
    return hit + new


def _leading(pool, keys):
    """How many leading keys the pool still holds (no lookup: that would refresh them)."""
    n = 0
    while n < len(keys) and keys[n] in pool.cached:
        n += 1
    return n


A = ["p0", "p1", "a2", "a3"]  # two contexts sharing a prefix of two blocks
B = ["p0", "p1", "b2", "b3"]


# --- matching ---------------------------------------------------------------------------------

def test_longest_prefix_match():
    pool = RadixCache(16, 4)
    a = hold(pool, A)
    assert pool.lookup(A) == a
    assert pool.lookup(["p0", "p1", "zz"]) == a[:2]  # diverges after two blocks
    assert pool.lookup(["zz"]) == []
    b = hold(pool, B)
    assert b[:2] == a[:2] and set(b[2:]).isdisjoint(a)  # the shared prefix is one copy
    assert pool.ref_cnt[a[0]] == 2 and pool.ref_cnt[a[2]] == 1
    assert pool.num_used == 6
    pool.check()
    pool.free(a)
    pool.free(b)
    assert pool.num_used == 0 and pool.num_free == 16  # cached but unlocked: all allocatable
    assert pool.lookup(B) == b
    pool.check()


def test_hit_inside_a_node_splits_it():
    pool = RadixCache(8, 4)
    a = hold(pool, A)  # one node p0..a3
    assert [pool._node_start[x] for x in a] == [True, False, False, False]
    pool.free(a)
    pool.lookup(["p0", "p1", "xx"])  # the hit ends after p1: SGLang's match_prefix splits there
    assert [pool._node_start[x] for x in a] == [True, False, True, False]
    pool.check()


# --- leaf-LRU eviction --------------------------------------------------------------------------

def _two_branches():
    """A then B (sharing p0 p1) computed and freed in that order, in a pool just that big."""
    pool = RadixCache(6, 4)
    a = hold(pool, A)
    b = hold(pool, B)
    pool.free(a)  # A's path is accessed before B's
    pool.free(b)
    assert pool.num_free == 6 and len(pool._free) == 0
    return pool, a, b


def test_older_unlocked_leaf_goes_first_and_whole():
    pool, a, b = _two_branches()
    got = pool.allocate(1)
    # A's branch (a2 a3: one node, split off when B's hit ended at p1) is the older leaf:
    # it goes whole, though one block was asked for; the shared prefix and B stay.
    assert pool.evictions == 2 and set(got) <= set(a[2:])
    assert _leading(pool, A) == 2 and _leading(pool, B) == 4
    pool.check()


def test_a_lookup_refreshes_the_path():
    pool, a, b = _two_branches()
    pool.lookup(A)  # a waiting call matched A: now B's branch is the older leaf
    pool.allocate(1)
    assert _leading(pool, A) == 4 and _leading(pool, B) == 2
    pool.check()


def test_interior_node_never_before_its_children():
    pool, a, b = _two_branches()
    pool.allocate(4)  # both branches go, leaves first; p0 p1 (same access time as B's leaf) stay
    assert _leading(pool, A) == _leading(pool, B) == 2 and pool.evictions == 4
    pool.allocate(2)  # now p0 p1 are the only leaf node left
    assert _leading(pool, A) == 0 and pool.evictions == 6
    pool.check()


def test_locked_path_never_evicted():
    pool = RadixCache(8, 4)
    a = hold(pool, A)
    b = hold(pool, B)
    pool.free(a)  # B still runs (or is pinned): p0 p1 b2 b3 are locked
    assert pool.num_free == 2 + 2  # two free blocks plus A's own branch
    assert pool.allocate(5) is None
    got = pool.allocate(4)
    assert got is not None and pool.evictions == 2
    assert _leading(pool, B) == 4 and _leading(pool, A) == 2
    assert pool.evict(100) == 0  # nothing unlocked is left
    pool.free(got)
    pool.free(b)
    pool.check()
    assert pool.num_used == 0


def test_duplicate_content_locks_the_tree_copy():
    """Two holders compute the same blocks at once: the second's copy aliases the first's,
    whose locks it then counts in, so the path under it stays evictable-safe."""
    pool = RadixCache(8, 4)
    x = pool.allocate(2)
    y = pool.allocate(2)  # both missed: nothing was cached yet
    pool.cache_many(x, ["s0", "s1"])
    pool.cache_many(y, ["s0", "s1"])  # already there: y aliases x
    assert pool.key[y[0]] is None and pool.lookup(["s0", "s1"]) == x
    y += pool.allocate(1)
    pool.cache_many(y[2:], ["y2"], "s1")  # y's own block hangs under x's s1
    pool.free(x)  # x's holder is done; y still locks s0 s1 through its aliases
    assert pool.evictable(x) == 0 and pool.num_free == 3
    pool.check()
    pool.free(y)  # y's copies are freed, its own block joins the tree under s1
    assert pool.num_free == 8 and _leading(pool, ["s0", "s1", "y2"]) == 3
    pool.check()


# --- not vLLM's pool ---------------------------------------------------------------------------------

def test_radix_and_block_pool_evict_differently():
    """The same operations on both: A then B computed and freed, then a waiting call
    matches A (no admission), then one block is allocated. vLLM's free queue evicts in
    free order (A's last block, untouched by a mere lookup); the radix tree evicts B's
    branch, the least recently accessed leaf, and all of it."""
    def run(pool):
        a = hold(pool, A)
        b = hold(pool, B)
        pool.free(a)
        pool.free(b)
        pool.lookup(A)
        pool.allocate(1)
        return _leading(pool, A), _leading(pool, B), pool.evictions

    assert run(BlockPool(6, 4)) == (3, 4, 1)  # a3 went
    assert run(RadixCache(6, 4)) == (4, 2, 2)  # b2 b3 went


# --- whole runs ------------------------------------------------------------------------------------

_SWE = ["--trace", "swebench", "--programs", "40", "--jps", "1", "--num-gpu-blocks", "3000", "--no-progress"]


@pytest.fixture
def pools(monkeypatch):
    """Every replica's pool at the end of each run (after execute's own check_end)."""
    seen = []
    check_end = simulate.check_end

    def spy(cluster, rec, trace):
        check_end(cluster, rec, trace)
        seen.append([e.sched.pool for e in cluster.engines])
    monkeypatch.setattr(simulate, "check_end", spy)
    return seen


@pytest.mark.parametrize("policy", ["vllm", "continuum"])
def test_sim_run_with_radix_cache(policy, pools, tmp_path, capsys):
    out = {}
    for cache in ("radix", "vllm"):
        assert main(["run", *_SWE, "--policy", policy, "--cache", cache, "--out", str(tmp_path / cache)]) == 0
        out[cache] = json.loads((tmp_path / cache / "summary.json").read_text())
    capsys.readouterr()
    radix_pools, vllm_pools = pools
    assert all(isinstance(p, RadixCache) for p in radix_pools) and all(isinstance(p, BlockPool) for p in vllm_pools)
    s = out["radix"]
    assert s["calls"] == out["vllm"]["calls"] > 0  # every call finished (check_end: exactly once)
    for p in radix_pools:
        p.check()
        assert p.num_used == 0 and not p.ref_cnt.any()  # no block held at the end
        assert p.evictions > 0  # the pool was contended
    assert s["prefill_tokens_cached"] > 0 and s["cache_hit_ratio"] > 0
    assert s["peak_kv_usage"] >= 0.9
    assert (s["mean_jct"], s["prefill_tokens_cached"]) != (out["vllm"]["mean_jct"], out["vllm"]["prefill_tokens_cached"])
    cfg = json.loads((tmp_path / "radix" / "config.json").read_text())
    assert cfg["cluster"]["cache"] == "radix"


def test_radix_run_with_replicas_and_offload(pools, capsys):
    assert main(["run", *_SWE, "--policy", "continuum", "--cache", "radix", "--replicas", "2",
                 "--router", "prefix", "--offload", "cpu:2GiB"]) == 0
    capsys.readouterr()
    for p in pools[0]:
        assert isinstance(p, RadixCache) and p.num_used == 0


@pytest.mark.parametrize("argv", [["--cache", "lru"], ["--cache", "RADIX"]])
def test_unknown_cache_is_one_line(argv, capsys):
    assert main(["run", *argv, "--programs", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--cache" in err and "vllm, radix" in err and err.count("\n") == 1 and "Traceback" not in err


def test_unknown_cache_in_a_config_file(tmp_path, capsys):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"cluster": {"cache": "lru"}}))
    assert main(["run", "--config", str(f), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cluster.cache" in err and err.count("\n") == 1


# --- random operations ---------------------------------------------------------------------------

@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["run", "miss", "share", "free", "look"]),
                          st.lists(st.integers(0, 2), min_size=1, max_size=6)), max_size=40),
       st.integers(4, 24))
def test_random_operations_keep_the_invariants(ops, n):
    """Holders of chained contexts (a key is the whole prefix, as sim/kv/content.py's are):
    runs that hit first, concurrent misses that compute a cached prefix again (aliases),
    second holders of a context (pins), frees, bare lookups; check() after each."""
    pool = RadixCache(n, 4)
    held = []
    for op, seq in ops:
        keys = [tuple(seq[:i + 1]) for i in range(len(seq))]
        if op == "run":
            hit = pool.lookup(keys)
            need = len(keys) - len(hit)
            if need <= pool.num_free - pool.evictable(hit):
                pool.touch(hit)
                new = pool.allocate(need)
                half = len(new) // 2  # cached over two steps, as a chunked prefill
                pool.cache_many(new[:half], keys[len(hit):len(hit) + half], keys[len(hit) - 1] if hit else None)
                j = len(hit) + half
                pool.cache_many(new[half:], keys[j:], keys[j - 1] if j else None)
                held.append(hit + new)
        elif op == "miss":
            new = pool.allocate(len(keys))
            if new is not None:
                pool.cache_many(new, keys)
                held.append(new)
        elif op == "share" and held:
            pool.touch(held[seq[0] % len(held)])
            held.append(held[seq[0] % len(held)])
        elif op == "free" and held:
            pool.free(held.pop(seq[0] % len(held)))
        else:
            pool.lookup(keys)
        pool.check()
        assert pool.num_used <= n
    for h in held:
        pool.free(h)
    pool.check()
    assert pool.num_used == 0 and pool.num_free == n


def test_a_stretch_ends_where_a_decoding_block_would_alias_the_trees_copy():
    """Identical prompts decode identical outputs (content keys), so p003's output blocks
    are p002's, freed into the tree: each fill makes p003's block an alias that locks an
    evictable tree block. A decode stretch inserts only at its end, so it counted 6 used
    blocks at 1.0 s where step by step held 8 (found by `make fuzz`); it now ends with the
    first such fill."""
    import numpy as np
    import pandas as pd

    from conftest import linear_profile, make_trace, simulate as run

    tr = make_trace([[(32, out, None, None)] for out in (1, 1, 38, 40)], shared_prefix=32)
    prof = linear_profile(blocks=20, budget=16, seqs=1, c2=1e-6, c4=1e-5)
    fast, step = (run(tr, "vllm", prof, np.zeros(4), fast_forward=ff, cache="radix") for ff in (True, False))
    pd.testing.assert_frame_equal(fast.kv_usage, step.kv_usage, check_exact=True)
    assert fast.kv_usage["used_blocks"].tolist() == [1, 8] and fast.summary == step.summary
