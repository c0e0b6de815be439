"""Run results: one row per turn, one per program, and a summary (also written to disk)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.call import Call
from agentsim.files import atomic_write


class Recorder:
    def __init__(self) -> None:
        self.turns: list[dict] = []

    def record(self, call: Call, now: float) -> None:
        r = call.req
        self.turns.append({
            "program_id": r.program_id, "turn": r.turn, "arrival": r.arrival,
            "program_arrival": r.program_arrival, "scheduled": call.scheduled_at,
            "first_token": call.first_token_at, "finish": now,
            "queue_delay": call.scheduled_at - r.arrival, "prompt_tokens": call.prompt_len,
            "output_tokens": call.num_output, "cached_tokens": call.cached_tokens,
            "computed_prompt_tokens": call.computed_prompt_tokens, "preemptions": call.preemptions,
            "exec_time": r.exec_time, "tool": r.tool, "is_last": r.is_last_step,
            "replica": call.replica, "loaded_tokens": call.loaded_tokens, "reload_s": call.reload_s,
        })


def turn_table(rec: Recorder) -> pd.DataFrame:
    return pd.DataFrame(rec.turns).sort_values(["program_id", "turn"], kind="stable").reset_index(drop=True)


def program_table(turns: pd.DataFrame) -> pd.DataFrame:
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
    })
    progs.insert(2, "jct", progs["finish"] - progs["arrival"])
    return progs.reset_index()


def summarize(turns: pd.DataFrame, progs: pd.DataFrame, extra: dict) -> dict:
    jct = progs["jct"].to_numpy()
    start, end = float(progs["arrival"].min()), float(progs["finish"].max())
    span = max(end - start, 1e-9)
    pct = {f"p{q}_jct": float(np.percentile(jct, q)) for q in (50, 90, 95, 99)}
    # a turn's latency: its call's arrival (the tool returned) to its last token, what a
    # user waiting on one agent step sees
    turn = (turns["finish"] - turns["arrival"]).to_numpy()
    return {
        "programs": int(len(progs)), "calls": int(len(turns)),
        "mean_jct": float(jct.mean()), **pct, "max_jct": float(jct.max()),
        "makespan_s": span, "jobs_per_s": len(progs) / span,
        "output_tokens_per_s": float(turns["output_tokens"].sum()) / span,
        "mean_queue_delay": float(turns["queue_delay"].mean()),
        "mean_turn_latency": float(turn.mean()), "p99_turn_latency": float(np.percentile(turn, 99)),
        "cache_hit_ratio": float(turns["cached_tokens"].sum() / turns["prompt_tokens"].sum()),
        "prefill_tokens_computed": int(turns["computed_prompt_tokens"].sum()),
        "prefill_tokens_cached": int(turns["cached_tokens"].sum()),
        "preemptions": int(turns["preemptions"].sum()),
        **extra,
    }


def write_results(out: Path, turns: pd.DataFrame, progs: pd.DataFrame, kv: pd.DataFrame, summary: dict) -> None:
    """turns/programs/kv_usage parquet, then summary.json last (its presence = run complete)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "turns.parquet", lambda p: turns.to_parquet(p, index=False))
    atomic_write(out / "programs.parquet", lambda p: progs.to_parquet(p, index=False))
    atomic_write(out / "kv_usage.parquet", lambda p: kv.to_parquet(p, index=False))
    atomic_write(out / "summary.json", lambda p: Path(p).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n"))
