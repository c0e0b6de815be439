"""Independent reference timings of MIXED steps (a prefill chunk beside a batch of decodes)
for `sim profile check`, in the shared probe-file format (sim/hardware/check.py).

The shared probe scripts (../shared/measurements/*/probe_shapes.py) time fresh and cached
prefills and decode batches, no mixed step, so a calibrated profile's mixed steps had only
aiconfigurator (kernel time, no launch gaps) to be judged against. This script times them
the way those scripts time a prefill, and none of the calibrator's code runs in it: plain
eager torch with random bf16 weights of the model's shape (its config.json), one step =
the GEMMs over all tokens of the step together, per layer one SDPA call causal over the
chunk (plus one over the chunk's cached prefix, added: a cost stand-in as in the shared
script) and one batched SDPA call of the decodes over their contiguous KV (one layer's KV,
reused by every layer). Eager, as vLLM runs steps of more than 512 tokens; timed with CUDA
events (CPU: the wall clock), the median of REPS runs after one untimed run
(benchmarks/gpu/attention_variants.py timed).

    python benchmarks/gpu/mixed_reference.py MODEL_DIR [--device cuda] [--points aic|quick] > FILE

Points (`aic`, the mixed grid of sim/hardware/check.py AIC_GRID): a 512 or 2,048-token chunk
fresh, or 512 after 8,000 cached, beside 32-256 decodes over 2,048 or 8,192 tokens.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # as a script: the repository root
from benchmarks.gpu.attention_variants import timed  # noqa: E402
from calibrate.torch_model import read_config  # noqa: E402  (the config's shape numbers only)
from sim.hardware.check import AIC_GRID  # noqa: E402

REPS = 5
QUICK = [(64, 0, 4, 32), (64, 48, 8, 64)]  # (n, k, B, ctx): a CPU smoke test


def points(which: str) -> list[tuple[int, int, int, int]]:
    if which == "quick":
        return QUICK
    return [(p.n, p.k, p.B, p.ctx) for p in AIC_GRID if p.kind == "mixed"]


class Model:
    """Random weights of the config's shape, one bf16 (CPU: float32) copy per layer."""

    def __init__(self, cfg, device: str):
        self.c, self.dev = cfg, device
        self.dt = torch.bfloat16 if device == "cuda" else torch.float32
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return torch.randn(*shape, generator=g, device=device, dtype=self.dt) * 0.02

        qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
        self.layers = [(w(cfg.hidden, qkv), w(cfg.heads * cfg.head_dim, cfg.hidden), w(cfg.hidden, 2 * cfg.intermediate),
                        w(cfg.intermediate, cfg.hidden)) for _ in range(cfg.layers)]
        self.norm = torch.ones(cfg.hidden, device=device, dtype=self.dt)
        self.emb, self.lm = w(cfg.vocab, cfg.hidden), w(cfg.hidden, cfg.vocab)

    def step(self, n: int, k: int, b: int, ctx: int):
        """A function that runs one mixed step: chunk of n after k cached, b decodes over ctx."""
        c, dev, dt = self.c, self.dev, self.dt
        hd, nh, nkv = c.head_dim, c.heads, c.kv_heads
        x = self.emb[torch.randint(0, c.vocab, (n + b,), device=dev)]
        pk, pv = (torch.randn(1, nkv, k, hd, device=dev, dtype=dt) for _ in range(2)) if k else (None, None)
        dk, dv = (torch.randn(b, nkv, ctx, hd, device=dev, dtype=dt) for _ in range(2))

        def norm(h):
            return F.rms_norm(h, (c.hidden,), self.norm, 1e-6)

        def run():
            h = x
            for wqkv, wo, wgu, wd in self.layers:
                q, kk, vv = (norm(h) @ wqkv).split([nh * hd, nkv * hd, nkv * hd], -1)
                # the chunk: causal over itself, plus its cached prefix
                cq = q[:n].reshape(n, nh, hd).transpose(0, 1).unsqueeze(0)
                ck = kk[:n].reshape(n, nkv, hd).transpose(0, 1).unsqueeze(0)
                cv = vv[:n].reshape(n, nkv, hd).transpose(0, 1).unsqueeze(0)
                co = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True, enable_gqa=True)
                if k:
                    co = co + F.scaled_dot_product_attention(cq, pk, pv, enable_gqa=True)
                # the decodes: one query each over its context
                do = F.scaled_dot_product_attention(q[n:].reshape(b, nh, 1, hd), dk, dv, enable_gqa=True)
                o = torch.cat([co.squeeze(0).transpose(0, 1).reshape(n, nh * hd), do.reshape(b, nh * hd)])
                h = h + o @ wo
                g, u = (norm(h) @ wgu).split(c.intermediate, -1)
                h = h + (F.silu(g) * u) @ wd
            return norm(h[n - 1:]) @ self.lm  # logits of the chunk's last token and of each decode

        return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", help="a directory with the model's config.json (benchmarks/gpu/models/NAME)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--points", default="aic", choices=["aic", "quick"])
    a = ap.parse_args(argv)
    cfg = read_config(a.model_dir)
    torch.manual_seed(0)
    model = Model(cfg, a.device)
    name = Path(a.model_dir).resolve().name
    out = {"device": torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU", "torch": torch.__version__,
           "model": f"{name} shape, random {'bf16' if a.device == 'cuda' else 'float32'}",
           "how": "benchmarks/gpu/mixed_reference.py: eager torch, one mixed step per point", "probes": []}
    t0 = time.time()
    with torch.inference_mode():
        for n, k, b, ctx in points(a.points):
            med = timed(model.step(n, k, b, ctx), REPS, a.device)
            out["probes"].append({"kind": "mixed", "n": n, "k": k, "B": b, "ctx": ctx, "median_s": med})
            print(f"mixed n={n} k={k} B={b} ctx={ctx}: {med * 1e3:.2f} ms", file=sys.stderr, flush=True)
            if a.device == "cuda":
                torch.cuda.empty_cache()
    out["probe_s"] = round(time.time() - t0, 1)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
