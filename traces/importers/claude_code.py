"""Claude Code session JSONL (`~/.claude/projects/*/<session>.jsonl`, or AgentCgroup's
`trace.jsonl`).

One record per content block: the records of one LLM call share `message.id` and
repeat its `usage`. The prompt is input + cache_creation + cache_read tokens. A
call's tool time runs from its last `tool_use` block to the last matching
`tool_result` (parallel tools overlap; the agent waits for the slowest). Sub-agent
(`isSidechain`) records form their own chains, rooted where `parentUuid` leaves the
sidechain; they are dropped (their time lies inside the parent's Task tool) or
imported as separate programs.

Content segments (traces/segments.py) come from the log's text: a call's new input is
the text of the user records since the previous call (prompts, tool results), one
segment named by a hash of it. A chain's first call also starts with Claude Code's
system prompt and tool schemas, which the log does not hold but the provider's cache
measures: the first call's `cache_read_input_tokens` is the part an earlier session
had already sent, one segment per (CLI version, model). A first call without a cache
read (the first session, an expired cache, a local model) takes the median of the
import's cache reads for that (version, model), or has no system segment if there is
none: AgentCgroup's Haiku sessions read 10,900-11,174 tokens, its local-model
sessions report no cache use.
"""
from __future__ import annotations

import json
import statistics

from pydantic import StrictBool, StrictStr

from traces.importers.common import (Call, Notes, Program, check_record, fail, fill_gap_durations, get_int, labels, parse_time,
                                     read_jsonl)
from traces.segments import text_id
from traces.validation import Model

PATTERNS = ("*.jsonl",)
GENERIC_NAMES = ("trace.jsonl",)


def load(files, opts: dict, notes: Notes) -> list[Program]:
    mode = opts.get("subagents") or "drop"
    progs = []
    for path, label in zip(files, labels(files, GENERIC_NAMES)):
        chains = _chains(path, read_jsonl(path), notes)
        for chain, calls in chains.items():
            if not calls or (chain != "main" and mode == "drop"):
                continue
            fill_gap_durations(calls, notes)
            pid = label if chain == "main" else f"{label}/{chain}"
            progs.append(Program(pid, calls, arrival_abs_s=calls[0].start_s))
    _system_segments(progs)
    return progs


def _system_segments(progs: list[Program]) -> None:
    """Put the system-prompt segment in front of each program's first call (see above)."""
    reads: dict[str, list[int]] = {}
    heads = [p.calls[0] for p in progs if p.calls[0].system is not None]
    for c in heads:
        sid, n = c.system
        if n:
            reads.setdefault(sid, []).append(n)
    for first in heads:
        sid, n = first.system
        n = n or (int(statistics.median(reads[sid])) if sid in reads else 0)
        if n:
            first.content = [(sid, n)] + first.content


class _Block(Model):
    """A content block, every field the importer reads: ids key dicts and texts are
    measured, so each must be text (a tool result's `content` and a tool's `input` may
    be any JSON: they are serialised)."""
    type: StrictStr | None = None
    id: StrictStr | None = None
    tool_use_id: StrictStr | None = None
    name: StrictStr | None = None
    text: StrictStr | None = None
    thinking: StrictStr | None = None


class _Message(Model):
    id: StrictStr | None = None
    model: StrictStr | None = None
    content: StrictStr | list[dict] | None = None  # text, or a list of block objects
    usage: dict | None = None  # its counts are read by get_int


class _Record(Model):
    type: StrictStr | None = None
    uuid: StrictStr | None = None
    parentUuid: StrictStr | None = None
    isSidechain: StrictBool | None = None
    version: StrictStr | None = None


def _check(path, line: int, r: dict) -> None:
    check_record(_Record, r, path, f"line {line}")
    msg = r.get("message")
    if r.get("type") in ("user", "assistant") and not isinstance(msg, dict):
        raise fail(path, f"line {line}", "message", f"is {msg!r}, not an object" if "message" in r else "is missing",
                   "a user or assistant record holds its message object (wrong format?)")
    if isinstance(msg, dict):
        check_record(_Message, msg, path, f"line {line} message")
        for i, b in enumerate(msg["content"] if isinstance(msg.get("content"), list) else []):
            check_record(_Block, b, path, f"line {line} message.content[{i}]")


def _chains(path, records, notes: Notes) -> dict[str, list[Call]]:
    for line, r in records:
        _check(path, line, r)
    by_uuid = {r.get("uuid"): r for _, r in records if r.get("uuid")}
    if not any(r.get("type") in ("user", "assistant") and isinstance(r.get("message"), dict) for _, r in records):
        raise fail(path, "", "type", "has no Claude Code user/assistant records", "is this the right format? (see `sim trace import --help`)")
    root_label: dict[str, str] = {}
    chains: dict[str, list[Call]] = {"main": []}
    open_calls: dict[str, tuple[Call, list]] = {}  # message.id → call, its tool blocks
    last_ts: dict[str, float] = {}  # chain → latest record time so far (order check)
    ready: dict[str, float] = {}  # chain → latest user/tool_result time: next call's input-ready
    results: dict[str, float] = {}  # tool_use_id → tool_result time
    text: dict[str, list[str]] = {}  # chain → user text since its last call (the next call's new input)
    untyped = 0
    for line, r in records:
        kind = r.get("type")
        if kind not in ("user", "assistant"):
            untyped += kind is None
            continue  # summary, system, file-history records carry no call
        where = f"line {line}"
        ts = parse_time(r.get("timestamp"), path, where, "timestamp")
        chain = _chain_of(r, by_uuid, root_label) if r.get("isSidechain") else "main"
        # Parallel tool results may be written a few ms out of order; a call must
        # still come after everything before it in its chain.
        if kind == "assistant" and ts < last_ts.get(chain, ts) - 1e-3:
            raise fail(path, where, "timestamp", "goes back in time within its chain (unsorted timestamps)", "give the records in the order Claude Code wrote them")
        last_ts[chain] = max(ts, last_ts.get(chain, ts))
        msg = r["message"]
        content = msg.get("content")
        if kind == "user":
            ready[chain] = max(ts, ready.get(chain, ts))
            text.setdefault(chain, []).append(_user_text(content))
            for b in content if isinstance(content, list) else []:
                if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id"):
                    results.setdefault(b["tool_use_id"], ts)
            continue
        if msg.get("model") == "<synthetic>":
            continue  # CLI-injected placeholder, not an LLM call
        mid = msg.get("id")
        if not mid:
            raise fail(path, where, "message.id", "is missing", "each assistant record needs the response id")
        usage = msg.get("usage")
        if not isinstance(usage, dict):
            raise fail(path, where, "message.usage", "is missing", "give the token usage on every assistant record")
        # The full prompt: uncached + written to the provider cache + read from it.
        parts = [get_int(usage, k, path, f"{where} message.usage", required=(k == "input_tokens"))
                 for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
        prompt = sum(p or 0 for p in parts)
        out = get_int(usage, "output_tokens", path, f"{where} message.usage")
        if mid not in open_calls:
            call = Call(output_tokens=out, prompt_tokens=prompt, output_chars=0, start_s=ready.get(chain, ts), end_s=ts)
            new_text = "".join(text.pop(chain, []))
            call.content = [(text_id(new_text, "claude-code") if new_text else None, None)]
            if not chains.get(chain):  # the chain's first call: the system prompt (see _system_segments)
                call.system = (f"claude-code-system:{r.get('version')}:{msg.get('model')}",
                               get_int(usage, "cache_read_input_tokens", path, f"{where} message.usage", required=False) or 0)
            open_calls[mid] = (call, [])
            chains.setdefault(chain, []).append(call)
        call, tools = open_calls[mid]
        call.end_s, call.output_tokens, call.prompt_tokens = ts, out, prompt  # last record wins
        for b in content if isinstance(content, list) else []:
            if not isinstance(b, dict):
                continue
            call.output_chars += len(b.get("text") or "") + len(b.get("thinking") or "")
            if b.get("type") == "tool_use":
                if not isinstance(b.get("name"), str) or not b["name"].strip():
                    raise fail(path, where, "message.content[].name", "is empty on a tool_use block", "give the tool's name")
                call.output_chars += len(json.dumps(b.get("input", {})))
                tools.append((b.get("id"), b["name"], ts))
    for call, tools in open_calls.values():
        _set_tool(call, tools, results)
    if untyped:  # Claude Code writes a type on every record: say what was skipped
        notes.extra.append(f"{path}: {untyped} records without a 'type' skipped")
    return chains


def _user_text(content) -> str:
    """The text a user record adds to the prompt: plain text and tool results' content
    (not their ids, which are unique per call)."""
    if isinstance(content, str):
        return content
    parts = []
    for b in content if isinstance(content, list) else []:
        if isinstance(b, dict):
            body = b.get("text") if b.get("type") == "text" else b.get("content") if b.get("type") == "tool_result" else None
            parts.append(body if isinstance(body, str) else json.dumps(body, sort_keys=True))
    return "\n".join(parts)


def _chain_of(r: dict, by_uuid: dict, root_label: dict) -> str:
    """Sidechain label: walk parentUuid up to the sidechain's root record."""
    node, seen = r, set()
    while True:
        parent = by_uuid.get(node.get("parentUuid"))
        if parent is None or not parent.get("isSidechain") or node.get("uuid") in seen:
            break
        seen.add(node.get("uuid"))
        node = parent
    root = node.get("uuid") or id(node)
    return root_label.setdefault(root, f"side{len(root_label) + 1}")


def _set_tool(call: Call, tools: list, results: dict) -> None:
    if not tools:
        return
    done = [(results[tid], name, ts) for tid, name, ts in tools if tid in results]
    if not done:  # interrupted: no result logged; the gap fallback applies
        call.tool = tools[0][1]
        return
    call.tool_walls = [max(0.0, res - ts) for res, _, ts in done]
    end, name, _ = max(done, key=lambda d: d[0])
    call.tool = name  # the slowest tool is what the agent waited for
    call.tool_duration_s = max(0.0, end - max(ts for _, _, ts in tools))
