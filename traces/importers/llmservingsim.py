"""LLMServingSim agentic sessions (JSONL): one line per session with
`session_id`, `arrival_time_ns` and `sub_requests[]` of `input_toks` (the full
prompt of the call), `output_toks` and `tool_duration_ns` (the wait after it).
AgentCgroup's `derived/*.sessions.jsonl` follow this schema.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictStr

from traces.importers.common import TOKENS_MAX, Call, Notes, Program, fail, read_jsonl
from traces.schema import SECONDS_MAX
from traces.validation import JSONInt, Model, validated

PATTERNS = ("*.sessions.jsonl",)
_Tokens = Annotated[JSONInt, Field(ge=1, le=TOKENS_MAX)]
_Nanoseconds = Annotated[JSONInt, Field(ge=0, le=int(SECONDS_MAX * 1e9))]  # the trace's bound on times


def _id(v):
    # the id becomes the trace's program_id: text or a whole number, not a list or object
    if v is None or isinstance(v, (str, int)) and not isinstance(v, bool):
        return v
    raise ValueError("should be text or a whole number")


class _Sub(Model):
    input_toks: _Tokens  # the call's full prompt
    output_toks: _Tokens
    tool_duration_ns: _Nanoseconds | None = None  # the wait after it; needed before the last
    tool: StrictStr | None = None  # another kind would be dropped silently


class _Session(Model):
    session_id: Annotated[Any, BeforeValidator(_id)] = None
    arrival_time_ns: _Nanoseconds | None = None
    sub_requests: list[_Sub]


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
            rec = validated(_Session, r, f"{path} {where}", "fix the record (wrong format?)")
            sid = str(rec.session_id if rec.session_id is not None else f"{path.stem}:{line}")
            if sid in seen:
                raise fail(path, where, "session_id", f"{sid!r} also appears at {seen[sid]}", "give each session once")
            seen[sid] = f"{path} {where}"
            calls = []
            for i, s in enumerate(rec.sub_requests):
                if s.tool_duration_ns is None and i < len(rec.sub_requests) - 1:
                    raise fail(path, f"{where} sub_requests[{i}]", "tool_duration_ns", "is missing", "give the wait after every request but the last")
                calls.append(Call(output_tokens=s.output_toks, prompt_tokens=s.input_toks, tool=s.tool,
                                  tool_duration_s=None if s.tool_duration_ns is None else s.tool_duration_ns / 1e9))
            arrival = rec.arrival_time_ns
            progs.append(Program(sid, calls, arrival_abs_s=None if arrival is None else arrival / 1e9))
    return progs
