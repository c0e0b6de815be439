"""Which tool does an LLM output call? (stdlib only, never raises: safe on any log or engine output.)

Continuum keys its tool-duration statistics by tool name, and the engine sees only
the generated text. `parse_tool` recognises the common tool-call formats and
returns the name, or None. It never raises: whatever the model (or a broken client)
produces, the scheduler must keep going.

Order, from most to least explicit:
  1. a client hint (the agent knows what it called);
  2. thinking models: only the text after the last `</think>` counts; with an
     unclosed `<think>` only the text before it (the model has not answered yet);
  3. Hermes/Qwen `<tool_call>{json}</tool_call>`;
  4. Llama `<|python_tag|>` (JSON, or `tool.call(...)`, else python code);
  5. mini-swe-agent: ```bash fenced blocks; exactly one is expected (as
     mini-swe-agent itself requires), so several mean no valid action → None;
  6. JSON anywhere in the text: OpenAI `tool_calls` / legacy `function_call`, the
     Responses API item `{"type": "function_call", "name": ...}`, `{"name",
     "arguments"|"parameters"}`, Anthropic `tool_use`, whole chat completions;
  7. Llama pythonic calls `[get_weather(city="Paris"), ...]`;
  8. one unlabelled ``` block holding a shell command.
"""
from __future__ import annotations

import json
import re
import shlex

_MAX_NAME = 200
_MAX_JSON_STARTS = 64  # bounds the JSON scan: a 1 MB run of '{' stays linear-ish
_DECODER = json.JSONDecoder()

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\r?\n(.*?)\r?\n?[ \t]*```", re.DOTALL)
_PY_CALL_RE = re.compile(r"\A\[?\s*([A-Za-z_][\w.]*)\s*\((.*)\)\s*(?:,.*)?\]?\Z", re.DOTALL)
_IDENT_RE = re.compile(r"\A[A-Za-z_][\w.-]*\Z")
_WORD_RE = re.compile(r"\A[\w./+-][\w./+:-]*\Z")
_ENV_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*=")
_SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
_PREFIX_WORDS = {"sudo", "env", "time", "nohup", "exec", "command"}
_SPLIT_RE = re.compile(r"&&|\|\||;|\||\n")


def parse_tool(text, hint=None):
    """Tool name the output `text` calls, or None. Never raises."""
    try:
        if isinstance(hint, str) and hint.strip():
            return hint.strip()[:_MAX_NAME]
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8", errors="replace")
        if not isinstance(text, str) or not text.strip():
            return None
        return _parse(_answer_part(text))
    except Exception:  # noqa: BLE001 - the scheduler must never crash on model output
        return None


def parse_tool_from_message(msg):
    """Tool name an OpenAI chat message dict calls (tool_calls, function_call,
    content text or content parts), or None. Never raises."""
    try:
        if not isinstance(msg, dict):
            return None
        name = _name_in_json(msg, 0)
        if name:
            return name
        content = msg.get("content")
        if isinstance(content, list):  # content parts: text, or Anthropic tool_use
            texts = []
            for part in content:
                if isinstance(part, dict):
                    name = _name_in_json(part, 0) if part.get("type") == "tool_use" else None
                    if name:
                        return name
                    if isinstance(part.get("text"), str):
                        texts.append(part["text"])
            content = "\n".join(texts)
        return parse_tool(content)
    except Exception:  # noqa: BLE001
        return None


def _answer_part(text: str) -> str:
    close = text.rfind("</think>")
    if close >= 0:
        return text[close + len("</think>"):]
    opened = text.rfind("<think>")
    return text[:opened] if opened >= 0 else text


def _parse(text: str):
    if not text.strip():
        return None
    for m in _TOOL_CALL_RE.finditer(text):  # Hermes/Qwen: first tool call
        name = _name_in_text_json(m.group(1))
        if name:
            return name
    tag = text.find("<|python_tag|>")
    if tag >= 0:
        return _python_tag(text[tag + len("<|python_tag|>"):])
    fences = _FENCE_RE.findall(text)
    bash = [body for lang, body in fences if lang.lower() in _SHELL_LANGS]
    if bash:  # mini-swe-agent: exactly one bash block is a valid action
        return command_name(bash[0]) if len(bash) == 1 else None
    name = _name_in_text_json(text)
    if name:
        return name
    name = _pythonic(text)
    if name:
        return name
    plain = [body for lang, body in fences if not lang]
    if len(plain) == 1:
        return command_name(plain[0])
    return None


def _python_tag(rest: str):
    rest = rest.replace("<|eom_id|>", "").replace("<|eot_id|>", "").strip()
    name = _name_in_text_json(rest)
    if name:
        return name
    m = re.match(r"([A-Za-z_]\w*)\.call\s*\(", rest)  # built-in tools: brave_search.call(...)
    if m:
        return m.group(1)
    return "python" if rest else None  # code interpreter: the tag precedes code


def _name_in_text_json(text: str):
    """Scan for JSON values embedded in text; first one that names a tool wins."""
    i, tries = 0, 0
    while tries < _MAX_JSON_STARTS:
        starts = [p for p in (text.find("{", i), text.find("[", i)) if p >= 0]
        if not starts:
            return None
        pos = min(starts)
        tries += 1
        try:
            obj, end = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):
            i = pos + 1
            continue
        name = _name_in_json(obj, 0)
        if name:
            return name
        i = max(end, pos + 1)
    return None


def _clean(name):
    if isinstance(name, str) and name.strip() and len(name.strip()) <= _MAX_NAME:
        return name.strip()
    return None


def _name_in_json(obj, depth: int):
    if depth > 6:
        return None
    if isinstance(obj, list):
        for item in obj[:16]:
            name = _name_in_json(item, depth + 1)
            if name:
                return name
        return None
    if not isinstance(obj, dict):
        return None
    calls = obj.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                fn = call.get("function")
                name = _clean(fn.get("name")) if isinstance(fn, dict) else _clean(call.get("name"))
                if name:
                    return name
    fc = obj.get("function_call")
    if isinstance(fc, dict) and _clean(fc.get("name")):
        return _clean(fc["name"])
    kind = obj.get("type")
    if kind in ("function_call", "tool_use", "tool_call") and _clean(obj.get("name")):
        return _clean(obj["name"])
    fn = obj.get("function")
    if kind == "function" and isinstance(fn, dict) and _clean(fn.get("name")):
        return _clean(fn["name"])
    if _clean(obj.get("name")) and ("arguments" in obj or "parameters" in obj):
        return _clean(obj["name"])
    for key in ("choices", "message", "output"):  # whole responses
        if key in obj:
            name = _name_in_json(obj[key], depth + 1)
            if name:
                return name
    return None


def _pythonic(text: str):
    """Llama 3.2-style `[func(a=1), other(b=2)]`, or a bare `func(a=1)` as the whole output."""
    m = _PY_CALL_RE.match(text.strip())
    if not m:
        return None
    args = m.group(2).strip()
    # A call with keyword arguments or none; keeps prose like "see (a)" out.
    if args and not re.match(r"\A[A-Za-z_]\w*\s*=", args):
        return None
    return m.group(1)


def command_name(body: str):
    """First program a shell snippet runs: 'cd /repo && pytest -x' -> 'cd'."""
    lines = [ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for segment in _SPLIT_RE.split("\n".join(lines)):
        try:
            words = shlex.split(segment, comments=True)
        except ValueError:  # unbalanced quotes: fall back to whitespace
            words = segment.split()
        while words and (_ENV_RE.match(words[0]) or words[0] in _PREFIX_WORDS or words[0] == "$"):
            prefix = words[0] in _PREFIX_WORDS
            words = words[1:]
            while prefix and words and words[0].startswith("-"):  # sudo -E ...
                words = words[1:]
        if words:
            word = words[0].lstrip("(").strip()
            return word if _WORD_RE.match(word) else None
    return None
