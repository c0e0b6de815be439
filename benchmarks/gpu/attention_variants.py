"""One layer's attention on a CUDA GPU, three ways, at the shapes where the calibrated
profile and the reference probes (../shared/measurements/h200/probe_shapes.py) differed:
  reference  the probes' calls: a causal SDPA over the chunk plus a full SDPA over the
             prefix (contiguous [1, kv_heads, k, d]); decode over contiguous [B, kv_heads, ctx, d]
  sdpa_flash2  calibrate/torch_model.py's per-group SDPA path (lower-right causal mask for a
             chunk after a prefix, a padded batch for decodes), FlashAttention 2 kernels
  cudnn      the same with cuDNN's kernels first, a chunk after a prefix as two merged calls
  varlen     its FlashAttention 2 varlen path: one call for the step, keys read in place
Llama-3.1-8B heads (32 q, 8 KV, 128), bf16; CUDA events, median of 20; the CUDA kernels
each one launched (torch profiler). Prints one JSON object; run on the GPU machine:
  python benchmarks/gpu/attention_variants.py > attention.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from calibrate.torch_model import ModelConfig, TorchLlama  # noqa: E402

CFG = ModelConfig(arch="LlamaForCausalLM", hidden=4096, layers=1, heads=32, kv_heads=8, head_dim=128,
                  intermediate=128, vocab=128, max_positions=40_000)
CACHED = [(2000, 8000), (512, 16000), (4000, 12000), (8000, 24000)]
FRESH = [256, 2000, 8000]
DECODE = [(16, 8192), (64, 2048), (256, 512), (256, 2048)]


def timed(fn, reps=20, device="cuda"):
    """Median seconds of fn() over `reps` runs after one untimed run: CUDA events on a GPU
    (what the kernels take, gaps between launches included), the wall clock on a CPU."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key[:90] for e in prof.key_averages() if e.device_time_total > 0})


def measure(fn):
    try:
        return {"s": timed(fn), "kernels": kernels(fn)}
    except Exception as e:  # noqa: BLE001 - a kernel this torch lacks is a finding, not a failure
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}


def variants(model, spans, lens, capacity, reference):
    cache = model.new_cache(len(spans), capacity)
    cache.fill(lens)
    b = model.prepare(spans, cache)
    q = torch.randn((b.positions.numel(), CFG.heads, CFG.head_dim), device="cuda", dtype=torch.bfloat16)
    out = {"reference": measure(reference)}

    def ours(impl, backends):
        def run():
            model.attention = impl
            with sdpa_kernel(backends, set_priority=True):
                model._attention(q, 0, b, cache)
        return run

    fa2 = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    out["sdpa_flash2"] = measure(ours("sdpa", fa2))
    out["cudnn"] = measure(ours("cudnn", [SDPBackend.CUDNN_ATTENTION] + fa2))  # what the runner allows
    out["varlen"] = measure(ours("flash_varlen", fa2))
    model.attention = "sdpa"
    return out


def main():
    torch.manual_seed(0)
    model = TorchLlama(CFG, "cuda", torch.bfloat16)
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "flash_schema": str(torch.ops.aten._flash_attention_forward.default._schema),
           "check": model.choose_gpu_attention(), "rows": []}
    model.attention = "sdpa"
    d, kv, h = CFG.head_dim, CFG.kv_heads, CFG.heads
    rnd = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    for n, k in CACHED + [(n, 0) for n in FRESH]:
        q, kn, vn = rnd(1, h, n, d), rnd(1, kv, n, d), rnd(1, kv, n, d)
        pk, pv = (rnd(1, kv, k, d), rnd(1, kv, k, d)) if k else (None, None)

        def ref(q=q, kn=kn, vn=vn, pk=pk, pv=pv):
            o = F.scaled_dot_product_attention(q, kn, vn, is_causal=True, enable_gqa=True)
            if pk is not None:
                o = o + F.scaled_dot_product_attention(q, pk, pv, enable_gqa=True)
            return o

        row = {"kind": "cached_prefill" if k else "prefill", "n": n, "k": k}
        row.update(variants(model, [(0, n)], {0: k}, n + k, ref))
        res["rows"].append(row)
        print(row["kind"], n, k, {v: row[v].get("s") for v in row if isinstance(row[v], dict)}, file=sys.stderr)
        torch.cuda.empty_cache()
    for B, ctx in DECODE:
        q, kc, vc = rnd(B, h, 1, d), rnd(B, kv, ctx, d), rnd(B, kv, ctx, d)
        row = {"kind": "decode", "B": B, "ctx": ctx}
        row.update(variants(model, [(i, 1) for i in range(B)], {i: ctx - 1 for i in range(B)}, ctx,
                            lambda q=q, kc=kc, vc=vc: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)))
        res["rows"].append(row)
        print("decode", B, ctx, {v: row[v].get("s") for v in row if isinstance(row[v], dict)}, file=sys.stderr)
        del kc, vc
        torch.cuda.empty_cache()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
