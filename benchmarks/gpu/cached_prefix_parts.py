"""Where the time of a chunk after a cached prefix goes in calibrate/torch_model.py's cuDNN path,
one layer of Llama-3.1-8B heads (32 q, 8 KV, 128), bf16, CUDA events, median of 20: the two
cuDNN calls with and without their log-sum-exp, the merge, and the reference probes' call
(SDPA over the prefix, no log-sum-exp). Prints one JSON object; run on the GPU machine:
  python benchmarks/gpu/cached_prefix_parts.py > cached_prefix_parts.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu.attention_variants import timed  # noqa: E402
from calibrate.torch_model import merge_by_lse  # noqa: E402

H, KV, D = 32, 8, 128
cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention


def merge_float32_steps(o1, lse1, o2, lse2):
    """The merge as calibrate/torch_model.py first wrote it: eight float32 passes."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = (lse1 - m).exp().unsqueeze(-1), (lse2 - m).exp().unsqueeze(-1)
    return ((o1.float() * w1 + o2.float() * w2) / (w1 + w2)).to(o1.dtype)


def main():
    rows = []
    rnd = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    for n, k in [(512, 16000), (2000, 8000), (512, 4000), (8000, 24000)]:
        q = rnd(n, H, D).transpose(0, 1).unsqueeze(0)  # [1, H, n, D] as the model's views are
        kc, vc = rnd(KV, k + n, D).unsqueeze(0), rnd(KV, k + n, D).unsqueeze(0)  # head-major
        pk, pv, ck, cv = kc[:, :, :k], vc[:, :, :k], kc[:, :, k:], vc[:, :, k:]
        r1, r2 = cudnn(q, pk, pv, None, True, 0.0, False, False), cudnn(q, ck, cv, None, True, 0.0, True, False)
        lse1, lse2 = r1[1].reshape(q.shape[:3]).float(), r2[1].reshape(q.shape[:3]).float()
        qc = q.contiguous()
        parts = {
            "prefix_cudnn_lse": lambda: cudnn(q, pk, pv, None, True, 0.0, False, False),
            "prefix_cudnn_no_lse": lambda: cudnn(q, pk, pv, None, False, 0.0, False, False),
            "prefix_cudnn_lse_q_contiguous": lambda: cudnn(qc, pk, pv, None, True, 0.0, False, False),
            "chunk_cudnn_lse": lambda: cudnn(q, ck, cv, None, True, 0.0, True, False),
            "merge": lambda: merge_by_lse(r1[0], lse1, r2[0], lse2),
            "merge_float32_steps": lambda: merge_float32_steps(r1[0], lse1, r2[0], lse2),
            "reference_prefix_sdpa": lambda: F.scaled_dot_product_attention(q, pk, pv, enable_gqa=True),
            "reference_chunk_sdpa": lambda: F.scaled_dot_product_attention(q, ck, cv, is_causal=True, enable_gqa=True),
        }
        row = {"n": n, "k": k}
        for name, fn in parts.items():
            try:
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                  SDPBackend.EFFICIENT_ATTENTION], set_priority=True):
                    row[name] = timed(fn)
            except Exception as e:  # noqa: BLE001 - a refused call is a finding
                row[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(row)
        print(row, file=sys.stderr)
        torch.cuda.empty_cache()
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
