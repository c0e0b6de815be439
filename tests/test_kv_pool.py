"""sim/hardware/kv_pool.py: the KV pool as vLLM 0.32 sizes it, term by term, and the judged table."""
import json
import math

import pytest

from agentsim.cli import main
from agentsim.errors import InputError
from benchmarks import kv_pool_table
from benchmarks.docs_tables import DOCS, marked_blocks
from sim.hardware import roofline
from sim.hardware.kv_pool import (CUDA_CONTEXT_BYTES, CUDAGRAPH_FIRST_MIB, CUDAGRAPH_PER_GRAPH_LAYER_MIB, DIST_INIT_BYTES, MiB, NON_TORCH_PROFILE_TP1_BYTES,
                                  NON_TORCH_PROFILE_TP_BYTES, NON_TORCH_TP1_BYTES, NON_TORCH_TP_BYTES, accounting_for,
                                  capture_sizes, cudagraph_estimate, kv_bytes_per_token, kv_pool)

H100 = 85017493504
LLAMA = roofline.find_model("llama3.1-8b")[1]
MOE = roofline.find_model("qwen3-30b-a3b")[1]


def pool(**kw):
    args = dict(gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_num_seqs=256)
    args.update(kw)
    return kv_pool(H100, LLAMA, **args)


def test_more_utilization_buys_exactly_its_bytes_in_blocks():
    lo, hi = pool(gpu_memory_utilization=0.8), pool(gpu_memory_utilization=0.9)
    extra = math.ceil(H100 * 0.9) - math.ceil(H100 * 0.8)  # requested = ceil(total * utilization)
    assert hi.available_bytes - lo.available_bytes == pytest.approx(extra, abs=2)
    assert hi.weights_bytes == lo.weights_bytes and hi.activation_bytes == lo.activation_bytes
    for p in (lo, hi):  # blocks = available // (block_size x bytes per token over all layers)
        assert p.blocks == p.available_bytes // p.block_bytes
        assert p.block_bytes == 16 * 2 * 32 * 8 * 128 * 2 and p.tokens == 16 * p.blocks
    assert hi.blocks - lo.blocks in (extra // hi.block_bytes, extra // hi.block_bytes + 1)


def test_a_larger_token_budget_raises_the_activation_peak_and_costs_blocks():
    small, big = pool(max_num_batched_tokens=2048, max_num_seqs=8), pool(max_num_batched_tokens=16384, max_num_seqs=8)
    assert big.forward_peak_bytes == pytest.approx(8 * small.forward_peak_bytes)  # linear in the tokens of the dummy run
    assert big.activation_bytes > small.activation_bytes and big.blocks < small.blocks
    # Llama-3.1-8B, eager: residual, normed input and output (3 x 4096) + gate_up and its activation (3 x 14336), bf16
    assert small.forward_peak_bytes == 2048 * 2 * (3 * 4096 + 3 * 14336)


def test_the_sampler_run_is_sized_by_max_num_seqs():
    few, many = pool(max_num_seqs=64), pool(max_num_seqs=1024)
    assert many.sampler_peak_bytes - few.sampler_peak_bytes == (1024 - 64) * 128256 * 14
    # the Triton top-k/top-p buffer (min(SMs, rows) x vocab fp32) stays; then the larger transient
    assert many.kept_bytes == 132 * 128256 * 4 and few.kept_bytes == 64 * 128256 * 4
    assert many.activation_bytes == many.kept_bytes + max(many.forward_peak_bytes, many.sampler_peak_bytes)
    assert pool(max_num_batched_tokens=512, max_num_seqs=1024).sampler_peak_bytes == pool(
        max_num_batched_tokens=512, max_num_seqs=512).sampler_peak_bytes  # rows = min(seqs, budget)


def test_tp2_halves_the_kv_heads_and_weights_per_gpu():
    one, two = pool(), pool(tp=2)
    assert kv_bytes_per_token(LLAMA, 2) * 2 == kv_bytes_per_token(LLAMA, 1)
    assert two.block_bytes * 2 == one.block_bytes
    # the parameters halve; the rotary cache (one per model, on every rank) does not
    params = [p.weights_bytes - p.load_overhead_bytes for p in (one, two)]
    assert params[1] == pytest.approx(params[0] / 2, rel=1e-9)
    assert two.load_overhead_bytes >= 131072 * 128 * 2 and one.load_overhead_bytes >= 131072 * 128 * 2
    assert two.non_torch_bytes > one.non_torch_bytes  # NCCL buffers grown by the first all-reduce
    assert kv_bytes_per_token(LLAMA, 16) == kv_bytes_per_token(LLAMA, 8)  # fewer KV heads than ranks: one each


def test_eager_and_versions_before_0_21_reserve_no_graph_pool():
    graphs, eager = pool(), pool(enforce_eager=True)
    assert graphs.cudagraph_bytes > 0 and eager.cudagraph_bytes == 0
    # 0.32 captures after the profiling window: eager differs by the graph estimate alone
    assert eager.available_bytes - graphs.available_bytes == pytest.approx(graphs.cudagraph_bytes, abs=1)
    # 0.21-0.26 capture inside it: eager also saves the capture's non-torch memory
    g21, e21 = pool(vllm_version="0.21"), pool(vllm_version="0.21", enforce_eager=True)
    assert e21.available_bytes - g21.available_bytes == pytest.approx(
        g21.cudagraph_bytes + NON_TORCH_TP1_BYTES - NON_TORCH_PROFILE_TP1_BYTES, abs=1)
    assert pool(vllm_version="0.20").cudagraph_bytes == 0 and g21.cudagraph_bytes > 0
    assert pool(cudagraph_bytes=123 * MiB).cudagraph_bytes == 123 * MiB  # an override wins


def test_the_capture_sizes_are_vllms_defaults():
    """config/vllm.py: 1, 2, 4, 8..248 by 8, 256.. by 16 up to min(2 x seqs, 512, budget), the
    budget itself when under the ceiling, max_num_seqs itself from 0.31; 1024 on data-centre
    Blackwell from 0.28."""
    a32, a30, a27, a28 = (accounting_for(v) for v in ("0.32", "0.30", "0.27.1", "0.28"))
    full = capture_sizes(a32, 1024, 8192)
    assert len(full) == 51 and full[-1] == 512 and full[:5] == [1, 2, 4, 8, 16]  # the 0.19 logs: PIECEWISE=51 (largest=512)
    assert capture_sizes(a32, 128, 2048)[-1] == 256 and len(capture_sizes(a32, 128, 2048)) == 35
    assert capture_sizes(a32, 6, 8192) == [1, 2, 4, 6, 8] and capture_sizes(a30, 6, 8192) == [1, 2, 4, 8]
    assert capture_sizes(a32, 1024, 200)[-1] == 200  # a budget under the ceiling is captured itself
    assert capture_sizes(a28, 1024, 8192, gpu="B200")[-1] == 1024 and len(capture_sizes(a28, 1024, 8192, gpu="B200")) == 83
    assert capture_sizes(a27, 1024, 8192, gpu="B200")[-1] == 512 and capture_sizes(a28, 1024, 8192, gpu="H200")[-1] == 512


def test_the_graph_estimate_follows_the_graphs_and_the_layers():
    """profile_cudagraph_memory: the largest first capture once, then per mode (graphs - 1) x
    the per-graph bytes, which grow with the layers; FULL graphs only up to max_num_seqs."""
    acc = accounting_for("0.32")
    est, info = cudagraph_estimate(acc, LLAMA, 1, 1024, 8192)
    assert info["graphs"] == {"PIECEWISE": 51, "FULL": 51}
    per = CUDAGRAPH_PER_GRAPH_LAYER_MIB["tp1"]
    assert est == int((CUDAGRAPH_FIRST_MIB["tp1"] + 32 * 50 * (per["PIECEWISE"] + per["FULL"])) * MiB)
    few, info = cudagraph_estimate(acc, LLAMA, 1, 128, 2048)
    assert info["graphs"] == {"PIECEWISE": 35, "FULL": 19} and few < est  # as a v0.22 log prints for these limits
    deeper = {**LLAMA, "num_layers": 64}
    extra = cudagraph_estimate(acc, deeper, 1, 1024, 8192)[0] - est  # 32 more layers: 32 x 50 more per-graph bytes each mode
    assert extra == pytest.approx(32 * 50 * (per["PIECEWISE"] + per["FULL"]) * MiB, abs=1)
    tp = cudagraph_estimate(acc, LLAMA, 2, 1024, 8192)[0]
    pt = CUDAGRAPH_PER_GRAPH_LAYER_MIB["tp"]
    assert tp == int((CUDAGRAPH_FIRST_MIB["tp"] + 32 * 50 * (pt["PIECEWISE"] + pt["FULL"])) * MiB)
    assert pool(max_num_seqs=8).cudagraph_bytes < pool(max_num_seqs=1024).cudagraph_bytes


def test_the_graph_constants_are_the_medians_of_vllms_own_profiles():
    """benchmarks/data/vllm_cudagraph_profile.json: vLLM 0.19's DEBUG profile per run; the
    constants are its medians (TP1 and TP > 1), and each run's total is the source's formula."""
    import statistics
    data = json.loads((kv_pool_table.CASES.parent / "vllm_cudagraph_profile.json").read_text())
    runs = data["runs"]
    assert len(runs) >= 40 and data["source"].startswith("https://")
    for r in runs:  # max(first captures) + sum((graphs - 1) x per-graph), as logged (GiB, 2 decimals)
        mib = max(r["piecewise"]["first_mib"], r["full"]["first_mib"]) + sum(
            (r[m]["graphs"] - 1) * r[m]["per_graph_mib"] for m in ("piecewise", "full"))
        assert abs(mib / 1024 - r["total_gib"]) <= 0.006, r["log"]
    for key, one in (("tp1", True), ("tp", False)):
        rs = [r for r in runs if (r["tp"] == 1) == one]
        assert CUDAGRAPH_FIRST_MIB[key] == statistics.median(
            max(r["piecewise"]["first_mib"], r["full"]["first_mib"]) for r in rs)
        for mode in ("PIECEWISE", "FULL"):
            assert CUDAGRAPH_PER_GRAPH_LAYER_MIB[key][mode] == pytest.approx(statistics.median(
                r[mode.lower()]["per_graph_mib"] / r["num_layers"] for r in rs))
    # none of those runs is judged by a rule that uses them: vLLM 0.19 does not subtract the estimate
    assert not accounting_for("0.19").graph_estimate_subtracted


def test_the_capture_leaves_the_profiling_window_at_0_27():
    """0.18-0.26 capture inside memory_profiling (its non-torch memory counted), 0.27 on after it."""
    assert accounting_for("0.26").graphs_in_profile and not accounting_for("0.27").graphs_in_profile
    assert not accounting_for("0.17").graphs_in_profile
    assert pool(vllm_version="0.26").non_torch_bytes == NON_TORCH_TP1_BYTES
    assert pool(vllm_version="0.27").non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES
    assert pool(vllm_version="0.26", tp=2).non_torch_bytes == NON_TORCH_TP_BYTES
    assert pool(vllm_version="0.32", tp=2).non_torch_bytes == NON_TORCH_PROFILE_TP_BYTES


def test_each_version_is_sized_by_its_own_rules():
    """The flags read in each release's worker code: top-k/top-p buffer from 0.17, graph
    capture inside the profiling window from 0.18, the graph estimate subtracted from 0.21;
    before 0.9 (V0's accounting) refused with one line."""
    old, mid, new = accounting_for("0.10.1.1"), accounting_for("0.18.0"), accounting_for("0.32")
    assert not (old.topk_topp_buffer or old.graphs_in_profile or old.graph_estimate_subtracted)
    assert mid.topk_topp_buffer and mid.graphs_in_profile and not mid.graph_estimate_subtracted
    assert new.topk_topp_buffer and not new.graphs_in_profile and new.graph_estimate_subtracted
    a, b = pool(vllm_version="0.16"), pool(vllm_version="0.17")
    assert a.kept_bytes == 0 and b.kept_bytes == 132 * 128256 * 4
    # non-torch measured without the capture in the window (before 0.18, or eager) and with it
    assert pool(vllm_version="0.17").non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES < NON_TORCH_TP1_BYTES
    assert pool(vllm_version="0.18").non_torch_bytes == NON_TORCH_TP1_BYTES
    assert pool(vllm_version="0.18", enforce_eager=True).non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES
    assert pool(vllm_version="0.17", tp=2).non_torch_bytes == NON_TORCH_PROFILE_TP_BYTES
    assert pool(vllm_version="0.26", tp=2).non_torch_bytes == NON_TORCH_TP_BYTES
    # no P2P: NCCL through host memory, only the single-GPU growth charged
    assert pool(vllm_version="0.17", tp=2, p2p=False).non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES
    assert accounting_for("0.9.1").sampler == "sort"  # memory_profiling arrives in 0.9.1, not 0.9.0
    for bad in ("0.9.0", "0.8.5", "0.5.0", "x.y"):
        with pytest.raises(InputError, match="vllm_version") as e:
            pool(vllm_version=bad)
        assert "\n" not in str(e.value)


def test_the_sampler_path_sets_the_bytes_a_logit():
    """0.17 on: the Triton top-k/top-p kernel from 8 rows (the sort below); before, the sort
    unless the log names FlashInfer."""
    def smp(**kw):
        return pool(max_num_batched_tokens=2048, **kw).sampler_peak_bytes - 2048 * 4096 * 2  # less the hidden states
    assert smp(vllm_version="0.32", max_num_seqs=256) == 256 * 128256 * 14
    assert smp(vllm_version="0.16", max_num_seqs=256) == 256 * 128256 * 38
    assert smp(vllm_version="0.16", max_num_seqs=256, sampler="flashinfer") == 256 * 128256 * 14
    assert smp(vllm_version="0.32", max_num_seqs=4) == 4 * 128256 * 38  # under 8 rows: the sort path
    assert pool(vllm_version="0.16").inputs["sampler"] == "sort" and pool().inputs["sampler"] == "triton"
    # the Triton kernel's kept buffer exists only where that kernel runs
    assert pool(sampler="flashinfer").kept_bytes == 0 and pool(max_num_seqs=4).kept_bytes == 0
    assert pool().kept_bytes == 132 * 128256 * 4
    with pytest.raises(InputError, match="sampler") as e:
        pool(sampler="radix")
    assert "\n" not in str(e.value)


def test_a_0_11_case_from_the_file_is_judged_by_0_11_rules():
    """llm-d-benchmark's vLLM 0.11.0 Qwen3-32B on one H100 (a 4.45 GiB pool): the sort sampler
    path, no graph capture in the window, no graph estimate; within 3% only by those rules."""
    data = kv_pool_table.load()
    case = next(c for c in data["cases"] if c["vllm_version"].startswith("0.11") and c["model"] == "qwen3-32b" and c["tp"] == 1)
    got, p = kv_pool_table.ours(data, case)
    assert p.inputs["sampler"] == "sort" and p.non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES and p.cudagraph_bytes == 0
    assert abs(got / case["figure"]["value"] - 1) <= kv_pool_table.TOLERANCE
    as_032, _ = kv_pool_table.ours(data, {**case, "vllm_version": "0.32.0", "sampler": None})
    assert abs(as_032 / case["figure"]["value"] - 1) > kv_pool_table.TOLERANCE


def test_a_0_10_case_from_the_file_is_judged_by_0_10_rules():
    """dennislee22's A100 TP2 run on vLLM 0.10.1.1 without P2P: no top-k/top-p buffer, no
    capture in the window, no NCCL NVLink buffers; within 3% only by those rules."""
    data = kv_pool_table.load()
    case = next(c for c in data["cases"] if c["vllm_version"].startswith("0.10") and c["tp"] == 2 and c.get("p2p") is False
                and c.get("sampler") == "flashinfer")
    got, p = kv_pool_table.ours(data, case)
    assert p.non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES and p.kept_bytes == 0 and p.cudagraph_bytes == 0
    assert abs(got / case["figure"]["value"] - 1) <= kv_pool_table.TOLERANCE
    as_032 = kv_pool(case["gpu_memory_bytes"], kv_pool_table.model_of(data, case["model"]), tp=2, num_sms=case["gpu_sms"],
                     gpu_memory_utilization=case["gpu_memory_utilization"], max_num_batched_tokens=case["max_num_batched_tokens"],
                     max_num_seqs=case["max_num_seqs"], vllm_version="0.32", p2p=False, sampler="flashinfer")
    assert abs(as_032.tokens / case["figure"]["value"] - 1) > kv_pool_table.TOLERANCE


def _v0_case(case_id):
    data = kv_pool_table.load()
    case = next(c for c in data["cases"] if c["id"] == case_id)
    return data, case


def _off(data, case, **changes):
    got, p = kv_pool_table.ours(data, {**case, **changes})
    return got / case["figure"]["value"] - 1, p


def test_the_v0_releases_read_have_their_rules_and_the_others_are_refused():
    """V0_RULES: 0.2.4 torch peak, 0.2.5-0.2.6 device used, 0.6.4 every non-torch byte, 0.7.0-0.7.3
    growth from a snapshot before distributed init; no graph estimate and the sort sampler."""
    rules = {v: accounting_for(v).v0 for v in ("0.2.4", "0.2.5", "0.2.6", "0.6.4", "0.7.0", "0.7.3", "0.9.1")}
    assert rules == {"0.2.4": "torch_peak", "0.2.5": "device_used", "0.2.6": "device_used", "0.6.4": "non_torch_whole",
                     "0.7.0": "baseline", "0.7.3": "baseline", "0.9.1": None}
    assert accounting_for("0.7.2").dist_init_counted and not accounting_for("0.6.4").dist_init_counted
    for v in ("0.2.4", "0.6.4", "0.7.2"):
        p = pool(vllm_version=v)  # not eager: V0 captures the graphs after the KV cache
        assert p.cudagraph_bytes == 0 and p.inputs["sampler"] == "sort" and p.kept_bytes == 0
    for bad in ("0.2.3", "0.3.0", "0.6.3", "0.6.5", "0.7.4", "0.8.5", "0.9.0"):
        with pytest.raises(InputError, match="V0 engine's releases only") as e:
            accounting_for(bad)
        assert "\n" not in str(e.value)


def test_each_v0_rule_charges_its_own_non_torch_bytes():
    assert pool(vllm_version="0.2.4").non_torch_bytes == 0  # max_memory_allocated only
    assert pool(vllm_version="0.2.5").non_torch_bytes == CUDA_CONTEXT_BYTES
    held = (2 * 32 + 1) * 8192 * 4096 * 2  # two row-parallel all-reduces a layer and the embedding's
    assert pool(vllm_version="0.2.5", tp=2).non_torch_bytes == CUDA_CONTEXT_BYTES + DIST_INIT_BYTES[2] + held
    assert pool(vllm_version="0.2.5", tp=2, p2p=False).non_torch_bytes == CUDA_CONTEXT_BYTES + held
    assert pool(vllm_version="0.6.4").non_torch_bytes == CUDA_CONTEXT_BYTES + NON_TORCH_PROFILE_TP1_BYTES
    assert pool(vllm_version="0.7.2").non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES  # the context is in the snapshot
    assert pool(vllm_version="0.7.2", tp=2).non_torch_bytes == NON_TORCH_PROFILE_TP_BYTES + DIST_INIT_BYTES[2]
    assert pool(vllm_version="0.7.2", non_torch_bytes=123).non_torch_bytes == 123  # a log's figure wins


def test_the_0_2_cases_by_0_2_4s_torch_peak_and_0_2_5s_device_use():
    """vLLM PR #2031's two runs: on its branch (0.2.5's rule) 7,351 and 20,865 blocks; on main
    (0.2.4's torch peak) 7,449 and 31,615, which 0.2.4's rule must give too."""
    for case_id, before in (("a100-llama2-7b", 7449), ("a100x4-llama2-70b", 31615)):
        data, case = _v0_case(case_id)
        assert kv_pool_table.version_of(case) == "0.2.5"
        got, _ = kv_pool_table.ours(data, {**case, "vllm_version": "0.2.4"})
        assert abs(got / before - 1) <= kv_pool_table.TOLERANCE
    data, case = _v0_case("a100-llama2-7b")
    assert abs(_off(data, case)[0]) <= kv_pool_table.TOLERANCE
    assert _off(data, case, vllm_version="0.2.4")[0] > 0.01  # the context is what 0.2.5 adds at TP1
    data, case = _v0_case("a100x4-llama2-70b")
    err, p = _off(data, case)
    assert 0 < err < 0.10 < _off(data, case, vllm_version="0.2.4")[0]  # held all-reduce inputs: +52% -> under +10%


def test_the_0_6_4_cases_by_its_torch_peak_and_the_logged_non_torch():
    """The log prints peak_torch_memory 17.06 and 17.98 GiB: weights + activation must give them."""
    for case_id, peak in (("3090-llama8b-20k", 17.06), ("3090-llama8b-29k", 17.98)):
        data, case = _v0_case(case_id)
        err, p = _off(data, case)
        assert abs(err) <= kv_pool_table.TOLERANCE and p.non_torch_bytes == int(0.35 * (1 << 30))
        assert (p.weights_bytes + p.activation_bytes) / (1 << 30) == pytest.approx(peak, abs=0.02)


def test_the_0_7_case_takes_rank_0_which_samples():
    """Rank 0 gathers the logits and samples (the sort over 256 rows), so its pool is the
    smallest, which the executor takes; the logged rank's (no sampler) was 8.69 GiB."""
    data, case = _v0_case("4090x2-r1qwen14b")
    err, p = _off(data, case)
    assert abs(err) <= kv_pool_table.TOLERANCE and p.sampler_peak_bytes > p.forward_peak_bytes
    rank1 = p.available_bytes + p.activation_bytes - p.forward_peak_bytes
    assert rank1 / (1 << 30) == pytest.approx(8.69, rel=kv_pool_table.TOLERANCE)
    assert rank1 // p.block_bytes * 16 / case["figure"]["value"] - 1 > 0.1


def test_moe_weights_split_by_ep_and_its_workspaces_stay():
    tp, ep = kv_pool(H100, MOE, tp=4), kv_pool(H100, MOE, ep=4)
    assert ep.weights_bytes > tp.weights_bytes  # EP replicates attention and embeddings
    assert ep.block_bytes == 4 * tp.block_bytes  # EP: every KV head on each GPU; TP4: one of 4
    one = kv_pool(H100, MOE, max_num_batched_tokens=8192, max_num_seqs=1)
    # Qwen3-30B-A3B: 8192 tokens x top-8 x (max(768, 2048) + max(1536, 2048)) bf16; one row takes the sort path,
    # so no Triton top-k buffer (8 rows take it: 8 x vocab fp32)
    assert one.kept_bytes == 8192 * 8 * (2048 + 2048) * 2
    assert kv_pool(H100, MOE, max_num_seqs=8).kept_bytes == 8192 * 8 * (2048 + 2048) * 2 + 8 * 151936 * 4
    assert all(v for v in tp.sources.values())


@pytest.mark.parametrize("kw, flag", [({"gpu_memory_utilization": 0}, "--gpu-memory-utilization"),
                                      ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
                                      ({"gpu_memory_utilization": 0.15}, "--gpu-memory-utilization"),
                                      ({"max_num_batched_tokens": 0}, "--max-num-batched-tokens"),
                                      ({"max_num_seqs": -1}, "--max-num-seqs")])
def test_bad_values_and_a_pool_that_cannot_fit_are_refused_naming_the_flag(kw, flag):
    with pytest.raises(InputError, match=flag) as e:
        pool(**kw)
    assert "\n" not in str(e.value)


def test_the_cli_refuses_with_exit_2_and_one_line(capsys):
    assert main(["profile", "roofline", "--gpu", "H100", "--model", "llama3.1-70b", "--gpu-memory-utilization", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpu-memory-utilization" in err
    assert main(["profile", "roofline", "--gpu", "H100", "--model", "llama3.1-8b", "--gpu-memory-utilization", "1.01"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_profile_written_carries_the_kv_pool_derivation(tmp_path):
    out = tmp_path / "p.json"
    assert main(["profile", "roofline", "--gpu", "H100", "--model", "llama3.1-8b", "--max-num-batched-tokens", "2048",
                 "--max-num-seqs", "64", "--enforce-eager", "--out", str(out)]) == 0
    prof = json.loads(out.read_text())
    kp = prof["kv_pool"]
    assert kp["blocks"] == prof["engine"]["num_gpu_blocks"] and kp["cudagraph_bytes"] == 0
    assert kp["inputs"]["max_num_batched_tokens"] == 2048 and kp["inputs"]["max_num_seqs"] == 64
    assert prof["engine"]["max_num_batched_tokens"] == 2048 and prof["engine"]["max_num_seqs"] == 64
    for term in ("requested_bytes", "weights_bytes", "activation_bytes", "non_torch_bytes", "cudagraph_bytes", "blocks"):
        assert kp["sources"][term]
    assert kp["available_bytes"] == kp["requested_bytes"] - kp["weights_bytes"] - kp["activation_bytes"] \
        - kp["non_torch_bytes"] - kp["cudagraph_bytes"]
    bigger, _ = roofline.roofline_profile("H100", "llama3.1-8b", max_num_batched_tokens=2048, max_num_seqs=64,
                                          enforce_eager=True, gpu_memory_utilization=0.95)
    assert bigger["engine"]["num_gpu_blocks"] > kp["blocks"]


def test_the_judged_cases_are_within_3_percent_or_say_why():
    """Read from the data file: a case inside 3% needs no note; one outside keeps its row and
    says why (never dropped)."""
    data = kv_pool_table.load()
    assert len(data["cases"]) >= 8
    for r in kv_pool_table.rows(data):
        c = r["case"]
        # an address, or a source without one says so in the table's note
        assert (c["source"].startswith("https://") or "not identified" in c.get("note", "")) and c["vllm_version"] and c["gpu"]
        if r["error"] is None or abs(r["error"]) > kv_pool_table.TOLERANCE:
            assert c.get("note"), f"{c['id']} is off ({r['error']}) and says nothing"
    good = [r["case"] for r in kv_pool_table.rows(data) if r["error"] is not None and abs(r["error"]) <= kv_pool_table.TOLERANCE]
    assert len(good) >= 8 and {c["tp"] for c in good} >= {1, 2, 4, 8}
    assert len({c["gpu_memory_utilization"] for c in good}) >= 2 and len({c["gpu"].split(" x")[0] for c in good}) >= 2
    assert any("moe" in kv_pool_table.model_of(data, c["model"]) for c in good)


def test_the_docs_table_is_what_the_script_writes():
    blocks = [b for b in marked_blocks(DOCS) if b.name == "kv_pool_table"]
    assert len(blocks) == 1 and blocks[0].key == kv_pool_table.KEY
    assert blocks[0].body == kv_pool_table.table(kv_pool_table.load()).strip("\n")


def test_before_0_11_the_distributed_init_buffers_count():
    """0.9.1-0.10.x take the init snapshot before NCCL / custom all-reduce init, so with P2P
    their buffers (0.19's init snapshots: TP > 1 less TP1) come out of the pool; 0.11 on not."""
    assert accounting_for("0.10.1.1").dist_init_counted and not accounting_for("0.11.0").dist_init_counted
    base = NON_TORCH_PROFILE_TP_BYTES
    assert pool(vllm_version="0.10.0", tp=2).non_torch_bytes == base + DIST_INIT_BYTES[2]
    assert pool(vllm_version="0.10.0", tp=4).non_torch_bytes == base + DIST_INIT_BYTES[4]
    assert pool(vllm_version="0.11.0", tp=4).non_torch_bytes == base
    assert pool(vllm_version="0.10.0", tp=2, p2p=False).non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES
    assert pool(vllm_version="0.10.0").non_torch_bytes == NON_TORCH_PROFILE_TP1_BYTES
    # the Qwen3-235B-FP8 TP4 run of that era: within 3% with the term, 13% over without it
    data = kv_pool_table.load()
    case = next(c for c in data["cases"] if c["id"] == "h100x4-qwen3-235b-fp8")
    got, p = kv_pool_table.ours(data, case)
    assert abs(got / case["figure"]["value"] - 1) <= kv_pool_table.TOLERANCE
    without = kv_pool(case["gpu_memory_bytes"], kv_pool_table.model_of(data, case["model"]), tp=4,
                      gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_num_seqs=1024,
                      vllm_version=kv_pool_table.version_of(case), non_torch_bytes=p.non_torch_bytes - DIST_INIT_BYTES[4])
    assert without.tokens / case["figure"]["value"] - 1 > 0.10


def test_a_profile_with_an_fp8_kv_cache_gets_the_pool_vllm_logged():
    """`sim profile roofline --kv-cache-dtype fp8` (roofline_profile's kv_cache_dtype) sizes the pool
    at 1 B a KV element: the collected vLLM 0.19.0 start-up line of Qwen2.5-7B served with
    --kv-cache-dtype fp8 on an H100 ("GPU KV cache size: 2,192,000 tokens") within 3%, and auto's
    pool of the same deployment half of it (within a block)."""
    d = json.loads(kv_pool_table.CASES.read_text())
    case = next(c for c in d["cases"] if c["id"] == "h100-qwen2.5-7b-kvfp8")
    shape = {k: v for k, v in d["models"][case["model"]].items() if k != "kv_dtype_bytes"}
    spec = {**roofline.find_model("qwen3-8b")[1], **shape, "aliases": []}
    kw = dict(tp=case["tp"], gpu_memory_utilization=case["gpu_memory_utilization"], max_model_len=case["max_model_len"],
              max_num_batched_tokens=case["max_num_batched_tokens"], max_num_seqs=case["max_num_seqs"], model_spec=spec,
              vllm_version=case["vllm_version"].split(" ")[0])
    fp8, _ = roofline.roofline_profile("H100", "qwen2.5-7b", kv_cache_dtype="fp8", **kw)
    auto, _ = roofline.roofline_profile("H100", "qwen2.5-7b", **kw)
    assert fp8["kv_pool"]["inputs"]["kv_dtype_bytes"] == 1 and fp8["model"]["kv_dtype_bytes"] == 1
    assert fp8["kv_pool"]["inputs"]["vllm_version"] == "0.19.0" and fp8["engine"]["version"].startswith("0.19.0")
    assert abs(fp8["kv_pool"]["tokens"] / case["figure"]["value"] - 1) <= 0.03
    assert abs(fp8["engine"]["num_gpu_blocks"] - 2 * auto["engine"]["num_gpu_blocks"]) <= 1
    assert fp8["kv_bytes_per_block"] * 2 == auto["kv_bytes_per_block"]
    with pytest.raises(InputError, match="--kv-cache-dtype 'fp16'"):
        roofline.roofline_profile("H100", "qwen2.5-7b", kv_cache_dtype="fp16", **kw)


def test_the_allocator_keeps_a_remainder_of_1_mib_or_less_in_the_block():
    """PyTorch's caching allocator (should_split, get_allocation_size): a large tensor gets a segment
    rounded up to 2 MiB, split only when more than 1 MiB is left; 1-10 MiB requests share 20 MiB
    segments; a freed block merges with free neighbours and is reused best-fit."""
    from sim.hardware.kv_pool import _LargePool
    p = _LargePool()
    assert p.alloc("a", 231 * MiB) == 232 * MiB        # 1 MiB left: kept, counted as allocated
    assert p.alloc("b", int(129.5 * MiB)) == 130 * MiB  # 0.5 MiB kept
    assert p.alloc("c", int(12.25 * MiB)) == int(12.25 * MiB)  # 1.75 MiB left: split off, free
    assert p.alloc("d", 8 * MiB) == 8 * MiB and p.alloc("e", 8 * MiB) == 8 * MiB  # one 20 MiB segment, 4 MiB free
    assert p.allocated() == (232 + 130 + 12.25 + 16) * MiB
    p.free("d"), p.free("e")                             # merged back into one 20 MiB free block
    assert p.alloc("f", int(19.5 * MiB)) == 20 * MiB and len(p.segments) == 4


def test_model_loading_is_the_parameters_plus_the_rope_cache_and_the_allocators_remainders():
    """vLLM's "Model loading took" on every collected log that prints it, to its printed precision give or take 1 MiB:
    parameters alone miss Qwen2.5-72B at TP2 by 0.09 GiB (80 down projections of 231 MiB, each
    in a 232 MiB block, + the 8 MiB rotary cache)."""
    from sim.hardware.kv_pool import GiB, load_overhead, weightsper_gpu
    data = kv_pool_table.load()
    logged = [c for c in data["cases"] if "model_loading_gib" in c]
    assert len(logged) >= 12
    for c in logged:
        m = kv_pool_table.model_of(data, c["model"])
        digits = len(str(c["model_loading_gib"]).split(".")[1])
        got = (weightsper_gpu(m, c["tp"], c.get("ep", 1)) + load_overhead(m, c["tp"], c.get("ep", 1))["bytes"]) / GiB
        # to the log's printed precision, give or take 1 MiB (small tensors are not modelled one by one)
        assert abs(got - c["model_loading_gib"]) <= 0.5 * 10 ** -digits + 1 / 1024, (c["id"], got, c["model_loading_gib"])
        assert kv_pool_table.ours(data, c)[1].weights_bytes == int(got * GiB) or c["figure"]["kind"] == "GiB"
    q72 = data["models"]["qwen2.5-72b"]
    o = load_overhead(q72, 2)
    assert o["rope_cache_bytes"] == 32768 * 128 * 2 and o["bytes"] >= 88 * MiB
    assert abs(weightsper_gpu(q72, 2) / GiB - 67.80) > 0.05  # the parameters alone do not make the log's figure


def test_the_rope_cache_follows_max_position_and_the_kv_replication_counts():
    from sim.hardware.kv_pool import load_overhead
    short = {**LLAMA, "max_position_embeddings": 4096}
    assert load_overhead(LLAMA)["rope_cache_bytes"] == 131072 * 128 * 2
    assert load_overhead(short)["rope_cache_bytes"] == 4096 * 128 * 2  # 1 MiB: the small pool
    # 8 KV heads on 16 ranks: each keeps one, so a rank holds more than 1/16 of the QKV weights
    wide = load_overhead(LLAMA, tp=16)["other_bytes"] - load_overhead(LLAMA, tp=8)["other_bytes"]
    assert wide > 0


def test_an_fp8_kv_cache_halves_the_page_in_0_10_2_too():
    """vLLM 0.10.2 sizes an FP8 KV cache at 1 B an element (v1/worker/gpu_model_runner.py:184-188 takes
    STR_DTYPE_TO_TORCH_DTYPE['fp8'] = torch.uint8, utils/__init__.py:181; v1/kv_cache_interface.py:66-70
    pages by get_dtype_size): Llama-3.3-70B-FP8 at TP2 on H100s (the InferenceX setting) gets twice the
    blocks of its bf16 cache from the same bytes."""
    m = roofline.find_model("llama3.1-70b-fp8")[1]
    kw = dict(tp=2, gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_num_seqs=512, vllm_version="0.10.2")
    bf16, fp8 = kv_pool(H100, m, **kw), kv_pool(H100, m, kv_dtype_bytes=1, **kw)
    assert fp8.available_bytes == bf16.available_bytes and fp8.block_bytes * 2 == bf16.block_bytes
    assert abs(fp8.blocks - 2 * bf16.blocks) <= 1


def test_the_triton_sampler_buffer_takes_each_gpus_own_sm_count():
    """min(SMs, rows) x vocab x 4 B: an A100 (108 SMs) keeps 24 rows fewer than an H100 (132), so
    the same memory gives it exactly those bytes more KV; a B200 (148) 16 rows more."""
    row = LLAMA["vocab_size"] * 4
    base = pool(gpu="H100")
    assert base.inputs["num_sms"] == 132 and "gpus.json H100" in base.inputs["num_sms_from"]
    for gpu, sms in (("A100-80GB", 108), ("B200", 148), ("rtx4090", 128)):
        p = pool(gpu=gpu)  # the same memory: only the buffer differs (no graph-ceiling change below 512 sizes)
        assert p.inputs["num_sms"] == sms, gpu
        assert p.kept_bytes - base.kept_bytes == (sms - 132) * row, gpu
        assert p.available_bytes - base.available_bytes == (132 - sms) * row, gpu
    # fewer rows than SMs: the rows bound it, whatever the GPU
    assert pool(gpu="A100-80GB", max_num_seqs=64).kept_bytes == pool(gpu="B200", max_num_seqs=64).kept_bytes == 64 * row
    # named as CUDA names it (profiles from measurements carry torch's device name)
    assert pool(gpu="NVIDIA A100-SXM4-80GB").inputs["num_sms"] == 108 and pool(gpu="NVIDIA B200").inputs["num_sms"] == 148
    # a device's own count wins over its name; an unknown name gets an H100's and says so
    assert pool(gpu="H100", num_sms=100).inputs["num_sms"] == 100
    unknown = pool(gpu="NVIDIA Tesla T4")
    assert unknown.inputs["num_sms"] == 132 and "not in sim/hardware/specs/gpus.json" in unknown.inputs["num_sms_from"]


def test_every_gpu_spec_names_its_sm_count_and_source():
    for name, spec in roofline.spec_table("gpus.json")["gpus"].items():
        assert isinstance(spec["sms"], int) and 60 < spec["sms"] < 200, name
        assert "SM" in spec["sources"]["sms"], name
