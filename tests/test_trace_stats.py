"""traces.stats: hand-computed statistics of a tiny trace, and the `sim trace stats` CLI."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from traces.schema import read_trace, write_trace
from traces.stats import trace_stats
from test_trace_generate import cli

KEYS = {"programs", "calls", "turns_mean", "turns_sd", "tool_calls", "tool_ms_mean", "tool_ms_sd",
        "tool_ms_p50", "tool_ms_p90", "tool_ms_p99", "tokens_per_program_mean", "tokens_per_program_sd",
        "final_context_mean", "final_context_sd", "final_context_max", "new_input_tokens_mean",
        "output_tokens_mean"}


def tiny():
    # a: contexts after each call 12, 19, 25 -> sum 56, final 25; b: one call, 25 -> sum 25, final 25
    return pd.DataFrame({
        "program_id": ["b", "a", "a", "a"],  # unsorted on purpose
        "turn": [0, 2, 0, 1],
        "new_input_tokens": [20, 5, 10, 3],
        "output_tokens": [5, 1, 2, 4],
        "tool": [None, None, "x", "y"],
        "tool_duration_s": [np.nan, np.nan, 1.0, 3.0],
    })


def test_hand_computed():
    s = trace_stats(tiny())
    assert set(s) == KEYS
    expect = {
        "programs": 2, "calls": 4, "turns_mean": 2.0, "turns_sd": math.sqrt(2), "tool_calls": 2,
        "tool_ms_mean": 2000.0, "tool_ms_sd": 1000 * math.sqrt(2), "tool_ms_p50": 2000.0,
        "tool_ms_p90": 2800.0, "tool_ms_p99": 2980.0, "tokens_per_program_mean": 40.5,
        "tokens_per_program_sd": 31 / math.sqrt(2), "final_context_mean": 25.0, "final_context_sd": 0.0,
        "final_context_max": 25, "new_input_tokens_mean": 9.5, "output_tokens_mean": 3.0,
    }
    for k, v in expect.items():
        assert s[k] == pytest.approx(v), k
    assert isinstance(s["programs"], int) and isinstance(s["final_context_max"], int)


def test_cli_table(capsys):
    assert cli(["trace", "stats", "swebench"]) == 0
    out = capsys.readouterr().out
    for text in ("No. of Turns", "(10.9, 2.1)", "Tool Time (ms)", "(925, 3,550)",
                 "Tokens per Program (sum)", "(70,126, 19,732)", "Final context", "p99", "synthetic"):
        assert text in out, text


def test_cli_json_matches_function(tmp_path, capsys):
    path = write_trace(tiny(), tmp_path / "tiny.parquet", {})
    assert cli(["trace", "stats", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == pytest.approx(trace_stats(read_trace(str(path))[0]))


def test_cli_unknown_trace(capsys):
    assert cli(["trace", "stats", "no_such_trace"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no_such_trace" in err and err.count("\n") == 1
