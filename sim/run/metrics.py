"""Run results: one row per turn, one per program, and a summary (also written to disk).

The summary is computed from plain rows with numpy; the tables are DataFrames, built
(and pandas imported, ~0.4 s) only where a caller asks for them (sim/simulate.Result).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sim.replica.call import Call
from agentsim.files import atomic_write


class Recorder:
    def __init__(self) -> None:
        self.turns: list[dict] = []

    def record(self, call: Call, now: float) -> None:
        r = call.req
        adm = call.admission_rows() or [(call.cached_tokens or 0, call.admission_loaded_tokens, call.computed_prompt_tokens)]  # a Call made by hand
        self.turns.append({
            "program_id": r.program_id, "turn": r.turn, "arrival": r.arrival,
            "program_arrival": r.program_arrival, "scheduled": call.scheduled_at,
            "first_token": call.first_token_at, "finish": now,
            "queue_delay": call.scheduled_at - r.arrival, "prompt_tokens": call.prompt_len,
            "output_tokens": call.num_output, "cached_tokens": call.cached_tokens,
            "computed_prompt_tokens": call.computed_prompt_tokens, "preemptions": call.preemptions,
            "exec_time": r.exec_time, "tool": r.tool, "is_last": r.is_last_step,
            "replica": call.replica, "loaded_tokens": adm[0][1], "computed_tokens": adm[0][2], "reload_s": call.reload_s,
            # vLLM's request metrics (`vllm bench serve`), from the call's arrival at the engine
            "ttft": call.first_token_at - r.arrival,
            "tpot": (now - call.first_token_at) / (call.num_output - 1) if call.num_output > 1 else float("nan"),
            "e2el": now - r.arrival,
            "reloaded_tokens_total": call.loaded_tokens,
            # every admission side by side, and their totals (computed's is computed_prompt_tokens)
            "admissions": len(adm), "admission_cached": [a[0] for a in adm], "admission_loaded": [a[1] for a in adm],
            "admission_computed": [a[2] for a in adm],
            "cached_tokens_total": sum(a[0] for a in adm), "loaded_tokens_total": sum(a[1] for a in adm),
        })


    def sorted_turns(self) -> list[dict]:
        """The rows by program and turn: the order of every table and sum below."""
        return sorted(self.turns, key=lambda t: (t["program_id"], t["turn"]))


# the columns the summary and the per-replica figures read
_NUMERIC = ("arrival", "program_arrival", "first_token", "finish", "queue_delay", "prompt_tokens", "output_tokens",
            "cached_tokens", "computed_prompt_tokens", "preemptions", "replica")


def turn_columns(turns: list[dict]) -> dict[str, np.ndarray]:
    """Sorted turns (`Recorder.sorted_turns`) as numpy columns, the program starts as `starts`."""
    cols = {k: np.array([t[k] for t in turns]) for k in _NUMERIC}
    pid = [t["program_id"] for t in turns]
    cols["starts"] = np.flatnonzero([i == 0 or pid[i] != pid[i - 1] for i in range(len(pid))])
    return cols


def turn_table(turns: list[dict]):
    import pandas as pd

    return pd.DataFrame(turns)


def program_table(turns):
    import pandas as pd

    g = turns.groupby("program_id", sort=False)
    progs = pd.DataFrame({
        "arrival": g["program_arrival"].first(),
        "finish": g["finish"].max(),
        "turns": g["turn"].count(),
        "queue_delay": g["queue_delay"].sum(),
        "prompt_tokens": g["prompt_tokens"].sum(),
        "cached_tokens": g["cached_tokens"].sum(),
        "computed_prompt_tokens": g["computed_prompt_tokens"].sum(),
        "output_tokens": g["output_tokens"].sum(),
        "preemptions": g["preemptions"].sum(),
        "loaded_tokens": g["loaded_tokens"].sum(),
        "reload_s": g["reload_s"].sum(),
        "reloaded_tokens_total": g["reloaded_tokens_total"].sum(),
    })
    progs.insert(2, "jct", progs["finish"] - progs["arrival"])
    return progs.reset_index()


def kv_table(samples: list[tuple[int, list]]):
    """(replica, its KV samples) -> one table."""
    import pandas as pd

    return pd.concat([pd.DataFrame(s, columns=["t", "used_blocks", "pinned_blocks"]).assign(replica=r) for r, s in samples],
                     ignore_index=True)


def summarize(turns: dict[str, np.ndarray], extra: dict) -> dict:
    """The summary from `turn_columns`."""
    starts = turns["starts"]
    arrival = turns["program_arrival"][starts]
    finish = np.maximum.reduceat(turns["finish"], starts)
    jct = finish - arrival
    start, end = float(arrival.min()), float(finish.max())
    span = max(end - start, 1e-9)
    pct = {f"p{q}_jct": float(np.percentile(jct, q)) for q in (50, 90, 95, 99)}
    # a turn's latency: its call's arrival (the tool returned) to its last token, what a
    # user waiting on one agent step sees
    turn = turns["finish"] - turns["arrival"]
    return {
        "programs": int(len(starts)), "calls": int(len(turn)),
        "mean_jct": float(jct.mean()), **pct, "max_jct": float(jct.max()),
        "makespan_s": span, "jobs_per_s": len(starts) / span,
        "output_tokens_per_s": float(turns["output_tokens"].sum()) / span,
        # agent steps (LLM calls) per minute, the rollout throughput of Continuum's Table 5
        # and ThunderAgent's; prompt and output tokens per second (vLLM's total_token_throughput)
        "steps_per_minute": len(turn) / span * 60,
        "total_tokens_per_s": float(turns["prompt_tokens"].sum() + turns["output_tokens"].sum()) / span,
        "mean_queue_delay": float(turns["queue_delay"].mean()),
        "mean_turn_latency": float(turn.mean()), "p99_turn_latency": float(np.percentile(turn, 99)),
        "cache_hit_ratio": float(turns["cached_tokens"].sum() / turns["prompt_tokens"].sum()),
        "prefill_tokens_computed": int(turns["computed_prompt_tokens"].sum()),
        "prefill_tokens_cached": int(turns["cached_tokens"].sum()),
        "preemptions": int(turns["preemptions"].sum()),
        **request_metrics(turns),
        **extra,
    }


# vLLM's request metrics under the names `vllm bench serve` (vllm/benchmarks/serve.py,
# formerly benchmarks/benchmark_serving.py) writes to its result JSON, with its default
# percentile (99): mean_/median_/std_/p99_ of ttft, tpot and e2el, in milliseconds. As
# there, TPOT is (E2E latency - TTFT) / (output tokens - 1) over calls of more than one
# output token, and a metric with no value is 0. A call's times run from its arrival at
# the engine (its program's start, or its tool's return), as a client's from sending the
# request. queue_time (vLLM's per-request `queue_time_ms`, the histogram
# `vllm:request_queue_time_seconds`: arrival to first scheduled) is the column queue_delay.
# ITL: only the mean, which is exact (all calls' decode time over all their token gaps);
# its median and p99 need each token's time, which decode stretches do not keep.
REQUEST_METRICS = ("ttft", "tpot", "e2el", "queue_time")


METRICS_AT = ("engine", "client")


def client_view(turns: dict[str, np.ndarray], server) -> dict[str, np.ndarray]:
    """`turn_columns` with first_token and finish as a benchmark client sees them: the
    API server's time (sim.hardware.profile.ServerTime) added after the run to the
    engine's timestamps, so the steps are the engine's own. The client sends at the
    call's arrival; the engine core sees it request_s + per_prompt_token_s * prompt later,
    and its outputs reach the API server later than the engine core stamps them, together
    handoff_s + handoff_per_prompt_token_s * prompt (a constant shift of what follows: the
    first token and the last come that much later), and each output token after the first
    costs per_output_token_s more to reach it.
    A first token also waits while the API server streams the tokens its step gave the
    calls ahead of it (`outputs_ahead`), per_output_ahead_s each."""
    pre = (server.request_s + server.handoff_s
           + (server.per_prompt_token_s + server.handoff_per_prompt_token_s) * turns["prompt_tokens"])
    post = server.per_output_token_s * np.maximum(turns["output_tokens"] - 1, 0)
    first = turns["first_token"] + pre + server.per_output_ahead_s * outputs_ahead(turns)
    finish = turns["finish"] + pre + post
    return {**turns, "first_token": first, "finish": np.where(turns["output_tokens"] > 1, np.maximum(finish, first), first)}


def outputs_ahead(turns: dict[str, np.ndarray]) -> np.ndarray:
    """Per call, how many other calls of its replica got a token in the step that gave its
    first: those between their first token and their last at that step's end. vLLM's
    scheduler lists the running requests before the new ones (Scheduler.schedule), emits
    a step's outputs in that order (update_from_output), and the API server's output
    handler detokenizes and streams them in it (AsyncLLM.output_handler), so a new call's
    first token reaches its client after theirs. A preempted call waiting for its
    recompute is counted too (it emits nothing). No backlog is carried from step to step:
    where a step's outputs keep the API server busier than the next step lasts, a client
    sees later tokens than this."""
    first, finish, replica = turns["first_token"], turns["finish"], turns["replica"]
    ahead = np.zeros(len(first), dtype=np.int64)
    for r in np.unique(replica):
        on = replica == r
        t = first[on]
        ahead[on] = np.searchsorted(np.sort(t), t, "right") - np.searchsorted(np.sort(finish[on]), t, "left") - 1
    return ahead


def ms_stats(name: str, x: np.ndarray) -> dict[str, float]:
    x = x if len(x) else np.zeros(1)  # vLLM: np.mean(values or 0)
    return {f"mean_{name}_ms": float(np.mean(x)) * 1000, f"median_{name}_ms": float(np.median(x)) * 1000,
            f"std_{name}_ms": float(np.std(x)) * 1000, f"p99_{name}_ms": float(np.percentile(x, 99)) * 1000}


def request_metrics(turns: dict[str, np.ndarray]) -> dict[str, float]:
    """vLLM's request metrics of `turn_columns` (see REQUEST_METRICS)."""
    first, finish, n = turns["first_token"], turns["finish"], turns["output_tokens"]
    multi = n > 1
    decode = finish - first
    gaps = int((n[multi] - 1).sum())
    return {
        **ms_stats("ttft", first - turns["arrival"]),
        **ms_stats("tpot", decode[multi] / (n[multi] - 1)),
        "mean_itl_ms": float(decode[multi].sum()) / gaps * 1000 if gaps else 0.0,
        **ms_stats("e2el", finish - turns["arrival"]),
        **ms_stats("queue_time", turns["queue_delay"]),
    }


# Unit and meaning of every column `sim run --out` writes, stored in each parquet file as
# the field's metadata (`unit`, `description`; pyarrow: `pq.read_schema(path).field(c).metadata`)
# and tabled in docs/reference/cli.md ("Output tables"). Times are simulated seconds from the start
# of the run. Units: s, tokens, blocks, count, index, id, name, bool.
COLUMNS: dict[str, dict[str, tuple[str, str]]] = {
    "turns": {
        "program_id": ("id", "the program (agent session) the call belongs to, as in the trace"),
        "turn": ("index", "the call's position in its program, from 0"),
        "arrival": ("s", "when the call arrived: the program's arrival, or the return of the previous call's tool"),
        "program_arrival": ("s", "when the program's first call arrived"),
        "scheduled": ("s", "when the call was first scheduled (admitted to the running batch)"),
        "first_token": ("s", "when the call's first output token was sampled"),
        "finish": ("s", "when the call's last output token was sampled"),
        "queue_delay": ("s", "scheduled - arrival"),
        "prompt_tokens": ("tokens", "the call's prompt (context at arrival)"),
        "output_tokens": ("tokens", "tokens the call generated"),
        "cached_tokens": ("tokens", "prompt tokens found in the prefix cache at first admission"),
        "computed_prompt_tokens": ("tokens", "prompt tokens actually prefilled, recomputation after preemption included"),
        "preemptions": ("count", "times the call was preempted (its KV freed, recomputed later)"),
        "exec_time": ("s", "model execution time of the steps the call took part in"),
        "tool": ("name", "the tool run after this call (none after the last call or where the trace names none)"),
        "is_last": ("bool", "the program's last call (no tool after it)"),
        "replica": ("index", "the replica that served the call, from 0"),
        "loaded_tokens": ("tokens", "prompt tokens reloaded from an offload tier instead of recomputed, at first admission "
                                    "(beside cached_tokens and computed_tokens: the three add up to the prompt once it is prefilled)"),
        "computed_tokens": ("tokens", "prompt tokens prefilled by the first admission (before a preemption, if any)"),
        "admissions": ("count", "times the call was admitted: the first, and once after each preemption (and on "
                                "its decode replica, when a prefill replica prefilled it)"),
        "admission_cached": ("tokens", "per admission, prompt tokens present in the replica's KV (a prefix hit, or "
                                       "handed over by a prefill replica)"),
        "admission_loaded": ("tokens", "per admission, prompt tokens reloaded from an offload tier"),
        "admission_computed": ("tokens", "per admission, prompt tokens prefilled before the next admission or the end; "
                                         "cached + loaded + computed = prompt for an admission that finished its prefill"),
        "cached_tokens_total": ("tokens", "admission_cached summed over admissions"),
        "loaded_tokens_total": ("tokens", "admission_loaded summed over admissions (prompt tokens only; every token "
                                          "reloaded: reloaded_tokens_total)"),
        "reload_s": ("s", "transfer time of all the call's reloads (every admission)"),
        "ttft": ("s", "time to first token: first_token - arrival (vLLM's TTFT)"),
        "tpot": ("s", "time per output token after the first: (finish - first_token) / (output_tokens - 1); "
                      "NaN for one output token (vLLM's TPOT)"),
        "e2el": ("s", "end-to-end latency: finish - arrival (vLLM's E2EL)"),
        "reloaded_tokens_total": ("tokens", "tokens reloaded from an offload tier over all the call's admissions "
                                            "(a preempted call reloads again; may exceed the prompt)"),
    },
    "programs": {
        "program_id": ("id", "the program, as in the trace"),
        "arrival": ("s", "when the program's first call arrived"),
        "finish": ("s", "when its last call's last token was sampled"),
        "jct": ("s", "job completion time: finish - arrival"),
        "turns": ("count", "calls (turns) of the program"),
        "queue_delay": ("s", "sum over its calls of scheduled - arrival"),
        "prompt_tokens": ("tokens", "sum of its calls' prompts"),
        "cached_tokens": ("tokens", "sum of its calls' prefix-cache hits"),
        "computed_prompt_tokens": ("tokens", "sum of its calls' prefilled prompt tokens"),
        "output_tokens": ("tokens", "sum of its calls' output tokens"),
        "preemptions": ("count", "sum of its calls' preemptions"),
        "loaded_tokens": ("tokens", "sum of its calls' loaded_tokens (reloaded at each call's first admission)"),
        "reload_s": ("s", "sum of its calls' reload transfer times"),
        "reloaded_tokens_total": ("tokens", "sum of its calls' reloaded_tokens_total (every admission)"),
    },
    "kv_usage": {
        "t": ("s", "the sample's time (a scheduler step's start; samples at least 1 s apart)"),
        "used_blocks": ("blocks", "KV blocks in use (running calls and pins) of the replica's num_gpu_blocks (summary.json)"),
        "pinned_blocks": ("blocks", "of those, blocks held by retention pins"),
        "replica": ("index", "the replica sampled, from 0"),
    },
}


def with_units(df, table: str):
    """df as a pyarrow Table whose fields carry COLUMNS[table]'s unit and description."""
    import pyarrow as pa

    t = pa.Table.from_pandas(df, preserve_index=False)
    cols = COLUMNS[table]
    fields = [f.with_metadata({"unit": cols[f.name][0], "description": cols[f.name][1]}) if f.name in cols else f
              for f in t.schema]
    return pa.Table.from_arrays(t.columns, schema=pa.schema(fields, metadata=t.schema.metadata))


def write_table(df, path, table: str) -> None:
    """One output table as parquet, units in its field metadata (read back by pandas as before)."""
    import pyarrow.parquet as pq

    pq.write_table(with_units(df, table), path)


def write_results(out: Path, turns, progs, kv, summary: dict) -> None:
    """turns/programs/kv_usage parquet (each column's unit in its field metadata), then
    summary.json last (its presence = run complete)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, df in (("turns", turns), ("programs", progs), ("kv_usage", kv)):
        atomic_write(out / f"{name}.parquet", lambda p, df=df, name=name: write_table(df, p, name))
    atomic_write(out / "summary.json", lambda p: Path(p).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n"))
