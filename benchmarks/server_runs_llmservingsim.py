"""Import the real vLLM 0.19.0 runs on RTX-class GPUs that casys-kaist/LLMServingSim publishes as its
validation examples into benchmarks/data/server_runs.json (runs of source `llmservingsim-bench`,
workload kind `trace`).

    python benchmarks/server_runs_llmservingsim.py --src DIR [--data FILE]

DIR is a checkout of https://github.com/casys-kaist/LLMServingSim at COMMIT (bench/examples/<GPU>/<model>/:
config.json, vllm/meta.json, vllm/requests.jsonl; workloads/<dataset>.jsonl). Each run is vLLM's
AsyncLLM in one process (bench/core/runner.py: no HTTP server), fed a ShareGPT-derived dataset as token
ids at the dataset's arrival offsets, greedy, each output pinned to the dataset's length (min_tokens =
max_tokens, ignore_eos). Taken per run: the engine settings meta.json records (and the block count vLLM
allocated where it records it), each request's arrival at the engine core (queued_ts), prompt and
output tokens, the prompt prefix it shares with an earlier request (from the dataset's token ids: the
prefix cache is on, and ShareGPT's later turns repeat their conversation's earlier prompt), and the
statistics of the measured latencies, engine view (vLLM's RequestStateStats stamps: TTFT and E2E from
queued_ts, as the source's validator takes them; wait, prefill and decode: queued -> scheduled ->
first token -> last). Per-request latencies are not stored, only their statistics.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402
from benchmarks.server_runs_ground_truth import DATA, _stats, _tpot, compact  # noqa: E402

SOURCE = "llmservingsim-bench"
COMMIT = "5daddb21a545658d5150b535712d0494584b5278"  # "Key bench/examples by hardware, and land the RTX 4090 validation"
BASE = f"https://github.com/casys-kaist/LLMServingSim/tree/{COMMIT}/bench/examples"
# example folder -> (our id, GPU of sim/hardware/specs/gpus.json, zoo model)
RUNS = {"RTX4090/Llama-3.1-8B": ("llmss-rtx4090-tp1-llama3.1-8b-sharegpt", "RTX-4090", "llama3.1-8b"),
        "RTXPRO6000/Llama-3.1-8B": ("llmss-rtxpro6000-tp1-llama3.1-8b-sharegpt", "RTX-PRO-6000", "llama3.1-8b"),
        "RTXPRO6000/Qwen3-32B": ("llmss-rtxpro6000-tp2-qwen3-32b-sharegpt", "RTX-PRO-6000", "qwen3-32b")}
SOURCE_ENTRY = {
    "what": "casys-kaist/LLMServingSim bench/examples: real vLLM 0.19.0 runs (AsyncLLM in one process, bench/core/runner.py) "
            "on an RTX 4090 24GB and RTX PRO 6000 96GB cards, 300 ShareGPT requests each sent as token ids at the dataset's "
            "arrival offsets (about 10 a second), greedy, outputs pinned to the dataset's lengths, prefix caching on; "
            "per request vLLM's RequestStateStats stamps (requests.jsonl), the engine's resolved settings (meta.json). "
            "Taken (benchmarks/server_runs_llmservingsim.py): the engine settings, the block count vLLM allocated where "
            "meta.json records it, each request's arrival at the engine core, prompt and output tokens, the prompt prefix "
            "it shares with an earlier request (the dataset's token ids), the statistics of the measured latencies",
    "licence": "casys-kaist/LLMServingSim is MIT; only per-request lengths, arrival times, shared-prefix lengths and statistics "
               "are taken",
    "settings": "vLLM 0.19.0 as meta.json records it: async scheduling on, chunked prefill on, CUDA graphs (compiled), "
                "KV cache dtype auto, bf16; the RTX PRO 6000 runs' meta.json has no resolved config or block count (their "
                "KV pool is derived); the RTX 4090 run logs 2,588 blocks at gpu_memory_utilization 0.9",
}
NOT_JUDGED = {"what": "casys-kaist/LLMServingSim bench/examples/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507 (vLLM 0.19.0, two RTX PRO "
                      "6000, data parallel 2 with expert parallelism)",
              "url": f"{BASE}/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507",
              "why": "two data-parallel engines with their own schedulers and KV pools behind vLLM's DP coordinator, stepping "
                     "in lockstep for the MoE layers: the simulator's `ep` layout is one engine over both GPUs"}
ENGINE_STATS = ("engine: vLLM's RequestStateStats (TTFT and E2E from queued_ts, the request's arrival at the engine core, as "
                "the source's validator takes them; wait, prefill and decode: queued -> first scheduled -> first token -> "
                "last; alone: the requests no other overlapped, the run's first left out); no client: AsyncLLM in process")


def shared_prefixes(prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """Per prompt, (the earlier prompt it shares the longest prefix with, or -1; that prefix's length in
    tokens), exact over the token ids. A trie over the prompts in order: O(total tokens)."""
    root: dict = {}
    of, length = [], []
    for i, p in enumerate(prompts):
        node, best, n = root, -1, 0
        for t in p:
            nxt = node.get(t)
            if nxt is None:
                break
            node, best, n = nxt[1], nxt[0], n + 1
        of.append(best if n else -1)
        length.append(n)
        node = root
        for t in p:
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = [i, {}]
            node = nxt[1]
    return of, length


def _parts(reqs: list[dict]) -> dict:
    """As benchmarks/server_runs_ground_truth.py parts(): wait (queued -> first scheduled), prefill
    (-> first token), decode (-> last token), and, where any, the requests no other overlapped (the
    first left out)."""
    q = np.array([r["queued_ts"] for r in reqs])
    s = np.array([r["scheduled_ts"] for r in reqs])
    f = np.array([r["first_token_ts"] for r in reqs])
    last = np.array([r["last_token_ts"] for r in reqs])
    out = np.array([r["output_toks"] for r in reqs])
    alone = [i for i in range(1, len(reqs)) if not any(j != i and q[j] < last[i] and last[j] > q[i] for j in range(len(reqs)))]
    multi = [i for i in alone if out[i] > 1]
    mean = lambda x: round(float(np.mean(x)) * 1e3, 3) if len(x) else None  # noqa: E731
    parts = {"wait_ms": _stats(s - q), "prefill_ms": _stats(f - s), "decode_ms": _stats(last - f)}
    if alone:
        parts["alone"] = {"requests": alone, "prefill_ms": mean((f - s)[alone]),
                          "decode_per_token_ms": mean([(last[i] - f[i]) / (out[i] - 1) for i in multi]),
                          "handoff_ms": mean((s - q)[alone])}
    return parts


# validation/summary.txt rows (metric, statistic) -> the runs file's peer keys (server_runs_table.peer_key)
SUMMARY_ROWS = {("TTFT", "Mean"): "ttft_mean_pct", ("TTFT", "P99"): "ttft_p99_pct", ("TPOT", "Mean"): "tpot_mean_pct",
                ("Latency", "Mean"): "e2e_mean_pct", ("Latency", "P99"): "e2e_p99_pct"}


def own_errors(path: Path) -> dict:
    """LLMServingSim's own simulator against the run (validation/summary.txt: metric, statistic, vLLM, Sim, Diff%):
    {"ttft_mean_pct": ..., ...}, its signed Diff% (sim - vLLM) / vLLM per SUMMARY_ROWS entry."""
    if not path.is_file():
        raise InputError(f"{path}: missing; the run's folder holds LLMServingSim's validation summary at {COMMIT[:7]}")
    out = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) == 5 and (f[0], f[1]) in SUMMARY_ROWS and f[4].endswith("%"):
            out[SUMMARY_ROWS[(f[0], f[1])]] = float(f[4][:-1])
    if len(out) != len(SUMMARY_ROWS):
        raise InputError(f"{path}: not LLMServingSim's validation summary (rows {', '.join(' '.join(k) for k in SUMMARY_ROWS)})")
    return out


def import_run(src: Path, folder: str) -> dict:
    rid, gpu, model = RUNS[folder]
    ex = src / "bench" / "examples" / folder
    meta = json.loads((ex / "vllm" / "meta.json").read_text())
    reqs = [json.loads(x) for x in (ex / "vllm" / "requests.jsonl").read_text().splitlines() if x.strip()]
    if any(r.get(k) is None for r in reqs for k in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")):
        raise InputError(f"{ex}/vllm/requests.jsonl: a request without vLLM's queued/scheduled/first/last token stamps")
    data = [json.loads(x) for x in (src / meta["dataset_path"]).read_text().splitlines() if x.strip()]
    if [d["input_toks"] for d in data[:len(reqs)]] != [r["input_toks"] for r in reqs]:
        raise InputError(f"{src / meta['dataset_path']}: its prompt lengths are not the run's ({ex}/vllm/requests.jsonl)")
    of, length = shared_prefixes([d["input_tok_ids"] for d in data[:len(reqs)]])
    # bench-i is dataset row i; order by the engine's arrival (ties kept in dataset order)
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i]["queued_ts"], i))
    rank = {i: k for k, i in enumerate(order)}
    ordered = [reqs[i] for i in order]
    q0 = ordered[0]["queued_ts"]
    ttft = [r["first_token_ts"] - r["queued_ts"] for r in ordered]
    e2e = [r["last_token_ts"] - r["queued_ts"] for r in ordered]
    out = [r["output_toks"] for r in ordered]
    k = meta["engine_kwargs"]
    kv = meta.get("kv_cache") or {}
    sched = meta.get("resolved_config", {}).get("scheduler_config", {})
    return {"id": rid, "source": SOURCE, "url": f"{BASE}/{folder}", "gpu": gpu, "tp": int(k["tensor_parallel_size"]), "model": model,
            "served_model": meta["model"], "vllm_version": meta["vllm_version"],
            "engine": {"max_num_seqs": k["max_num_seqs"], "max_num_batched_tokens": k["max_num_batched_tokens"],
                       "max_model_len": k.get("max_model_len"), "gpu_memory_utilization": kv.get("gpu_memory_utilization", 0.9),
                       "num_gpu_blocks": kv.get("num_gpu_blocks"), "kv_cache_dtype": k.get("kv_cache_dtype", "auto"),
                       "async_scheduling": bool(sched.get("async_scheduling", True)), "prefix_caching": True,
                       "enable_chunked_prefill": True,
                       "settings_from": f"{BASE.replace('/tree/', '/blob/')}/{folder}/vllm/meta.json"},
            "workload": {"kind": "trace", "label": f"LLMServingSim {meta['dataset_path'].split('/')[-1]}", "shared_prefix_tokens": 0,
                         "client": "vLLM AsyncLLM in process (LLMServingSim bench/core/runner.py): token-id prompts at the "
                                   "dataset's arrival offsets, greedy, min_tokens = max_tokens = the dataset's output, "
                                   "ignore_eos; arrivals as the engine core stamped them (queued_ts)",
                         "columns": ["arrival_s", "prompt_tokens", "output_tokens", "prefix_of", "prefix_tokens"],
                         "requests": [[round(r["queued_ts"] - q0, 4), r["input_toks"], r["output_toks"],
                                       rank[of[i]] if of[i] >= 0 else -1, length[i]] for r, i in zip(ordered, order)]},
            "measured": {"engine": {"requests": len(ordered), "ttft_ms": _stats(ttft), "tpot_ms": _stats(_tpot(ttft, e2e, out)),
                                    "e2el_ms": _stats(e2e), **_parts(ordered)}},
            "measured_stats": ENGINE_STATS,
            # its own simulator on the same run, from its layers (profiler/perf), as it publishes them
            "peers": [{"stage": -1, "simulator": "llmservingsim", "their_run": folder,
                       "file": f"{BASE.replace('/tree/', '/blob/')}/{folder}/validation/summary.txt",
                       **own_errors(ex / "validation" / "summary.txt")}]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help=f"a checkout of casys-kaist/LLMServingSim at {COMMIT[:7]}")
    ap.add_argument("--data", default=str(DATA), help="the runs file to update (default benchmarks/data/server_runs.json)")
    args = ap.parse_args(argv)
    try:
        src = Path(args.src)
        missing = [f for f in RUNS if not (src / "bench" / "examples" / f / "vllm" / "requests.jsonl").is_file()]
        if missing:
            raise InputError(f"--src {src}: no bench/examples/{missing[0]}/vllm/requests.jsonl; give a checkout of "
                             f"casys-kaist/LLMServingSim at {COMMIT[:7]}")
        runs = [import_run(src, f) for f in RUNS]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = Path(args.data)
    d = json.loads(path.read_text())
    ids = {r["id"] for r in runs}
    d["runs"] = [r for r in d["runs"] if r["id"] not in ids] + runs
    d["sources"][SOURCE] = SOURCE_ENTRY
    d["not_judged"] = [x for x in d["not_judged"] if x["url"] != NOT_JUDGED["url"]] + [NOT_JUDGED]
    path.write_text(compact(json.dumps(d, indent=1) + "\n"))
    for r in runs:
        e = r["measured"]["engine"]
        print(f"{r['id']}: {e['requests']} requests, TTFT mean {e['ttft_ms']['mean']:.0f} ms, E2E mean {e['e2el_ms']['mean']:.0f} ms, "
              f"prefix-shared tokens {sum(x[4] for x in r['workload']['requests'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
