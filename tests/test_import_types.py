"""Issue 36 item 4: importers check the type of every field they read (pydantic models of
each format's records, traces/importers/*.py). A wrong type is one line naming the file,
the record (line, or place in a JSON document) and the field, exit 2, nothing written;
where the format allows skipping, the skip is a counted warning; never a silent drop.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentsim.cli import main
from traces.importers import import_trace

FIX = Path(__file__).parent / "fixtures" / "importers"


def _lines(name):
    return [json.loads(x) for x in (FIX / name).read_text().splitlines() if x.strip()]


def _write(tmp_path, name, doc) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(r) for r in doc) + "\n" if name.endswith(".jsonl") else json.dumps(doc))
    return p


def _refused(capsys, tmp_path, fmt, path, *parts):
    out = tmp_path / "t.parquet"
    rc = main(["trace", "import", fmt, str(path), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert str(path) in err[0], err[0]
    for p in parts:
        assert p in err[0], err[0]
    assert not out.exists()
    return err[0]


# --- claude-code ------------------------------------------------------------------------
@pytest.mark.parametrize("line,mutate,parts", [
    # was: TypeError (len of an int) while measuring the output text
    (4, lambda r: r["message"]["content"][0].__setitem__("text", 7), ("line 4 message.content[0]", "field 'text' is 7")),
    (3, lambda r: r["message"]["content"][0].__setitem__("thinking", True), ("line 3 message.content[0]", "field 'thinking'")),
    # was: the record's calls dropped without a word (not a dict message, a non-bool sidechain flag)
    (16, lambda r: r.__setitem__("message", 5), ("line 16", "field 'message' is 5, not an object")),
    (9, lambda r: r.__setitem__("isSidechain", "yes"), ("line 9", "field 'isSidechain'")),
    (16, lambda r: r["message"].__setitem__("model", 7), ("line 16 message", "field 'model' is 7")),
    (16, lambda r: r["message"]["content"].__setitem__(0, "text"), ("line 16 message", "field 'content")),
    (7, lambda r: r.__setitem__("type", 7), ("line 7", "field 'type' is 7")),
])
def test_claude_code_wrong_types(line, mutate, parts, tmp_path, capsys):
    doc = _lines("claude_code_session.jsonl")
    mutate(doc[line - 1])
    _refused(capsys, tmp_path, "claude-code", _write(tmp_path, "s.jsonl", doc), *parts)


def test_claude_code_untyped_records_are_counted(tmp_path):
    doc = _lines("claude_code_session.jsonl")
    full, _ = import_trace("claude-code", [_write(tmp_path, "a.jsonl", doc)])
    del doc[15]["type"]  # the last call's record
    df, meta = import_trace("claude-code", [_write(tmp_path, "b.jsonl", doc)])
    assert len(df) == len(full) - 1
    assert any("1 records without a 'type' skipped" in w for w in meta["warnings"])


# --- mini-swe-agent ---------------------------------------------------------------------
@pytest.mark.parametrize("mutate,parts", [
    # was: a message of integer role dropped silently (3 calls instead of 4)
    (lambda m: m.__setitem__("role", 7), ("messages[2]", "field 'role' is 7")),
    (lambda m: m.pop("role"), ("messages[2]", "field 'role' is missing")),
    # was: integer content read as an empty message
    (lambda m: m.__setitem__("content", 7), ("messages[2]", "field 'content' is 7")),
    (lambda m: m.__setitem__("tool_calls", "ls"), ("messages[2]", "field 'tool_calls'")),
])
def test_mini_swe_agent_wrong_types(mutate, parts, tmp_path, capsys):
    doc = json.loads((FIX / "django__django-11099.traj.json").read_text())
    mutate(doc["messages"][2])
    _refused(capsys, tmp_path, "mini-swe-agent", _write(tmp_path, "x.traj.json", doc), *parts)


# --- tracelab -----------------------------------------------------------------------------
@pytest.mark.parametrize("mutate,parts", [
    # was: an event or a tool that is not an object skipped; an event type never matched
    (lambda r: r["timing_events"].__setitem__(0, 5), ("line 2", "field 'timing_events.0'")),
    (lambda r: r["timing_events"][0].__setitem__("event_type", 7), ("line 2", "field 'timing_events.0.event_type' is 7")),
    (lambda r: r["tools"][0].__setitem__("tool_name", ["Bash"]), ("line 2", "field 'tools.0.tool_name'")),
    (lambda r: r.__setitem__("session_id", 3), ("line 2", "field 'session_id' is 3")),
])
def test_tracelab_wrong_types(mutate, parts, tmp_path, capsys):
    doc = _lines("tracelab_good.jsonl")
    mutate(doc[1])
    _refused(capsys, tmp_path, "tracelab", _write(tmp_path, "round_trace.jsonl", doc), *parts)


# --- continuum-timestamps -----------------------------------------------------------------
def test_continuum_timestamps_wrong_type_and_skips(tmp_path, capsys):
    doc = json.loads((FIX / "scheduler_timestamps.json").read_text())
    bad = json.loads(json.dumps(doc))
    bad["job_1"][1]["prompt_length"] = "4096"
    _refused(capsys, tmp_path, "continuum-timestamps", _write(tmp_path, "scheduler_timestamps.json", bad),
             "job 'job_1' event 1", "field 'prompt_length'")
    # an event with none of the recorder's fields: skipped and counted, never guessed at
    odd = json.loads(json.dumps(doc))
    odd["job_1"].insert(3, {"note": "x"})
    df, meta = import_trace("continuum-timestamps", [_write(tmp_path, "scheduler_timestamps.json", odd)])
    assert any("1 events with no field the Continuum recorder writes skipped (the first: job 'job_1' event 3)" in w
               for w in meta["warnings"])
    # a lost arrival used to merge two requests silently (the second departure overwrote the first)
    lost = json.loads(json.dumps(doc))
    i = next(i for i, e in enumerate(lost["job_1"]) if i > 0 and "Request_arrival_time" in e)
    lost["job_1"][i] = {"note": "x"}
    _refused(capsys, tmp_path, "continuum-timestamps", _write(tmp_path, "scheduler_timestamps.json", lost),
             "field 'Request_departure_time'", "second departure")


# --- openai-chat and llmservingsim (models since issue 17; one case each here) ------------
def test_openai_chat_wrong_type(tmp_path, capsys):
    doc = _lines("openai_chat_log.jsonl")
    doc[2]["messages"][1]["content"] = 7
    _refused(capsys, tmp_path, "openai-chat", _write(tmp_path, "c.jsonl", doc), "line 3", "field 'messages.1.content' is 7")


def test_llmservingsim_wrong_type(tmp_path, capsys):
    doc = _lines("llmservingsim_sessions.jsonl")
    doc[1]["sub_requests"][0]["tool"] = 7
    _refused(capsys, tmp_path, "llmservingsim", _write(tmp_path, "x.sessions.jsonl", doc), "line 2",
             "field 'sub_requests.0.tool' is 7")
