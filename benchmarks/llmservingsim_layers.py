"""Steps composed from LLMServingSim's per-layer vLLM 0.19.0 measurements on the RTX cards of its held-out runs,
beside the step the table's profile prices; then the attention of decodes beside a prefill chunk against the same
parts alone (what the step model's c6 prices); then each real run's own decode steps against the profile's; then
batches of decodes at different contexts against the same batch at its mean context (the profiler's skew.csv: the step
model prices the sum of contexts, as at the mean; LLMServingSim's own simulator corrects for it). Layers is the
composition benchmarks/measured_kernels.py --layers fits; this script itself keeps nothing.

    python benchmarks/llmservingsim_layers.py --src DIR

DIR is a checkout of https://github.com/casys-kaist/LLMServingSim at benchmarks/server_runs_llmservingsim.py's
COMMIT (profiler/perf/<GPU>/<model>/bf16/tp<N>/: dense.csv, attention.csv, per_sequence.csv: each layer of one
decoder block timed eagerly by vLLM 0.19.0's own modules, dummy weights, at each token count; the attention
per (prefill chunk, its cached context, decode sequences, their context)). A step = the decoder block's layers
x the model's layers + embedding, final norm, LM head and sampler; interpolated linearly between measured
token counts, attention at a measured grid point; at tp 2 each layer as one rank ran it, plus the all-reduces the
layers hold none of (2 a layer, aiconfigurator's measured all-reduce of the run's vLLM release, as the profile takes
it). Compared, per step shape, with the profile benchmarks/server_runs_table.py builds for the run.
Eager per-layer timings carry each kernel's launch; the server ran CUDA graphs: the composed steps are an
upper bound on the device time of a graphed decode step.

The real runs' decode steps (a diagnostic, nothing fitted): bench/examples/<GPU>/<model>/vllm/timeseries.csv counts
each second's generated tokens and running requests; in a second with no prompt tokens (nor in the one before), the
same requests running and as many as the request stamps say are between their first and last token, every step is a
decode of them all: step = running / tokens that second (quantized: a second holds a whole number of steps), priced
by the profile at the stamps' mean context (each request's input + its share of output by then).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402

# (GPU folder, model folder, tp) of each judged run -> its id in benchmarks/data/server_runs.json
RUNS = {("RTX4090", "meta-llama/Llama-3.1-8B", 1): "llmss-rtx4090-tp1-llama3.1-8b-sharegpt",
        ("RTXPRO6000", "meta-llama/Llama-3.1-8B", 1): "llmss-rtxpro6000-tp1-llama3.1-8b-sharegpt",
        ("RTXPRO6000", "Qwen/Qwen3-32B", 2): "llmss-rtxpro6000-tp2-qwen3-32b-sharegpt"}
ENDS = ("embedding", "final_layernorm")  # once a step; every other dense layer once a decoder block, layernorm twice
DECODE = ((1, 1024), (16, 1024), (64, 1024), (128, 1024), (256, 1024), (128, 2048))  # (sequences, context)
MIXED = ((2048, 0, 0), (1024, 0, 64), (512, 1024, 128))  # (prefill chunk, its cached context, decode sequences at 1024)
RATIO_CHUNKS, RATIO_DECODES, RATIO_CTX = (256, 1024), (16, 64, 128), (512, 2048)


class Layers:
    def __init__(self, folder: Path):
        self.folder = folder
        self.dense = pd.read_csv(folder / "dense.csv")
        self.seq = pd.read_csv(folder / "per_sequence.csv")
        self.attn = pd.read_csv(folder / "attention.csv")
        names = [x for x in dict.fromkeys(self.dense["layer"]) if x not in ENDS]
        self.block = names + ["layernorm"]  # the block's input and post-attention norms

    def _at(self, frame: pd.DataFrame, col: str, layer: str, n: int) -> float:
        f = frame[frame["layer"] == layer].sort_values(col)
        return float(np.interp(n, f[col], f["time_us"])) * 1e-6

    def attention(self, chunk: int, cached: int, decodes: int, ctx: int) -> float:
        """The attention of one layer measured at exactly this (chunk, cached, decodes, context)."""
        a = self.attn
        hit = a[(a["prefill_chunk"] == chunk) & (a["kv_prefill"] == cached) & (a["n_decode"] == decodes)
                & (a["kv_decode"] == (ctx if decodes else 0))]
        if hit.empty:
            raise InputError(f"attention.csv has no row of prefill chunk {chunk}, cached {cached}, {decodes} decodes at {ctx}")
        return float(hit["time_us"].iloc[0]) * 1e-6

    def mixed_ratio(self, chunk: int, decodes: int, ctx: int) -> float:
        """One layer's attention of a chunk and decodes in one step over the same chunk alone plus the decodes
        alone: 1 where a decode costs the same beside a chunk as in a decode-only step."""
        return self.attention(chunk, 0, decodes, ctx) / (self.attention(chunk, 0, 0, 0) + self.attention(0, 0, decodes, ctx))

    def step(self, layers: int, chunk: int, cached: int, decodes: int, ctx: int) -> float:
        tokens, seqs = chunk + decodes, decodes + (1 if chunk else 0)
        block = sum(self._at(self.dense, "tokens", x, tokens) for x in self.block) + self.attention(chunk, cached, decodes, ctx)
        ends = sum(self._at(self.dense, "tokens", x, tokens) for x in ENDS)
        return layers * block + ends + sum(self._at(self.seq, "sequences", x, seqs) for x in ("lm_head", "sampler"))


def skewed_decodes(folder: Path) -> dict[str, tuple[int, float, float]]:
    """Per regime of the profiler's skew.csv (`pure`: decodes alone, `mixed`: beside a prefill chunk): (batches, mean,
    90th percentile) of one layer's attention of a batch whose decodes' contexts differ (nb of n at a long context, the
    rest short) over the same batch at its mean context, every decode alike (what a step model pricing the sum of
    contexts prices); {} where the profiler measured none."""
    path = folder / "skew.csv"
    if not path.is_file():
        return {}
    s = pd.read_csv(path)
    out = {}
    for regime, g in s.groupby("regime"):
        r = (g["t_skew_us"] / g["t_mean_us"]).to_numpy()
        out[str(regime)] = (len(r), float(r.mean()), float(np.percentile(r, 90)))
    return out


def decode_seconds(run_dir: Path, step) -> list[tuple[int, float, float]]:
    """(running, real step s, profile step s) of each pure-decode second of a real run (the module's docstring);
    step(n, ctx) prices a decode of n requests at mean context ctx."""
    ts = pd.read_csv(run_dir / "timeseries.csv")
    reqs = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines() if x.strip()]
    t0 = min(r["queued_ts"] for r in reqs)
    out = []
    for prev, now in zip(ts.itertuples(), ts.iloc[1:].itertuples()):
        if prev.prompt_throughput or now.prompt_throughput or prev.running != now.running or not now.gen_throughput:
            continue
        t = t0 + now.t - 0.5  # mid-second
        ctx = [r["input_toks"] + r["output_toks"] * (t - r["first_token_ts"]) / max(r["last_token_ts"] - r["first_token_ts"], 1e-9)
               for r in reqs if r["first_token_ts"] <= t <= r["last_token_ts"]]
        if len(ctx) == now.running and now.running >= 8:
            out.append((int(now.running), now.running / now.gen_throughput, step(int(now.running), float(np.mean(ctx)))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="a checkout of casys-kaist/LLMServingSim")
    args = ap.parse_args(argv)
    from benchmarks import server_runs_table as srt
    from sim.hardware import measured_kernels as mk
    from sim.hardware.profile import load_profile, step_features
    from sim.hardware.roofline import find_model

    data = srt.load_data(srt.DATA)
    runs = {r["id"]: r for r in data["runs"]}
    ratios, decodes = {}, {}
    lines = ["| run | profile | step | LLMServingSim's layers composed (+ all-reduce at tp > 1) (ms) | profile (ms) | profile / layers |",
             "|---|---|---|---:|---:|---:|"]
    try:
        for (gpu, model, tp), rid in RUNS.items():
            folder = Path(args.src) / "profiler" / "perf" / gpu / model / "bf16" / f"tp{tp}"
            if not (folder / "dense.csv").is_file():
                raise InputError(f"--src {args.src}: no profiler/perf/{gpu}/{model}/bf16/tp{tp}/dense.csv")
            if rid not in runs:
                raise InputError(f"benchmarks/data/server_runs.json has no run {rid}")
            lay = ratios[rid] = Layers(folder)
            run = runs[rid]
            with tempfile.TemporaryDirectory() as tmp:
                path, which, _ = srt.build_profile(data, run, "engine", Path(tmp))
                prof = load_profile(path)
            shape = srt.model_spec(data, run["model"]) or find_model(run["model"])[1]
            n_layers = shape["num_layers"]
            ar = mk.collective(run["gpu"], "all_reduce", tp, run["vllm_version"]) if tp > 1 else None
            shapes = [(0, 0, b, k) for b, k in DECODE] + [(c, cached, b, 1024) for c, cached, b in MIXED]
            for chunk, cached, b, k in shapes:
                chunks = [(1, k)] * b + ([(chunk, cached + chunk)] if chunk else [])
                ours = prof.step.time(*step_features(chunks))
                theirs = lay.step(n_layers, chunk, cached, b, k)
                if ar:
                    theirs += 2 * n_layers * (ar["latency_s"] + (chunk + b) * shape["hidden_size"] * 2 / (ar["GBps"] * 1e9))
                what = (f"decode {b} x {k}" if not chunk else
                        f"chunk {chunk}{f' after {cached} cached' if cached else ''}{f' + decode {b} x {k}' if b else ''}")
                lines.append(f"| {rid} | {which} | {what} | {theirs * 1e3:.2f} | {ours * 1e3:.2f} | {ours / theirs:.2f} |")
            run_dir = Path(args.src) / "bench" / "examples" / gpu / model.split("/")[-1] / "vllm"
            if not (run_dir / "timeseries.csv").is_file():
                raise InputError(f"--src {args.src}: no bench/examples/{gpu}/{model.split('/')[-1]}/vllm/timeseries.csv")
            decodes[rid] = decode_seconds(run_dir, lambda n, k: prof.step.time(*step_features([(1, round(k))] * n)))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print("\nAttention of a prefill chunk and decodes in one step over the chunk alone + the decodes alone (one layer, "
          "the same measurements; 1.00: a decode costs beside a chunk what it costs in a decode-only step, as the step "
          "model and aiconfigurator's composed steps price it):\n")
    print("| run | " + " | ".join(f"chunk {c} + {b} x {k}" for c in RATIO_CHUNKS for b in RATIO_DECODES for k in RATIO_CTX) + " |")
    print("|---|" + "---:|" * (len(RATIO_CHUNKS) * len(RATIO_DECODES) * len(RATIO_CTX)))
    for rid, lay in ratios.items():
        print(f"| {rid} | " + " | ".join(f"{lay.mixed_ratio(c, b, k):.2f}" for c in RATIO_CHUNKS for b in RATIO_DECODES
                                        for k in RATIO_CTX) + " |")
    print("\nEach real run's pure-decode seconds (a second of decode steps only: the docstring) against the profile's "
          "decode step of as many requests at their mean context:\n")
    print("| run | seconds | requests running | real step (ms, mean) | profile / real: mean | min | max |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for rid, rows in decodes.items():
        if not rows:
            print(f"| {rid} | 0 | - | - | - | - | - |")
            continue
        r = [sim / real for _, real, sim in rows]
        print(f"| {rid} | {len(rows)} | {min(n for n, _, _ in rows)}-{max(n for n, _, _ in rows)} | "
              f"{np.mean([real for _, real, _ in rows]) * 1e3:.1f} | {np.mean(r):.3f} | {min(r):.2f} | {max(r):.2f} |")
    print("\nDecodes of different contexts in one batch (the profiler's skew.csv, one layer's attention): the batch over "
          "the same batch at its mean context, as the step model prices it (the sum of contexts):\n")
    print("| run | decodes alone: batches | mean | p90 | beside a chunk: batches | mean | p90 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for rid, lay in ratios.items():
        sk = skewed_decodes(lay.folder)
        cells = [f"{sk[k][0]} | {sk[k][1]:.3f} | {sk[k][2]:.3f}" if k in sk else "0 | - | -" for k in ("pure", "mixed")]
        print(f"| {rid} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
