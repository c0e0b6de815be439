"""Trace transforms used by sweeps.

`repeat_turns` is the paper's turn-scaling experiment (Fig. 14, §6.3): "repeating the
trace (1x to 5x) while inversely scaling the token lengths to emulate more turns but
make total token fit within the context window".
"""
from __future__ import annotations

import numpy as np

from traces import segments
from agentsim.errors import InputError
from traces.schema import validate


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
        for col in ("output_tokens",) + (("shared_prefix_tokens",) if "shared_prefix_tokens" in rep else ()):
            rep[col] = -(-rep[col] // n)  # ceil
        rep = segments.rescale(rep, -(-rep["new_input_tokens"] // n), 1 / n)
        joints = (rep["turn"] % k == k - 1) & (rep["turn"] < k * n - 1)
        rep.loc[joints, "tool"] = joint_tool
        rep.loc[joints, "tool_duration_s"] = joint_dur
        out.append(rep)
    return validate(pd.concat(out, ignore_index=True))
