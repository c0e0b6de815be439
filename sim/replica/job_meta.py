"""Per-request agent metadata as it reaches vLLM: `SamplingParams.extra_args`.

On the OpenAI server it is the request's `vllm_xargs` field (booleans arrive as 0/1,
everything may arrive as a string). The scheduler must never crash on it, so parsing
never raises: it returns what it could read and a list of problems to log once.

    job_id        program id (str or int). Missing or malformed: the request is a
                  one-turn program of its own.
    is_last_step  the program's last call (bool, 0/1, "true"/"false"). Default False.
    tool          the tool the program runs after this call (a client hint); also
                  read from `tool_hint`. Default None.
    tool_duration_s  how long that tool will run, s: only a trace replay knows it (for the
                  oracle and InferCept's public-code form, as in the simulator). Default None.
    kv_hints      the client's retention hint for this call's KV, shaped like vLLM's
                  KvHintsEnvelope and Dynamo's cache_control: {"priority": 0-100,
                  "ttl": seconds (a number, or text such as "30s", "5m", "1h"), "session":
                  str}; read by parse_hint (policies.base.RetentionHint). Default None.
"""
from __future__ import annotations

from dataclasses import dataclass, field

_TRUE = {"1", "true", "yes"}
_FALSE = {"0", "false", "no", ""}


@dataclass
class JobMeta:
    program_id: str
    is_last_step: bool
    tool: str | None
    anonymous: bool  # no usable job_id: a one-turn program
    problems: list[str] = field(default_factory=list)
    tool_duration_s: float | None = None


def _flag(value, problems: list[str]) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    problems.append(f"is_last_step={value!r} is not a boolean (true/false/0/1); taken as false")
    return False


def parse_job_meta(extra_args, request_id: str) -> JobMeta:
    if type(extra_args) is dict:  # fast path (runs per request): the form a replay or client sends
        job, last = extra_args.get("job_id"), extra_args.get("is_last_step", False)
        tool, duration = extra_args.get("tool", extra_args.get("tool_hint")), extra_args.get("tool_duration_s")
        if (type(job) is str and job and not job[0].isspace() and not job[-1].isspace() and type(last) is bool
                and (tool is None or type(tool) is str) and (duration is None or (type(duration) is float
                                                                                   and 0.0 <= duration < _INF))):
            return JobMeta(job, last, tool or None, False, [], duration)
    return _parse(extra_args, request_id)


_INF = float("inf")


def _parse(extra_args, request_id: str) -> JobMeta:
    problems: list[str] = []
    if extra_args is None:
        extra_args = {}
    if not isinstance(extra_args, dict):
        problems.append(f"extra_args is a {type(extra_args).__name__}, not a mapping; ignored")
        extra_args = {}
    job = extra_args.get("job_id")
    if isinstance(job, bool) or not isinstance(job, (str, int)) or (isinstance(job, str) and not job.strip()):
        if job is not None:
            problems.append(f"job_id={job!r} is not a non-empty string or integer; "
                            "the request is served as a one-turn program")
        return JobMeta(f"<anon>{request_id}", True, None, True, problems)
    last = _flag(extra_args.get("is_last_step", False), problems)
    tool = extra_args.get("tool", extra_args.get("tool_hint"))
    if tool is not None and not isinstance(tool, str):
        problems.append(f"tool={tool!r} is not a string; ignored")
        tool = None
    duration = extra_args.get("tool_duration_s")
    if duration is not None:
        try:
            duration = float(duration)
            if not duration >= 0 or duration == float("inf"):
                raise ValueError
        except (TypeError, ValueError):
            problems.append(f"tool_duration_s={extra_args['tool_duration_s']!r} is not a finite number >= 0; ignored")
            duration = None
    return JobMeta(str(job).strip(), last, tool or None, False, problems, tool_duration_s=duration)


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(v) -> float:
    if isinstance(v, str) and v.strip() and v.strip()[-1] in _UNITS:
        return float(v.strip()[:-1]) * _UNITS[v.strip()[-1]]
    if isinstance(v, bool):
        raise ValueError
    return float(v)


def parse_hint(hints) -> tuple:
    """A kv_hints mapping as (policies.base.RetentionHint or None, problems); never raises.
    A hint with neither a priority nor a ttl asks for nothing (None)."""
    from policies.base import HINT_PRIORITY, RetentionHint

    if hints is None:
        return None, []
    if not isinstance(hints, dict):
        return None, [f"kv_hints is a {type(hints).__name__}, not a mapping; ignored"]
    problems, prio, ttl = [], hints.get("priority"), hints.get("ttl")
    if prio is not None:
        try:
            if isinstance(prio, bool) or float(prio) != int(float(prio)) or not 0 <= int(float(prio)) <= 100:
                raise ValueError
            prio = int(float(prio))
        except (TypeError, ValueError):
            problems.append(f"kv_hints priority={hints['priority']!r} is not a whole number 0-100; hint ignored")
            return None, problems
    if ttl is not None:
        try:
            ttl = _seconds(ttl)
            if not 0 <= ttl < _INF:
                raise ValueError
        except (TypeError, ValueError):
            problems.append(f"kv_hints ttl={hints['ttl']!r} is not finite seconds >= 0 (or 30s, 5m, 1h); hint ignored")
            return None, problems
    session = hints.get("session")
    if prio is None and ttl is None:
        return None, problems
    return RetentionHint(HINT_PRIORITY if prio is None else prio, ttl, None if session is None else str(session)), problems
