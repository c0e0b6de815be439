"""Trace statistics in the Continuum paper's Table 2 form, plus percentiles.

`sim trace stats TRACE [--json]`; TRACE is a bundled name (`swebench`) or a parquet path.
Tokens per program is the "sum" definition (see traces.generate): the sum over a
program's calls of prompt + output, prompt_t = prompt_{t-1} + output_{t-1} + new_input_t.
Sds are sample sds (ddof=1); percentiles are numpy's (linear).
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from traces.schema import read_trace, validate


def _sd(x) -> float:
    return float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")


def trace_stats(df: pd.DataFrame) -> dict:
    df = validate(df)
    prog = df["program_id"].to_numpy()
    added = (df["new_input_tokens"] + df["output_tokens"]).to_numpy(dtype=np.int64)
    context = pd.Series(added).groupby(prog, sort=False).cumsum()  # context after each call
    per = pd.DataFrame({"p": prog, "ctx": context.to_numpy(), "added": added}).groupby("p", sort=False)
    turns = per.size().to_numpy()
    sums = per["ctx"].sum().to_numpy()  # prompt_t + output_t = context after call t
    final = per["added"].sum().to_numpy()
    ms = df["tool_duration_s"].dropna().to_numpy() * 1000.0
    pct = np.percentile(ms, [50, 90, 99]) if len(ms) else [float("nan")] * 3
    return {
        "programs": int(len(turns)),
        "calls": int(len(df)),
        "turns_mean": float(turns.mean()),
        "turns_sd": _sd(turns),
        "tool_calls": int(len(ms)),
        "tool_ms_mean": float(ms.mean()) if len(ms) else float("nan"),
        "tool_ms_sd": _sd(ms),
        "tool_ms_p50": float(pct[0]),
        "tool_ms_p90": float(pct[1]),
        "tool_ms_p99": float(pct[2]),
        "tokens_per_program_mean": float(sums.mean()),
        "tokens_per_program_sd": _sd(sums),
        "final_context_mean": float(final.mean()),
        "final_context_sd": _sd(final),
        "final_context_max": int(final.max()),
        "new_input_tokens_mean": float(df["new_input_tokens"].mean()),
        "output_tokens_mean": float(df["output_tokens"].mean()),
    }


def format_table(s: dict, name: str = "") -> str:
    def pair(m, sd, fmt):
        return f"({m:{fmt}}, {sd:{fmt}})"

    rows = [
        ("No. of Turns", pair(s["turns_mean"], s["turns_sd"], ",.1f")),
        ("Tool Time (ms)", pair(s["tool_ms_mean"], s["tool_ms_sd"], ",.0f")),
        ("Tokens per Program (sum)", pair(s["tokens_per_program_mean"], s["tokens_per_program_sd"], ",.0f")),
        ("Final context", pair(s["final_context_mean"], s["final_context_sd"], ",.0f")),
        ("Tool time p50 / p90 / p99 (ms)", f"{s['tool_ms_p50']:,.1f} / {s['tool_ms_p90']:,.1f} / {s['tool_ms_p99']:,.1f}"),
        ("Final context max", f"{s['final_context_max']:,}"),
        ("Mean new input / output tokens per call", f"{s['new_input_tokens_mean']:,.1f} / {s['output_tokens_mean']:,.1f}"),
        ("Programs / calls / tool calls", f"{s['programs']:,} / {s['calls']:,} / {s['tool_calls']:,}"),
    ]
    width = max(len(r[0]) for r in rows)
    head = f"{name}  (mean, sd)" if name else "(mean, sd)"
    return "\n".join([head] + [f"  {k:<{width}}  {v}" for k, v in rows])


def _stats_cmd(args) -> int:
    df, meta = read_trace(args.trace)
    s = trace_stats(df)
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        label = args.trace + (" (synthetic)" if meta.get("synthetic") else "")
        print(format_table(s, label))
    return 0


def register(tsub) -> None:
    p = tsub.add_parser("stats", help="print a trace's statistics (paper Table 2 form)")
    p.add_argument("trace", metavar="TRACE", help="bundled name (swebench, bfcl) or a parquet path")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=_stats_cmd)
