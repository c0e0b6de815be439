"""Offload tiers (sim/kv/tiers.py): flag parsing, LRU capacity, write-through, reload
arithmetic on hand-computed runs, exact decode stretches, no leaks in any tier."""
import numpy as np
import pytest

from conftest import linear_profile, make_trace, random_trace, simulate
from policies.base import OFFLOAD, Policy
from sim.kv.tiers import Tier, TierSpec, build_tiers, parse_offload
from agentsim.errors import InputError

# linear_profile's model: 2 * 1 layer * 1 KV head * 64 dims * 2 bytes * 16 tokens = 4096 B per block;
# a 256-token chunk is 16 blocks = 65,536 B. At 0.004096 GB/s one block moves in 1 ms.
BLOCK_MS = "@0.004096"


def run(trace, arrivals, policy="vllm", offload=None, ff=True, **prof):
    p = linear_profile(**prof)
    return simulate(trace, policy, p, arrivals, fast_forward=ff, offload=offload)


# --- the flag ------------------------------------------------------------------------------
def test_parse_offload():
    assert parse_offload(None) == () and parse_offload("none") == ()
    assert parse_offload("cpu:200GiB") == (TierSpec("cpu", 200 * 2**30),)
    assert parse_offload("cpu:1.5GB@25, ssd:1TiB") == (TierSpec("cpu", 1_500_000_000, 25.0), TierSpec("ssd", 2**40))


@pytest.mark.parametrize("spec, fragment", [
    ("cpu:abc", "size 'abc' is not a size"),
    ("gpu:1GiB", "is not TIER:SIZE"),
    ("cpu", "is not TIER:SIZE"),
    ("cpu:0GiB", "needs a size > 0"),
    ("ssd:1TiB", "first tier must be cpu"),
    ("cpu:1GiB,cpu:2GiB", "given twice"),
    ("cpu:1GiB@-3", "bandwidth"),
])
def test_parse_offload_bad_input(spec, fragment):
    with pytest.raises(InputError, match=fragment) as e:
        parse_offload(spec)
    assert "\n" not in str(e.value) and "--offload" in str(e.value)


def test_profile_without_pcie_bandwidth_needs_one_in_the_flag():
    prof = linear_profile()  # no pcie section
    with pytest.raises(InputError, match="no PCIe bandwidth"):
        build_tiers(parse_offload("cpu:1GiB"), prof, 16)
    (t,) = build_tiers(parse_offload("cpu:1GiB@25"), prof, 16)
    assert t.bandwidth == 25e9 and t.chunk_bytes == 65536 and t.capacity == 2**30 // 65536


# --- one tier: capacity and LRU --------------------------------------------------------------
def test_tier_capacity_and_lru():
    t = Tier("cpu", capacity_chunks=3, chunk_bytes=10, bandwidth=100.0, latency=0.5)
    for k in "abc":
        assert t.put(k)
    assert not t.put("a")  # present: skipped, and not touched
    t.touch("a")  # LRU order now b, c, a
    assert t.put("d")  # evicts b, the least recently used
    assert list(t.lru) == ["c", "a", "d"] and "b" not in t
    assert (t.stored, t.evicted, t.bytes_written) == (4, 1, 40)
    assert t.transfer_time(200) == pytest.approx(0.5 + 2.0)
    t.check()
    empty = Tier("cpu", 0, 10, 1.0, 0.0)
    assert not empty.put("x") and len(empty) == 0


# --- reload arithmetic, by hand ---------------------------------------------------------------
# A: 512-token prompt, 1 output, tool 10 s, then 16 new tokens. B (t=1 s) fills all 39
# usable blocks (40 minus vLLM's null block) and evicts A's 32 cached blocks.
TWO = [[(512, 1, "ls", 10.0), (16, 1, None, None)], [(624, 1, None, None)]]


def test_reload_replaces_recompute_hand_computed():
    # A turn 0: prefill 512 (0.01 + 0.512) -> 0.522; written through: 2 chunks.
    # A turn 1 arrives 10.522, prompt 529: GPU hit 0, CPU prefix hit 2 chunks = 32 blocks
    # (<= (529-1)//16 = 33), loaded in 32 ms; 17 tokens computed: 0.01 + 0.017 + 0.032.
    res = run(make_trace(TWO), [0.0, 1.0], offload="cpu:1GiB" + BLOCK_MS, blocks=40)
    a = res.turns[res.turns["program_id"] == "p000"].reset_index()
    assert a["finish"].tolist() == pytest.approx([0.522, 10.522 + 0.059])
    assert a["cached_tokens"].tolist() == [0, 0]
    assert a["loaded_tokens"].tolist() == [0, 512]
    assert a["computed_prompt_tokens"].tolist() == [512, 17]
    assert a["reload_s"].iloc[1] == pytest.approx(0.032)
    s = res.summary
    # tokens past the GPU hit that a tier could have supplied, at every admission:
    # A turn 0 (511//16 = 31 blocks), B (623//16 = 38), A turn 1 (33); 32 blocks came
    assert s["cpu_hit_ratio"] == pytest.approx(512 / ((31 + 38 + 33) * 16))
    assert s["tiers"]["cpu"]["stored"] == 4  # A's 2 chunks + B's 2; A's turn 1 adds none
    assert s["tiers"]["cpu"]["bytes_read"] == 32 * 4096 and s["reload_s"] == pytest.approx(0.032)
    # without offload: recompute all 529 tokens
    plain = run(make_trace(TWO), [0.0, 1.0], blocks=40).turns
    assert plain["finish"].iloc[1] == pytest.approx(10.522 + 0.01 + 0.529)


def test_lru_capacity_evicts_the_oldest_chunk():
    # room for 3 chunks: B's 2 chunks evict A's chunk 0, so A has no CPU prefix hit left
    res = run(make_trace(TWO), [0.0, 1.0], offload=f"cpu:{3 * 65536}B" + BLOCK_MS, blocks=40)
    a = res.turns[res.turns["program_id"] == "p000"]
    assert a["loaded_tokens"].tolist() == [0, 0]
    # B's chunk 1 evicted A's chunk 0; A's turn 1 writes its 2 chunks again (2 more)
    assert res.summary["tiers"]["cpu"]["evicted"] == 3 and res.summary["tiers"]["cpu"]["stored"] == 6
    assert a["finish"].iloc[1] == pytest.approx(10.522 + 0.539)


def test_write_through_on_prefill_only_decode_tokens_wait_for_the_next_prefill():
    # 300-token prompt -> 1 full chunk on prefill; 500 decoded tokens are not saved;
    # the next turn's prefill (prompt 300+500+10 = 810) stores chunks 1 and 2.
    tr = make_trace([[(300, 500, "ls", 1.0), (10, 1, None, None)]])
    res = run(tr, [0.0], offload="cpu:1GiB" + BLOCK_MS, blocks=100)
    assert res.summary["tiers"]["cpu"]["stored"] == 3
    one = run(make_trace([[(300, 500, None, None)]]), [0.0], offload="cpu:1GiB" + BLOCK_MS, blocks=100)
    assert one.summary["tiers"]["cpu"]["stored"] == 1


class OffloadAll(Policy):
    name = "offload-all"

    def retention(self, req, now, view):
        return OFFLOAD


def test_offload_retention_writes_decode_chunks_and_charges_the_next_step():
    # A: prompt 256 (chunk 0 written through), 257 outputs -> KV of 512 tokens; OFFLOAD at
    # its finish copies chunk 1 (16 blocks: 16 ms), which B's next step must wait for.
    # Step 1: both prefills (272 tokens, 0.282 s); 256 decode steps of 2 (0.012 s): A done;
    # B's 43 remaining steps alone (0.011 s), the first one stretched to 0.016 s.
    tr = make_trace([[(256, 257, "ls", 5.0), (16, 1, None, None)], [(16, 300, None, None)]])
    res = run(tr, [0.0, 0.0], policy=OffloadAll(), offload="cpu:1GiB" + BLOCK_MS, blocks=100)
    s = res.summary
    assert s["offload_bytes"] == 65536 and s["tiers"]["cpu"]["stored"] == 2
    b = res.turns.set_index("program_id")["finish"]["p001"]
    assert b == pytest.approx(0.282 + 256 * 0.012 + 0.016 + 42 * 0.011)
    plain = run(tr, [0.0, 0.0], policy="vllm", blocks=100).turns.set_index("program_id")["finish"]["p001"]
    assert plain == pytest.approx(0.282 + 256 * 0.012 + 43 * 0.011)
    # A's turn 1 (5 s later) finds its 512 tokens on GPU: nothing to load; the copy
    # finished long before, so it costs A nothing
    assert res.turns["loaded_tokens"].sum() == 0


# --- exactness and conservation --------------------------------------------------------------
@pytest.mark.parametrize("policy", ["vllm", "continuum-offload", "infercept", "autellix"])
def test_decode_stretches_match_step_by_step_with_offload(policy):
    tr = random_trace(np.random.default_rng(3), 25)
    arr = np.sort(np.random.default_rng(4).uniform(0, 10, 25))
    kw = dict(blocks=150, c2=1e-6, c4=1e-5, c5=2e-6, offload="cpu:4MiB@0.05")
    fast = run(tr, arr, policy=policy, **kw)
    slow = run(tr, arr, policy=policy, ff=False, **kw)
    assert fast.summary["steps"] == slow.summary["steps"]
    assert fast.summary["offload_loads"] == slow.summary["offload_loads"] > 0
    np.testing.assert_allclose(fast.turns["finish"], slow.turns["finish"], rtol=1e-9)
    assert (fast.turns["loaded_tokens"] == slow.turns["loaded_tokens"]).all()


def test_offload_is_deterministic():
    tr = random_trace(np.random.default_rng(1), 30)
    arr = np.sort(np.random.default_rng(2).uniform(0, 20, 30))
    a = run(tr, arr, policy="continuum-offload", offload="cpu:2MiB@0.05", blocks=120).summary
    b = run(tr, arr, policy="continuum-offload", offload="cpu:2MiB@0.05", blocks=120).summary
    assert a == b
