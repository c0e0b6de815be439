"""Logged OpenAI chat-completion calls (a JSON list or JSONL; one object per call):

    {"session_id": "s1",                 # or conversation_id / program_id / job_id;
                                         # none: the whole file is one program
     "start_time": "2026-01-01T00:00:00Z",  # or request_time / timestamp / created
     "end_time": 1767225601.5,            # or response_time; ISO-8601 or epoch s
     "messages": [...],                   # or request.messages: the prompt
     "response": {"choices": [{"message": {...}}], "usage": {...}}}
                                         # or choices / response_message

Calls of a program are ordered by start time. Token counts come from `usage` when
logged, else from the named tokenizer or the chars/token estimate. The tool is the
response message's tool call (traces.toolparse); its duration is the gap from
this call's end to the next call's start (chat logs have no tool timestamps).
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from traces.toolparse import parse_tool_from_message
from traces.importers.common import (TOKENS_MAX, Call, Content, Notes, Program, ToolCall, fail, fill_gap_durations, labels,
                                     message_text, one_of, parse_time, read_json, read_jsonl, token_counter)
from traces.validation import JSONInt, Model, validated

PATTERNS = ("*.jsonl", "*.json")
_ID_KEYS = ("session_id", "conversation_id", "program_id", "job_id")
_START_KEYS = ("start_time", "request_time", "timestamp", "created")
_END_KEYS = ("end_time", "response_time")


# a program id becomes a dict key and a trace column: text or a whole number, never a
# list or object (str() of them would be an id nobody logged)
_Id = one_of(lambda v: isinstance(v, (str, int)) and not isinstance(v, bool), "text or a whole number")


class _Message(Model):
    content: Content = None
    tool_calls: list[ToolCall] | None = None


class _Choice(Model):
    message: _Message | None = None


class _Usage(Model):  # absent counts are None; null ones are refused
    prompt_tokens: Annotated[JSONInt, Field(ge=1, le=TOKENS_MAX)] = None
    completion_tokens: Annotated[JSONInt, Field(ge=0, le=TOKENS_MAX)] = None


class _Response(Model):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None


class _Request(Model):
    messages: list[_Message] | None = None


class _Record(_Response, _Request):  # a call's fields may also sit at the top level
    session_id: _Id = None
    conversation_id: _Id = None
    program_id: _Id = None
    job_id: _Id = None
    request: _Request | None = None
    response: _Response | None = None
    response_message: _Message | None = None


def load(files, opts: dict, notes: Notes) -> list[Program]:
    count = token_counter(opts)
    sessions: dict[str, list] = {}
    for path, label in zip(files, labels(files)):
        for where, r in _records(path):
            sid = next((str(r[k]) for k in _ID_KEYS if r.get(k) is not None), label)
            sessions.setdefault(sid, []).append(_call(path, where, r, count))
    progs = []
    for sid, calls in sessions.items():
        calls.sort(key=lambda c: c.start_s)
        fill_gap_durations(calls, notes)
        progs.append(Program(sid, calls, arrival_abs_s=calls[0].start_s))
    return progs


def _records(path):
    if path.suffix == ".jsonl":
        return [(f"line {n}", r) for n, r in read_jsonl(path)]
    data = read_json(path)
    if isinstance(data, dict):
        data = data.get("calls", data.get("data", [data]))
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise fail(path, "", "", "is not a list of chat-completion call objects", "give a JSON list or JSONL of calls")
    return [(f"record {i}", r) for i, r in enumerate(data)]


def _call(path, where, r: dict, count) -> Call:
    rec = validated(_Record, r, f"{path} {where}", "fix the record (wrong format?)")
    req = r.get("request") if isinstance(r.get("request"), dict) else r
    msgs = req.get("messages")
    resp = r.get("response") if isinstance(r.get("response"), dict) else r
    choices = resp.get("choices")
    out_msg = r.get("response_message") or (choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None)
    if not isinstance(msgs, list) or not isinstance(out_msg, dict):
        raise fail(path, where, "messages" if not isinstance(msgs, list) else "response.choices[0].message", "is missing",
                   "each call needs its prompt messages and response message (wrong format?)")
    key = next((k for k in _START_KEYS if r.get(k) is not None), None)
    start = r[key] if key else resp.get("created")
    start_s = parse_time(start, path, where, key or "start_time")
    end = next((r[k] for k in _END_KEYS if r.get(k) is not None), None)
    end_s = start_s if end is None else parse_time(end, path, where, "end_time")
    if end_s < start_s:
        raise fail(path, where, "end_time", "is before start_time", "timestamps are swapped or unsorted; fix the record")
    usage = (rec.response or rec).usage
    out_text = message_text(out_msg)
    if usage is not None and usage.prompt_tokens is not None:
        if usage.completion_tokens is None:
            raise fail(path, f"{where} usage", "completion_tokens", "is missing", "each record needs 'completion_tokens'")
        prompt, out = usage.prompt_tokens, usage.completion_tokens
    else:
        prompt = max(1, count("\n".join(message_text(m) for m in msgs)))
        out = count(out_text)
    return Call(output_tokens=out, prompt_tokens=prompt, output_chars=len(out_text),
                tool=parse_tool_from_message(out_msg), start_s=start_s, end_s=end_s)
