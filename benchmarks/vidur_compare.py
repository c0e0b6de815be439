"""A peer comparison: Vidur and this simulator on the same work, interleaved, as a ratio.

    python benchmarks/vidur_compare.py --vidur-src DIR [--requests 3000] [--reps 3] [--seed 0]
                                       [--qps 0.4] [--max-num-seqs 128] [--work-dir DIR]
                                       [--write-docs [PAGE]]

Vidur (github.com/microsoft/vidur) is pinned at commit VIDUR_COMMIT below; get it with

    git clone https://github.com/microsoft/vidur && git -C vidur checkout 7d47513363ec447a741ac5e47241580b47724fbf
    python -m pip install -r vidur/requirements.txt

Without `--vidur-src`, or where Vidur cannot be imported, the script prints one line and
exits 0 (CI has no Vidur).

The work, the same on both: N single-turn requests, prompt tokens uniform in [5000, 20000],
output tokens uniform in [100, 300], Poisson arrivals at `--qps` (all drawn once from
`--seed` and written to two files: this project's trace parquet, with the arrivals in
`arrival_s`, and Vidur's trace-replay CSV). One Llama-3-8B-class model on one A100:
this simulator's `llama3.1-8b-a100-80gb` profile under `--policy vllm`; Vidur's
`meta-llama/Meta-Llama-3-8B` on `a100` (its measured profiling data, random-forest
predictor, its defaults) under its `sarathi` scheduler. Both: chunked prefill with an
8,192-token step budget (Vidur: chunk size 8192), block size 16, at most `--max-num-seqs`
running (Vidur: batch_size_cap), the same KV pool (Vidur's num_gpu_blocks set to 24,766 blocks
of 16 tokens, this project's A100 pool when the comparison was first run, kept so runs compare).

Each simulator runs as a whole process (interpreter start, imports, reading its inputs,
the run, its per-request results), alternating A/B rep by rep so machine noise hits both
alike; the headline ratio is the median over reps of each rep's Vidur/agentsim ratio (the
two runs of a rep are adjacent in time, so a load change between reps cancels), with the
ratio of the medians and of the fastest reps beside it. Vidur writes only its request metrics (no plots, no chrome trace, no batch or
utilisation metrics, no wandb); this simulator writes nothing and prints its summary.
Vidur trains its execution-time models and predicts a table of step times on its first
run and caches them (`--work-dir`/vidur_cache): that cold first run is timed separately,
before the reps, which then find the cache warm.

Vidur's attention profile: at the pinned commit `data/profiling/compute/a100/meta-llama/
Meta-Llama-3-8B/attention.csv` is a 9 MB file that some copies lack (a Git LFS pointer, or a
snapshot that left out its largest files). Where it is missing the script writes a stand-in
in Vidur's column format from naive roofline terms of an A100 (attention FLOPs per
query-key pair and KV bytes read per context token, 60% of peak) and
says so in its output and table: the MLP, projection and norm times stay Vidur's measured
ones, but the outcomes are then not Vidur's own prediction. The speed ratio stands either way
(the stand-in is smaller than the real file, so Vidur's cold training is shorter than it
would be).

The simulated outcomes are printed side by side so a reader sees both simulated comparable
work. They will not match: the step models differ (Vidur: per-operator random forests over
measured kernels; this simulator: one roofline-estimated step formula), and so do the
schedulers' details (Sarathi's chunking against vLLM's).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS_PAGE = ROOT / "docs" / "reference" / "results.md"
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
HOW_TO_GET = (f"git clone https://github.com/microsoft/vidur && git -C vidur checkout {VIDUR_COMMIT[:7]} "
              "&& pip install -r vidur/requirements.txt")
PROFILE = "llama3.1-8b-a100-80gb"
VIDUR_MODEL = "meta-llama/Meta-Llama-3-8B"
CHUNK = 8192
BLOCK = 16
NUM_BLOCKS = 24766  # the KV pool of both (see the docstring)
PROMPT = (5000, 20000)
OUTPUT = (100, 300)
OUTCOME_KEYS = ("requests", "mean_e2e_s", "p50_e2e_s", "p99_e2e_s", "mean_ttft_s", "p50_ttft_s", "p99_ttft_s", "makespan_s")
MARK, END = "<!-- vidur_compare -->", "<!-- end vidur_compare -->"

# This simulator's half: runs in a fresh interpreter with this tree first on sys.path; prints one JSON line.
AGENTSIM_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
cfg = SimConfig(workload=WorkloadConfig(trace=sys.argv[2]), policy=PolicyConfig(name="vllm"),
                engine=EngineLimits(profile=sys.argv[3], block_size=int(sys.argv[4]), max_num_batched_tokens=int(sys.argv[5]),
                                    max_num_seqs=int(sys.argv[6]), num_gpu_blocks=int(sys.argv[7]), enable_chunked_prefill=True))
s = execute(build_run(cfg)).summary
print(json.dumps({"requests": s["calls"],
                  "mean_e2e_s": s["mean_e2el_ms"] / 1e3, "p50_e2e_s": s["median_e2el_ms"] / 1e3, "p99_e2e_s": s["p99_e2el_ms"] / 1e3,
                  "mean_ttft_s": s["mean_ttft_ms"] / 1e3, "p50_ttft_s": s["median_ttft_ms"] / 1e3, "p99_ttft_s": s["p99_ttft_ms"] / 1e3,
                  "makespan_s": s["makespan_s"]}))
"""


def workload(n: int, qps: float, seed: int) -> dict[str, np.ndarray]:
    """The requests both simulators get: arrival (s), prompt and output tokens."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / qps, size=n))
    prompt = rng.integers(PROMPT[0], PROMPT[1] + 1, size=n)
    output = rng.integers(OUTPUT[0], OUTPUT[1] + 1, size=n)
    return {"arrival": arrival, "prompt": prompt, "output": output}


def write_agentsim_trace(w: dict, path: Path) -> Path:
    """Single-turn programs in this project's trace schema, the arrivals in arrival_s."""
    import pandas as pd

    from traces.schema import write_trace

    n = len(w["arrival"])
    df = pd.DataFrame({"program_id": [f"r{i:06d}" for i in range(n)], "turn": 0,
                       "new_input_tokens": w["prompt"].astype(np.int64), "output_tokens": w["output"].astype(np.int64),
                       "tool": pd.Series([None] * n, dtype=object), "tool_duration_s": np.nan,
                       "arrival_s": w["arrival"].astype(float)})
    return write_trace(df, path, {"generator": "benchmarks/vidur_compare.py", "source": "uniform prompts/outputs, Poisson arrivals"})


def write_vidur_trace(w: dict, path: Path) -> Path:
    """Vidur's trace-replay CSV: arrived_at, num_prefill_tokens, num_decode_tokens."""
    with open(path, "w") as f:
        f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        for a, p, o in zip(w["arrival"], w["prompt"], w["output"]):
            f.write(f"{float(a)!r},{int(p)},{int(o)}\n")
    return path


def standin_attention(path: Path) -> Path:
    """Vidur's attention.csv for Llama-3-8B (one layer, tp 1, block 16), from the roofline terms
    of this project's A100 profile: prefill attention 4*hidden FLOPs per (query, key) pair per
    layer, decode reads 2*kv_heads*head_dim*2 bytes per context token per layer, at 60% of the
    A100's 312 TFLOP/s and 2.039 TB/s; the KV save writes the new tokens' K and V. Times in ms,
    as Vidur's profiler writes them."""
    hidden, q_heads, kv_heads, head_dim = 4096, 32, 8, 128
    flops, bw = 312e12 * 0.6, 2.039e12 * 0.6
    kv_bytes_per_token = 2 * kv_heads * head_dim * 2
    stats = ("min", "max", "mean", "median", "std")
    ops = ("attn_input_reshape", "attn_kv_cache_save", "attn_prefill", "attn_decode", "attn_output_reshape")
    header = [f"time_stats.{op}.{s}" for op in ops for s in stats] + [
        "n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers", "max_model_len",
        "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill", "attention_backend"]
    rows = []

    def row(batch: int, chunk: int, kv: int) -> None:
        new_tokens = chunk if chunk else batch
        save = new_tokens * kv_bytes_per_token / bw * 1e3
        if chunk:
            pairs = chunk * (kv + (chunk + 1) / 2)
            t = {"attn_kv_cache_save": save, "attn_prefill": 4 * hidden * pairs / flops * 1e3 + 0.01, "attn_decode": 0.0}
        else:
            t = {"attn_kv_cache_save": save, "attn_prefill": 0.0, "attn_decode": batch * kv * kv_bytes_per_token / bw * 1e3 + 0.01}
        vals = []
        for op in ops:
            v = t.get(op, 0.0)
            vals += [v, v, v, v, 0.0]
        rows.append(vals + [hidden, q_heads, kv_heads, BLOCK, 1, 32768, batch, chunk, kv, bool(chunk), "AttentionBackend.FLASHINFER"])

    for chunk in (64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192):
        for kv in range(0, 32768 - chunk + 1, 512):
            row(1, chunk, kv)
    for batch in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256):
        for kv in range(512, 32768 + 1, 512):
            row(batch, 0, kv)
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")
    return path


def vidur_attention(src: Path) -> Path | None:
    """Vidur's own attention profile for the model on a100, or None where this copy lacks it."""
    p = src / "data" / "profiling" / "compute" / "a100" / VIDUR_MODEL / "attention.csv"
    if not p.exists() or p.stat().st_size < 10_000:  # absent, or a Git LFS pointer
        return None
    return p


def vidur_commit(src: Path) -> str:
    r = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else f"{VIDUR_COMMIT[:7]}?"  # an export: the commit cannot be checked


def vidur_usable(src: Path | None) -> str | None:
    """None where Vidur can run from `src`, else why not (one line)."""
    if src is None:
        return "no --vidur-src given"
    if not (src / "vidur" / "main.py").exists():
        return f"{src} holds no vidur/main.py"
    r = subprocess.run([sys.executable, "-c", "import vidur.main"], cwd=src, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(src)})
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"Vidur does not import from {src}: {last}"
    return None


def run_agentsim(trace: Path, max_num_seqs: int) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", AGENTSIM_CHILD, str(ROOT), str(trace), PROFILE, str(BLOCK), str(CHUNK),
                        str(max_num_seqs), str(NUM_BLOCKS)], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"agentsim failed:\n{r.stderr[-3000:]}")
    return wall, json.loads(r.stdout.strip().splitlines()[-1])


def vidur_args(trace: Path, attention: Path | None, out_dir: Path, cache_dir: Path, max_num_seqs: int, max_tokens: int) -> list[str]:
    rf = "--random_forrest_execution_time_predictor_config_"
    args = [
        "--replica_config_device", "a100", "--replica_config_model_name", VIDUR_MODEL,
        "--replica_config_network_device", "a100_pairwise_nvlink",
        "--cluster_config_num_replicas", "1", "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--global_scheduler_config_type", "round_robin",
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace),
        "--trace_request_generator_config_max_tokens", str(max_tokens),
        "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_chunk_size", str(CHUNK),
        "--sarathi_scheduler_config_batch_size_cap", str(max_num_seqs),
        "--sarathi_scheduler_config_block_size", str(BLOCK),
        "--sarathi_scheduler_config_num_blocks", str(NUM_BLOCKS),
        "--execution_time_predictor_config_type", "random_forrest",
        f"{rf}prediction_max_prefill_chunk_size", str(CHUNK),
        f"{rf}prediction_max_batch_size", str(max_num_seqs),
        f"{rf}prediction_max_tokens_per_request", str(max_tokens),
        "--metrics_config_output_dir", str(out_dir), "--metrics_config_cache_dir", str(cache_dir),
        "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
        "--no-metrics_config_store_batch_metrics", "--no-metrics_config_store_utilization_metrics",
    ]
    if attention is not None:
        args += [f"{rf}attention_input_file", str(attention)]
    return args


def vidur_outcome(out_dir: Path, w: dict) -> dict:
    """The run's per-request metrics (request_metrics.csv, in seconds) as the outcome dict."""
    import pandas as pd

    files = sorted(out_dir.glob("*/request_metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise SystemExit(f"Vidur wrote no request_metrics.csv under {out_dir}")
    df = pd.read_csv(files[-1]).sort_values("Request Id")
    e2e, ttft = df["request_e2e_time"].to_numpy(), df["prefill_e2e_time"].to_numpy()
    ids = df["Request Id"].to_numpy(dtype=int)
    finish = w["arrival"][ids] + e2e
    return {"requests": len(df), **_stats("e2e", e2e), **_stats("ttft", ttft), "makespan_s": float(finish.max())}


def _stats(name: str, x: np.ndarray) -> dict:
    return {f"mean_{name}_s": float(np.mean(x)), f"p50_{name}_s": float(np.median(x)), f"p99_{name}_s": float(np.percentile(x, 99))}


def run_vidur(src: Path, args: list[str], out_dir: Path, w: dict) -> tuple[float, dict, str]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "vidur.main", *args], cwd=src, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(src), "WANDB_MODE": "disabled"})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"Vidur failed:\n{r.stderr[-3000:]}")
    return wall, vidur_outcome(out_dir, w), r.stdout + r.stderr


def table(res: dict) -> str:
    """The markdown block --write-docs puts between the markers."""
    a, v = res["agentsim"], res["vidur"]
    ma, mv = statistics.median(a["walls"]), statistics.median(v["walls"])
    paired = statistics.median(x / y for x, y in zip(v["walls"], a["walls"]))  # each rep's two runs are adjacent in time
    lines = [
        f"{res['requests']} requests, prompts {PROMPT[0]}-{PROMPT[1]} tokens, outputs {OUTPUT[0]}-{OUTPUT[1]}, Poisson "
        f"{res['qps']}/s (seed {res['seed']}); one A100, Llama-3-8B class, {CHUNK}-token chunks, block {BLOCK}, "
        f"max {res['max_num_seqs']} seqs, {NUM_BLOCKS} KV blocks; Vidur {res['vidur_commit']}"
        f"{' with a stand-in attention profile (roofline; its own was missing)' if res['standin'] else ''}; "
        f"{res['reps']} interleaved reps, {res['machine']}",
        "",
        "| | agentsim (`vllm`) | Vidur (`sarathi`) |",
        "|---|---|---|",
        f"| whole process s, per rep | {', '.join(f'{x:.2f}' for x in a['walls'])} | {', '.join(f'{x:.2f}' for x in v['walls'])} |",
        f"| whole process s, median | {ma:.2f} | {mv:.2f} |",
        f"| Vidur cold first run s (training its models and predicting its step-time tables, cached after; "
        f"{res['vidur_cold_requests']} requests) | | {res['vidur_cold_s']:.1f} |",
        f"| **ratio Vidur / agentsim**, warm: median of the reps' paired ratios | | **{paired:.1f}x** |",
        f"| ratio of the medians; of the fastest reps | | {mv / ma:.1f}x; {min(v['walls']) / min(a['walls']):.1f}x |",
    ]
    for key, label in (("mean_e2e_s", "E2E mean s"), ("p50_e2e_s", "E2E p50 s"), ("p99_e2e_s", "E2E p99 s"),
                       ("mean_ttft_s", "TTFT mean s"), ("p50_ttft_s", "TTFT p50 s"), ("p99_ttft_s", "TTFT p99 s"),
                       ("makespan_s", "simulated makespan s")):
        lines.append(f"| {label} | {a['outcome'][key]:.2f} | {v['outcome'][key]:.2f} |")
    return "\n".join(lines)


def write_docs(page: Path, block: str) -> None:
    text = page.read_text()
    if MARK not in text or END not in text:
        raise SystemExit(f"{page} has no {MARK} ... {END} markers")
    head, rest = text.split(MARK, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{MARK}\n\n{block}\n\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vidur-src", type=Path, default=None, help=f"a checkout of microsoft/vidur at {VIDUR_COMMIT[:7]}")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--qps", type=float, default=0.4)
    ap.add_argument("--max-num-seqs", type=int, default=128, help="running requests at most, on both (default 128)")
    ap.add_argument("--work-dir", type=Path, default=None, help="traces, Vidur's output and model cache (default: a temp dir)")
    ap.add_argument("--write-docs", nargs="?", const=str(RESULTS_PAGE), default=None, metavar="PAGE",
                    help=f"write the table between {MARK} and {END} in PAGE (default docs/reference/results.md)")
    ap.add_argument("--machine", default=f"{os.cpu_count()}-core machine", help="words for the table's machine")
    a = ap.parse_args(argv)

    why = vidur_usable(a.vidur_src)
    if why is not None:
        print(f"vidur_compare: skipped ({why}); Vidur pinned at {VIDUR_COMMIT[:7]}: {HOW_TO_GET}, then --vidur-src vidur")
        return 0
    src = a.vidur_src.resolve()
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="vidur_compare_"))
    work.mkdir(parents=True, exist_ok=True)
    w = workload(a.requests, a.qps, a.seed)
    max_tokens = -(-(PROMPT[1] + OUTPUT[1]) // 1024) * 1024
    atrace = write_agentsim_trace(w, work / "trace.parquet")
    vtrace = write_vidur_trace(w, work / "vidur_trace.csv")
    attention = vidur_attention(src)
    standin = attention is None
    if standin:
        attention = standin_attention(work / "attention_standin.csv")
        print(f"note: {src} lacks Vidur's own a100/{VIDUR_MODEL}/attention.csv: a roofline stand-in is used "
              f"({attention}); Vidur's outcomes are then not its own prediction")
    commit = vidur_commit(src)
    print(f"Vidur at {commit} (pinned {VIDUR_COMMIT[:7]}{'; not a git checkout, so not checked' if commit.endswith('?') else ''}); "
          f"{a.requests} requests, {a.reps} reps, work dir {work}")
    out_dir, cache_dir = work / "vidur_out", work / "vidur_cache"
    args = vidur_args(vtrace, attention, out_dir, cache_dir, a.max_num_seqs, max_tokens)

    cold_n = a.requests
    cold_s, _, log = run_vidur(src, args, out_dir, w)  # trains and caches its models unless the cache is warm already
    trained = "Trained model" in log or "Predicting execution time" in log
    cold_file = cache_dir / "vidur_compare_cold.json"  # this script's own note beside Vidur's cache
    if trained:
        cold_file.write_text(json.dumps({"cold_s": cold_s, "requests": a.requests}))
        print(f"vidur cold run: {cold_s:.1f} s (trained its models and predicted its step-time tables; cached in {cache_dir})")
    elif cold_file.exists():
        cold = json.loads(cold_file.read_text())
        print(f"vidur first run: {cold_s:.1f} s, cache already warm; the cold run that filled it took {cold['cold_s']:.1f} s "
              f"({cold['requests']} requests)")
        cold_s, cold_n = cold["cold_s"], cold["requests"]
    else:
        print(f"vidur first run: {cold_s:.1f} s, cache already warm (cold time unknown)")
        cold_s = float("nan")

    res = {"requests": a.requests, "qps": a.qps, "seed": a.seed, "reps": a.reps, "max_num_seqs": a.max_num_seqs,
           "vidur_commit": commit if commit.startswith(VIDUR_COMMIT[:7]) else f"{commit[:7]} (pinned {VIDUR_COMMIT[:7]})",
           "standin": standin, "vidur_cold_s": cold_s, "vidur_cold_requests": cold_n, "machine": a.machine,
           "agentsim": {"walls": []}, "vidur": {"walls": []}}
    for rep in range(a.reps):
        for name in ("agentsim", "vidur") if rep % 2 == 0 else ("vidur", "agentsim"):
            if name == "agentsim":
                wall, outcome = run_agentsim(atrace, a.max_num_seqs)
            else:
                wall, outcome, _ = run_vidur(src, args, out_dir, w)
            res[name]["walls"].append(wall)
            res[name]["outcome"] = outcome
            print(f"rep {rep} {name}: {wall:.2f} s")
    block = table(res)
    print(block)
    print("The outcomes differ by design: different step models (Vidur's per-operator random forests over measured "
          "kernels, this simulator's roofline step formula) and schedulers (Sarathi vs vLLM); the wall-time ratio is what compares.")
    if a.write_docs:
        write_docs(Path(a.write_docs), block)
        print(f"wrote {a.write_docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
