"""`sim trace import mooncake | mooncake-agentic` (traces/importers/mooncake.py): the hand-written
fixtures are read as their rows say, a run on them shows the prefix sharing their hash ids
describe, and bad input is one line naming file, line and field, exit 2, nothing written."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from agentsim.cli import main
from traces.importers import import_trace

FIX = Path(__file__).parent / "fixtures" / "importers"
PLAIN = FIX / "mooncake_trace.jsonl"
AGENTIC = FIX / "mooncake_agentic.jsonl"


def seg(df, i):
    return [(s["id"], s["tokens"]) for s in df["segments"].iloc[i]]


def test_plain_fixture():
    df, meta = import_trace("mooncake", PLAIN)
    assert list(df["program_id"]) == ["mooncake_trace:1", "mooncake_trace:2", "mooncake_trace:3", "mooncake_trace:4"]
    assert list(df["turn"]) == [0, 0, 0, 0]
    assert list(df["new_input_tokens"]) == [1200, 1100, 700, 600]
    assert list(df["output_tokens"]) == [40, 30, 20, 25]
    assert list(df["arrival_s"]) == [0.0, 0.5, 1.0, 1.5]              # timestamps are ms
    # one segment per hash id, 512 tokens each, the last block the rest: 1200 = 512 + 512 + 176
    assert seg(df, 0) == [("mooncake_trace.jsonl#0", 512), ("mooncake_trace.jsonl#1", 512), ("mooncake_trace.jsonl#2", 176)]
    assert seg(df, 3) == [("mooncake_trace.jsonl#0", 512), ("mooncake_trace.jsonl#6", 88)]
    assert meta["format"] == "mooncake" and not meta["warnings"]


def test_agentic_fixture():
    df, _ = import_trace("mooncake-agentic", AGENTIC)
    a, b = df[df["program_id"] == "mooncake_agentic:a"], df[df["program_id"] == "mooncake_agentic:b"]
    assert list(a["turn"]) == [0, 1, 2] and list(b["turn"]) == [0, 1]
    # new input = prompt - (previous prompt + previous output): 1500; 2000 - 1600 = 400; 2380 - 2080 = 300
    assert list(a["new_input_tokens"]) == [1500, 400, 300] and list(b["new_input_tokens"]) == [700, 1000 - 760]
    # call t's tool time = row t+1's tool_wait_ms + delay: (2500 + 100) ms, 1200 ms; b: 800 ms
    assert list(a["tool_duration_s"].iloc[:2]) == [2.6, 1.2] and b["tool_duration_s"].iloc[0] == 0.8
    # the tool is the class of the longest event (a3: grep 300 ms, bash 1200 ms)
    assert list(a["tool"].iloc[:2]) == ["bash", "bash"] and b["tool"].iloc[0] == "read_file"
    assert a["arrival_s"].iloc[0] == 0.0 and b["arrival_s"].iloc[0] == 0.3
    # turn 1 of a starts at prompt position 1600, 64 tokens into block 3 (1536-2047, id 104)
    assert seg(a, 1) == [("mooncake_agentic.jsonl#104@64", 400)]
    assert seg(b, 0) == [("mooncake_agentic.jsonl#100", 512), ("mooncake_agentic.jsonl#200", 188)]


def _cached(tmp_path, fmt, src) -> dict:
    trace, out = tmp_path / "t.parquet", tmp_path / "run"
    assert main(["trace", "import", fmt, str(src), "-o", str(trace)]) == 0
    assert main(["run", "--trace", str(trace), "--policy", "vllm", "--out", str(out), "--no-progress"]) == 0
    turns = pd.read_parquet(out / "turns.parquet")
    return {(p, t): c for p, t, c in zip(turns["program_id"], turns["turn"], turns["cached_tokens"])}


def test_a_run_shows_the_sharing_the_plain_hash_ids_describe(tmp_path):
    hit = _cached(tmp_path, "mooncake", PLAIN)
    assert hit[("mooncake_trace:1", 0)] == 0         # ids 0 1 2: first seen
    assert hit[("mooncake_trace:2", 0)] == 1024      # ids 0 1 repeat: 2 x 512 tokens cached
    assert hit[("mooncake_trace:3", 0)] == 0         # ids 4 5: never seen, nothing shared
    assert hit[("mooncake_trace:4", 0)] == 512       # id 0 repeats, id 6 is new


def test_a_run_shows_the_sharing_the_agentic_hash_ids_describe(tmp_path):
    hit = _cached(tmp_path, "mooncake-agentic", AGENTIC)
    assert hit[("mooncake_agentic:a", 0)] == 0
    assert hit[("mooncake_agentic:b", 0)] == 512     # b1 starts with a1's block 100 (512 tokens)
    # later turns hit their own session's context: 1600 tokens, the last output token's KV never
    # written, 1599 -> 99 full blocks of 16 = 1584; then 2080 -> 2079 -> 129 blocks = 2064; b: 760 -> 47 = 752
    assert hit[("mooncake_agentic:a", 1)] == 1584
    assert hit[("mooncake_agentic:a", 2)] == 2064
    assert hit[("mooncake_agentic:b", 1)] == 752


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write(tmp_path, rows) -> Path:
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def _refused(capsys, tmp_path, fmt, path, *parts, extra=()):
    out = tmp_path / "t.parquet"
    rc = main(["trace", "import", fmt, str(path), "-o", str(out), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    for p in parts:
        assert p in err[0], err[0]
    assert not out.exists()


@pytest.mark.parametrize("line,edit,parts", [
    (2, lambda r: r.__setitem__("hash_ids", [0, 1]), ("line 2", "field 'hash_ids' has 2 ids for input_length 1100 = 3 blocks of 512")),
    (1, lambda r: r.pop("input_length"), ("line 1", "field 'input_length' is missing")),
    (3, lambda r: r.__setitem__("output_length", "20"), ("line 3", "field 'output_length'")),
    (4, lambda r: r.__setitem__("hash_ids", [0, -6]), ("line 4", "field 'hash_ids.1'")),
    (2, lambda r: r.__setitem__("timestamp", -1), ("line 2", "field 'timestamp'")),
    (1, lambda r: r.__setitem__("hash_ids", "0 1 2"), ("line 1", "field 'hash_ids'")),
])
def test_plain_bad_input(capsys, tmp_path, line, edit, parts):
    rows = _rows(PLAIN)
    edit(rows[line - 1])
    path = _write(tmp_path, rows)
    _refused(capsys, tmp_path, "mooncake", path, str(path), *parts)


@pytest.mark.parametrize("line,edit,parts", [
    (3, lambda r: r.__setitem__("wait_for", ["b1"]), ("line 3", "field 'wait_for'", "session's previous request")),
    (1, lambda r: r.__setitem__("branches", ["a9"]), ("line 1", "field 'branches'")),
    (2, lambda r: r.__setitem__("request_id", "a1"), ("line 2", "field 'request_id'", "also appears")),
    (2, lambda r: r.pop("session_id"), ("line 2", "field 'session_id' is missing")),
    (5, lambda r: r["tool_events"][1].__setitem__("duration_ms", "long"), ("line 5", "field 'tool_events.1.duration_ms'")),
    (4, lambda r: r.__setitem__("tool_wait_ms", -3), ("line 4", "field 'tool_wait_ms'")),
    (3, lambda r: r.__setitem__("prefix_reset", "no"), ("line 3", "field 'prefix_reset'")),
])
def test_agentic_bad_input(capsys, tmp_path, line, edit, parts):
    rows = _rows(AGENTIC)
    edit(rows[line - 1])
    path = _write(tmp_path, rows)
    _refused(capsys, tmp_path, "mooncake-agentic", path, str(path), *parts)


def test_block_size_option(capsys, tmp_path):
    _refused(capsys, tmp_path, "mooncake", PLAIN, "line 1", "5 blocks of 256", extra=["--block-size", "256"])
    _refused(capsys, tmp_path, "mooncake", PLAIN, "--block-size: 0 is below 1", extra=["--block-size", "0"])
    # 1200 tokens in blocks of 400 are 3 ids: the fixture's first row reads
    df, _ = import_trace("mooncake", PLAIN, block_size=400)
    assert seg(df, 0) == [("mooncake_trace.jsonl#0", 400), ("mooncake_trace.jsonl#1", 400), ("mooncake_trace.jsonl#2", 400)]


def test_agentic_rows_read_as_plain_say_what_is_lost():
    df, meta = import_trace("mooncake", AGENTIC)
    assert df["program_id"].nunique() == 2                # session_id groups turns
    assert any("mooncake-agentic" in w for w in meta["warnings"])
