"""Shared pieces of the importers: reading files with errors that name the file,
record and field, and turning per-call logs into trace rows.

Every importer reduces a log to a list of `Call`s per program; `rows_for` then
applies the trace's one convention: turn t's prompt = turn t-1's prompt + its
output + new input (see traces/schema.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from typing import Annotated, Any

from pydantic import BeforeValidator, StrictStr

from agentsim.errors import InputError
from traces.schema import SECONDS_MAX
from traces.validation import Model, validated

PLACEHOLDER_MAX = 4  # Claude Code 2.0.0 logs output_tokens of 1-4 from the stream start


def fail(path, where: str, fld: str, problem: str, fix: str) -> InputError:
    """The one-line error: file, record, field, what is wrong, how to fix it."""
    loc = f"{path}" + (f" {where}" if where else "")
    return InputError(f"{loc}: field '{fld}' {problem}; {fix}" if fld else f"{loc}: {problem}; {fix}")


def check_record(model, obj, path, where: str) -> None:
    """The record's shape against the importer's pydantic model (traces/validation.py):
    a field of the wrong type is one line naming file, record and field."""
    validated(model, obj, f"{path}" + (f" {where}" if where else ""), "fix the record (wrong format?)")


def one_of(ok, what: str):
    """A field that may hold several JSON kinds: one message naming them (a pydantic
    union would name its first member only, as 'field.str')."""
    def check(v):
        if v is None or ok(v):
            return v
        raise ValueError(f"should be {what}")
    return Annotated[Any, BeforeValidator(check)]


def _text_or_parts(v) -> bool:  # a content part: text, an image, an Anthropic tool_use block
    return isinstance(v, str) or isinstance(v, list) and all(
        isinstance(p, str) or isinstance(p, dict) and isinstance(p.get("text"), (str, type(None))) for p in v)


# A chat message's content (message_text reads it): text or a list of content parts.
Content = one_of(_text_or_parts, "text or a list of content parts (text, or objects whose 'text' is text)")


_Arguments = one_of(lambda v: isinstance(v, (str, dict)), "text or an object")


class ToolFunction(Model):
    name: StrictStr | None = None
    arguments: _Arguments = None


class ToolCall(Model):  # a chat message's tool call (OpenAI form)
    function: ToolFunction | None = None


@dataclass
class Call:
    """One LLM call as logged. Either `prompt_tokens` (the full prompt) or
    `new_input_tokens` (what it adds) is set."""
    output_tokens: int | None
    prompt_tokens: int | None = None
    new_input_tokens: int | None = None
    output_chars: int | None = None  # for the chars/token estimate
    tool: str | None = None
    tool_duration_s: float | None = None
    start_s: float | None = None  # absolute seconds (epoch) where the log has times
    end_s: float | None = None
    tool_walls: list[float] = field(default_factory=list)  # each tool's own wall time (s)
    # what the new input holds, in order, where the log has text (traces/segments.py):
    # (segment id or None = unknown, tokens or None = the rest of the new input)
    content: list[tuple[str | None, int | None]] | None = None
    system: tuple[str, int] | None = None  # a first call's system-prompt segment id, its size if logged (else 0)


@dataclass
class Program:
    program_id: str
    calls: list[Call]
    arrival_abs_s: float | None = None  # absolute; made relative over the import


@dataclass
class Notes:
    """Counts that become warnings in the metadata and the CLI line."""
    shrank: int = 0  # calls whose prompt was smaller than the previous context
    gap_fallback: int = 0  # tool durations taken from call gaps, not tool timestamps
    extra: list[str] = field(default_factory=list)


def find_files(paths, patterns: tuple[str, ...], fmt: str) -> list[Path]:
    """Files given, plus the format's files found under any directory given."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted({q for pat in patterns for q in p.rglob(pat) if q.is_file()})
            if not found:
                raise InputError(f"{p}: no {fmt} files ({', '.join(patterns)}) under this directory; give the files or the right directory")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"{p}: no such file or directory; check the path")
    out = list(dict.fromkeys(out))  # a file named twice is imported once
    if not out:
        raise InputError(f"no input files for {fmt}; give one or more files")
    return out


def read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise fail(path, f"byte {e.start}", "", "is not UTF-8 text", "give the log file itself, not a binary or compressed file") from None
    except OSError as e:
        raise fail(path, "", "", f"cannot be read ({e.strerror})", "check the path and permissions") from None
    if not text.strip():
        raise fail(path, "", "", "is empty", "give a non-empty log file")
    return text


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line; every line must be a JSON object."""
    lines = read_text(path).splitlines()
    last = max(i for i, ln in enumerate(lines) if ln.strip())
    out = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError as e:
            hint = "the file looks truncated; drop the incomplete last line" if i == last else "fix or remove that line"
            raise fail(path, f"line {i + 1}", "", f"is not valid JSON ({e.msg})", hint) from None
        if not isinstance(obj, dict):
            raise fail(path, f"line {i + 1}", "", f"is a JSON {type(obj).__name__}, not an object", "each line must be one JSON object")
        out.append((i + 1, obj))
    return out


def read_json(path: Path):
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise fail(path, f"line {e.lineno}", "", f"is not valid JSON ({e.msg})", "give a complete JSON file (is it truncated, or JSON Lines?)") from None


def parse_time(value, path, where: str, fld: str) -> float:
    """ISO-8601 string or epoch number → epoch seconds."""
    if value is None:
        raise fail(path, where, fld, "is missing", "give a timestamp (ISO-8601 or epoch seconds)")
    t = None
    if isinstance(value, bool):  # true is a wrong type (json's 1), not a missing field
        raise fail(path, where, fld, f"is {json.dumps(value)}, a boolean, not a timestamp", "give ISO-8601 (2026-01-31T12:00:00.000Z) or epoch seconds")
    if isinstance(value, (int, float)) and math.isfinite(value):
        t = float(value)
    elif isinstance(value, str):
        try:
            t = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    if t is None:
        raise fail(path, where, fld, f"is {value!r}, not a timestamp", "give ISO-8601 (2026-01-31T12:00:00.000Z) or epoch seconds")
    if not 0 <= t <= SECONDS_MAX:  # the trace's bound on its times (traces/schema.py), so any difference fits
        raise fail(path, where, fld, f"is {value!r}, " + ("before 1970" if t < 0 else f"more than {SECONDS_MAX:.0e} s after 1970 (milliseconds?)"),
                   "give epoch seconds or ISO-8601")
    return t


TOKENS_MAX = 10**9  # far above any context: a larger count is a corrupt record (and would overflow int64)


def get_int(obj: dict, key: str, path, where: str, *, required: bool = True, minimum: int = 0):
    v = obj.get(key)
    if v is None:
        if required:
            raise fail(path, where, key, "is missing", f"each record needs '{key}'")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) \
            or not minimum <= v <= TOKENS_MAX:
        raise fail(path, where, key, f"is {v!r}, not a whole number in [{minimum}, {TOKENS_MAX:.0e}]", "fix the record")
    return int(v)


def estimate_tokens(chars: int | None, chars_per_token: float) -> int | None:
    if chars is None:
        return None
    return max(1, int(round(chars / chars_per_token)))


def rows_for(prog: Program, notes: Notes) -> list[dict]:
    """Trace rows of one program. A full prompt becomes what it adds to the trace's
    own context so far (previous prompt + output). Real prompts can grow by less
    than the previous output (thinking dropped from the history, compaction): the
    increment is clipped at 0 (counted in `notes.shrank`), and because `context`
    follows the trace, the excess is absorbed by later growth instead of adding up."""
    rows = []
    context = 0  # the trace's previous prompt + previous output
    for t, c in enumerate(prog.calls):
        out = max(1, int(c.output_tokens or 1))
        if c.prompt_tokens is not None:
            new = c.prompt_tokens - context
            if new < 0:
                notes.shrank += 1
                new = 0
        else:
            new = int(c.new_input_tokens or 0)
        if t == 0:
            new = max(1, new)
        context += new + out
        rows.append({
            "program_id": prog.program_id, "turn": t, "new_input_tokens": int(new),
            "output_tokens": out, "tool": c.tool,
            "tool_duration_s": None if t == len(prog.calls) - 1 else _duration(c),
        })
        if c.content is not None:
            rows[-1]["segments"] = _segments(c.content, int(new), f"{prog.program_id}#{t}")
    return rows


def _segments(content, n: int, own: str) -> list[dict]:
    """Segments covering n new tokens: sized pieces first (clipped to what is left),
    a None size takes the rest, and whatever remains is the call's own content."""
    out, left = [], n
    for j, (sid, k) in enumerate(content):
        k = left if k is None else min(k, left)
        if k > 0:
            out.append({"id": sid or f"{own}#{j}", "tokens": k})
            left -= k
    if left:
        out.append({"id": f"{own}#rest", "tokens": left})
    return out


def _duration(c: Call) -> float:
    d = c.tool_duration_s
    return 0.0 if d is None or not math.isfinite(d) else max(0.0, float(d))


def fill_gap_durations(calls: list[Call], notes: Notes) -> None:
    """Where a call has no tool timing, the wait is next start − this end."""
    for a, b in zip(calls, calls[1:]):
        if a.tool_duration_s is None and a.end_s is not None and b.start_s is not None:
            a.tool_duration_s = max(0.0, b.start_s - a.end_s)
            notes.gap_fallback += 1


def placeholder_warning(programs: list[Program], estimate: bool) -> str | None:
    outs = [c.output_tokens for p in programs for c in p.calls if c.output_tokens is not None]
    if not outs or estimate:
        return None
    frac = sum(1 for o in outs if o <= PLACEHOLDER_MAX) / len(outs)
    if frac >= 0.5:
        return f"placeholder output tokens (1-{PLACEHOLDER_MAX}) in {frac:.0%} of calls; rerun with --estimate-tokens"
    return None


def labels(files: list[Path], generic_names: tuple[str, ...] = ()) -> list[str]:
    """Program ids from paths: unique over the import, readable.

    `.../dask__dask-11628/attempt_1/trace.jsonl` → `dask__dask-11628/attempt_1` (the
    derived AgentCgroup files use the same id); with several sets, the path below
    their common folder keeps ids apart.
    """
    def stem(p: Path) -> Path:
        return p.parent if p.name in generic_names else p.with_suffix("")

    stems = [stem(f.resolve()) for f in files]
    if len(stems) == 1:
        s = stems[0]
        return [f"{s.parent.name}/{s.name}" if files[0].name in generic_names else s.name]
    import os
    root = Path(os.path.commonpath([str(s.parent) for s in stems]))
    return [str(s.relative_to(root)) for s in stems]


def token_counter(opts: dict):
    """Counts tokens of text: the tokenizer the user named (offline only), else
    characters / --chars-per-token (default 4.0, about right for English and code)."""
    name = opts.get("tokenizer")
    if name:
        try:
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - ImportError, OSError, ValueError...
            raise InputError(f"--tokenizer {name!r} cannot be loaded offline ({type(e).__name__}); "
                             "put it in the Hugging Face cache first, or drop --tokenizer to use --chars-per-token") from None
        return lambda text: len(tok.encode(text or "", add_special_tokens=False))
    cpt = opts.get("chars_per_token", 4.0)  # checked in import_trace
    return lambda text: int(round(len(text or "") / cpt))


def message_text(msg) -> str:
    """The text a chat message puts in the context: content (string or parts) plus
    tool-call names and arguments."""
    if not isinstance(msg, dict):
        return ""
    parts = []
    content = msg.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, str):
                parts.append(p)
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            parts.append(str(fn.get("name") or ""))
            args = fn.get("arguments")
            parts.append(args if isinstance(args, str) else json.dumps(args))
    return "\n".join(parts)


def tool_wall_stats(programs: list[Program]) -> dict | None:
    """Each logged tool's own wall time (ms): mean and percentiles, to compare with
    the source's statistics (a trace row holds one wait per call, the slowest of
    its parallel tools)."""
    walls = sorted(w * 1000.0 for p in programs for c in p.calls for w in c.tool_walls)
    if not walls:
        return None

    def pct(q: float) -> float:  # linear interpolation, as numpy's default
        k = (len(walls) - 1) * q / 100.0
        lo = int(k)
        hi = min(lo + 1, len(walls) - 1)
        return walls[lo] + (walls[hi] - walls[lo]) * (k - lo)

    return {"n": len(walls), "mean_ms": sum(walls) / len(walls), "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99)}
