"""Replay a trace against a real vLLM, as an agent client would, and time every turn.

Each program arrives at its (seeded Poisson or recorded) arrival; each turn sends the
program's token ids: the previous prompt + the tokens the engine actually returned +
the turn's new input (random ids, seeded; drawn from the segment's id where the trace
has content segments, so equal segments send equal ids), with max_tokens = the trace's output length
and EOS ignored; `extra_args` carries job_id, is_last_step and the tool as a hint (what
sim/vllm_replica/scheduler.py reads). Then the client sleeps the tool's duration.

Two drivers, one bookkeeping:
- in-process (default): a `vllm.LLM` whose engine core runs in this process; the loop
  adds due requests and calls `step()`, sleeping only while the engine is idle. Times
  come from the engine core's monotonic clock (queued / scheduled / first token), and
  the scheduler object is reachable for its pin counters.
- server: an OpenAI-compatible URL (`/v1/completions` with token-id prompts and
  `vllm_xargs`); each turn is one HTTP call from a thread; times are client-side, and
  cached tokens are reported only by a server started with --enable-prompt-tokens-details.
"""
from __future__ import annotations

import heapq
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from traces import segments
from agentsim.errors import InputError

VOCAB_LOW = 100  # avoid special ids at the bottom of the vocabulary


@dataclass
class _Program:
    pid: str
    rows: list[dict]
    arrival: float
    tokens: list[int] = field(default_factory=list)  # the context so far (prompt + returned output)
    turn: int = 0


class TraceReplay:
    """Bookkeeping shared by both drivers: prompts, due turns, per-turn records."""

    def __init__(self, trace: pd.DataFrame, arrivals: np.ndarray, vocab_size: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.vocab = (VOCAB_LOW, int(vocab_size))
        self.programs: dict[str, _Program] = {}
        shared_len = int(trace["shared_prefix_tokens"].max()) if "shared_prefix_tokens" in trace.columns else 0
        self.shared = self._ids(rng, shared_len)
        self.by_content = segments.COLUMN in trace.columns  # then segments, not shared_prefix_tokens, say what is shared
        for (pid, g), arr in zip(trace.groupby("program_id", sort=False), arrivals):
            self.programs[str(pid)] = _Program(str(pid), g.sort_values("turn").to_dict("records"), float(arr))
        self.rng = rng
        self.due: list[tuple[float, int, str]] = [(p.arrival, i, p.pid) for i, p in enumerate(self.programs.values())]
        heapq.heapify(self.due)
        self.records: list[dict] = []
        self.open = len(self.programs)
        self.t0 = 0.0  # time.monotonic() of the replay's start, set by the driver

    def _ids(self, rng, n: int) -> list[int]:
        return rng.integers(self.vocab[0], self.vocab[1], size=int(n)).tolist()

    def _content(self, segs, new: int) -> list[int]:
        """A row's new input by its segments: the same id gives the same token ids (a
        shorter segment is a prefix of a longer one); unknown content is random."""
        if segments.is_unknown(segs):
            return self._ids(self.rng, new)
        out: list[int] = []
        for s in segs:
            out += self._ids(np.random.default_rng(segments.seed_of(s["id"])), s["tokens"])
        return out

    def next_due(self) -> float | None:
        return self.due[0][0] if self.due else None

    def pop_due(self, now: float) -> list[tuple[str, list[int], int, dict, float]]:
        """Turns whose time has come: (request id, prompt ids, max_tokens, extra_args, due time)."""
        out = []
        while self.due and self.due[0][0] <= now:
            t, _, pid = heapq.heappop(self.due)
            p = self.programs[pid]
            row = p.rows[p.turn]
            new = int(row["new_input_tokens"])
            if self.by_content:
                p.tokens = p.tokens + self._content(row[segments.COLUMN], new)
            elif p.turn == 0 and self.shared:
                shared = self.shared[: int(row.get("shared_prefix_tokens", 0) or 0)]
                p.tokens = shared + self._ids(self.rng, new - len(shared))
            else:
                p.tokens = p.tokens + self._ids(self.rng, new)
            last = p.turn == len(p.rows) - 1
            xargs = {"job_id": pid, "is_last_step": last}
            if not last:
                if isinstance(row.get("tool"), str):
                    xargs["tool"] = row["tool"]
                # the trace's true duration: only the oracle and InferCept's public-code form read it
                xargs["tool_duration_s"] = float(row["tool_duration_s"])
            out.append((f"{pid}#{p.turn}", list(p.tokens), int(row["output_tokens"]), xargs, t))
        return out

    def finished(self, rid: str, output_ids: list[int], rec: dict) -> None:
        """A turn came back at rec['finish']: record it, schedule the program's next turn."""
        pid, turn = rid.rsplit("#", 1)
        p = self.programs[pid]
        row = p.rows[p.turn]
        if len(output_ids) != int(row["output_tokens"]):
            raise RuntimeError(f"{rid}: the engine returned {len(output_ids)} tokens, not {row['output_tokens']}")
        rec.update(program_id=pid, turn=int(turn), prompt_tokens=len(p.tokens), output_tokens=len(output_ids))
        self.records.append(rec)
        carry = row.get("carry") or "cached"  # how the next prompt carries this output (traces/schema.py)
        if carry == "rerendered":
            p.tokens = p.tokens + self._ids(self.rng, len(output_ids))
        else:
            drop = min(int(row["reasoning_tokens"]), len(output_ids)) if carry == "reasoning-dropped" else 0
            p.tokens = p.tokens + list(output_ids[drop:])
        p.turn += 1
        if p.turn < len(p.rows):
            heapq.heappush(self.due, (rec["finish"] + float(row["tool_duration_s"]), len(self.records), pid))
        else:
            self.open -= 1

    def tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per-turn records and per-program JCT (last finish - program arrival)."""
        turns = pd.DataFrame(self.records).sort_values(["program_id", "turn"]).reset_index(drop=True)
        g = turns.groupby("program_id", sort=False)
        progs = pd.DataFrame({"arrival": [self.programs[p].arrival for p in g.groups],
                              "finish": g["finish"].max().to_numpy(),
                              "turns": g.size().to_numpy()}, index=list(g.groups))
        progs["jct"] = progs["finish"] - progs["arrival"]
        progs.index.name = "program_id"
        return turns, progs.reset_index()


def _sampling(max_tokens: int, xargs: dict, mode: str = "greedy"):
    from vllm import SamplingParams

    from calibrate.sampler import PARAMS

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False, extra_args=xargs, **PARAMS[mode])


def replay_in_process(llm, replay: TraceReplay, timeout_s: float = 1800.0, sampling: str = "greedy") -> float:
    """Drive an in-process `vllm.LLM` through the trace in real time, its calls sampling in
    `sampling` (calibrate/sampler.py PARAMS); returns the wall span."""
    engine = llm.llm_engine
    t0 = replay.t0 = time.monotonic()  # the scheduler's clock too: late arrivals are measured on it
    submitted: dict[str, float] = {}
    while replay.open:
        now = time.monotonic() - t0
        if now > timeout_s:
            raise RuntimeError(f"replay did not finish within {timeout_s:.0f} s ({replay.open} programs open)")
        for rid, ids, n_out, xargs, due in replay.pop_due(now):
            submitted[rid] = due
            engine.add_request(rid, {"prompt_token_ids": ids}, _sampling(n_out, xargs, sampling))
        if not engine.has_unfinished_requests():
            nxt = replay.next_due()
            if nxt is not None:
                time.sleep(max(0.0, nxt - (time.monotonic() - t0)))
            continue
        for out in engine.step():
            if not out.finished:
                continue
            m = out.metrics
            rel = (lambda ts: ts - t0 if ts else float("nan"))
            finish = time.monotonic() - t0
            replay.finished(out.request_id, list(out.outputs[0].token_ids), {
                "arrival": submitted.pop(out.request_id), "scheduled": rel(m.scheduled_ts),
                "first_token": rel(m.first_token_ts), "finish": finish,
                "cached_tokens": int(out.num_cached_tokens or 0)})
    return time.monotonic() - t0


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def replay_server(url: str, model: str, replay: TraceReplay, timeout_s: float = 1800.0) -> float:
    """Replay against an OpenAI-compatible vLLM server; one thread per in-flight turn."""
    endpoint = url.rstrip("/") + "/v1/completions"
    t0 = time.monotonic()

    def one(rid, ids, n_out, xargs, due):
        body = {"model": model, "prompt": ids, "max_tokens": n_out, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True, "request_id": rid, "vllm_xargs": {k: (int(v) if isinstance(v, bool) else v)
                                                                             for k, v in xargs.items()}}
        sent = time.monotonic() - t0
        try:
            resp = _post(endpoint, body, timeout_s)
        except OSError as err:
            raise InputError(f"server {url} failed on {rid}: {err}; check the URL and that vLLM is serving {model!r}") from None
        finish = time.monotonic() - t0
        choice = resp["choices"][0]
        ids_out = choice.get("token_ids")
        if ids_out is None:
            raise InputError(f"server {url} returned no token_ids; use a vLLM that supports return_token_ids")
        cached = ((resp.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return rid, ids_out, {"arrival": due, "sent": sent, "scheduled": float("nan"), "first_token": float("nan"),
                              "finish": finish, "cached_tokens": int(cached)}

    with ThreadPoolExecutor(max_workers=64) as pool:
        pending = set()
        while replay.open:
            now = time.monotonic() - t0
            if now > timeout_s:
                raise RuntimeError(f"replay did not finish within {timeout_s:.0f} s")
            for item in replay.pop_due(now):
                pending.add(pool.submit(one, *item))
            done = {f for f in pending if f.done()}
            for f in done:
                replay.finished(*f.result()[:2], f.result()[2])
            pending -= done
            nxt = replay.next_due()
            time.sleep(0.002 if pending or nxt is None else max(0.0, min(0.05, nxt - now)))
    return time.monotonic() - t0
