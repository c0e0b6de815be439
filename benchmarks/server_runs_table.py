"""Judge profiles on held-out published runs of real GPU vLLM servers.

    python benchmarks/server_runs_table.py [--data FILE] [--only ID[,ID]] [--quick] [--json FILE] [--write-docs [PAGE]]

For each run of benchmarks/data/server_runs.json: the workload as the source describes it
(a closed loop at the client's fixed concurrency, each request its input and output
tokens, single-turn and independent), the profile `sim profile roofline` would make for
the GPU, tp, model and the run's stated engine settings (vLLM's defaults where the
source states none; the KV pool as sim/hardware/kv_pool.py derives it unless the run
logged its block count), simulated twice: as the engine sees it (the device's steps and vLLM's
engine-core host time per step, benchmarks/host/llama3.1-8b-h100-host.json: added to a
synchronous step, hidden behind an asynchronous one, so in the engine's own stamps either way)
and as a benchmark client sees it (plus the API server's time per request and vLLM's hand-off
to the engine core and back, benchmarks/host/cpu-micro-llama-server.json; both measured on CPUs
here, host_cpu_factor 1). Printed:
each published statistic's error (sim - real) / real, unscaled; nothing is fitted on
these runs. E2E is not published by every source: where a run gives mean TTFT and mean
TPOT only, mean E2E is taken as TTFT + TPOT x (mean n - 1) on both sides (exact for equal
output lengths n; the same identity applied to the simulator's own means).

A run of workload kind `trace` (real vLLM 0.11.0 servers on H100, guidellm sweeps:
benchmarks/server_runs_ground_truth.py imports them; real vLLM 0.19.0 on RTX 4090 and RTX PRO
6000 cards, ShareGPT token ids: benchmarks/server_runs_llmservingsim.py) is replayed request by
request: each request's arrival at the engine, prompt and output tokens and the shared prefix
its client sent (or, given as prefix_of / prefix_tokens columns, the prompt prefix each request
shares with an earlier one: prefix_segments), the engine settings and the block count where the
source states it. Its measured statistics are per view: `engine` from vLLM's own per-request
stamps (TTFT and E2E from the arrival at the engine), `client` from the benchmark client's
results where published; each simulated view
is judged against its own (mean and p99 of TTFT and E2E, mean TPOT), never across views; the
engine view also in parts (render_parts: wait, prefill, decode, and the requests that ran alone),
and, as a diagnostic that changes no profile, replayed with the prices those alone requests show
(what_if). A vLLM release before 0.19 is replayed with its admission rule (a waiting request
admitted when its first chunk fits: sim/hardware/roofline.py full_isl_admission).

A run of workload kind `stages` (real vLLM 0.15.1 servers loaded by inference-perf at constant-rate stages:
benchmarks/server_runs_inference_perf.py imports them) is judged per stage on requests synthesized from its spec,
client view, with issue 50's bounds per GPU (within_bounds).

--quick runs the first two runs at a quarter of their requests (the test's mode; a trace
run given by --only: its first quarter of requests by arrival);
--write-docs puts the table into docs/reference/validation.md (or PAGE) in place of its block
`<!-- server_runs_table: --data ./benchmarks/data/server_runs.json -->`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402
from agentsim.files import read_json  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "server_runs.json"
HOST = ROOT / "benchmarks" / "host" / "llama3.1-8b-h100-host.json"
SERVER = ROOT / "benchmarks" / "host" / "cpu-micro-llama-server.json"
PAGE = ROOT / "docs" / "reference" / "validation.md"
KEY = "--data ./benchmarks/data/server_runs.json"
WAVES = 10  # requests per concurrency slot where the source does not state its prompt count (InferenceMAX's)
COLUMNS = ("run", "GPU x tp", "model", "workload", "profile", "settings", "view", "metric", "real (ms)", "sim (ms)", "error")


def load_data(path: Path) -> dict:
    data = read_json(path, "--data")
    for r in data.get("runs", []):
        src = data.get("sources", {}).get(r.get("source"))
        if src is None or not src.get("licence") or not r.get("url"):
            raise InputError(f"--data {path}: run {r.get('id')!r} names no source with a licence and URL")
        # the requests set no sampling parameters: the served model's generation_config decides (data["sampling"])
        r["sampling"] = data.get("sampling", {}).get(r.get("served_model"), {}).get("mode")
    return data


def sampling_of(run: dict, prof: dict) -> str | None:
    """The mode the run's requests sampled in (load_data) where the profile prices it, else None (not priced):
    the profile holds the mode (top-p where the release sorts for it, sim/hardware/measured_sampler.py) and the
    run's log does not name FlashInfer's top-k/top-p kernel (engine.top_k_top_p), which nothing here measures."""
    mode = run.get("sampling")
    if mode is None or run["engine"].get("top_k_top_p") == "flashinfer":
        return None
    return mode if mode in (prof.get("sampler") or {}).get("modes", {}) else None


def model_spec(data: dict, name: str) -> dict | None:
    """A model of the data file (a zoo model with overrides), or None for a zoo model."""
    m = data.get("models", {}).get(name)
    if m is None:
        return None
    from sim.hardware.roofline import find_model

    _, base = find_model(m["base"])
    return {**base, **{k: v for k, v in m.items() if k != "base"}, "aliases": []}


def engine_args(run: dict) -> dict:
    """roofline_profile's engine settings as the run states them (vLLM's defaults where it does not):
    the memory setting, budget, sequences, max_model_len, KV cache dtype and the release whose
    start-up accounting sizes the pool."""
    e = run["engine"]
    kv = e.get("kv_cache_dtype") or "auto"
    return dict(gpu_memory_utilization=e.get("gpu_memory_utilization") or 0.9, max_num_batched_tokens=e.get("max_num_batched_tokens"),
                max_num_seqs=e.get("max_num_seqs"), max_model_len=e.get("max_model_len"),
                kv_cache_dtype="auto" if kv.startswith("auto") else kv, vllm_version=run.get("vllm_version"))


def build_profile(data: dict, run: dict, view: str, out: Path) -> tuple[str, str, list[str]]:
    """(profile path, which profile, settings notes) for the run."""
    from sim.hardware.roofline import roofline_profile

    spec = model_spec(data, run["model"])
    prof, _ = roofline_profile(run["gpu"], run["model"], tp=run["tp"], measured=True, model_spec=spec, **engine_args(run))
    e = run["engine"]
    unknown = [k for k in ("vllm_version",) if run.get(k) is None] + \
              [k for k in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "num_gpu_blocks") if e.get(k) is None]
    if e.get("num_gpu_blocks"):
        prof["engine"]["num_gpu_blocks"] = int(e["num_gpu_blocks"])
    prof["host"] = json.loads(HOST.read_text())["host"]  # the engine core's: in both views
    if view == "client":
        prof["server"] = json.loads(SERVER.read_text())["server"]
    path = out / f"{run['id']}-{view}.json"
    path.write_text(json.dumps(prof))
    which = "measured" if prof["provenance"].get("source", "").startswith("measured") else "roofline"
    return str(path), which, unknown


def lengths(w: dict, key: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n lengths as the client drew them: uniform whole numbers in [ratio x L, L] (benchmark_serving.py's
    random dataset with --random-range-ratio, the version InferenceMAX ran), or exactly L."""
    L = int(w[key])
    spread = w.get("length_spread")
    if not spread:
        return np.full(n, L, dtype=np.int64)
    return rng.integers(int(L * spread["low_ratio"]), L + 1, size=n).astype(np.int64)


def requests_frame(prompt, output, arrival, **columns) -> pd.DataFrame:
    """One-call programs (no tools), a request each: the trace frame the simulator reads; `columns`
    adds per-request columns (shared_prefix_tokens, segments)."""
    n = len(prompt)
    return pd.DataFrame({"program_id": [f"r{i:06d}" for i in range(n)], "turn": np.zeros(n, dtype=np.int64),
                         "new_input_tokens": np.asarray(prompt, dtype=np.int64), "output_tokens": np.asarray(output, dtype=np.int64),
                         "tool": [None] * n, "tool_duration_s": np.full(n, np.nan), "arrival_s": arrival, **columns})


def prefix_segments(run_id: str, requests: list[list]) -> list[list[dict]]:
    """Content segments (traces/segments.py) of trace requests [arrival, prompt, output, prefix_of,
    prefix_tokens]: request i's first prefix_tokens tokens are request prefix_of's (-1: none), the rest
    its own; so the simulator's prefix cache sees exactly the prompt prefixes the run's requests shared."""
    segs: dict[int, list[dict]] = {}

    def of(i: int) -> list[dict]:
        if i not in segs:
            prompt, parent, shared = int(requests[i][1]), int(requests[i][3]), int(requests[i][4])
            head, left = [], shared if parent >= 0 else 0
            for s in (of(parent) if left else []):
                if left <= 0:
                    break
                head.append({"id": s["id"], "tokens": min(s["tokens"], left)})  # a shorter segment: its prefix
                left -= s["tokens"]
            own = prompt - sum(s["tokens"] for s in head)
            segs[i] = head + ([{"id": f"{run_id}#{i}", "tokens": own}] if own else [])
        return segs[i]

    return [of(i) for i in range(len(requests))]


def trace_of(run: dict, n: int, seed: int = 0) -> pd.DataFrame:
    w = run["workload"]
    if w.get("kind") == "trace":
        req = np.array(w["requests"][:n], dtype=float)
        arrival, prompt, out = req[:, 0], req[:, 1].astype(np.int64), req[:, 2].astype(np.int64)
        shared = {"shared_prefix_tokens": np.minimum(int(w.get("shared_prefix_tokens") or 0), prompt)}
        if "prefix_of" in w["columns"]:
            from traces.segments import objects

            shared["segments"] = objects(prefix_segments(run["id"], w["requests"])[:n])
        return requests_frame(prompt, out, arrival - arrival[0], **shared)
    rng = np.random.default_rng(seed)
    return requests_frame(lengths(w, "input_tokens", n, rng), lengths(w, "output_tokens", n, rng), np.zeros(n))


PROMPT_Q = (("min", 0.0), ("p0.1", 0.001), ("p1", 0.01), ("p5", 0.05), ("p10", 0.1), ("p25", 0.25), ("median", 0.5), ("p75", 0.75),
            ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p99.9", 0.999), ("max", 1.0))


def stage_trace(run: dict, stage: int, n: int | None = None) -> pd.DataFrame:
    """A `stages` run's requests of one stage as its client (inference-perf's shared_prefix data at a
    constant rate) sent them, synthesized, seeded by the workload's seed and the stage: rate x duration
    arrivals at exponential gaps rescaled to sum to the duration (its ConstantLoadTimer); num_groups x
    num_prompts_per_group prompts, a prompt's length the reported prompt_len distribution at its rank
    (the client re-tokenizes the decoded random tokens, so lengths spread around system + question),
    the first system_prompt_len tokens its group's; prompts shuffled and request i sending prompt i mod
    their number (an identical prompt every that many requests: vLLM's prefix cache holds it whole);
    each request output_len tokens (max_tokens, ignore_eos). Only the first n by arrival where given."""
    w = run["workload"]
    st = w["stages"][stage]
    rng = np.random.default_rng([int(w.get("seed", 0)), stage])
    total = int(st["rate"] * st["duration"])
    gaps = rng.exponential(1 / st["rate"], total)
    arrival = np.cumsum(gaps * st["duration"] / gaps.sum())
    per, sys_len = int(w["num_prompts_per_group"]), int(w["system_prompt_len"])
    count = int(w["num_groups"]) * per
    q = [(p, st["prompt_len"][k]) for k, p in PROMPT_Q]
    lengths = np.round(np.interp((np.arange(count) + 0.5) / count, [p for p, _ in q], [v for _, v in q])).astype(np.int64)
    lengths = np.maximum(rng.permutation(lengths), sys_len + 1)  # prompt j: group j // per
    order = rng.permutation(count)
    n = total if n is None else min(n, total)
    idx = order[np.arange(n) % count]
    return requests_frame(lengths[idx], np.full(n, int(w["output_len"])), arrival[:n],
                          shared_prefix_tokens=np.full(n, sys_len, dtype=np.int64),
                          segments=[[{"id": f"sys{j // per}", "tokens": sys_len}, {"id": f"q{j}", "tokens": int(lengths[j]) - sys_len}]
                                    for j in idx])


def replay(run: dict, profile_path: str, view: str, trace: pd.DataFrame):
    """The run simulated on the profile, its sampler priced where sampling_of says: sim.run.simulate's
    Result (summary and per-call rows)."""
    from sim.run.config import EngineLimits, SimConfig, WorkloadConfig, build_run, execute

    w = run["workload"]
    engine = EngineLimits(profile=profile_path, metrics_at=view, async_scheduling=bool(run["engine"].get("async_scheduling")),
                          sampling=sampling_of(run, json.loads(Path(profile_path).read_text())))
    if w["kind"] in ("trace", "stages"):  # open: each request at its recorded (or synthesized) arrival
        cfg = SimConfig(engine=engine)
        return execute(build_run(cfg, trace=trace, arrivals=trace["arrival_s"].to_numpy()))
    if w["kind"] != "closed":
        raise InputError(f"run {run['id']}: workload kind {w['kind']!r} is not rebuilt here (closed or trace)")
    cfg = SimConfig(engine=engine, workload=WorkloadConfig(mode="closed", concurrency=int(w["concurrency"])))
    return execute(build_run(cfg, trace=trace))


def simulate(run: dict, profile_path: str, view: str, trace: pd.DataFrame) -> dict:
    return replay(run, profile_path, view, trace).summary


def sim_parts(res, alone: list[int]) -> dict:
    """The simulated requests' parts as parts() of benchmarks/server_runs_ground_truth.py takes the
    real ones: mean wait (arrival -> first scheduled), prefill (-> first token) and decode (-> last
    token), ms; and over the requests `alone` (indices by arrival) the mean prefill and decode per
    output token after the first."""
    t = res.turns.sort_values("program_id")  # r000000, r000001, ...: by arrival
    wait, prefill, decode = (t["scheduled"] - t["arrival"]).to_numpy(), (t["first_token"] - t["scheduled"]).to_numpy(), \
        (t["finish"] - t["first_token"]).to_numpy()
    a = np.asarray([i for i in alone if i < len(t)], dtype=int)
    n = t["output_tokens"].to_numpy()[a]
    return {"wait": wait.mean() * 1e3, "prefill": prefill.mean() * 1e3, "decode": decode.mean() * 1e3,
            "alone prefill": prefill[a].mean() * 1e3 if len(a) else None,
            "alone computed": float(t["computed_prompt_tokens"].to_numpy()[a].mean()) if len(a) else None,
            "alone decode per token": (decode[a][n > 1] / (n[n > 1] - 1)).mean() * 1e3 if (n > 1).any() else None}


PARTS = (("wait", "wait_ms"), ("prefill", "prefill_ms"), ("decode", "decode_ms"))


def parts_row(run: dict, res, n: int) -> dict | None:
    """Real against simulated parts of a trace run's engine view (None where the data has no parts)."""
    real = run["measured"]["engine"]
    if "wait_ms" not in real:
        return None
    alone = [i for i in real.get("alone", {}).get("requests", []) if i < n]
    sim = sim_parts(res, alone)
    row = {"run": run["id"], "model": run["model"], "requests": n, "alone": len(alone),
           "handoff_ms": real.get("alone", {}).get("handoff_ms"), "e2el_ms": real["e2el_ms"]["mean"]}
    for k, key in PARTS:
        row[k] = (real[key]["mean"], sim[k])
    if alone and n == len(run["workload"]["requests"]):  # the alone means are over every alone request
        row["alone prefill"] = (real["alone"]["prefill_ms"], sim["alone prefill"])
        row["alone computed"] = sim["alone computed"]
        row["alone decode per token"] = (real["alone"]["decode_per_token_ms"], sim["alone decode per token"])
    return row


TRACE_METRICS = (("ttft", "mean"), ("ttft", "p99"), ("tpot", "mean"), ("e2el", "mean"), ("e2el", "p99"))


def trace_rows(data: dict, run: dict, quick: bool, tmp: Path, parts: list | None = None) -> list[dict]:
    """A trace run's rows: per view it has measurements of, each of TRACE_METRICS, sim against real;
    the engine view's parts (parts_row) appended to `parts` where given."""
    w = run["workload"]
    n = len(w["requests"]) if not quick else max(1, len(w["requests"]) // 4)
    trace = trace_of(run, n)
    out = []
    for view, real in run["measured"].items():
        path, which, unknown = build_profile(data, run, view, tmp)
        res = replay(run, path, view, trace)
        s = res.summary
        if view == "engine" and parts is not None:
            row = parts_row(run, res, n)
            if row is not None:
                parts.append(row)
        for m, stat in TRACE_METRICS:
            r, x = real[f"{m}_ms"][stat], s.get(f"{stat}_{m}_ms")
            out.append({"run": run["id"], "gpu": run["gpu"], "tp": run["tp"], "model": run["model"], "label": w.get("label", ""),
                        "concurrency": None, "profile": which, "unknown": unknown, "view": view, "metric": m, "stat": stat,
                        "real_ms": r, "sim_ms": x, "error_pct": (x - r) / r * 100, "requests": n, "kind": "trace",
                        "max_num_batched_tokens": run["engine"]["max_num_batched_tokens"],
                        "shared_prefix_tokens": "by token ids" if "prefix_of" in w["columns"] else int(w.get("shared_prefix_tokens") or 0)})
    return out


STAGE_METRICS = (("ttft", "mean"), ("ttft", "p99"), ("tpot", "mean"), ("e2el", "mean"), ("e2el", "p99"))


def stage_rows(data: dict, run: dict, quick: bool, tmp: Path) -> list[dict]:
    """A `stages` run's rows: per stage, the client view simulated on its synthesized requests
    (stage_trace; --quick: a quarter of them), each of STAGE_METRICS sim against real, on the table's
    profile. TPOT on both sides is (mean E2E - mean TTFT) / (output_len - 1): inference-perf's own
    TPOT counts streamed messages, not tokens (stored, not judged)."""
    w = run["workload"]
    path, which, unknown = build_profile(data, run, "client", tmp)
    out = []
    for i, real in enumerate(run["measured"]["stages"]):
        st = w["stages"][i]
        total = int(st["rate"] * st["duration"])
        trace = stage_trace(run, i, total // 4 if quick else None)
        res = replay(run, path, "client", trace)
        s, c = res.summary, real["client"]
        n1 = int(w["output_len"]) - 1
        sim = {("tpot", "mean"): (s["mean_e2el_ms"] - s["mean_ttft_ms"]) / n1}
        ref = {("tpot", "mean"): (c["e2el_ms"]["mean"] - c["ttft_ms"]["mean"]) / n1}
        for m, stat in STAGE_METRICS:
            r = ref.get((m, stat), c.get(f"{m}_ms", {}).get(stat))
            x = sim.get((m, stat), s.get(f"{stat}_{m}_ms"))
            out.append({"run": run["id"], "gpu": run["gpu"], "tp": run["tp"], "model": run["model"], "label": w["label"],
                        "stage": i, "rate": st["rate"], "concurrency": None, "profile": which, "unknown": unknown, "view": "client",
                        "metric": m, "stat": stat, "real_ms": r, "sim_ms": x, "error_pct": (x - r) / r * 100, "requests": len(trace),
                        "kind": "stages", "real_requests": real["requests"], "hit_ratio": s.get("cache_hit_ratio"),
                        "settings": settings_of(run), "source": run["source"], "cpu_offload": bool(run["engine"].get("cpu_offload")),
                        "peak_kv_usage": s.get("peak_kv_usage"), "num_gpu_blocks": s.get("num_gpu_blocks")})
    return out


def settings_of(run: dict) -> str:
    """A `stages` run's engine settings in brief: the budget, the memory setting and KV CPU offloading where on."""
    e = run["engine"]
    return (f"budget {e['max_num_batched_tokens']}, util {e['gpu_memory_utilization']:g}"
            + (", KV offload" if e.get("cpu_offload") else ""))


def render_stages(rows: list[dict]) -> str:
    """One line per run and stage: real / sim and error of each STAGE_METRICS statistic."""
    head = ["| run | GPU x tp | model | settings | stage: rate (req/s) | profile | " + " | ".join(
        f"{'TPOT (derived)' if m == 'tpot' else 'E2E' if m == 'e2el' else 'TTFT'} {st}: real / sim (ms), error" for m, st in STAGE_METRICS)
        + " |", "|---|---|---|---|---|---|" + "---|" * len(STAGE_METRICS)]
    by = {}
    for r in rows:
        if r.get("kind") == "stages":
            by.setdefault((r["run"], r["stage"], r.get("profile")), {})[(r["metric"], r["stat"])] = r
    for (rid, stage, _), d in by.items():
        f = next(iter(d.values()))
        cells = [f"{x['real_ms']:.1f} / {x['sim_ms']:.1f}, {x['error_pct']:+.1f}%" for x in (d[k] for k in STAGE_METRICS)]
        head.append(f"| {rid} | {f['gpu']} x{f['tp']} | {f['model']} | {f['settings']} | {stage}: {f['rate']:g} | {f['profile']} | "
                    + " | ".join(cells) + " |")
    return "\n".join(head)


QUEUE_BOUND = 0.25  # a stage whose real mean TTFT exceeds this share of its mean E2E: the server fell behind the arrivals


def within_bounds(gpu: str, e: dict) -> bool:
    """Issue 50's bounds for one stage's errors (%): on an H100 mean E2E within 3%, mean TTFT and the p99 of TTFT
    and E2E within 10%; on another GPU mean E2E within 10%."""
    if gpu != "H100":
        return abs(e[("e2el", "mean")]) <= 10
    return (abs(e[("e2el", "mean")]) <= 3 and abs(e[("ttft", "mean")]) <= 10 and abs(e[("ttft", "p99")]) <= 10
            and abs(e[("e2el", "p99")]) <= 10)


def stages_summary(rows: list[dict]) -> str:
    """Per GPU x tp: how many stages meet issue 50's bounds (within_bounds), mean |error| and signed mean per metric,
    over the stages the real server kept up with (the queue-bound ones named apart)."""
    groups, bound = {}, set()
    real = {(r["run"], r["stage"], r["metric"]): r["real_ms"] for r in rows if r.get("kind") == "stages" and r["stat"] == "mean"}
    for r in rows:
        if r.get("kind") != "stages":
            continue
        if real[(r["run"], r["stage"], "ttft")] > QUEUE_BOUND * real[(r["run"], r["stage"], "e2el")]:
            bound.add((r["run"], r["stage"]))
            continue
        key = (r["gpu"], r["tp"])
        groups.setdefault(key, {}).setdefault((r["run"], r["stage"]), {})[(r["metric"], r["stat"])] = r["error_pct"]
    out = [f"Queue-bound on the real server (mean TTFT over {QUEUE_BOUND:.0%} of mean E2E: arrivals outran it), listed, not "
           f"summarized: {', '.join(f'{rid} stage {s}' for rid, s in sorted(bound))}"] if bound else []
    for (g, tp), stages in sorted(groups.items()):
        ok = sum(within_bounds(g, e) for e in stages.values())
        parts = ", ".join(f"{m} {st} {np.mean([abs(e[(m, st)]) for e in stages.values()]):.1f}% "
                          f"(signed {np.mean([e[(m, st)] for e in stages.values()]):+.1f}%)" for m, st in STAGE_METRICS)
        bound = "mean E2E within 3%, mean TTFT within 10% and p99 TTFT and E2E within 10%" if g == "H100" else "mean E2E within 10%"
        out.append(f"{g} x{tp} inference-perf stages ({len({rid for rid, _ in stages})} runs): "
                   f"mean |error| {parts}; "
                   f"{ok} of {len(stages)} stages {bound}")
    return "\n".join(out[1:] + out[:1]) if bound else "\n".join(out)


REPEAT_ENGINE = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization", "kv_cache_dtype",
                 "async_scheduling", "prefix_caching", "cpu_offload")
REPEAT_WORKLOAD = ("label", "num_groups", "num_prompts_per_group", "system_prompt_len", "question_len", "output_len")


def repeats(runs: list[dict]) -> list[list[dict]]:
    """The `stages` runs that repeat one experiment (the same GPU, tp, served model, vLLM release, engine settings and
    workload spec, stage rates and durations), groups of two or more."""
    groups: dict = {}
    for r in runs:
        if r["workload"]["kind"] != "stages":
            continue
        w = r["workload"]
        key = json.dumps([r["gpu"], r["tp"], r.get("served_model"), r.get("vllm_version"),
                          [r["engine"].get(k) for k in REPEAT_ENGINE], [w.get(k) for k in REPEAT_WORKLOAD],
                          [(st["rate"], st["duration"]) for st in w["stages"]]])
        groups.setdefault(key, []).append(r)
    return [g for g in groups.values() if len(g) > 1]


def repeats_note(rows: list[dict], runs: list[dict]) -> str:
    """How far apart the real server's repeats of one experiment lie, per stage and metric (max / min - 1), beside the
    simulated value (one per stage: the same spec, the same seed): the spread no single prediction can be within."""
    lines = []
    for g in repeats(runs):
        ids = [r["id"] for r in g]
        per = {}
        for r in rows:
            if r.get("kind") == "stages" and r["run"] in ids:
                per.setdefault((r["stage"], r["metric"], r["stat"]), []).append((r["real_ms"], r["sim_ms"]))
        cells = []
        for (stage, m, st), v in sorted(per.items()):
            real = [x for x, _ in v]
            cells.append(f"stage {stage} {m} {st} {min(real):,.1f}-{max(real):,.1f} ms (+{max(real) / min(real) - 1:.0%}; "
                         f"sim {v[0][1]:,.1f})")
        lines.append(f"{g[0]['gpu']} x{g[0]['tp']} {g[0].get('served_model')} {g[0]['workload']['label']}, {len(g)} runs "
                     f"({', '.join(ids)}): " + "; ".join(cells))
    if not lines:
        return ""
    return ("The real servers' repeats of one experiment (the same deployment, settings and workload spec), each statistic's "
            "range over the repeats (how much the largest exceeds the smallest) beside the simulated value: "
            + " | ".join(lines) + ". A single prediction is within 10% of every repeat only where that excess is under 22%.")


def warmup_note(runs: list[dict]) -> str:
    """How often the real first stage's TTFT tail exceeds the second's though the second ran at a higher rate: a
    steady server's tail grows with its load, so the first stage's holds something else (the first requests a
    started server sees), which the simulator, every stage from an empty warm engine, does not price."""
    staged = [r for r in runs if r["workload"]["kind"] == "stages" and len(r["measured"]["stages"]) > 1
              and r["workload"]["stages"][1]["rate"] > r["workload"]["stages"][0]["rate"]]
    if not staged:
        return ""
    pairs = [[st["client"]["ttft_ms"] for st in r["measured"]["stages"][:2]] for r in staged]
    ratio = [r["workload"]["stages"][1]["rate"] / r["workload"]["stages"][0]["rate"] for r in staged]
    p99, mean = (sum(a[k] > b[k] for a, b in pairs) for k in ("p99", "mean"))
    return (f"The real first stage's p99 TTFT exceeds the second stage's in {p99} of {len(pairs)} runs (its mean TTFT "
            f"in {mean}), though the second ran at {min(ratio):.1f}-{max(ratio):.1f}x the rate; a steady server's tail "
            "grows with its load, so the first stage's likely holds the start-up (the first requests a started server "
            "sees), which the simulator (each stage from an empty, warm engine) does not price.")


TAIL_SEQS = 1024  # the cap lifted: vLLM's default max_num_seqs for an API server on a GPU of 70 GB or more, A100s aside


def tail_note(data: dict, runs: list[dict], rows: list[dict], tmp: Path) -> str:
    """Where a stage's simulated TTFT has a queue's tail (p99 over twice the mean): the same stage simulated on two
    other draws of its arrivals and prompts, and with its cap on running sequences lifted (max_num_seqs TAIL_SEQS), beside
    the real p99. A diagnostic: the tail a stage's cap makes hangs on how often the arrivals outrun it."""
    sim = {(r["run"], r["stage"], r["stat"]): r for r in rows if r.get("kind") == "stages" and r["metric"] == "ttft"}
    sub = tmp / "tail"  # apart from the table's own profiles
    sub.mkdir(exist_ok=True)
    cells = []
    for run in runs:
        for stage in range(len(run["workload"]["stages"])):
            p99, mean = sim.get((run["id"], stage, "p99")), sim.get((run["id"], stage, "mean"))
            if p99 is None or p99["sim_ms"] <= 2 * mean["sim_ms"]:
                continue
            seed = int(run["workload"].get("seed", 0))
            lifted = json.loads(json.dumps(run))
            lifted["engine"]["max_num_seqs"] = TAIL_SEQS
            draws = []
            for r in (run, lifted):
                path, _, _ = build_profile(data, r, "client", sub)
                for s in ((seed + 1, seed + 2) if r is run else (seed,)):
                    d = json.loads(json.dumps(r))
                    d["workload"]["seed"] = s
                    draws.append(simulate(d, path, "client", stage_trace(d, stage))["p99_ttft_ms"])
            cells.append(f"{run['id']} stage {stage} (max_num_seqs {run['engine'].get('max_num_seqs')}): real {p99['real_ms']:.0f}, "
                         f"sim {p99['sim_ms']:.0f} (other draws {draws[0]:.0f}, {draws[1]:.0f}; cap lifted {draws[2]:.0f})")
    if not cells:
        return ""
    return ("Where a stage's simulated TTFT has a queue's tail (p99 over twice the mean), its p99 TTFT in ms on two other draws "
            f"of the stage's arrivals and prompts and with the cap on running sequences lifted (max_num_seqs {TAIL_SEQS}): "
            + "; ".join(cells) + ".")


def whole_run(rows: list[dict], runs: list[dict]) -> dict:
    """{run id: {stage -> (E2E error, TTFT error)}} with stage -1 the whole run: stage means weighted by
    the real run's successful requests on both sides (the whole run's mean over its requests)."""
    out = {}
    for run in runs:
        st = [r for r in rows if r.get("kind") == "stages" and r["run"] == run["id"]]
        if not st:
            continue
        d = {}
        for m in ("e2el", "ttft"):
            per = {r["stage"]: r for r in st if r["metric"] == m and r["stat"] == "mean"}
            for i, r in per.items():
                d.setdefault(i, {})[m] = r["error_pct"]
            w = np.array([per[i]["real_requests"] for i in sorted(per)], float)
            real = np.array([per[i]["real_ms"] for i in sorted(per)]) @ w
            sim = np.array([per[i]["sim_ms"] for i in sorted(per)]) @ w
            d.setdefault(-1, {})[m] = (sim - real) / real * 100
        out[run["id"]] = d
    return out


STAGES_NOTE = ("Constant-rate stages (workload kind stages: real vLLM 0.15.1 servers at BF16, inference-perf's "
               "shared_prefix client; no per-request data published; the runs ending -eN are the same campaign's experiment N, "
               "their statistics from inference-sim/sim-to-real-accuracy-validation's CSV, their spec the campaign's "
               "workloads.yaml by workload name (general-lite: general's lengths at 2.5 then 6 req/s), their prompt lengths "
               "a same-model default_args run's report, or, for Llama-3.1-8B, system + question tokens as specified, not "
               "re-tokenized): each stage's requests synthesized from the stated spec "
               "(seeded: arrivals at exponential gaps rescaled to the stage's duration, as inference-perf's constant load; "
               "num_groups x num_prompts_per_group prompts cycled by request number, so identical prompts recur; prompt lengths "
               "the reported distribution; output_len tokens each, ignore_eos), every request of the stage simulated from an "
               "empty engine (the real second stage followed the first on a warm server), "
               "client view, the KV pool derived (no vllm.log published); Mixtral-8x7B priced by the roofline (aiconfigurator "
               "0.12.0 lists no Mixtral). vLLM's sampler: the requests set no sampling "
               "parameters, so each model's generation_config.json applies (benchmarks/data/server_runs.json `sampling`: top-p "
               "for Llama-3.1-8B-Instruct, Llama-2-7b-hf and Qwen3-14B, whose top-p vLLM 0.15.1 sorts the whole vocabulary "
               "for); priced on the H100 from the H200's sampler timings (sim/hardware/measured_sampler.py); not priced "
               "for the other models (their generation_config not checked) or GPUs (not measured). "
               "TPOT (derived) = "
               "(mean E2E - mean TTFT) / (output_len - 1) on both sides:")
TRACE_PEERS_NOTE = ("Beside the simulator that published the run, on its own run (its signed errors as its validation "
                    "summary prints them; LLMServingSim prices steps from the same per-layer measurements our RTX fits are "
                    "fitted to, looked up per step rather than fitted, and corrects decodes of different contexts in one "
                    "batch by its measured skew profile, which our step model, pricing their sum of contexts, does not: "
                    "`python benchmarks/llmservingsim_layers.py --src DIR` measures both):")
PEERS_NOTE = ("Beside other simulators on the same runs (their published signed errors of mean E2E / mean TTFT, as in "
              "inference-sim/sim-to-real-accuracy-validation's CSVs at the commits benchmarks/data/server_runs.json names; "
              "a row matched to a run by its actual mean E2E; whole run: stage means weighted by requests; LLMServingSim's file "
              "is left out: its actuals match none of these runs):")


def kv_note(rows: list[dict]) -> str:
    """Whether the KV cache's CPU offloading the runs enabled can matter: the simulated peak KV use of the derived pool."""
    every = {(r["run"], r["stage"]): r for r in rows
             if r.get("kind") == "stages" and r.get("peak_kv_usage") is not None}
    st = {k: r for k, r in every.items() if r.get("cpu_offload", True)}
    if not st:
        return ""
    top = max(st.values(), key=lambda r: r["peak_kv_usage"])
    hit = np.mean([r["hit_ratio"] for r in every.values() if r.get("hit_ratio") is not None])
    return (f"KV CPU offloading (8 GiB, enabled on the real servers marked KV offload) is not modelled: on those the "
            f"simulated peak KV use is at most {top['peak_kv_usage']:.0%} of the derived GPU pool ({top['run']} stage "
            f"{top['stage']}), so nothing is evicted for it to keep; the prefix cache serves {hit:.0%} of prompt tokens on "
            "average (recurring prompts).")


PEER_NAMES = ("blis-roofline", "blis-evolved", "vidur", "aiconfigurator-estimate", "llm-optimizer-estimate")


def render_peers(rows: list[dict], runs: list[dict]) -> str:
    """Ours beside each peer's published signed error of mean E2E / mean TTFT, per run and stage
    (-1: the whole run) where the peers' files hold the run (benchmarks/server_runs_inference_perf.py --peers)."""
    ours = whole_run(rows, runs)
    head = ["| run | stage | ours (client view, the table's profile): E2E / TTFT | " + " | ".join(PEER_NAMES) + " |",
            "|---|---|---|" + "---|" * len(PEER_NAMES)]
    for run in runs:
        peers = run.get("peers") or []
        if run["id"] not in ours or not peers:
            continue
        for stage in sorted({p["stage"] for p in peers}):
            if stage not in ours[run["id"]]:
                continue
            o = ours[run["id"]][stage]
            by = {p["simulator"]: p for p in peers if p["stage"] == stage}
            cells = [f"{by[n]['e2e_mean_pct']:+.1f}% / " + (f"{by[n]['ttft_mean_pct']:+.1f}%" if by[n]['ttft_mean_pct'] is not None else "-")
                     if n in by else "-" for n in PEER_NAMES]
            head.append(f"| {run['id']} | {'whole run' if stage < 0 else stage} | {o['e2el']:+.1f}% / {o['ttft']:+.1f}% | "
                        + " | ".join(cells) + " |")
    mean = lambda xs: f"{np.mean(np.abs(xs)):.1f}%" if xs else "-"  # noqa: E731
    cells = []
    for n in PEER_NAMES:
        pts = [(p["e2e_mean_pct"], ours[r["id"]][p["stage"]]["e2el"]) for r in runs for p in (r.get("peers") or [])
               if p["simulator"] == n and r["id"] in ours and p["stage"] in ours[r["id"]]]
        cells.append(f"{mean([a for a, _ in pts])} (ours {mean([b for _, b in pts])}, {len(pts)})")
    head.append("| mean \\|E2E error\\| over the rows it has (ours over the same, rows) | | | " + " | ".join(cells) + " |")
    return "\n".join(head)


def rows_of(data: dict, run: dict, quick: bool, tmp: Path, parts: list | None = None) -> list[dict]:
    w = run["workload"]
    if w["kind"] == "trace":
        return trace_rows(data, run, quick, tmp, parts)
    if w["kind"] == "stages":
        return stage_rows(data, run, quick, tmp)
    n = int(w.get("requests") or WAVES * w["concurrency"])
    if quick:
        n = max(w["concurrency"], n // 4)
    real = {m: run["measured"][m]["mean"] for m in ("ttft_ms", "tpot_ms")}
    trace = trace_of(run, n)
    osl = float(trace["output_tokens"].mean())  # the same mean output length on both sides
    real["e2el_ms"] = real["ttft_ms"] + real["tpot_ms"] * (osl - 1)
    out = []
    for view in ("engine", "client"):
        path, which, unknown = build_profile(data, run, view, tmp)
        s = simulate(run, path, view, trace)
        sim = {"ttft_ms": s["mean_ttft_ms"], "tpot_ms": s["mean_tpot_ms"]}
        sim["e2el_ms"] = sim["ttft_ms"] + sim["tpot_ms"] * (osl - 1)
        for m in ("ttft_ms", "tpot_ms", "e2el_ms"):
            out.append({"run": run["id"], "gpu": run["gpu"], "tp": run["tp"], "model": run["model"], "label": w.get("label", ""),
                        "concurrency": w["concurrency"], "profile": which, "unknown": unknown, "view": view,
                        "metric": m[:-3] + (" (derived)" if m == "e2el_ms" else ""), "stat": "mean", "real_ms": real[m],
                        "sim_ms": sim[m], "error_pct": (sim[m] - real[m]) / real[m] * 100, "requests": n})
    return out


PARTS_NOTE = ("The engine view in parts (real: vLLM's per-request stamps; alone: requests no other overlapped, the "
              "server's first left out; hand-off: vLLM's arrival stamp to the engine core's queue and the first token's way "
              "back, which the simulator's engine view does not price and its client view does, as measured on CPUs here: "
              "benchmarks/server_time.py):")
WHAT_IF_NOTE = ("What the runs' own prices explain (a diagnostic, no profile is changed): replayed without vLLM's host time "
                "per step, as replayed (with it), and with each scheduled token dearer by the alone requests' miss per "
                "prefilled token (cheaper where the miss is negative); mean and p99 TTFT and mean E2E error:")


def render(rows: list[dict]) -> str:
    head = ["| GPU x tp | workload | concurrency | profile | view | TTFT real / sim (ms) | TTFT error | TPOT real / sim (ms) | "
            "TPOT error | mean E2E (derived) error |", "|---|---|---:|---|---|---|---:|---|---:|---:|"]
    by = {}
    for r in rows:
        if r.get("kind") is None:
            by.setdefault((r["run"], r["view"]), {})[r["metric"].split(" ")[0]] = r
    lines = []
    for (_, view), d in by.items():
        t, p, e = d["ttft"], d["tpot"], d["e2el"]
        lines.append(f"| {t['gpu']} x{t['tp']} | {t['model']} {t['label']} | {t['concurrency']} | {t['profile']} | {view} | "
                     f"{t['real_ms']:.0f} / {t['sim_ms']:.0f} | {t['error_pct']:+.1f}% | {p['real_ms']:.2f} / {p['sim_ms']:.2f} | "
                     f"{p['error_pct']:+.1f}% | {e['error_pct']:+.1f}% |")
    return "\n".join(head + lines)


def render_trace(rows: list[dict]) -> str:
    """The trace runs' table: per run and view, each metric's real / sim and error."""
    head = ["| run | model | budget | shared prefix | requests | profile | view | " + " | ".join(
        f"{m.upper()} {st} real / sim (ms) | error" for m, st in TRACE_METRICS) + " |",
        "|---|---|---:|---:|---:|---|---|" + "---|---:|" * len(TRACE_METRICS)]
    by = {}
    for r in rows:
        if r.get("kind") == "trace":
            by.setdefault((r["run"], r["view"]), {})[(r["metric"], r["stat"])] = r
    lines = []
    for (run, view), d in by.items():
        f = next(iter(d.values()))
        cells = [f"{d[k]['real_ms']:.{2 if k[0] == 'tpot' else 0}f} / {d[k]['sim_ms']:.{2 if k[0] == 'tpot' else 0}f} | "
                 f"{d[k]['error_pct']:+.1f}%" for k in TRACE_METRICS]
        lines.append(f"| {run} | {f['model']} | {f['max_num_batched_tokens']} | {f['shared_prefix_tokens']} | {f['requests']} | "
                     f"{f['profile']} | {view} | " + " | ".join(cells) + " |")
    return "\n".join(head + lines)


def peer_key(metric: str, stat: str) -> str:
    """A peer's published signed error of one of our metrics in the runs file (`peers`): e2e_mean_pct, ttft_p99_pct..."""
    return f"{'e2e' if metric == 'e2el' else metric}_{stat}_pct"


def render_trace_peers(rows: list[dict], runs: list[dict]) -> str:
    """Per trace run a peer simulated itself (its published signed errors, `peers` in the runs file): ours (engine
    view, the table's profile) beside it, per TRACE_METRICS; "" where none."""
    ours = {(r["run"], r["metric"], r["stat"]): r["error_pct"] for r in rows
            if r.get("kind") == "trace" and r["view"] == "engine"}
    fmt = lambda err: " / ".join(f"{err[k]:+.1f}%" for k in TRACE_METRICS)  # noqa: E731
    lines = []
    for run in runs:
        if run["workload"]["kind"] != "trace" or (run["id"], *TRACE_METRICS[0]) not in ours:
            continue
        mine = {k: ours[(run["id"], *k)] for k in TRACE_METRICS}
        for p in run.get("peers") or []:
            theirs = {k: p[peer_key(*k)] for k in TRACE_METRICS}
            lines.append(f"| {run['id']} | {fmt(mine)} | [{p['simulator']}]({p['file']}) | {fmt(theirs)} |")
    if not lines:
        return ""
    what = " / ".join(f"{m.upper()} {st}" for m, st in TRACE_METRICS)
    return "\n".join([f"| run | ours (engine view): {what} | peer | the peer's own: {what} |", "|---|---|---|---|", *lines])


def render_parts(parts: list[dict]) -> str:
    """Per trace run (engine view): the requests that ran alone (step prices without queueing or
    batching) and every request's wait, prefill and decode, real against simulated; the mean E2E
    error split into what each part adds (points of the real mean E2E)."""
    head = ["| run | alone | alone: prefill real / sim (ms) | error | alone: decode per output token real / sim (ms) | error | "
            "alone: hand-off (ms) | wait real / sim (ms) | prefill real / sim (ms) | decode real / sim (ms) | "
            "mean E2E error from wait / prefill / decode |", "|---|---:|---|---:|---|---:|---:|---|---|---|---|"]
    lines = []
    for r in parts:
        cells = []
        for k in ("alone prefill", "alone decode per token"):
            real, sim = r.get(k, (None, None))
            cells.append(f"{real:.2f} / {sim:.2f} | {(sim - real) / real * 100:+.1f}%" if real and sim else "- | -")
        pts = [(r[k][1] - r[k][0]) / r["e2el_ms"] * 100 for k, _ in PARTS]
        lines.append(f"| {r['run']} | {r['alone']} | " + " | ".join(cells) + " | " + ("-" if r["handoff_ms"] is None else f"{r['handoff_ms']:.1f}") + " | "
                     + " | ".join(f"{r[k][0]:.0f} / {r[k][1]:.0f}" for k, _ in PARTS) + " | "
                     + " / ".join(f"{x:+.1f}" for x in pts) + " |")
    return "\n".join(head + lines)


WHAT_IF = (("device time only", "no host"), ("as replayed", None), ("and prefill priced as measured alone", "prefill"))


def what_if(data: dict, runs: list[dict], parts: list[dict], tmp: Path) -> str:
    """How much of each trace run's engine-view miss the prices the runs themselves show explain (a
    diagnostic, not a profile: nothing here is kept): replayed without the host section (benchmarks/host/
    llama3.1-8b-h100-host.json: vLLM 0.32's engine-core CPU time per step, measured on CPUs here, which a
    synchronous engine such as vLLM 0.11.0's default adds to every step), as replayed, and with every
    scheduled token dearer by what the requests that ran alone miss per prefilled token ((real - simulated
    prefill) / prefilled tokens: the price of a prefill chunk, whatever its size, a decode token charged the
    same)."""
    by = {r["run"]: r for r in parts if r.get("alone prefill")}
    lines = ["| run | alone miss per prefilled token (us) | " + " | ".join(f"{name}: TTFT mean / p99, E2E mean" for name, _ in WHAT_IF)
             + " |", "|---|---:|" + "---|" * len(WHAT_IF)]
    for run in runs:
        r = by.get(run["id"])
        if r is None:
            continue
        miss = (r["alone prefill"][0] - r["alone prefill"][1]) / 1e3 / r["alone computed"]  # s per prefilled token
        path, _, _ = build_profile(data, run, "engine", tmp)
        base = json.loads(Path(path).read_text())
        trace = trace_of(run, len(run["workload"]["requests"]))
        real = run["measured"]["engine"]
        cells = []
        for name, change in WHAT_IF:
            prof = json.loads(json.dumps(base))
            if change == "no host":
                prof.pop("host")
            elif change == "prefill":  # every step's device time, per scheduled token (a miss may be < 0: the price dearer)
                st = prof["step_time"]
                st["collective_shift_token"] = st.get("collective_shift_token", 0.0) + miss
            alt = tmp / f"{run['id']}-what-if.json"
            alt.write_text(json.dumps(prof))
            sm = simulate(run, str(alt), "engine", trace)
            err = [(sm[f"{st}_{m}_ms"] - real[f"{m}_ms"][st]) / real[f"{m}_ms"][st] * 100
                   for m, st in (("ttft", "mean"), ("ttft", "p99"), ("e2el", "mean"))]
            cells.append(" / ".join(f"{e:+.1f}%" for e in err))
        lines.append(f"| {run['id']} | {miss * 1e6:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def trace_summary(rows: list[dict]) -> str:
    """Per GPU x tp and view of the trace runs: how many meet issue 50's bounds for the GPU
    (within_bounds), mean |error| per metric."""
    groups = {}
    for r in rows:
        if r.get("kind") == "trace":
            groups.setdefault((r["gpu"], r["tp"], r["view"]), {}).setdefault(r["run"], {})[(r["metric"], r["stat"])] = r["error_pct"]
    out = []
    for (g, tp, view), runs in groups.items():
        ok = sum(within_bounds(g, e) for e in runs.values())
        parts = ", ".join(f"{m} {st} {np.mean([abs(e[(m, st)]) for e in runs.values()]):.1f}%" for m, st in TRACE_METRICS)
        bound = ("mean E2E within 3%, mean TTFT within 10% and p99 TTFT and E2E within 10%" if g == "H100"
                 else "mean E2E within 10%")
        out.append(f"{g} x{tp} traces, {view}: mean |error| {parts}; {ok} of {len(runs)} runs {bound}")
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    """Mean |error| per GPU x tp and view, and how many runs meet issue 50's bounds: mean E2E
    within 3% and TTFT within 10% on an H100, mean E2E within 10% elsewhere (p99 is not
    published by every source; where it is not, it is not judged)."""
    out = []
    groups = {}
    for r in rows:
        if r.get("kind") == "trace":
            continue
        g = groups.setdefault((r["gpu"], r["tp"], r["view"]), {})
        g.setdefault(r["metric"].split(" ")[0], []).append(r["error_pct"])
    for (g, tp, view), d in groups.items():
        parts = ", ".join(f"{m} {np.mean(np.abs(v)):.1f}% (signed {np.mean(v):+.1f}%)" for m, v in d.items())
        e2e, ttft = np.abs(d["e2el"]), np.abs(d["ttft"])
        ok = (e2e <= 3) & (ttft <= 10) if g == "H100" else e2e <= 10
        bound = "E2E within 3% and TTFT within 10%" if g == "H100" else "E2E within 10%"
        out.append(f"{g} x{tp}, {view}: mean |error| {parts}; {int(ok.sum())} of {len(ok)} runs {bound}")
    return "\n".join(out)


def _profile(gpu: str, model: str, tp: int, measured: bool, spec: dict | None = None, **engine):
    from sim.hardware.profile import load_profile
    from sim.hardware.roofline import roofline_profile

    prof, _ = roofline_profile(gpu, model, tp=tp, measured=measured, model_spec=spec, **engine)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prof, f)
    try:
        return load_profile(f.name), prof["provenance"].get("source", "")
    finally:
        Path(f.name).unlink()


def decode_ctx(run: dict) -> float:
    """The mean context of a decode step over a request's life: mean input + half the mean output
    (the client's uniform draw in [ratio x L, L] has mean (1 + ratio) / 2 x L)."""
    w = run["workload"]
    mean = lambda L: L * (1 + (w.get("length_spread") or {}).get("low_ratio", 1.0)) / 2  # noqa: E731
    return mean(w["input_tokens"]) + mean(w["output_tokens"]) / 2


def explain(data: dict, runs: list[dict], rows: list[dict], view: str = "client") -> str:
    """What can be measured of each run's miss, nothing fitted: the KV pool the simulator derives;
    the sequences in decode on average, by Little's law on a closed loop (c x (E2E - TTFT) / E2E),
    real and simulated; and a decode step of that many real sequences at the mean decode
    context, priced by the profile the table used (measured kernels where the file has them)
    and by the roofline, beside the real TPOT."""
    lines = ["Why (measured beside the table, nothing fitted): the KV pool each deployment gets, and per run the "
             "sequences in decode (Little's law: concurrency x (E2E - TTFT) / E2E) and a decode step of the real "
             "number of them at the mean decode context (input + output / 2), as the table's profile and the "
             "roofline price it, beside the real TPOT:", ""]
    seen = {}
    for r in runs:
        key = (r["gpu"], r["tp"], r["model"])
        if key in seen:
            continue
        eng = engine_args(r)
        spec = model_spec(data, r["model"])
        meas, src = _profile(r["gpu"], r["model"], r["tp"], True, spec, **eng)
        roof, _ = _profile(r["gpu"], r["model"], r["tp"], False, spec, **eng)
        seen[key] = (meas, roof, src.startswith("measured"))
        tokens = meas.engine.num_gpu_blocks * meas.block_size
        lines.append(f"- {r['gpu']} x{r['tp']}: KV pool {tokens:,} tokens"
                     + "".join(f"; {tokens / decode_ctx(x):.0f} {x['workload']['label']} requests at their mean decode context"
                               for x in {x["workload"].get("label"): x for x in runs if (x["gpu"], x["tp"], x["model"]) == key}
                               .values()))
    lines += ["", "| GPU x tp | workload | concurrency | in decode: real / sim | real TPOT (ms) | sim TPOT | "
              "decode step of the real number: table's profile / roofline (ms) |", "|---|---|---:|---|---:|---:|---|"]
    by = {(x["run"], x["metric"].split(" ")[0]): x for x in rows if x["view"] == view}
    bound, held = [], {}
    for r in runs:
        t, p, e = (by.get((r["id"], m)) for m in ("ttft", "tpot", "e2el"))
        if t is None:
            continue
        c = r["workload"]["concurrency"]
        real_n = c * (e["real_ms"] - t["real_ms"]) / e["real_ms"]
        sim_n = c * (e["sim_ms"] - t["sim_ms"]) / e["sim_ms"]
        meas, roof, is_meas = seen[(r["gpu"], r["tp"], r["model"])]
        b, ctx = max(1, round(real_n)), decode_ctx(r)
        step = lambda prof: prof.step_time(b, b, b * ctx, b * ctx) * 1e3  # noqa: E731
        lines.append(f"| {r['gpu']} x{r['tp']} | {r['model']} {r['workload'].get('label', '')} | {c} | {real_n:.1f} / {sim_n:.1f} | "
                     f"{p['real_ms']:.2f} | {p['sim_ms']:.2f} | {step(meas):.2f}{'' if is_meas else ' (roofline)'} / "
                     f"{step(roof):.2f} |")
        pool = meas.engine.num_gpu_blocks * meas.block_size
        held.setdefault((r["gpu"], r["tp"], r["model"], r["workload"].get("label", "")), []).append((c, real_n, sim_n, ctx, pool, r))
        if real_n * ctx > 1.05 * pool:
            bound.append(f"{r['gpu']} x{r['tp']} {r['workload'].get('label', '')} at concurrency {c}: the real server kept "
                         f"{real_n:.0f} sequences in decode, about {real_n * ctx:,.0f} tokens of KV at their mean context, "
                         f"{real_n * ctx / pool:.2f}x the {pool:,} tokens of the pool derived here, where {sim_n:.0f} run")
    if bound:
        lines += ["", "KV-pool bound: " + "; ".join(bound) + "."]
    ceilings = [_ceiling(key, pts, lambda r: _auto_kv_pool(data, r)) for key, pts in held.items()]
    if any(ceilings):
        lines += ["", "A ceiling below the pool: " + "; ".join(c for c in ceilings if c) + "."]
    lines += ["", ttft_lines(runs, seen, {r["run"]: r["sim_ms"] for r in rows if r["view"] == view and r["metric"] == "ttft"})]
    return "\n".join(lines)


def _auto_kv_pool(data: dict, run: dict) -> int | None:
    """The pool of the run's deployment with vLLM's default KV dtype, where the run states an FP8 KV cache."""
    eng = engine_args(run)
    if eng["kv_cache_dtype"] == "auto":
        return None
    prof, _ = _profile(run["gpu"], run["model"], run["tp"], True, model_spec(data, run["model"]), **{**eng, "kv_cache_dtype": "auto"})
    return prof.engine.num_gpu_blocks * prof.block_size


def _ceiling(key: tuple, pts: list[tuple], auto_pool=lambda run: None) -> str:
    """A deployment whose real sequences in decode stop growing with the concurrency (the top two
    concurrencies within 10% of each other) while the simulated ones go on growing: the real server
    held no more, whatever the client sent, as a KV pool that size would hold them; pts: (concurrency,
    real and simulated sequences in decode, mean decode context, derived pool tokens, run) per run;
    auto_pool(run): the pool with vLLM's default KV dtype where the run states another (else None)."""
    if len(pts) < 2:
        return ""
    (c1, r1, s1, *_), (c2, r2, s2, ctx, pool, run) = sorted(pts, key=lambda x: x[0])[-2:]
    if r2 > 1.1 * r1 or s2 < 1.1 * r2:
        return ""
    auto = auto_pool(run)
    return (f"{key[0]} x{key[1]} {key[3]}: the real server kept {r1:.1f} and {r2:.1f} sequences in decode at concurrency "
            f"{c1} and {c2} (simulated {s1:.1f} and {s2:.1f}), about {r2 * ctx:,.0f} tokens of KV at their mean decode "
            f"context, {r2 * ctx / pool:.2f}x the {pool:,} tokens of the pool derived here"
            + (f" (the run's {run['engine']['kv_cache_dtype']} KV cache; with vLLM's default KV dtype the pool would be "
               f"{auto:,} tokens)" if auto else ""))


def ttft_lines(runs: list[dict], seen: dict, sim: dict) -> str:
    """TTFT at each deployment's lowest concurrency beside the profile's fresh prefill of the mean
    prompt (one step at these budgets); with two prompt lengths, the line through the two points,
    TTFT = a + k x prefill, real and simulated (sim: run id -> simulated TTFT): the simulator's k
    holds what its queueing and mixed steps add, so a real k above it says the real prefill is
    dearer than the profile prices it, and a the time that does not grow with the prompt."""
    out = []
    for key, (meas, _, _) in seen.items():
        pts = []
        for r in runs:
            if (r["gpu"], r["tp"], r["model"]) != key:
                continue
            low = min(x["workload"]["concurrency"] for x in runs if (x["gpu"], x["tp"], x["model"], x["workload"].get("label"))
                      == (*key, r["workload"].get("label")))
            if r["workload"]["concurrency"] != low:
                continue
            w = r["workload"]
            n = round(w["input_tokens"] * (1 + (w.get("length_spread") or {}).get("low_ratio", 1.0)) / 2)
            pf = meas.step_time(n, 1, n * (n + 1) / 2, n) * 1e3
            pts.append((pf, r["measured"]["ttft_ms"]["mean"], sim.get(r["id"]), f"{w.get('label', '')} c={low}"))
        if not pts:
            continue
        text = ", ".join(f"{lab} {real:.0f} ms (sim {s_:.0f}) against {pf:.0f} ms" for pf, real, s_, lab in pts)
        if len(pts) == 2 and pts[0][0] != pts[1][0]:
            line = lambda i: ((pts[1][i] - pts[0][i]) / (pts[1][0] - pts[0][0]))  # noqa: E731
            kr, ks = line(1), line(2)
            text += (f"; through both: real TTFT = {pts[0][1] - kr * pts[0][0]:.0f} ms + {kr:.2f} x prefill, "
                     f"sim {pts[0][2] - ks * pts[0][0]:.0f} ms + {ks:.2f} x prefill")
        out.append(f"{key[0]} x{key[1]}: {text}")
    return ("TTFT at the lowest concurrency (client view), real and simulated, against the table's profile's fresh prefill "
            "of the mean prompt: " + "; ".join(out) + ".")


def _rows_and_parts(job: tuple) -> tuple[list[dict], list[dict]]:
    data, run, quick, tmp = job
    parts = []
    return rows_of(data, run, quick, Path(tmp), parts), parts


def run_all(data: dict, runs: list[dict], quick: bool, tmp: Path, jobs: int) -> list[tuple[list[dict], list[dict]]]:
    """Each run's (rows, trace parts), in the runs' order; with jobs > 1 the runs are simulated in that many
    processes (each run is seeded on its own, so the rows are the same either way)."""
    work = [(data, r, quick, str(tmp)) for r in runs]
    if jobs == 1 or len(runs) < 2:
        return [_rows_and_parts(w) for w in work]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_rows_and_parts, work))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA), help="the runs file (default benchmarks/data/server_runs.json)")
    ap.add_argument("--only", help="comma-separated run ids")
    ap.add_argument("--quick", action="store_true", help="the first two runs, a quarter of the requests (tests; a trace run: its first quarter by arrival)")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), default=None, metavar="PAGE",
                    help="write the table into docs/reference/validation.md (or PAGE) in place of its marked block")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--no-explain", action="store_true", help="skip the KV-pool and roofline-against-kernels lines")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="runs simulated at once, each in its own process (default: 2, or 1 on one CPU)")
    args = ap.parse_args(argv)
    try:
        if args.jobs < 1:
            raise InputError(f"--jobs {args.jobs}: give 1 or more processes")
        data_path = ROOT / args.data if args.data.startswith("./") else Path(args.data)
        if args.write_docs and (args.quick or args.only or data_path.resolve() != DATA.resolve()):
            raise InputError("--write-docs writes the full table of the bundled file: drop --quick, --only and --data")
        data = load_data(data_path)
        runs = data["runs"]
        if args.only:
            want = args.only.split(",")
            missing = [x for x in want if x not in {r["id"] for r in runs}]
            if missing:
                raise InputError(f"--only: no run {missing[0]!r} in {args.data}")
            runs = [r for r in runs if r["id"] in want]
        if args.quick:
            runs = runs[:2]
        rows, parts = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for got, got_parts in run_all(data, runs, args.quick, Path(tmp), args.jobs):
                rows += got
                parts += got_parts
            traced_runs = [r for r in runs if r["workload"]["kind"] == "trace"]
            gap = what_if(data, traced_runs, parts, Path(tmp)) if parts and not (args.quick or args.no_explain) else ""
            staged_runs = [r for r in runs if r["workload"]["kind"] == "stages"]
            tails = "" if args.quick or args.no_explain else tail_note(data, staged_runs, rows, Path(tmp))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    closed = [r for r in runs if r["workload"]["kind"] == "closed"]
    closed_rows = [r for r in rows if r.get("kind") is None]
    why = "" if args.no_explain or not closed else explain(data, closed, closed_rows)
    table = render(closed_rows) if closed_rows else ""
    traced = render_trace(rows) if any(r.get("kind") == "trace" for r in rows) else ""
    trace_peered = render_trace_peers(rows, runs)
    staged = render_stages(rows) if staged_runs else ""
    peered = render_peers(rows, staged_runs) if staged_runs else ""
    kv = kv_note(rows) if staged_runs else ""
    rep = " ".join(x for x in (repeats_note(rows, staged_runs), warmup_note(staged_runs), tails) if x)
    unknown = sorted({u for r in rows for u in r["unknown"]})
    notes = (f"Settings not stated by the source (vLLM's defaults used, KV pool derived): {', '.join(unknown) or 'none'}. "
             "Requests and lengths as the source's client drew them (benchmarks/data/server_runs.json).")
    parted = render_parts(parts) if parts else ""
    for part in (table, summary(closed_rows), traced, trace_summary(rows), trace_peered, parted, gap, staged, stages_summary(rows),
                 kv, rep, peered, notes, why):
        if part:
            print(part + ("\n" if part in (table, traced, trace_peered, parted, gap, staged, peered) else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.write_docs:
        from benchmarks.docs_tables import write_block

        body = (f"Made by `python benchmarks/server_runs_table.py --write-docs` (runs and sources: "
                f"benchmarks/data/server_runs.json). {notes} The client view (the engine view's rows: the script's "
                f"output):\n\n{render([r for r in rows if r['view'] == 'client'])}\n\n"
                + summary(closed_rows).replace("\n", "; ") + ".\n\n"
                + why
                + ("\n\nReplayed request by request (workload kind trace: each request's arrival at the engine, prompt and "
                   "output tokens, the client's shared prefix or, where the source gives each prompt's token ids, the prefix "
                   "each shares with an earlier one; the block count vLLM logged where it did), both views, each against its own "
                   "measurement (engine: vLLM's per-request stamps; client: guidellm's results, where published):\n\n"
                   + traced + "\n\n" + trace_summary(rows).replace("\n", "; ") + "." if traced else "")
                + (f"\n\n{TRACE_PEERS_NOTE}\n\n{trace_peered}" if trace_peered else "")
                + (f"\n\n{PARTS_NOTE}\n\n{parted}" if parted else "")
                + (f"\n\n{WHAT_IF_NOTE}\n\n{gap}" if gap else "")
                + (f"\n\n{STAGES_NOTE}\n\n{staged}\n\n" + stages_summary(rows).replace("\n", "; ") + f". {kv}" if staged else "")
                + (f"\n\n{rep}" if rep else "")
                + (f"\n\n{PEERS_NOTE}\n\n{peered}" if peered else ""))
        write_block(args.write_docs, "server_runs_table", KEY, body)
        print(f"wrote {args.write_docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
