"""What aiconfigurator's prefill step is made of, op by op, beside the project's measured probe steps.

    python benchmarks/prefill_terms.py [--gpu H100] [--model llama3.1-8b] [--tp 1] [--n 1000,2000,4000,8000]

Needs the optional extra (aiconfigurator-core). For a fresh prefill of n tokens, one sequence:
aiconfigurator's per-op times (its vLLM database; GEMMs, attention with its rotary and KV-cache
write extras, elementwise ops by its memory-op formula, logits of the last token), then the terms
vLLM runs that it leaves out or under-prices, each by its own memory-op formula (bytes / (mem_bw x
mem_bw_empirical_scaling_factor) + its constant): the rotary and KV-cache write of the other n - 1
tokens (sim/hardware/check.py aic_token_extras_s; it prices them for one token) and the final
RMSNorm over the n tokens (not in its op list). Where the GPU has a shipped probe file
(sim/hardware/measurements/), the measured step and what is left per token and layer, and the GEMMs'
throughput both ways: aiconfigurator's, and the probe's if everything but its GEMMs costs what
aiconfigurator says (benchmarks/gpu/gemm_power.py measures why they differ: the values multiplied,
the duty). A diagnostic: it changes no profile.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402
from sim.hardware import check as pc  # noqa: E402
from sim.hardware import roofline  # noqa: E402

PROBES = {"H100": "h100", "H200": "h200"}  # sim/hardware/measurements/<dir>/<model>-shape-torch-probes.json
# the probes' own attention call (Llama-3.1-8B heads) timed alone on the same GPU model and torch: its "reference"
PROBE_ATTENTION = {("H100", "llama3.1-8b"): "benchmarks/gpu/h100-2026-11-26-lerp-merge/attention.json"}
GROUPS = (("GEMMs (qkv, o, gate-up, down)", ("qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm")),
          ("attention (its table + extras)", ("attention",)),
          ("add+RMSNorm x2, SiLU-mul", ("add_norm_1", "add_norm_2", "act_gate")),
          ("embedding, logits (1 token)", ("embedding", "logits_gemm")),
          ("all-reduce, p2p", ("embedding_ar", "ar_1", "ar_2", "p2p")))
CONSTANT_S = 3e-6  # its mem_empirical_constant_latency (every system file of 0.12.0)


def final_norm_s(shape: dict, tokens: int, mem_bw: float) -> float:
    """vLLM's last add+RMSNorm over every token of the step (before the logits pick the last one),
    by aiconfigurator's byte count for its add_norm ops (2h in, 2h out, bf16)."""
    return 4 * shape["hidden_size"] * 2 * tokens / mem_bw + CONSTANT_S


def gemm_flops(shape: dict, tp: int, tokens: int) -> float:
    """Floating-point operations of a dense layer stack's four GEMMs (qkv, o, gate-up, down) for `tokens`
    tokens on one GPU of `tp`."""
    h, hd = shape["hidden_size"], shape["head_dim"]
    q = shape["num_attention_heads"] * hd
    kv = max(shape["num_kv_heads"] // tp, 1) * hd * tp  # KV heads replicated below one a GPU
    per_token = h * (q + 2 * kv) + q * h + 3 * h * shape["intermediate_size"]
    return 2 * tokens * shape["num_layers"] * per_token / tp


def terms(gpu: str, model: str, tp: int, ns: list[int]) -> list[dict]:
    from sim.hardware.profile import parse_profile

    engine, perf_database, utils = pc._aic()
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    raw, _ = roofline.roofline_profile(gpu, model, tp)
    prof = parse_profile(raw, f"{model}-{gpu}-tp{tp}")
    system = pc.aic_system(str(raw["device"]))
    version = perf_database.get_latest_database_version(system, pc.AIC_BACKEND)
    h = engine.EngineHandle.compile(pc.aic_model(prof.model, utils), system, pc.AIC_BACKEND, backend_version=version,
                                    tp_size=tp, moe_tp_size=tp, kvcache_quant_mode="bfloat16", fmha_quant_mode="bfloat16")
    shape, bw = pc.model_shape(prof.model), pc.aic_mem_bw(system)
    probes = {}
    if tp == 1 and gpu in PROBES:
        f = ROOT / "sim" / "hardware" / "measurements" / PROBES[gpu] / f"{model}-shape-torch-probes.json"
        if f.is_file():
            probes = {p["n"]: p["median_s"] for p in json.loads(f.read_text())["probes"]
                      if p["kind"] == "prefill" and not p.get("k")}
    attn = {}
    if tp == 1 and (gpu, model) in PROBE_ATTENTION:
        attn = {r["n"]: r["reference"]["s"] for r in json.loads((ROOT / PROBE_ATTENTION[gpu, model]).read_text())["rows"]
                if r.get("kind") == "prefill" and "reference" in r}
    rows = []
    for n in ns:
        ops = {name.removeprefix("context_"): ms / 1e3 for name, ms, *_ in h.run_static_per_op(batch_size=1, isl=n, osl=2)[0]}
        row = {"n": n, "groups": {g: sum(ops.get(k, 0.0) for k in keys) for g, keys in GROUPS}}
        row["aic_s"] = h.predict_prefill_latency(1, n, 0) / 1e3
        row["extras_s"] = pc.aic_token_extras_s(shape, tp, n, bw)
        row["final_norm_s"] = final_norm_s(shape, n, bw)
        row["probe_s"] = probes.get(n)
        row["probe_attention_s"] = attn[n] * shape["num_layers"] if n in attn else None
        row["gemm_flops"] = None if prof.model.get("moe") else gemm_flops(shape, tp, n)
        rows.append(row)
    return rows


def table(gpu: str, model: str, tp: int, rows: list[dict]) -> str:
    ns = [r["n"] for r in rows]
    head = f"| {gpu} x{tp} {model}, fresh prefill (ms) | " + " | ".join(f"n = {n}" for n in ns) + " |"
    out = [head, "|---|" + "---:|" * len(ns)]

    def line(label, vals):
        out.append(f"| {label} | " + " | ".join(vals) + " |")

    for g, _ in GROUPS:
        line(g, [f"{r['groups'][g] * 1e3:.2f}" for r in rows])
    line("**aiconfigurator's step**", [f"**{r['aic_s'] * 1e3:.2f}**" for r in rows])
    line("left out: rotary + KV write of n - 1 tokens",
         [f"{r['extras_s'] * 1e3:.2f} ({r['extras_s'] / r['aic_s']:+.1%})" for r in rows])
    line("left out: final add+RMSNorm", [f"{r['final_norm_s'] * 1e3:.3f} ({r['final_norm_s'] / r['aic_s']:+.2%})" for r in rows])
    if any(r["probe_s"] for r in rows):
        layers = roofline.find_model(model)[1]["num_layers"]
        line("measured probe step (torch eager)", [f"{r['probe_s'] * 1e3:.2f}" if r["probe_s"] else "-" for r in rows])
        line("aiconfigurator vs probe, without / with the terms", [
            f"{r['aic_s'] / r['probe_s'] - 1:+.1%} / {(r['aic_s'] + r['extras_s'] + r['final_norm_s']) / r['probe_s'] - 1:+.1%}"
            if r["probe_s"] else "-" for r in rows])
        if any(r["probe_attention_s"] for r in rows):
            line("the probe's attention call timed alone, x layers", [
                f"{r['probe_attention_s'] * 1e3:.2f}" if r["probe_attention_s"] else "-" for r in rows])
        gemms = GROUPS[0][0]
        if rows[0]["gemm_flops"]:
            line("GEMM TFLOPS: aiconfigurator / the probe's, the rest as aiconfigurator's", [
                f"{r['gemm_flops'] / r['groups'][gemms] / 1e12:.0f} / "
                f"{r['gemm_flops'] / (r['probe_s'] - r['aic_s'] - r['extras_s'] - r['final_norm_s'] + r['groups'][gemms]) / 1e12:.0f}"
                if r["probe_s"] else "-" for r in rows])
        line("probe left over per token and layer (ns)", [
            f"{(r['probe_s'] - r['aic_s'] - r['extras_s'] - r['final_norm_s']) / r['n'] / layers * 1e9:.0f}"
            if r["probe_s"] else "-" for r in rows])
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--model", default="llama3.1-8b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--n", default="1000,2000,4000,8000", help="prompt lengths (comma-separated)")
    a = ap.parse_args(argv)
    try:
        ns = [int(x) for x in a.n.split(",")]
    except ValueError:
        print(f"error: --n {a.n!r}: give whole token counts, comma-separated", file=sys.stderr)
        return 2
    if not ns or min(ns) < 1:
        print(f"error: --n {a.n!r}: give token counts of 1 or more", file=sys.stderr)
        return 2
    try:
        rows = terms(a.gpu, a.model, a.tp, ns)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(a.gpu, a.model, a.tp, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
