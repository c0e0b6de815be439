"""Trace transforms.

`carry_over` sets how each turn's output reaches the next prompt (traces/schema.py `carry`).
`repeat_turns` is the paper's turn-scaling experiment (Fig. 14, §6.3): "repeating the
trace (1x to 5x) while inversely scaling the token lengths to emulate more turns but
make total token fit within the context window".
"""
from __future__ import annotations

import numpy as np

from traces import segments
from agentsim.errors import InputError
from traces.schema import CARRY_MODES, validate


def repeat_turns(trace, n: int):
    """Each program's turns played n times in a row, every token count divided by n.

    Token counts are rounded up (a turn keeps >= 1 output token), so a program's total
    tokens stay within n tokens per turn of the original and its context fits where the
    original's did. The joint between one copy's last turn and the next copy's first is
    a tool call: the program's own last tool call (tool and duration), or an unnamed
    0 s tool for a one-turn program. Arrivals are kept.
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"turn repeat must be a whole number >= 1 (got {n!r}); 1 leaves the trace as is")
    trace = validate(trace)
    if n == 1:
        return trace
    import pandas as pd  # the trace is a DataFrame already

    out = []
    for _, g in trace.groupby("program_id", sort=False):
        k = len(g)
        calls = g[g["turn"] < k - 1]
        joint_tool, joint_dur = (calls["tool"].iloc[-1], float(calls["tool_duration_s"].iloc[-1])) if len(calls) else (None, 0.0)
        rep = pd.concat([g] * n, ignore_index=True)
        rep["turn"] = np.arange(k * n)
        for col in ("output_tokens",) + tuple(c for c in ("shared_prefix_tokens", "reasoning_tokens") if c in rep):
            rep[col] = -(-rep[col] // n)  # ceil
        if "reasoning_tokens" in rep:
            rep["reasoning_tokens"] = np.minimum(rep["reasoning_tokens"], rep["output_tokens"])
        rep = segments.rescale(rep, -(-rep["new_input_tokens"] // n), 1 / n)
        joints = (rep["turn"] % k == k - 1) & (rep["turn"] < k * n - 1)
        rep.loc[joints, "tool"] = joint_tool
        rep.loc[joints, "tool_duration_s"] = joint_dur
        out.append(rep)
    return validate(pd.concat(out, ignore_index=True))


def carry_over(trace, mode: str, reasoning_share: float | None = None):
    """Every turn's output carried to the next prompt by `mode` (CARRY_MODES). With
    `reasoning_share` (reasoning-dropped only), each turn's reasoning_tokens become
    round(share x output_tokens), replacing the trace's own; without it the trace's own are
    kept, and a trace without them is refused."""
    if mode not in CARRY_MODES:
        raise InputError(f"--mode {mode!r} is not a carry mode; give one of {', '.join(CARRY_MODES)}")
    if reasoning_share is not None:
        if mode != "reasoning-dropped":
            raise InputError(f"--reasoning-share applies to --mode reasoning-dropped only (got --mode {mode}); drop it")
        if not 0 <= reasoning_share <= 1:
            raise InputError(f"--reasoning-share must be within [0, 1] (got {reasoning_share:g}): the reasoning part of each output")
    trace = validate(trace).copy()
    if reasoning_share is not None:
        trace["reasoning_tokens"] = np.rint(reasoning_share * trace["output_tokens"]).astype(np.int64)
    elif mode == "reasoning-dropped" and "reasoning_tokens" not in trace:
        raise InputError("--mode reasoning-dropped needs each turn's reasoning tokens: the trace has no reasoning_tokens "
                         "column; give --reasoning-share F")
    trace["carry"] = mode
    return validate(trace)


def register(tsub) -> None:
    p = tsub.add_parser("carry", help="set how each turn's output reaches the next prompt",
                        description="Set the trace's `carry` column: how the next prompt carries each turn's output "
                                    "(cached: as generated, its KV reused; rerendered: re-rendered by a chat template, "
                                    "so the prefix cache hits the previous prompt only; reasoning-dropped: without "
                                    "its reasoning tokens, recomputed from where they began).")
    p.add_argument("trace", help="a trace (parquet path or bundled name)")
    p.add_argument("--mode", required=True, metavar="{" + ",".join(CARRY_MODES) + "}", help="the carry mode of every turn")
    p.add_argument("--reasoning-share", type=float, default=None, metavar="F",
                   help="reasoning-dropped: each turn's reasoning tokens = round(F x output_tokens), replacing the trace's")
    p.add_argument("-o", "--output", required=True, metavar="OUT.parquet", help="where to write the trace")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    from traces.schema import read_trace, write_trace

    df, meta = read_trace(args.trace)
    out = carry_over(df, args.mode, args.reasoning_share)
    meta = {**meta, "carry": {"mode": args.mode, "reasoning_share": args.reasoning_share, "source": str(args.trace)}}
    path = write_trace(out, args.output, meta)
    share = f", reasoning share {args.reasoning_share:g}" if args.reasoning_share is not None else ""
    print(f"wrote {path}: {out['program_id'].nunique()} programs, {len(out)} calls, carry {args.mode}{share}")
    return 0
