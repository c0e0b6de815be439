"""TraceLab `round_trace.jsonl`: one line per LLM call ("round") of Claude Code or
Codex sessions.

`input_tokens_total` is the full prompt (TraceLab's `newly_append_tokens` is
relative to the provider's cache hit, not to the previous call, so it is not
used). A round's tool time runs from its last tool emission to its last tool
result; a round without tools waits for the user (think time until the next
round's input).
"""
from __future__ import annotations

from pydantic import StrictStr

from traces.importers.common import Call, Notes, Program, check_record, fail, fill_gap_durations, get_int, parse_time, read_jsonl
from traces.validation import Model

PATTERNS = ("round_trace.jsonl", "*.round_trace.jsonl")


def load(files, opts: dict, notes: Notes) -> list[Program]:
    sessions: dict[str, list] = {}
    for path in files:
        for line, r in read_jsonl(path):
            where = f"line {line}"
            if "input_tokens_total" not in r and "round_index" not in r:
                raise fail(path, where, "input_tokens_total", "is missing", "is this a TraceLab round_trace.jsonl? (wrong format?)")
            check_record(_Round, r, path, where)
            sid = r.get("session_id")
            if not isinstance(sid, str) or not sid:
                raise fail(path, where, "session_id", "is missing", "each round needs its session id")
            idx = get_int(r, "round_index", path, where)
            sessions.setdefault(sid, []).append((idx, path, where, r))
    progs = []
    for sid, rounds in sessions.items():
        rounds.sort(key=lambda x: x[0])
        for (a, *_), (b, path, where, _) in zip(rounds, rounds[1:]):
            if a == b:
                raise fail(path, where, "round_index", f"{b} appears twice in session {sid!r}", "give each round once")
        calls = [_call(path, where, r) for _, path, where, r in rounds]
        for (_, path, where, _), prev, cur in zip(rounds[1:], calls, calls[1:]):
            if cur.start_s is not None and prev.start_s is not None and cur.start_s < prev.start_s:
                raise fail(path, where, "timing_events", "starts before the previous round", "timestamps must follow round_index; fix the file's order or times")
        fill_gap_durations(calls, notes)
        progs.append(Program(sid, calls, arrival_abs_s=calls[0].start_s))
    return progs


class _Event(Model):
    event_type: StrictStr | None = None  # the timestamp is read by parse_time


class _Tool(Model):
    tool_name: StrictStr | None = None  # required below, with its own message
    # emitted_at / result_at by parse_time, tool_wall_latency_ms by get_int


class _Round(Model):
    """Every field the importer reads, the kinds the checks below do not cover: an
    event or tool that is not an object would be skipped, an event type of another
    kind never match."""
    session_id: StrictStr | None = None
    timing_events: list[_Event] | None = None
    tools: list[_Tool] | None = None


def _call(path, where: str, r: dict) -> Call:
    prompt = get_int(r, "input_tokens_total", path, where, minimum=1)
    out = get_int(r, "output_tokens", path, where)
    times = []
    for i, e in enumerate(r.get("timing_events") or []):
        if isinstance(e, dict):
            times.append((e.get("event_type"), parse_time(e.get("timestamp"), path, f"{where} timing_events[{i}]", "timestamp")))
    inputs = [t for kind, t in times if kind in ("user_message", "tool_result")]
    call = Call(output_tokens=out, prompt_tokens=prompt,
                start_s=max(inputs) if inputs else (times[0][1] if times else None),
                end_s=max(t for _, t in times) if times else None)
    done = []
    tools = r.get("tools") or []
    if not isinstance(tools, list):
        raise fail(path, where, "tools", "is not a list", "give tools as a list of objects")
    for i, t in enumerate(tools):
        w = f"{where} tools[{i}]"
        name = t.get("tool_name") if isinstance(t, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise fail(path, w, "tool_name", "is missing or empty", "give each tool's name")
        start = parse_time(t.get("emitted_at"), path, w, "emitted_at")
        if t.get("result_at") is not None:
            end = parse_time(t["result_at"], path, w, "result_at")
        elif t.get("tool_wall_latency_ms") is not None:
            end = start + get_int(t, "tool_wall_latency_ms", path, w) / 1000.0
        else:
            raise fail(path, w, "result_at", "is missing (and no tool_wall_latency_ms)", "give the tool's result time or latency")
        if end < start:
            raise fail(path, w, "result_at", "is before emitted_at", "timestamps are out of order; fix the record")
        done.append((end, start, name))
    if done:
        call.tool_walls = [e - s for e, s, _ in done]
        end, _, call.tool = max(done)  # the agent waits for the slowest tool
        call.tool_duration_s = end - max(s for _, s, _ in done)
    return call
