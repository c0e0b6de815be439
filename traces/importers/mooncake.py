"""Mooncake-format traces (JSONL), plain and agentic.

`mooncake`: one request per line, as in the FAST'25 Mooncake release
(kvcache-ai/Mooncake `FAST25-release/traces/*.jsonl`) and AIPerf's `mooncake_trace` dataset:
`timestamp` (ms from the trace start), `input_length` (the full prompt), `output_length`,
`hash_ids` (one id per block of the prompt, `--block-size` tokens, 512 in the FAST'25
traces; a trailing partial block has an id too; equal leading ids are equal prefixes).
Dynamo's MooncakeRow aliases are read too (`input_tokens`, `output_tokens`, `created_time`,
`delay_ms`). Each line is a one-call program arriving at its timestamp; rows that carry a
`session_id` are the turns of one program in file order, and a turn's `delay` (ms after the
previous turn finished) is the previous call's tool time.

`mooncake-agentic`: the agentic Mooncake rows Dynamo's agent simulation replays
(docs.nvidia.com/dynamo, Agents > Agent Simulation, "Agentic Row Semantics"): the fields
above plus `request_id`, `session_id`, `wait_for` (request ids that must finish first),
`branches` (child requests spawned), `prefix_reset` (first request of a session),
`delay` (non-tool delay after the dependencies finish), `tool_wait_ms` (tool time after
them, overlapping spans counted once) and `tool_events` (per-tool spans: `tool_class`,
`duration_ms`, ...). A session becomes a program: each row waits for the row before it in
its session (a linear chain; a row that waits for another, or spawns branches, is refused),
and row t+1's `tool_wait_ms` + `delay` is call t's tool time, named by the class of its
longest tool event.

Hash ids become content segments (traces/segments.py): the block of id h is segment
"<file>#h" (equal ids, equal tokens, so the prefix cache sees what the trace says is
shared). A turn adds the prompt past the previous prompt + output; where that starts inside
a block, the block's rest is segment "<file>#h@offset".
"""
from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AliasChoices, BeforeValidator, Field, StrictBool, StrictStr

from traces.importers.common import TOKENS_MAX, Call, Notes, Program, fail, read_jsonl
from traces.schema import SECONDS_MAX
from traces.validation import JSONFloat, JSONInt, Model, validated

PATTERNS = ("*.jsonl",)
DEFAULT_BLOCK = 512  # tokens per hash id in the FAST'25 Mooncake traces
_Tokens = Annotated[JSONInt, Field(ge=1, le=TOKENS_MAX)]
_Ms = Annotated[JSONFloat, Field(ge=0, le=SECONDS_MAX * 1e3)]  # the trace's bound on times
_HashId = Annotated[JSONInt, Field(ge=0)]


def _id(v):
    # an id becomes part of the trace's program_id: text or a whole number
    if v is None or isinstance(v, (str, int)) and not isinstance(v, bool):
        return v
    raise ValueError("should be text or a whole number")


_Id = Annotated[Any, BeforeValidator(_id)]


class _Row(Model):
    timestamp: _Ms | None = Field(None, validation_alias=AliasChoices("timestamp", "created_time"))
    input_length: _Tokens = Field(validation_alias=AliasChoices("input_length", "input_tokens"))
    output_length: _Tokens = Field(validation_alias=AliasChoices("output_length", "output_tokens"))
    hash_ids: list[_HashId]
    session_id: _Id = None
    delay: _Ms | None = Field(None, validation_alias=AliasChoices("delay", "delay_ms"))


class _ToolEvent(Model):
    tool_class: StrictStr | None = None
    duration_ms: _Ms | None = None


class _AgenticRow(_Row):
    request_id: _Id = None
    session_id: _Id
    wait_for: list[_Id] | None = None
    branches: list[_Id] | None = None
    prefix_reset: StrictBool | None = None
    tool_wait_ms: _Ms | None = None
    tool_events: list[_ToolEvent] | None = None


def _block_size(opts: dict) -> int:
    return opts.get("block_size") or DEFAULT_BLOCK


def _check_blocks(path, where: str, row: _Row, bs: int) -> None:
    need = math.ceil(row.input_length / bs)
    if len(row.hash_ids) != need:
        raise fail(path, where, "hash_ids", f"has {len(row.hash_ids)} ids for input_length {row.input_length} "
                   f"= {need} blocks of {bs} tokens", "give one id per block (--block-size: the trace's block size)")


def _content(ns: str, row: _Row, start: int, bs: int) -> list[tuple[str, int]]:
    """Segments covering prompt positions [start, input_length): the hash blocks they fall in."""
    out = []
    pos = start
    while pos < row.input_length:
        j = pos // bs
        end = min((j + 1) * bs, row.input_length)
        off = pos - j * bs
        out.append((f"{ns}#{row.hash_ids[j]}" + (f"@{off}" if off else ""), end - pos))
        pos = end
    return out


def _calls(path, ns: str, rows: list[tuple[str, _Row]], bs: int, gaps: list[float | None],
           tools: list[str | None], walls: list[list[float]]) -> list[Call]:
    """A program's calls from its rows in order; gaps[t] / tools[t] / walls[t]: the wait
    (s) after call t, its tool name, its tools' wall times (s)."""
    calls, ctx = [], 0
    for t, (where, r) in enumerate(rows):
        _check_blocks(path, where, r, bs)
        content = _content(ns, r, ctx, bs) if r.input_length > ctx else []
        calls.append(Call(output_tokens=r.output_length, prompt_tokens=r.input_length, content=content,
                          tool=tools[t], tool_duration_s=gaps[t], tool_walls=walls[t]))
        ctx = r.input_length + r.output_length
    return calls


def load(files, opts: dict, notes: Notes) -> list[Program]:
    bs = _block_size(opts)
    progs, agentic = [], 0
    for path in files:
        singles, sessions, order = [], {}, []
        for line, r in read_jsonl(path):
            where = f"line {line}"
            agentic += "tool_wait_ms" in r or "wait_for" in r
            row = validated(_Row, r, f"{path} {where}", "fix the record (is this a Mooncake trace? wrong format?)")
            if row.session_id is None:
                singles.append((where, row))
                continue
            sid = str(row.session_id)
            if sid not in sessions:
                sessions[sid] = []
                order.append(sid)
            sessions[sid].append((where, row))
        for where, row in singles:
            calls = _calls(path, path.name, [(where, row)], bs, [None], [None], [[]])
            progs.append(Program(f"{path.stem}:{where.split()[-1]}", calls, _arrival(row)))
        for sid in order:
            rows = sessions[sid]
            gaps = [None if r.delay is None else r.delay / 1e3 for _, r in rows[1:]] + [None]
            calls = _calls(path, path.name, rows, bs, gaps, [None] * len(rows), [[] for _ in rows])
            progs.append(Program(f"{path.stem}:{sid}", calls, _arrival(rows[0][1])))
    if agentic:
        notes.extra.append(f"{agentic} rows carry tool_wait_ms or wait_for (agentic Mooncake rows); their tool time is "
                           "not read by this format: import them as mooncake-agentic")
    return progs


def _arrival(row: _Row) -> float | None:
    return None if row.timestamp is None else row.timestamp / 1e3


def load_agentic(files, opts: dict, notes: Notes) -> list[Program]:
    bs = _block_size(opts)
    progs, seen = [], {}
    for path in files:
        sessions, order = {}, []
        for line, r in read_jsonl(path):
            where = f"line {line}"
            if "input_length" not in r and "input_tokens" not in r and "schema" in r:
                notes.extra.append(f"{path} {where}: a header record (schema {r.get('schema')!r}), not a request; skipped")
                continue
            row = validated(_AgenticRow, r, f"{path} {where}", "fix the record (is this an agentic Mooncake trace? wrong format?)")
            rid = str(row.request_id if row.request_id is not None else f"{path.stem}:{line}")
            if rid in seen:
                raise fail(path, where, "request_id", f"{rid!r} also appears at {seen[rid]}", "give each request once")
            seen[rid] = f"{path} {where}"
            if row.branches:
                raise fail(path, where, "branches", f"spawns {len(row.branches)} child request(s)",
                           "sub-agent branches are not imported: a program here is one linear chain of calls")
            if row.session_id is None:
                raise fail(path, where, "session_id", "is missing", "each agentic request names its session")
            sid = str(row.session_id)
            if sid not in sessions:
                sessions[sid] = []
                order.append(sid)
            prev = sessions[sid][-1][2] if sessions[sid] else None
            wf = None if row.wait_for is None else [str(w) for w in row.wait_for]
            if wf is not None and wf != ([] if prev is None else [prev]):
                raise fail(path, where, "wait_for", f"is {row.wait_for!r}, not " + (f"[{prev!r}] (the session's previous request)"
                           if prev is not None else "empty (the session's first request)"),
                           "only linear sessions are imported: each request waits for the one before it in its session")
            sessions[sid].append((where, row, rid))
        for sid in order:
            rows = sessions[sid]
            gaps, tools, walls = [], [], []
            for _, nxt, _ in rows[1:]:
                ev = [e for e in (nxt.tool_events or []) if e.duration_ms is not None or e.tool_class]
                gaps.append(((nxt.tool_wait_ms or 0.0) + (nxt.delay or 0.0)) / 1e3)
                longest = max(ev, key=lambda e: e.duration_ms or 0.0, default=None)
                tools.append(longest.tool_class if longest else None)
                walls.append([e.duration_ms / 1e3 for e in ev if e.duration_ms is not None])
            calls = _calls(path, path.name, [(w, r) for w, r, _ in rows], bs, gaps + [None], tools + [None], walls + [[]])
            progs.append(Program(f"{path.stem}:{sid}", calls, _arrival(rows[0][1])))
    return progs
