"""mini-swe-agent trajectories (`<instance>.traj.json`): `{"info": ..., "messages":
[...], "trajectory_format": "mini-swe-agent-1..."}`.

Each assistant message is one LLM call. Newer versions record `extra.timestamp`
(when the message was made) and `extra.response` (the raw completion, with
`usage`); observations (role user/tool) carry their own `extra.timestamp`, so a
tool runs from the assistant message to the last observation after it. The tool
is the first word of the single ```bash block (traces.toolparse), or the
tool call's name in tool-calling mode. Without `usage`, tokens are estimated from
the message text (--tokenizer / --chars-per-token).

Content segments (traces/segments.py): each message since the previous call is one
segment named by a hash of its text and sized by the token counter, the last one
taking the rest of the logged prompt growth; so the system prompt and an instance's
task text are shared by every trajectory that has them.
"""
from __future__ import annotations

from traces.toolparse import command_name, parse_tool_from_message
from pydantic import StrictStr

from traces.segments import text_id
from traces.importers.common import (Call, Content, Notes, Program, ToolCall, check_record, fail, get_int, message_text,
                                     parse_time, read_json, token_counter)
from traces.validation import Model


class _Extra(Model):
    response: dict | None = None  # the raw completion, with usage
    actions: list[dict | StrictStr] | None = None  # a bare string would read as its letters


class _Message(Model):
    """Every field the importer reads: a message of another role or without one would
    be dropped from the calls, content of another kind read as empty."""
    role: StrictStr | None = None  # required where other messages have one (_calls)
    content: Content = None
    tool_calls: list[ToolCall] | None = None
    extra: _Extra | None = None

PATTERNS = ("*.traj.json", "*.traj")


def load(files, opts: dict, notes: Notes) -> list[Program]:
    count = token_counter(opts)
    progs = []
    for path in files:
        data = read_json(path)
        msgs = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise fail(path, "", "messages", "is missing or not a list of message objects", "is this a mini-swe-agent .traj.json? (wrong format?)")
        name = path.name
        for suffix in (".traj.json", ".traj", ".json"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        calls = _calls(path, msgs, count, notes)
        if calls:
            stamps = [_ts(path, i, m) for i, m in enumerate(msgs)]
            progs.append(Program(name, calls, arrival_abs_s=min(t for t in stamps if t is not None)))
    return progs


def _ts(path, i, m):
    extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
    t = extra.get("timestamp", m.get("timestamp"))
    return None if t is None else parse_time(t, path, f"messages[{i}]", "extra.timestamp")


def _calls(path, msgs, count, notes: Notes) -> list[Call]:
    calls: list[Call] = []
    text_so_far = []  # the context: every message before the call
    since = 0  # index in text_so_far of the first message after the last call
    last_ts = None
    roles = any("role" in m for m in msgs)  # none at all: another format ("no LLM calls found")
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        check_record(_Message, m, path, where)
        if roles and m.get("role") is None:
            raise fail(path, where, "role", "is missing", "every message has its role (system, user, assistant, tool)")
        ts = _ts(path, i, m)
        if ts is not None and last_ts is not None and ts < last_ts - 1e-3:
            raise fail(path, where, "extra.timestamp", "is earlier than the message before it", "give messages in the order they were made")
        last_ts = ts if ts is not None else last_ts
        role = m.get("role")
        if role == "assistant":
            if ts is None:
                raise fail(path, where, "extra.timestamp", "is missing", "this trajectory has no timing (older mini-swe-agent); rerun with a version that records extra.timestamp")
            usage = ((m.get("extra") or {}).get("response") or {}).get("usage") or m.get("usage")
            out_text = message_text(m)
            if isinstance(usage, dict):
                prompt = get_int(usage, "prompt_tokens", path, f"{where} extra.response.usage", minimum=1)
                out = get_int(usage, "completion_tokens", path, f"{where} extra.response.usage")
            elif calls:  # estimate what the messages since the last call add to its context
                prev = calls[-1]
                prompt, out = prev.prompt_tokens + prev.output_tokens + count("\n".join(text_so_far[since:])), count(out_text)
            else:
                prompt, out = max(1, count("\n".join(text_so_far))), count(out_text)
            new = text_so_far[since:]
            since = len(text_so_far) + 1  # messages after this one are new input
            calls.append(Call(output_tokens=out, prompt_tokens=prompt, output_chars=len(out_text),
                              tool=_tool(m), start_s=last_ts, end_s=ts,
                              content=[(text_id(t, "mini-swe-agent"), None if k == len(new) - 1 else count(t))
                                       for k, t in enumerate(new)]))
        elif role in ("user", "tool") and calls and ts is not None:
            c = calls[-1]  # an observation of the last call's action: the tool ended
            c.tool_duration_s = max(0.0, ts - c.end_s)
        if role != "exit":
            text_so_far.append(message_text(m))
    return calls


def _tool(m: dict):
    name = parse_tool_from_message(m)
    if name:
        return name
    actions = (m.get("extra") or {}).get("actions") or []
    if actions:  # v2 keeps the parsed commands: [{"command": "..."}] or ["..."]
        a = actions[0]
        cmd = a.get("command") if isinstance(a, dict) else a
        return command_name(cmd) if isinstance(cmd, str) else None
    return None
