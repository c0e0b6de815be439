"""LLMServingSim agentic sessions (JSONL): one line per session with
`session_id`, `arrival_time_ns` and `sub_requests[]` of `input_toks` (the full
prompt of the call), `output_toks` and `tool_duration_ns` (the wait after it).
AgentCgroup's `derived/*.sessions.jsonl` follow this schema.
"""
from __future__ import annotations

from traces.importers.common import Call, Notes, Program, fail, get_int, read_jsonl

PATTERNS = ("*.sessions.jsonl",)


def load(files, opts: dict, notes: Notes) -> list[Program]:
    progs, seen = [], {}
    for path in files:
        for line, r in read_jsonl(path):
            where = f"line {line}"
            subs = r.get("sub_requests")
            if not isinstance(subs, list):
                raise fail(path, where, "sub_requests", "is missing or not a list", "is this an LLMServingSim sessions file? (wrong format?)")
            if not subs:
                raise fail(path, where, "sub_requests", "is empty", "a session needs at least one request")
            sid = str(r.get("session_id") if r.get("session_id") is not None else f"{path.stem}:{line}")
            if sid in seen:
                raise fail(path, where, "session_id", f"{sid!r} also appears at {seen[sid]}", "give each session once")
            seen[sid] = f"{path} {where}"
            arrival = get_int(r, "arrival_time_ns", path, where, required=False)
            calls = []
            for i, s in enumerate(subs):
                w = f"{where} sub_requests[{i}]"
                if not isinstance(s, dict):
                    raise fail(path, w, "", "is not an object", "give each sub-request as an object")
                dur = get_int(s, "tool_duration_ns", path, w, required=i < len(subs) - 1)
                calls.append(Call(
                    output_tokens=get_int(s, "output_toks", path, w, minimum=1),
                    prompt_tokens=get_int(s, "input_toks", path, w, minimum=1),
                    tool=s.get("tool") if isinstance(s.get("tool"), str) else None,
                    tool_duration_s=None if dur is None else dur / 1e9,
                ))
            progs.append(Program(sid, calls, arrival_abs_s=None if arrival is None else arrival / 1e9))
    return progs
