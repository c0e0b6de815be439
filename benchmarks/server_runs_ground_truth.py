"""Import the real vLLM 0.11.0 H100 server runs of inference-sim/inference-sim eval/ground_truth
into benchmarks/data/server_runs.json (runs of source `blis-ground-truth`, workload kind `trace`).

    python benchmarks/server_runs_ground_truth.py --src DIR [--data FILE]

DIR holds the run folders as the source keeps them (eval/ground_truth/<run>/: vllm.log,
exp-config.yaml, profile.yaml, traces.json, and guidellm-results.json where published), e.g. a
checkout of https://github.com/inference-sim/inference-sim at COMMIT. Taken per run: the engine
settings the log's start-up lines state (vLLM's non-default args, the block count vLLM allocated),
each request's arrival at the engine, prompt and output tokens (the OTel `llm_request` spans vLLM
exported), the shared prefix the client's data config states, and the statistics of the measured
latencies: as the engine saw them (the spans: TTFT, E2E, TPOT = (E2E - TTFT) / (output - 1), and
their parts: the wait before the first scheduling, the prefill, the decode) and, where guidellm's
results are published, as the client saw them (its per-request TTFT and latency, TPOT over the
engine's token count). Per-request latencies are not stored, only their statistics, and which
requests ran alone on the engine (`alone`: the step prices without queueing or batching).
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "server_runs.json"
SOURCE = "blis-ground-truth"
COMMIT = "e7a4aa3715982f089bddd0441e85e0a7d1690ec2"  # adds every jan* run's files (vllm.log of f452683f unchanged)
BASE = f"https://github.com/inference-sim/inference-sim/tree/{COMMIT}/eval/ground_truth"
# run folder -> (our id, zoo model); the folder named llama7b-tp1 served CodeLlama-34B (its log and exp-config say so)
RUNS = {"jan20-codellama-prefill-1": ("blis-h100-tp1-codellama34b-prefill-b64", "codellama-34b"),
        "jan20-prefill-llama7b-tp1-1": ("blis-h100-tp1-codellama34b-prefill-b4096", "codellama-34b"),
        "jan20-codellama-train-1": ("blis-h100-tp1-codellama34b-train", "codellama-34b"),
        "jan21-llama7b-train-1": ("blis-h100-tp1-llama2-7b-train", "llama2-7b")}
SOURCE_ENTRY = {
    "what": "inference-sim/inference-sim (BLIS) eval/ground_truth: real vLLM 0.11.0 servers on one H100 80GB (the source's "
            "evaluator runs its simulator with --hardware H100; 'Model loading took' and 'Available KV cache memory' fit an "
            "80 GB card at gpu_memory_utilization 0.9), each a guidellm 0.6.0.dev2 sweep (synchronous, throughput, then "
            "constant rates) of synthetic prompts with ignore_eos, vLLM exporting one OTel llm_request span per request. "
            "Taken (benchmarks/server_runs_ground_truth.py): the engine settings of the log's last start-up, the block count "
            "vLLM allocated ('num_gpu_blocks is'), each request's arrival at the engine, prompt and output tokens, the "
            "client's shared prefix (profile.yaml data.prefix_tokens) and the statistics of the measured latencies",
    "licence": "inference-sim/inference-sim is Apache-2.0; only per-request lengths, arrival times and statistics are taken",
    "settings": "vLLM 0.11.0 defaults where the log's non-default args say nothing: gpu_memory_utilization 0.9, prefix caching "
                "on (the log reports its hit rate), chunked prefill on (logged), async scheduling off, KV cache dtype auto; "
                "TP1 ('world size 1')",
    "client_url": f"{BASE}/jan20-codellama-prefill-1/profile.yaml".replace("/tree/", "/blob/"),
    "settings_url": f"{BASE}/jan20-codellama-prefill-1/vllm.log".replace("/tree/", "/blob/"),
}
NOT_JUDGED = {"what": "inference-sim/inference-sim eval/ground_truth dec11-train-qwen7b-1 and dec17-testsumm-qwen7-1 "
                      "(Qwen2.5-7B-Instruct, vLLM 0.11.0, H100)",
              "url": "https://github.com/inference-sim/inference-sim/tree/d9f61a2d47496c5642395e8795e61e80001a2ab9/eval/ground_truth",
              "why": "only vllm.log is published for them: no per-request data to replay or judge (their KV pool start-up "
                     "lines are usable)"}
STATS = ("mean", "median", "p99")
ENGINE_STATS = ("engine: vLLM's OTel llm_request spans (TTFT and E2E from the request's arrival at the engine; wait, prefill "
                "and decode: arrival -> first scheduled -> first token -> last, from the engine core's stamps; alone: the "
                "requests no other overlapped, the server's first left out); ")


def _stats(x) -> dict:
    x = np.asarray(x, float) * 1e3
    return {"mean": round(float(x.mean()), 3), "median": round(float(np.median(x)), 3),
            "p99": round(float(np.percentile(x, 99)), 3)}


def log_settings(text: str, where: str) -> dict:
    """The last start-up of a vllm.log: version, non-default args, block count, KV pool lines."""
    starts = [m.start() for m in re.finditer(r"vLLM API server version", text)]
    if not starts:
        raise InputError(f"{where}: no 'vLLM API server version' line: not a vLLM server log")
    last = text[starts[-1]:]

    def line(pattern: str, cast=str):
        m = re.search(pattern, last)
        return cast(m.group(1).replace(",", "")) if m else None

    args = ast.literal_eval(re.search(r"non-default args: (\{.*\})", last).group(1))
    return {"version": line(r"vLLM API server version (\S+)"), "args": args,
            "num_gpu_blocks": line(r"num_gpu_blocks is: (\d+)", int),
            "kv_tokens": line(r"GPU KV cache size: ([\d,]+) tokens", int),
            "available_gib": line(r"Available KV cache memory: ([\d.]+) GiB", float),
            "weights_gib": line(r"Model loading took ([\d.]+) GiB", float),
            "flashinfer_sampler": "Using FlashInfer for top-p & top-k sampling" in last}


def spans(path: Path) -> list[dict]:
    """vLLM's OTel llm_request spans (one JSON export per line), by arrival."""
    out = []
    for raw in path.read_text().splitlines():
        if not raw.strip():
            continue
        for rs in json.loads(raw)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    if sp["name"] != "llm_request":
                        continue
                    a = {x["key"]: next(iter(x["value"].values())) for x in sp["attributes"]}
                    out.append({"t": int(sp["startTimeUnixNano"]) / 1e9, "id": a["gen_ai.request.id"],
                                "prompt": int(a["gen_ai.usage.prompt_tokens"]), "out": int(a["gen_ai.usage.completion_tokens"]),
                                "ttft": float(a["gen_ai.latency.time_to_first_token"]), "e2e": float(a["gen_ai.latency.e2e"]),
                                # the engine core's own stamps: queued -> scheduled, scheduled -> first token -> last
                                **{k: float(a[f"gen_ai.latency.time_in_{k}"]) for k in ("queue", "model_prefill", "model_decode")
                                   if f"gen_ai.latency.time_in_{k}" in a}})
    return sorted(out, key=lambda s: s["t"])


def _tpot(ttft, e2e, out) -> np.ndarray:
    ttft, e2e, out = map(np.asarray, (ttft, e2e, out))
    m = out > 1
    return (e2e[m] - ttft[m]) / (out[m] - 1)


PARTS = ("queue", "model_prefill", "model_decode")


def parts(sp: list[dict], where: str) -> dict:
    """The engine's TTFT and E2E in parts, per request: `wait_ms` from the arrival vLLM stamps (the
    API server's, after tokenizing) to the first scheduling = TTFT - prefill (the hand-off to the
    engine core, the wait for the step it runs, the queue; and the first token's way back),
    `prefill_ms` first scheduling -> first token, `decode_ms` first token -> last; and `alone`:
    the requests no other request overlapped (arrival to finish), but the server's first (warm-up:
    Llama-2-7B's took 272 ms against 30-40 ms for its likes), with the means of their prefill,
    decode time per output token after the first, and hand-off (TTFT - queue - prefill)."""
    if any(k not in s for s in sp for k in PARTS):
        raise InputError(f"{where}: an llm_request span without gen_ai.latency.time_in_queue / time_in_model_prefill / "
                         "time_in_model_decode: not vLLM's request spans")
    prefill = [s["model_prefill"] for s in sp]
    alone = [i for i, s in enumerate(sp) if i > 0 and not any(
        j != i and x["t"] < s["t"] + s["e2e"] and x["t"] + x["e2e"] > s["t"] for j, x in enumerate(sp))]
    multi = [i for i in alone if sp[i]["out"] > 1]
    mean = lambda x: round(float(np.mean(x)) * 1e3, 3) if len(x) else None  # noqa: E731
    return {"wait_ms": _stats([s["ttft"] - p for s, p in zip(sp, prefill)]), "prefill_ms": _stats(prefill),
            "decode_ms": _stats([s["model_decode"] for s in sp]),
            "alone": {"requests": alone, "prefill_ms": mean([sp[i]["model_prefill"] for i in alone]),
                      "decode_per_token_ms": mean([sp[i]["model_decode"] / (sp[i]["out"] - 1) for i in multi]),
                      "handoff_ms": mean([sp[i]["ttft"] - sp[i]["queue"] - sp[i]["model_prefill"] for i in alone])}}


def client_stats(path: Path, by_id: dict) -> dict:
    """guidellm's per-request TTFT and latency of the requests the engine traced (matched by id)."""
    g = json.loads(path.read_text())
    ttft, lat, out = [], [], []
    for b in g["benchmarks"]:
        for r in b["requests"]["successful"]:
            s = by_id.get(f"{r['response_id']}-0")
            if s is None:
                continue
            ttft.append(r["time_to_first_token_ms"] / 1e3)
            lat.append(r["request_latency"])
            out.append(s["out"])
    return {"requests": len(ttft), "ttft_ms": _stats(ttft), "tpot_ms": _stats(_tpot(ttft, lat, out)), "e2el_ms": _stats(lat)}


def import_run(folder: Path) -> tuple[dict, dict]:
    """(the run's entry, its KV pool start-up lines)."""
    import yaml

    name = folder.name
    rid, model = RUNS[name]
    log = log_settings((folder / "vllm.log").read_text(errors="replace"), str(folder / "vllm.log"))
    data = yaml.safe_load((folder / "profile.yaml").read_text())["data"]
    a = log["args"]
    sp = spans(folder / "traces.json")
    t0 = sp[0]["t"]
    by_id = {s["id"]: s for s in sp}
    measured = {"engine": {"requests": len(sp), "ttft_ms": _stats([s["ttft"] for s in sp]),
                           "tpot_ms": _stats(_tpot([s["ttft"] for s in sp], [s["e2e"] for s in sp], [s["out"] for s in sp])),
                           "e2el_ms": _stats([s["e2e"] for s in sp]),
                           **parts(sp, str(folder / "traces.json"))}}
    if (folder / "guidellm-results.json").is_file():
        measured["client"] = client_stats(folder / "guidellm-results.json", by_id)
    url = f"{BASE}/{name}"
    run = {"id": rid, "source": SOURCE, "url": url, "gpu": "H100", "tp": 1, "model": model,
           "served_model": a.get("served_model_name", [a.get("model")])[0], "vllm_version": log["version"],
           "engine": {"max_num_seqs": a.get("max_num_seqs", 256), "max_num_batched_tokens": a.get("max_num_batched_tokens"),
                      "max_model_len": a.get("max_model_len"), "gpu_memory_utilization": a.get("gpu_memory_utilization", 0.9),
                      "num_gpu_blocks": log["num_gpu_blocks"], "kv_cache_dtype": a.get("kv_cache_dtype", "auto"),
                      "async_scheduling": bool(a.get("async_scheduling", False)), "prefix_caching": True,
                      "enable_chunked_prefill": True, "settings_from": f"{BASE.replace('/tree/', '/blob/')}/{name}/vllm.log",
                      **({"top_k_top_p": "flashinfer"} if log["flashinfer_sampler"] else {})},
           "workload": {"kind": "trace", "label": f"guidellm sweep {name}", "shared_prefix_tokens": int(data.get("prefix_tokens") or 0),
                        "client": "guidellm 0.6.0.dev2 sweep (synchronous, throughput, constant rates), one request at a time "
                                  "per stream, ignore_eos; arrivals as the engine stamped them",
                        "columns": ["arrival_s", "prompt_tokens", "output_tokens"],
                        "requests": [[round(s["t"] - t0, 4), s["prompt"], s["out"]] for s in sp]},
           "measured": measured,
           "measured_stats": ENGINE_STATS + ("client: guidellm's per-request TTFT and latency" if "client" in measured else
                                             "no client results published")}
    pool = {"case": name, "gpu": "H100", "tp": 1, "model": model, "util": run["engine"]["gpu_memory_utilization"],
            "max_num_batched_tokens": run["engine"]["max_num_batched_tokens"], "kv_tokens": log["kv_tokens"],
            "num_gpu_blocks": log["num_gpu_blocks"], "available_gib": log["available_gib"], "weights_gib": log["weights_gib"],
            "url": f"{BASE.replace('/tree/', '/blob/')}/{name}/vllm.log"}
    return run, pool


def compact(text: str) -> str:
    """The runs file as json.dumps(indent=1) writes it, with each request [arrival, prompt, output]
    (and, where a run has them, [.., prefix_of, prefix_tokens]) and the list of requests that ran
    alone on one line."""
    text = re.sub(r"\[\n\s+(-?[\d.]+),\n\s+(\d+),\n\s+(\d+)(?:,\n\s+(-?\d+),\n\s+(\d+))?\n\s+\]",
                  lambda m: "[" + ", ".join(g for g in m.groups() if g is not None) + "]", text)
    return re.sub(r'"requests": \[\n((?:\s+\d+,?\n)+)\s+\]', lambda m: '"requests": [' + ", ".join(m[1].split()).replace(",,", ",") + "]", text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="the folder holding the run folders (eval/ground_truth)")
    ap.add_argument("--data", default=str(DATA), help="the runs file to update (default benchmarks/data/server_runs.json)")
    args = ap.parse_args(argv)
    try:
        src = Path(args.src)
        missing = [n for n in RUNS if not (src / n / "traces.json").is_file()]
        if missing:
            raise InputError(f"--src {src}: no {missing[0]}/traces.json; give eval/ground_truth of the source")
        out = [import_run(src / n) for n in RUNS]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = Path(args.data)
    d = json.loads(path.read_text())
    ids = {r["id"] for r, _ in out}
    d["runs"] = [r for r in d["runs"] if r["id"] not in ids] + [r for r, _ in out]
    d["sources"][SOURCE] = SOURCE_ENTRY
    d["not_judged"] = [x for x in d["not_judged"] if "eval/ground_truth" not in x["url"]] + [NOT_JUDGED]
    path.write_text(compact(json.dumps(d, indent=1) + "\n"))
    for _, p in out:
        print(json.dumps(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
