"""The Continuum fork's `scheduler_timestamps` JSON (Continuum_Recorder):
`{job_id: [event, ...]}` where a request is `{"Request_arrival_time": t}`, then
`{"waiting_to_running": t, "prompt_length": n, "hit_length": h}` (again after a
preemption as `evicted_to_running`), `{"Request_departure_time": t}`, and pin
events (`pinned_time`, `unpinned_time`, `Request_evicted_from_running_queue_time`).

Tool durations are next arrival − previous departure (what the fork's estimator
measures). The recorder logs prompt lengths but no output lengths and no tool
names: output tokens come from an `output_length`/`output_tokens` field if a
patched recorder wrote one, else from `--output-tokens N`.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from traces.importers.common import TOKENS_MAX, Call, Notes, Program, fail, read_json
from traces.schema import SECONDS_MAX
from traces.validation import JSONFloat, JSONInt, Model, validated

PATTERNS = ("scheduler_timestamps", "scheduler_timestamps*.json")
_OUT_KEYS = ("output_length", "output_tokens", "num_output_tokens")

_Time = Annotated[JSONFloat, Field(ge=0, le=SECONDS_MAX)]  # epoch seconds, finite; absent is None, null refused
_Tokens = Annotated[JSONInt, Field(ge=1, le=TOKENS_MAX)]


class _Event(Model):
    """The recorder's events: one or a few of these fields each, the others absent."""
    Request_arrival_time: _Time = None
    Request_departure_time: _Time = None
    waiting_to_running: _Time = None
    evicted_to_running: _Time = None
    pinned_time: _Time = None
    unpinned_time: _Time = None
    Request_evicted_from_running_queue_time: _Time = None
    prompt_length: _Tokens = None
    output_length: _Tokens = None  # from a patched recorder, under one of _OUT_KEYS
    output_tokens: _Tokens = None
    num_output_tokens: _Tokens = None


_KNOWN = frozenset(_Event.model_fields) | {"hit_length"}


def load(files, opts: dict, notes: Notes) -> list[Program]:
    progs = []
    fixed_out = opts.get("output_tokens")
    for path in files:
        data = read_json(path)
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise fail(path, "", "", "is not a Continuum scheduler_timestamps object {job_id: [events]}", "is this the right format?")
        skipped: list[str] = []
        for job, events in data.items():
            reqs = _requests(path, job, events, notes, skipped)
            if not reqs:
                continue
            calls = []
            for k, rq in enumerate(reqs):
                w = f"job {job!r} request {k}"
                if "prompt_length" not in rq:
                    raise fail(path, w, "prompt_length", "is missing (never scheduled?)", "give the waiting_to_running event with prompt_length")
                out = rq.get("output")
                if out is None:
                    if fixed_out is None:
                        raise fail(path, w, "output_length", "is not recorded by the Continuum recorder", "pass --output-tokens N (tokens per call) to import it")
                    out = fixed_out
                calls.append(Call(output_tokens=out, prompt_tokens=rq["prompt_length"], start_s=rq["arrival"], end_s=rq["departure"]))
            for a, b in zip(calls, calls[1:]):
                a.tool_duration_s = b.start_s - a.end_s
            progs.append(Program(str(job), calls, arrival_abs_s=calls[0].start_s))
        if skipped:
            notes.extra.append(f"{path}: {len(skipped)} events with no field the Continuum recorder writes skipped "
                               f"(the first: {skipped[0]})")
    return progs


def _requests(path, job, events, notes: Notes, skipped: list[str]) -> list[dict]:
    reqs: list[dict] = []
    for i, e in enumerate(events):
        w = f"job {job!r} event {i}"
        if not isinstance(e, dict):
            raise fail(path, w, "", "is not an object", "each event is a JSON object")
        ev = validated(_Event, e, f"{path} {w}", "fix the event (wrong format?)")
        if not _KNOWN.intersection(e):  # none of the recorder's fields: counted (load), not guessed at
            skipped.append(w)
            continue
        if ev.Request_arrival_time is not None:
            t = ev.Request_arrival_time
            if reqs and "departure" not in reqs[-1]:
                raise fail(path, w, "Request_arrival_time", "comes before the previous request's departure", "a job's requests run one after another; check the event order")
            if reqs and t < reqs[-1]["departure"]:
                raise fail(path, w, "Request_arrival_time", "is earlier than the previous departure (unsorted timestamps)", "give the events in time order")
            reqs.append({"arrival": t})
            continue
        if not reqs:
            raise fail(path, w, "Request_arrival_time", "is missing before this event", "a job's events start with its request's arrival")
        rq = reqs[-1]
        if ev.prompt_length is not None and "prompt_length" not in rq:  # the first admission;
            rq["prompt_length"] = ev.prompt_length  # a preemption repeats it
        for key in _OUT_KEYS:
            if getattr(ev, key) is not None:
                rq["output"] = getattr(ev, key)
        if ev.Request_departure_time is not None:
            t = ev.Request_departure_time
            if "departure" in rq:
                raise fail(path, w, "Request_departure_time", "is a second departure of the request (its next arrival missing?)",
                           "each request has one Request_arrival_time and one Request_departure_time")
            if t < rq["arrival"]:
                raise fail(path, w, "Request_departure_time", "is before the request's arrival (unsorted timestamps)", "give the events in time order")
            rq["departure"] = t
    if reqs and "departure" not in reqs[-1]:  # in flight when the recorder exported
        reqs.pop()
        notes.extra.append(f"job {job}: last request had no departure (in flight at export), dropped")
    return reqs
