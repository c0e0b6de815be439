"""Step-time coefficients and collectives from measured kernels: aiconfigurator's database.

Derive (needs the optional extra, `pip install aiconfigurator-core==0.12.0`):

    python benchmarks/measured_kernels.py --derive [--out sim/hardware/specs/measured_kernels.json] [--gpus G,..] [--models M,..]

(--gpus/--models: only those are derived, replacing their entries in an existing --out file.
--kv-cache-dtype fp8 with --gpus/--models: the steps with vLLM's FP8 KV cache, fitted into each GPU's
kv_fp8_models, which `sim profile roofline --kv-cache-dtype fp8` uses.)

For every GPU of sim/hardware/specs/gpus.json with an `aiconfigurator_system` whose database has
vLLM kernels, every zoo model aiconfigurator ships a config of (sim/hardware/check.py
aic_model), and tp 1, 2, 4, 8 where the model fits and divides: the step times of a grid
of steps (fresh prefill, cached prefill, decode by batch, mixed) as aiconfigurator's engine
composes them from its measured GEMMs, attention, MoE and all-reduce kernels plus the rotary
embedding and KV-cache write of every token of a step with prefill tokens, which aiconfigurator
prices for one token whatever the step (sim/hardware/check.py aiconfigurator_points and
aic_token_extras_s, the same steps as `sim profile check --aiconfigurator`), then the GPU step model of sim/hardware/profile.py
(c0..c5, w, launch, p) fitted on part of the shapes (calibrate/fit.py
fit_gpu_step_model, each kind weighing the same) and judged on the rest, held out by
shape (HELD below). Collectives: vLLM's all-reduce (its custom all-reduce in a CUDA
graph, comm/vllm) and NCCL's all-to-all (comm/nccl) per GPU at 2, 4 and 8 GPUs, each
fitted as latency + bytes / bandwidth over 8 KiB-256 MiB messages.

A GPU aiconfigurator has no data of, from LLMServingSim's per-layer vLLM measurements instead (no extra):

    python benchmarks/measured_kernels.py --layers DIR [--out FILE]

DIR: a checkout of casys-kaist/LLMServingSim (LAYERS below: the GPU, its profiler folder, the models);
each step of LAYER_GRID composed from the layers vLLM 0.19.0 ran on that GPU (benchmarks/
llmservingsim_layers.py Layers: a decoder block's layers times the model's layers, embedding, final
norm, LM head and sampler; attention as measured at the step's exact chunk, cached context, decodes
and their context), fitted and held out by shape as above. Their grid stops at 2,048 tokens a step
and 16,384 of context, so the fit covers those steps (prefill past them is the model's extrapolation).

Tables (from the shipped file; no extra needed):

    python benchmarks/measured_kernels.py [--table heldout|collectives] [--write-docs [PAGE]]

--write-docs puts each table into docs/reference/profiles.md between `<!-- measured_kernels: --table
NAME -->` and `<!-- end measured_kernels -->` (benchmarks/docs_tables.py).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402

from agentsim.errors import InputError  # noqa: E402
from sim.hardware import measured_kernels as mk  # noqa: E402
from sim.hardware import check as pc  # noqa: E402
from sim.hardware import roofline  # noqa: E402
from sim.hardware.kv_pool import release  # noqa: E402

TPS = (1, 2, 4, 8)
# The grid and what is held out of the fit (by shape: a point is held out when one of its
# sizes is in the held-out set of its kind).
PREFILL_N = (128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
CACHED_N, CACHED_K = (128, 512, 1024, 2048, 4096, 8192), (1024, 4096, 8192, 16384, 32768)
DECODE_B = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
DECODE_CTX = (256, 1024, 2048, 4096, 8192, 16384, 32768)
MIXED_N, MIXED_K, MIXED_B, MIXED_CTX = (256, 512, 1024, 2048), (0, 8192), (16, 32, 64, 128, 256), (2048, 8192)
HELD = {"fresh prefill": {"n": {256, 2048, 6144, 16384}},
        "cached prefill": {"n": {512, 4096}, "k": {8192}},
        "decode": {"B": {2, 24, 96, 192}, "ctx": {4096}},
        "mixed": {"n": {1024}, "B": {64}}}
HELD_RULE = ("held out by shape: fresh prefill n in {256, 2048, 6144, 16384}; cached prefill n in {512, 4096} or "
             "k = 8192; decode B in {2, 24, 96, 192} or ctx = 4096; mixed n = 1024 or B = 64")
# The one-token step's extra (sim/hardware/profile.py `single`) is fitted for per-tensor FP8 checkpoints:
# their one-row GEMMs take about twice two rows' time on Blackwell (fitted 0 on Hopper). Block-FP8's one-
# and two-row GEMMs are both slow; a one-token term made its held-out decode B=2-16 worse there (tried).
SINGLE_FOR = "tensor"
COMM_RANGE = (8192, 268435456)  # message bytes the fits cover: a token's hidden state to a 16K-token step's


def grid() -> list[pc.Probe]:
    pts = [pc.Probe("prefill", n=n) for n in PREFILL_N]
    pts += [pc.Probe("prefill", n=n, k=k) for n in CACHED_N for k in CACHED_K]
    pts += [pc.Probe("decode", B=b, ctx=c) for b in DECODE_B for c in DECODE_CTX if b * c <= 256 * 8192]
    pts += [pc.Probe("mixed", n=n, k=k, B=b, ctx=c) for n in MIXED_N for k in MIXED_K for b in MIXED_B for c in MIXED_CTX]
    return pts


def kind(p: pc.Probe) -> str:
    return {"fresh_prefill": "fresh prefill", "cached_prefill": "cached prefill"}.get(p.group, p.group)


def held_out(p: pc.Probe, held: dict = HELD) -> bool:
    return any(getattr(p, f) in vals for f, vals in held[kind(p)].items())


def _rows(points: list[pc.Probe], held: dict = HELD) -> list[dict]:
    from calibrate.fit import FEATURES
    from calibrate.probes import step_row

    out = []
    for p in points:
        k = {"fresh prefill": "prefill", "cached prefill": "cached_prefill"}.get(kind(p), kind(p))
        out.append({"kind": k, "heldout": held_out(p, held), "seconds": p.seconds[pc.STAT], "probe": p,
                    "features": dict(zip(FEATURES, map(float, step_row(p.chunks()))))})
    return out


def step_times(theta, X, share: float, mixed=None, c6: float = 0.0):
    """sim/hardware/profile.py StepModel.time, vectorised: theta = c0..c5, w, launch, p, routed, single; X rows
    of calibrate/fit.py FEATURES (one step each); share = routed_share (top-k / experts); mixed: each step's
    mixed decodes' context, priced c6 a token (None: none)."""
    import numpy as np

    from calibrate.fit import smooth_max

    c, w, launch, p, routed = theta[:6], theta[6], theta[7], theta[8], theta[9]
    single = theta[10] if len(theta) > 10 else 0.0
    steps, tokens, sum_qk, seqs, sum_k, sum_qc = np.asarray(X, float).T
    gemm = smooth_max(np.full(len(tokens), w), c[1] * tokens, p) if w > 0 else c[1] * tokens
    t = c[0] * steps + routed * (1.0 - (1.0 - share) ** tokens) + single * (tokens == 1) + gemm + c[2] * sum_qk \
        + c[3] * seqs + c[4] * sum_k + c[5] * sum_qc
    if c6:
        t = t + c6 * np.asarray(mixed, float)
    if launch > 0:
        t = np.where(tokens > seqs, smooth_max(np.full(len(t), launch), t, p), t)
    return t


NAMES = ("c0", "c1", "c2", "c3", "c4", "c5", "w", "launch", "p", "routed", "single")


def fit_rows(rows: list[dict], share: float | None, starts: int = 6, single: bool = True) -> dict:
    """The GPU step model (+ routed experts for an MoE: share = top-k / experts) fitted by least
    squares on relative error over the training rows, each group of pc.GROUPS (fresh and
    cached prefill, decode by batch, mixed) weighing the same; started from
    calibrate/fit.py fit_gpu_step_model's point and a few perturbed ones. single: fit the
    one-token step's extra (sim/hardware/profile.py `single`; False = the model without it)."""
    import numpy as np
    from scipy.optimize import least_squares

    from calibrate.fit import fit_gpu_step_model

    train = [r for r in rows if not r["heldout"]]
    X = np.array([list(r["features"].values()) for r in train])
    y = np.array([r["seconds"] for r in train])
    groups = [pc._group(r["probe"]) for r in train]
    sw = np.sqrt([len(groups) / len(set(groups)) / groups.count(g) for g in groups])
    base = fit_gpu_step_model(rows, balance_kinds=True)["coef"]
    n = len(NAMES) if single else len(NAMES) - 1  # without the one-token term: exactly the fit before it
    guess = np.array([base[k] for k in NAMES[:9]] + [0.0] * (n - 9))
    if share:
        guess[9] = max(guess[0], y.min() / 4)
    scale = np.where(guess > 0, guess, 0.0)
    floor = {0: y.min(), 1: y.max() / X[:, 1].max(), 2: y.max() / max(X[:, 2].max(), 1), 3: y.min() / 64,
             4: y.max() / max(X[:, 4].max(), 1), 5: y.max() / max(X[:, 5].max(), 1), 6: y.min(), 7: y.min(), 8: 1.0, 9: y.min(),
             10: y.min() / 10}
    scale = np.array([scale[i] if scale[i] > 0 else floor[i] for i in range(n)])
    lo, hi = np.zeros(n), np.full(n, np.inf)
    lo[8], hi[8] = 1.0, 64.0
    if not share:
        hi[9] = 1e-30  # a dense model: no routed term
    lo_x, hi_x = lo / scale, hi / scale

    def resid(x):
        return (step_times(x * scale, X, share or 0.0) / y - 1.0) * sw

    rng = np.random.default_rng(0)
    best = None
    for s in range(starts):
        x0 = guess / scale * (np.exp(rng.normal(0, 0.5, n)) if s else 1.0)
        x0 = np.clip(x0, lo_x + 1e-9, np.minimum(hi_x, 1e9) - 1e-12)
        if not share:
            x0[9] = 0.0
        r = least_squares(resid, x0, bounds=(lo_x, np.maximum(hi_x, lo_x + 1e-30)), x_scale="jac", max_nfev=3000,
                          ftol=1e-12, xtol=1e-12, gtol=1e-12)
        if best is None or r.cost < best.cost:
            best = r
    theta = best.x * scale
    # a term at its bound is off: 0, not 1e-18
    coef = {k: 0.0 if v < 1e-15 else float(f"{v:.6g}") for k, v in zip(NAMES, theta)
            if (k != "routed" or share) and (k != "single" or single)}
    if share:
        coef["routed_share"] = float(f"{share:.6g}")
    return coef


def predict(coef: dict, rows: list[dict]) -> list[float]:
    theta = [coef.get(k, 0.0) for k in NAMES]
    mixed = [r["probe"].features()[5] for r in rows] if coef.get("c6") else None
    return list(map(float, step_times(theta, [list(r["features"].values()) for r in rows], coef.get("routed_share", 0.0),
                                      mixed, coef.get("c6", 0.0))))


def fit_combo(gpu: str, model: str, tp: int, kv_cache_dtype: str = "auto") -> dict | None:
    """aiconfigurator's points for one GPU, model and tp (kv_cache_dtype fp8: its steps with an FP8
    KV cache), with the rotary and KV-cache write of every token of a step, which it prices for one
    (sim/hardware/check.py aic_token_extras_s), the fit and its errors by group; None where the model
    does not fit the GPU at this tp or divide by it."""
    from sim.hardware.profile import parse_profile

    try:
        raw, _ = roofline.roofline_profile(gpu, model, tp, kv_cache_dtype=kv_cache_dtype)
    except InputError:
        return None
    prof = parse_profile(raw, f"{model}-{gpu}-tp{tp}")
    pts, used = pc.aiconfigurator_points(prof, grid())
    rows = _rows(pts)
    spec = roofline.find_model(model)[1]
    moe = spec.get("moe")
    coef = fit_rows(rows, moe["experts_per_token"] / moe["num_experts"] if moe else None, single=spec.get("fp8_scaling") == SINGLE_FOR)
    errs = pc.error_rows(predict(coef, rows), [r["probe"] for r in rows])
    for e, r in zip(errs, rows):
        e["heldout"] = r["heldout"]
    return {"coef": coef, "used": used, "rows": errs}


# LLMServingSim's profiler (profiler/perf/<folder>/<model>/bf16/tp<N>/), per GPU: `steps` fits every coefficient on the
# composed steps (a GPU aiconfigurator has no data of); `c6` adds only the mixed decodes' price to aiconfigurator's fits
# (its composed mixed steps add decode and prefill attention as if apart). max_context: the most context a step of the
# card holds (a 24 GB RTX 4090: 41,408 tokens of Llama-3.1-8B, vLLM 0.19.0's own pool, benchmarks/data/
# vllm_kv_pool_cases.json), so the fit is not bent by steps the card never runs.
LAYERS = {"RTX-4090": {"folder": "RTX4090", "fit": "steps", "max_context": 65536,
                       "models": {"llama3.1-8b": ("meta-llama/Llama-3.1-8B", (1,))}},
          # c6 into aiconfigurator's fits (vLLM 0.24.0), and the steps as the fits of the layers' own release
          "RTX-PRO-6000": {"folder": "RTXPRO6000", "fit": "c6+release", "max_context": 1 << 20,
                           "models": {"llama3.1-8b": ("meta-llama/Llama-3.1-8B", (1, 2)), "qwen3-32b": ("Qwen/Qwen3-32B", (1, 2))}}}
LAYERS_SOURCE = ("LLMServingSim profiler, vLLM {vllm} layers (casys-kaist/LLMServingSim {commit}: one decoder block's "
                 "layers timed eagerly by vLLM's own modules, dummy weights, per token count; attention per chunk, cached "
                 "context, decodes and their context)")
# HELD at the layers' grid, whose batches are powers of 2: decode contexts of 512 held out too, so that every decode
# bucket has held-out steps
LAYER_HELD = {**HELD, "decode": {"B": {2}, "ctx": {512, 4096}}}
LAYER_HELD_RULE = HELD_RULE.replace("decode B in {2, 24, 96, 192} or ctx = 4096", "decode B = 2 or ctx in {512, 4096}")
LAYER_GRID_TEXT = ("fresh prefill 16-2048 tokens, cached prefill 128-2048 over 1K-16K, decode B 1-256 over 256-16K "
                   "tokens, mixed; at most {max_context} tokens of context a step")
C6_TEXT = ("c6 (a mixed step's decodes, per context token): the measured attention of a chunk and decodes in one step less "
           "the chunk's and the decodes' alone, over the training mixed steps' decode context")
# the measured grid: powers of 2 from 16 to 2,048 tokens a step and 16,384 of context
LAYER_PREFILL_N = (16, 32, 64, 128, 256, 512, 1024, 2048)
LAYER_CACHED_N, LAYER_CACHED_K = (128, 512, 1024, 2048), (1024, 4096, 8192, 16384)
LAYER_DECODE_B = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LAYER_DECODE_CTX = (256, 512, 1024, 2048, 4096, 8192, 16384)
LAYER_MIXED_N, LAYER_MIXED_K, LAYER_MIXED_B, LAYER_MIXED_CTX = (256, 512, 1024), (0, 8192), (8, 16, 32, 64, 128), (512, 2048)


def layer_grid(max_context: int) -> list[pc.Probe]:
    """grid()'s kinds at the sizes LLMServingSim measured (a step of at most 2,048 tokens, 255 decodes beside a chunk)
    whose context (every token a step attends over) fits max_context."""
    pts = [pc.Probe("prefill", n=n) for n in LAYER_PREFILL_N]
    pts += [pc.Probe("prefill", n=n, k=k) for n in LAYER_CACHED_N for k in LAYER_CACHED_K if n + k <= max_context]
    pts += [pc.Probe("decode", B=b, ctx=c) for b in LAYER_DECODE_B for c in LAYER_DECODE_CTX if b * c <= max_context]
    pts += [pc.Probe("mixed", n=n, k=k, B=b, ctx=c) for n in LAYER_MIXED_N for k in LAYER_MIXED_K for b in LAYER_MIXED_B
            for c in LAYER_MIXED_CTX if n + b <= 2048 and n + k + b * c <= max_context]
    return pts


def layer_points(lay, layers: int, max_context: int) -> list[pc.Probe]:
    """layer_grid's steps priced by the layers: `lay` a benchmarks/llmservingsim_layers.py Layers."""
    from dataclasses import replace

    return [replace(p, seconds={pc.STAT: lay.step(layers, p.n, p.k, p.B, p.ctx)}) for p in layer_grid(max_context)]


def mixed_c6(lay, layers: int, points: list[pc.Probe], held: dict = LAYER_HELD) -> tuple[float, float]:
    """(c6, its held-out MAPE %): the mixed steps' attention beyond the chunk's and the decodes' alone, summed over the
    training mixed points, over their decodes' context (s per context token), and how far c6 x context misses that
    excess on the held-out mixed points."""
    excess = {p: layers * (lay.attention(p.n, p.k, p.B, p.ctx) - lay.attention(p.n, p.k, 0, 0) - lay.attention(0, 0, p.B, p.ctx))
              for p in points if p.kind == "mixed"}
    train = [p for p in excess if not held_out(p, held)]
    c6 = max(0.0, sum(excess[p] for p in train) / sum(p.B * p.ctx for p in train))
    test = [p for p in excess if held_out(p, held) and excess[p] > 0]
    return float(f"{c6:.6g}"), round(100 * sum(abs(c6 * p.B * p.ctx / excess[p] - 1) for p in test) / max(len(test), 1), 2)


def derive_layers(src: Path, out_path: Path) -> dict:
    """Each GPU of LAYERS from its layers into out_path: in place of its entry (`steps`), or into its fits' c6 and
    as the fits of the layers' vLLM release in the entry's `by_vllm` (`c6+release`; a tp > 1 step of the layers
    holds no all-reduce, which a profile adds as measured for its release)."""
    import yaml

    from benchmarks.llmservingsim_layers import Layers
    from benchmarks.server_runs_llmservingsim import COMMIT

    data = json.loads(out_path.read_text())
    for g, spec in LAYERS.items():
        entry, version = {"models": {}, "collectives": {}}, None
        for m, (repo, tps) in spec["models"].items():
            base = src / "profiler" / "perf" / spec["folder"] / repo / "bf16"
            if not (base / "meta.yaml").is_file():
                raise InputError(f"--layers {src}: no profiler/perf/{spec['folder']}/{repo}/bf16/meta.yaml; give a checkout "
                                 f"of casys-kaist/LLMServingSim at {COMMIT[:7]}")
            version = str(yaml.safe_load((base / "meta.yaml").read_text())["vllm_version"])
            for tp in tps:
                lay, layers = Layers(base / f"tp{tp}"), roofline.find_model(m)[1]["num_layers"]
                points = layer_points(lay, layers, spec["max_context"])
                c6, c6_err = mixed_c6(lay, layers, points)
                print(f"{g} {m} tp{tp}: c6 {c6:.3g} s per mixed decode context token (held out {c6_err}%)", file=sys.stderr)
                if spec["fit"] == "c6+release":
                    fit = data["gpus"][g]["models"].get(m, {}).get(str(tp))
                    if fit is not None:
                        fit["coef"]["c6"] = c6
                        fit["c6"] = {"source": LAYERS_SOURCE.format(vllm=version, commit=COMMIT[:7]), "how": C6_TEXT,
                                     "heldout_mape_pct": c6_err}
                rows = _rows(points, LAYER_HELD)
                mixed = [r["probe"].features()[5] for r in rows]
                # the rest fitted on the steps less the mixed decodes' c6, which is priced apart
                coef = fit_rows([{**r, "seconds": r["seconds"] - c6 * x} for r, x in zip(rows, mixed)], None, single=False)
                coef["c6"] = c6
                errs = pc.error_rows(predict(coef, rows), [r["probe"] for r in rows])
                for e, r in zip(errs, rows):
                    e["heldout"] = r["heldout"]
                sm = _summary(errs)
                entry["models"].setdefault(m, {})[str(tp)] = {"coef": coef, "points": len(rows), "heldout": sm["heldout"],
                                                              "train": {k: v["mape_pct"] for k, v in sm["train"].items()},
                                                              "c6": {"how": C6_TEXT, "heldout_mape_pct": c6_err}}
                print(f"{g} {m} tp{tp}: held-out " + ", ".join(f"{k} {v['mape_pct']:.1f}" for k, v in sm["heldout"].items()),
                      file=sys.stderr, flush=True)
        fitted = {"source": LAYERS_SOURCE.format(vllm=version, commit=COMMIT[:7]), "vllm": version,
                  "grid": LAYER_GRID_TEXT.format(max_context=spec["max_context"]), "held_out": LAYER_HELD_RULE, **entry}
        if spec["fit"] == "steps":
            data["gpus"][g] = fitted
        else:
            fitted.pop("collectives")
            data["gpus"][g]["by_vllm"] = {version: fitted}
    out_path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def _summary(errs: list[dict]) -> dict:
    out = {}
    for part in ("heldout", "train"):
        sel = [e for e in errs if e["heldout"] == (part == "heldout")]
        out[part] = {s["kind"]: {"points": s["points"], "mape_pct": round(s["mape_pct"], 2),
                                 "worst_pct": round(s["worst"]["error_pct"], 2), "worst_point": s["worst"]["point"]}
                     for s in pc.summary(sel)}
    return out


def _fit_link(sizes, secs) -> dict:
    """latency + bytes / bandwidth, least squares on relative error."""
    from calibrate.fit import mape, nnls_relative

    a, inv_bw = nnls_relative([[1.0, s] for s in sizes], secs)
    pred = [a + inv_bw * s for s in sizes]
    return {"latency_s": float(f"{a:.4g}"), "GBps": float(f"{1 / inv_bw / 1e9:.4g}") if inv_bw > 0 else None,
            "fit_mape_pct": round(mape(pred, secs), 1), "messages": len(sizes)}


def collectives(system: str) -> dict:
    """vLLM's all-reduce (graph) and NCCL's all-to-all at 2, 4 and 8 GPUs, fitted on bytes: the
    tables' message_size is an element count (aiconfigurator's comm queries take elements;
    its engine's decode all-reduce of B tokens reads the row of B x hidden), of 2-byte
    bf16 / half elements."""
    import pandas as pd
    from aiconfigurator_core.sdk import perf_database

    root = Path(perf_database.__file__).resolve().parents[1] / "systems" / "data" / system / "comm"
    out = {}

    def latest(d: Path) -> Path | None:
        vs = sorted((v for v in d.iterdir() if v.is_dir()), key=lambda v: release(v.name)) if d.is_dir() else []
        return vs[-1] if vs else None

    def all_reduce(v: Path) -> dict:
        d = pd.read_parquet(v / "custom_allreduce_perf.parquet")
        d = d.assign(nbytes=d.message_size * 2)
        d = d[(d.backend == "vllm_graph") & d.nbytes.between(*COMM_RANGE)]
        ver = str(d.version.iloc[0]) if len(d) else v.name
        return {"source": f"comm/vllm/{v.name}/custom_allreduce_perf.parquet (vLLM {ver}, CUDA graph, bf16; "
                          "message = 2 B x the reduced tensor's elements)",
                **{str(n): _fit_link(g.nbytes.to_numpy(float), (g.latency.to_numpy(float) / 1e3))
                   for n, g in d.groupby("num_gpus")}}

    v = latest(root / "vllm")
    if v is not None and (v / "custom_allreduce_perf.parquet").is_file():
        # each release's own prices a run of that release (vLLM's all-reduce changed between them: RTX PRO
        # 6000 x2, 16 MB: 1.12 ms in 0.19.0, 0.47 in 0.24.0; sim/hardware/measured_kernels.py collective);
        # the latest's is the default
        by = {r.name: all_reduce(r) for r in sorted((r for r in (root / "vllm").iterdir()
                                                     if (r / "custom_allreduce_perf.parquet").is_file()),
                                                    key=lambda r: release(r.name))}
        out["all_reduce"] = {**by[v.name], "vllm": v.name, "by_vllm": by}
    v = latest(root / "nccl")
    if v is not None and (v / "nccl_perf.parquet").is_file():
        d = pd.read_parquet(v / "nccl_perf.parquet")
        d = d.assign(nbytes=d.message_size * 2)
        d = d[(d.op_name == "alltoall") & (d.nccl_dtype == "half") & d.nbytes.between(*COMM_RANGE)]
        if len(d):
            out["all_to_all"] = {"source": f"comm/nccl/{v.name}/nccl_perf.parquet (NCCL {v.name} alltoall, half; "
                                            "message = 2 B x the elements each GPU sends)",
                                 **{str(n): _fit_link(g.nbytes.to_numpy(float), g.latency.to_numpy(float) / 1e3)
                                    for n, g in d.groupby("num_gpus")}}
    return out


def derive(out_path: Path, only_gpus=None, only_models=None, kv_cache_dtype: str = "auto") -> dict:
    """Every GPU and zoo model (or only those given) into out_path; kv_cache_dtype fp8: into each
    GPU's kv_fp8_models table of the existing file instead (needs --gpus or --models), the rest kept."""
    kv_fp8 = kv_cache_dtype == "fp8"
    if kv_fp8 and not out_path.is_file():
        raise InputError(f"--kv-cache-dtype fp8 adds fits to an existing file: {out_path} not found")
    engine, perf_database, utils = pc._aic()
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    supported = perf_database.get_supported_databases()
    gpus = roofline.spec_table("gpus.json")["gpus"]
    models = roofline.spec_table("models.json")["models"]
    data = {"about": mk.ABOUT, "package": f"{pc.AIC_PACKAGE} {pc.AIC_VERSION}", "licence": mk.LICENCE,
            "held_out": HELD_RULE, "fit": "calibrate/fit.py fit_gpu_step_model(balance_kinds=True) on the training points",
            "gpus": {}}
    for g, spec in gpus.items():
        system = spec.get("aiconfigurator_system")
        if not system or (only_gpus and g not in only_gpus):
            continue
        if "vllm" not in supported.get(system, {}):
            print(f"{g}: {system} has no vLLM data", file=sys.stderr)
            continue
        version = perf_database.get_latest_database_version(system, "vllm")
        entry = {"system": system, "vllm": version, "collectives": collectives(system), "models": {}, "missing": {}}
        for m, mspec in models.items():
            if only_models and m not in only_models:
                continue
            try:
                pc.aic_model({**mspec, "name": mspec["hf_repo"]}, utils)
            except InputError:
                entry["missing"][m] = "aiconfigurator ships no config of this model"
                continue
            for tp in TPS:
                try:
                    res = fit_combo(g, m, tp, kv_cache_dtype)
                except InputError as e:
                    entry["missing"][f"{m} tp {tp}"] = str(e)[:200]
                    print(f"{g} {m} tp{tp}: {e}", file=sys.stderr)
                    continue
                if res is None:
                    continue
                s = _summary(res["rows"])
                entry["models"].setdefault(m, {})[str(tp)] = {"coef": res["coef"], "points": len(res["rows"]),
                                                              "heldout": s["heldout"],
                                                              "train": {k: v["mape_pct"] for k, v in s["train"].items()}}
                h = s["heldout"]
                print(f"{g} {m} tp{tp}: held-out " + ", ".join(f"{k} {v['mape_pct']:.1f}" for k, v in h.items()),
                      file=sys.stderr, flush=True)
        data["gpus"][g] = entry
    if kv_fp8:
        data = _with_kv_fp8(json.loads(out_path.read_text()), data)
    elif (only_gpus or only_models) and out_path.is_file():
        data = _merged(json.loads(out_path.read_text()), data, list(gpus), list(models), only_models)
    out_path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def _merged(old: dict, new: dict, gpu_order: list[str], model_order: list[str], only_models) -> dict:
    """The existing file with the GPUs (and, given only_models, just those models) derived anew
    in place of theirs: what a full --derive writes for them, the rest kept."""
    def model_of(key: str) -> str:
        return key.split(" tp ")[0]

    out = {**old, **{k: v for k, v in new.items() if k != "gpus"}, "gpus": {}}
    for g in gpu_order:
        if g not in new["gpus"]:
            if g in old["gpus"]:
                out["gpus"][g] = old["gpus"][g]
            continue
        was, now = old["gpus"].get(g), new["gpus"][g]
        if was is None or not only_models:
            out["gpus"][g] = now
            continue
        fitted = {**{m: v for m, v in was["models"].items() if m not in only_models}, **now["models"]}
        missing = {**{k: v for k, v in was["missing"].items() if model_of(k) not in only_models}, **now["missing"]}
        # what this derive does not make (the GPU's kv_fp8_models) is kept
        out["gpus"][g] = {**was, **now, "models": {m: fitted[m] for m in model_order if m in fitted},
                          "missing": {k: missing[k] for m in model_order for k in missing if model_of(k) == m}}
    return out


def _with_kv_fp8(old: dict, new: dict) -> dict:
    """The existing file with the FP8-KV fits just derived put into each GPU's kv_fp8_models (and
    what could not be fitted into kv_fp8_missing), model by model; the bf16-KV fits untouched."""
    out = {**old, "gpus": {g: dict(d) for g, d in old["gpus"].items()}}
    for g, now in new["gpus"].items():
        if g not in out["gpus"]:
            continue
        d = out["gpus"][g]
        d[mk.KV_FP8_TABLE] = {**d.get(mk.KV_FP8_TABLE, {}), **now["models"]}
        missing = {**d.get("kv_fp8_missing", {}), **now["missing"]}
        if missing:
            d["kv_fp8_missing"] = missing
    return out


# ---- tables from the shipped file ---------------------------------------------------------------

TABLE_KINDS = ("fresh prefill", "cached prefill", "decode B=1", "decode B=2-16", "decode B=17-64", "decode B=65-256",
               "mixed", "all")


def heldout_table(data: dict | None = None) -> str:
    data = data or mk.load()
    # a GPU's fits, then those of measurements of another vLLM release (by_vllm), each a column
    entries = {label: e for g, d in data["gpus"].items()
               for label, e in [(g, d), *((f"{g} vLLM {v}", sub) for v, sub in d.get("by_vllm", {}).items())]}
    gpus = list(entries)
    others = {g: d["source"] for g, d in entries.items() if "source" in d}
    lines = [f"Held-out error of the measured coefficients against {data['package']}'s vLLM kernels"
             + "".join(f" ({g}: against the {src}, `--layers`; its grid: {entries[g]['grid']})" for g, src in others.items())
             + ", per GPU and kind: MAPE over every model and tp fitted (worst model and tp's MAPE), "
             "by `python benchmarks/measured_kernels.py --derive` (table: `--table heldout`):", "",
             "| kind | " + " | ".join(gpus) + " |", "|" + "---|" * (len(gpus) + 1)]
    for k in TABLE_KINDS:
        cells = []
        for g in gpus:
            per = [(mt["heldout"][k]["mape_pct"], mt["heldout"][k]["points"]) for mm in entries[g]["models"].values()
                   for mt in mm.values() if k in mt["heldout"]]
            if not per:
                cells.append("-")
                continue
            pooled = sum(e * n for e, n in per) / sum(n for _, n in per)
            cells.append(f"{pooled:.1f}% ({max(e for e, _ in per):.1f}%)")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    release = {g: "" if g.endswith(d["vllm"]) else f" (vLLM {d['vllm']})" for g, d in entries.items()}
    lines += ["", "Fitted: " + "; ".join(f"{g}{release[g]} {sum(len(mm) for mm in d['models'].values())} "
                                        "model-tp pairs" for g, d in entries.items()) + "."]
    over, cells = {}, 0
    for g, d in entries.items():
        for m, by_tp in d["models"].items():
            for tp, fit in by_tp.items():
                for k in TABLE_KINDS[:-1]:
                    if k in fit["heldout"]:
                        cells += 1
                        if fit["heldout"][k]["mape_pct"] > 10:
                            over.setdefault((g, m, k.replace("decode ", "")), []).append((tp, fit["heldout"][k]["mape_pct"]))
    by_gm = {}
    for (g, m, k), tps in over.items():
        by_gm.setdefault((g, m), []).append(f"{k} (tp {','.join(tp for tp, _ in tps)}: {max(e for _, e in tps):.0f}%)")
    c6 = [(g, m, tp, fit) for g, d in data["gpus"].items() for m, by_tp in d["models"].items() for tp, fit in by_tp.items()
          if fit["coef"].get("c6")]
    if c6:
        lines += ["", "c6, a decode's price per context token beside a prefill chunk (FlashAttention 2's mixed call), from "
                  "LLMServingSim's layers (`--layers`; held-out MAPE of the excess it prices): "
                  + "; ".join(f"{g} {m} tp {tp} {fit['coef']['c6'] * 1e9:.0f} ns ({fit['c6']['heldout_mape_pct']:.0f}%)"
                              for g, m, tp, fit in c6)
                  + ". Elsewhere 0: aiconfigurator composes a mixed step's attention as its parts apart."]
    lines += ["", f"Over 10% held out: {sum(len(v) for v in over.values())} of {cells} model-tp-kind cells: "
              + "; ".join(f"{g} {m} {', '.join(v)}" for (g, m), v in by_gm.items()) + ". " + MISSES]
    return "\n".join(lines)


# why the cells over 10% miss (found by per-op breakdowns of aiconfigurator's steps)
MISSES = ("Why: the measured kernels are not monotone in the batch, which the step model (smooth, monotone) cannot "
          "follow. Block-scaled FP8 GEMMs: on Blackwell (B200, GB200, B300, GB300) 1-2 rows take about 1.5x as long as "
          "4, so decode B=1-16 and mixed miss on the FP8 models; on Hopper 24-48 rows take up to 2x as long as 64 "
          "(Qwen3-32B-FP8's output projection, all layers: 11.2 ms at 48 rows, 5.6 ms at 64), so decode B=17-64 misses. "
          "Per-tensor FP8 GEMMs (Llama-3.1-70B-FP8): on Blackwell 1 row takes about 2x as long as 2 (B200, the tp 2 QKV "
          "projection: 30.2 us at 1 row, 14.4 at 2), which the one-token term (single) prices; some row counts take "
          "about 2x their neighbours (its output projection at 9, 14-16, 48 and 96 rows) and at tp 1 on B200 2 rows "
          "are as slow as 1, so decode B=2-16 still misses there; on Hopper 257-512 rows take about 1.9x as long as 256 "
          "(H100, the tp 2 QKV projection: 60.9 us at 257 rows, 32.0 at 256), so mixed steps of about 320 tokens are up "
          "to 27% dearer than the model. "
          "vLLM's all-reduce on 8 GPUs is slower for 24-64 tokens than for 128 (B200 Qwen3-32B: 26 us per call at 32 "
          "tokens, 18 us at 128), so tp 8 decode B=17-64 misses; on L40S at tp 8 the PCIe all-reduce is most of the "
          "step and bends with size. Not investigated: Qwen3-30B-A3B decode of 2-16 sequences (10-16%), its FP8 "
          "decode B=65-256 on GB200 and GB300 (11-23%) and at tp 8 on RTX PRO 6000 (12%), and GB200 prefill of the "
          "32B and 70B models at tp 1 (10-11%), Llama-3.1-70B-FP8 decode B=17-64 on H200 at tp 1-2 (12%).")


def collectives_table(data: dict | None = None) -> str:
    data = data or mk.load()
    lines = ["Collectives from the same database, fitted as latency + bytes / bandwidth (8 KiB-256 MiB): vLLM's all-reduce "
             "(tp) and NCCL's all-to-all (ep), µs and GB/s, by `python benchmarks/measured_kernels.py --table collectives`:",
             "", "| GPU | all-reduce tp 2 | tp 4 | tp 8 | all-to-all ep 2 | ep 4 | ep 8 | worst fit MAPE |",
             "|---|---|---|---|---|---|---|---|"]
    for g, d in data["gpus"].items():
        if not d["collectives"]:  # a GPU fitted from LLMServingSim's layers: single-GPU steps only
            continue
        cells, worst = [], 0.0
        for op in ("all_reduce", "all_to_all"):
            c = d["collectives"].get(op, {})
            for n in ("2", "4", "8"):
                f = c.get(n)
                cells.append(f"{f['latency_s'] * 1e6:.0f} + {f['GBps']:.3g}" if f and f.get("GBps") else "-")
                worst = max(worst, f["fit_mape_pct"] if f and f.get("GBps") else 0.0)
        lines.append(f"| {g} | " + " | ".join(cells) + f" | {worst:.0f}% |")
    lines += ["", "Sources: vLLM's `custom_allreduce_perf` (latest vLLM version of each GPU's comm data) and NCCL's "
              "`nccl_perf` alltoall; GB200 has no 8-GPU data. "
              "All-reduce per step: 2 per layer of a token's hidden state (bf16); all-to-all: a dispatch and a combine "
              "per MoE layer of each GPU's top-k copies. A profile for a vLLM release (`sim profile roofline` of a "
              "server run's release) takes that release's all-reduce, else the latest measured before it, else the "
              "earliest; where one differs from the latest by more than 10% at 16 MiB:"]
    lines += [""] + [f"- {x}" for x in release_differences(data)]
    return "\n".join(lines)


def release_differences(data: dict) -> list[str]:
    """Per GPU and GPU count, the vLLM releases whose all-reduce of a 16 MiB message (a 1,024-token
    step of an 8,192-wide model) takes 10% more or less than the latest release's."""
    size, out = 16 * 2 ** 20, []
    for g, d in data["gpus"].items():
        ar = d["collectives"].get("all_reduce", {})
        latest = ar.get("vllm")
        for n in ("2", "4", "8"):
            f = ar.get(n)
            if not f or not f.get("GBps"):
                continue
            t0 = f["latency_s"] + size / (f["GBps"] * 1e9)
            diff = [(v, o[n]["latency_s"] + size / (o[n]["GBps"] * 1e9)) for v, o in ar.get("by_vllm", {}).items()
                    if v != latest and o.get(n, {}).get("GBps")]
            diff = [f"{v} {t * 1e6:.0f} us" for v, t in diff if abs(t / t0 - 1) > 0.10]
            if diff:
                out.append(f"{g} x{n}: {latest} {t0 * 1e6:.0f} us; " + ", ".join(diff))
    return out or ["none"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--derive", action="store_true", help="query aiconfigurator and write the coefficients (needs the extra)")
    ap.add_argument("--out", default=str(mk.DATA_FILE))
    ap.add_argument("--collectives-only", action="store_true",
                    help="derive only the collectives, into the existing file (needs the extra)")
    ap.add_argument("--gpus", default=None, help="derive: only these GPUs (comma-separated), in place of theirs in --out")
    ap.add_argument("--models", default=None, help="derive: only these models (comma-separated), in place of theirs in --out")
    ap.add_argument("--kv-cache-dtype", choices=roofline.KV_CACHE_DTYPES, default="auto",
                    help="derive: fp8 fits steps with an FP8 KV cache into each GPU's kv_fp8_models (with --gpus/--models)")
    ap.add_argument("--layers", metavar="DIR", help="fit LAYERS' GPUs from a checkout of casys-kaist/LLMServingSim into --out")
    ap.add_argument("--table", choices=("heldout", "collectives"), default=None, help="one table (default both)")
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "profiles.md"), default=None, metavar="PAGE")
    a = ap.parse_args(argv)
    data = None
    if a.kv_cache_dtype != "auto" and (not a.derive or a.collectives_only):
        print("error: --kv-cache-dtype applies to --derive only", file=sys.stderr)
        return 2
    if a.layers and (a.derive or a.collectives_only or a.gpus or a.models or a.kv_cache_dtype != "auto"):
        print("error: --layers fits LAYERS' GPUs on their own: drop --derive, --collectives-only, --gpus, --models and "
              "--kv-cache-dtype", file=sys.stderr)
        return 2
    if a.layers:
        try:
            data = derive_layers(Path(a.layers), Path(a.out))
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {a.out}", file=sys.stderr)
    elif a.collectives_only:
        data = json.loads(Path(a.out).read_text())
        for d in data["gpus"].values():
            if "system" in d:  # a GPU fitted from LLMServingSim's layers has no aiconfigurator collectives
                d["collectives"] = collectives(d["system"])
        Path(a.out).write_text(json.dumps(data, indent=1) + "\n")
    elif a.derive:
        if a.kv_cache_dtype == "fp8" and not (a.gpus or a.models):
            print("error: --kv-cache-dtype fp8 derives into the existing file: give --gpus and/or --models", file=sys.stderr)
            return 2
        try:
            data = derive(Path(a.out), a.gpus and a.gpus.split(","), a.models and a.models.split(","), a.kv_cache_dtype)
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {a.out}", file=sys.stderr)
    elif not Path(a.out).is_file():
        raise SystemExit(f"error: {a.out} not found; derive it with --derive")
    data = data or json.loads(Path(a.out).read_text())
    names = [a.table] if a.table else ["heldout", "collectives"]
    tables = {n: {"heldout": heldout_table, "collectives": collectives_table}[n](data) for n in names}
    print("\n\n".join(tables.values()))
    if a.write_docs:
        for key, body in tables.items():
            write_block(a.write_docs, "measured_kernels", f"--table {key}", body)
        print(f"wrote {a.write_docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
