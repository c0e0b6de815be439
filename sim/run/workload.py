"""Agent programs as SimPy processes: arrive, then alternate an LLM call with a tool wait.

Turn t's prompt = turn t-1's prompt + its output + new input (append-only context), the
output carried as the trace's `carry` says (as generated unless it says otherwise).
Arrivals come from the trace (`arrival_s`) or a seeded Poisson process at `jps` (open
loop); or, closed loop (`closed_loop_arrivals`), N programs start at 0 and each of the
others, in trace order, when a running one finishes: a program whose arrival is NaN
starts at the finish of an earlier one, as a rollout worker takes its next task.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import numpy as np

from policies.base import HINT_PRIORITY, Request, RetentionHint
from sim.replica.call import Call
from sim.kv.content import ContentKeys, carried
from traces import segments
from agentsim.errors import InputError


def poisson_arrivals(n: int, jps: float, seed: int) -> np.ndarray:
    if not 0 < jps < float("inf"):
        raise InputError(f"--jps must be > 0 and finite (got {jps}); give programs per second, e.g. 0.2")
    gaps = np.random.default_rng(seed).exponential(1.0 / jps, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])]) if n else gaps


def dropped(row: dict, output: int) -> int:
    """Tokens of a turn's `output` its next prompt does not carry: the reasoning, where the
    trace says the next prompt drops it (traces/schema.py `carry`)."""
    if row.get("carry") != "reasoning-dropped":
        return 0
    return min(int(row["reasoning_tokens"]), output)


def row_hint(row: dict) -> RetentionHint | None:
    """A trace row's retention hint (traces/schema.py kv_priority, kv_ttl_s, kv_session)."""
    prio, ttl = row.get("kv_priority", math.nan), row.get("kv_ttl_s", math.nan)
    if math.isnan(prio) and math.isnan(ttl):
        return None
    return RetentionHint(HINT_PRIORITY if math.isnan(prio) else int(prio), None if math.isnan(ttl) else float(ttl),
                         row.get("kv_session"))


def closed_loop_arrivals(n: int, concurrency: int) -> np.ndarray:
    """Closed loop: programs 0..concurrency-1 start at 0; the others (NaN) each when a
    running program finishes, in trace order."""
    if not isinstance(concurrency, (int, np.integer)) or isinstance(concurrency, bool) or concurrency < 1:
        raise InputError(f"--concurrency must be an integer >= 1 (got {concurrency!r}): the programs in flight at once")
    a = np.full(n, np.nan)
    a[:concurrency] = 0.0
    return a



class Submits(Protocol):
    """What the workload hands its calls to."""

    def submit(self, call: Call) -> None: ...

class Workload:
    """Builds the program processes for one run and tells the engine's finishes back to them."""

    def __init__(self, env, trace, arrivals: np.ndarray, block_size: int, max_model_len: int, num_gpu_blocks: int,
                 whole_prompt_budget: int | None = None):
        self.env = env
        self.block_size = block_size
        self.programs: list[tuple[str, list[dict], float]] = []
        self._events: dict[int, object] = {}
        self.by_content = segments.COLUMN in trace
        # `trace`: checked columns (traces.schema.Columns) or a DataFrame; rows as plain dicts
        names = list(trace)
        groups: dict[object, list[dict]] = {}  # program -> its rows, programs in order of first row
        for vals in zip(*(np.asarray(trace[c]).tolist() for c in names)):  # one conversion, not one per program
            r = dict(zip(names, vals))
            groups.setdefault(r["program_id"], []).append(r)
        self._next: deque = deque()  # closed loop: programs that start when a running one finishes
        for (pid, rows), arr in zip(groups.items(), arrivals):
            self._check_fits(pid, rows, max_model_len, num_gpu_blocks, whole_prompt_budget)
            if math.isnan(arr):
                self._next.append((str(pid), rows))
                arr = math.inf  # for the cluster: no known arrival (sim/cluster/cluster.py plans to known ones)
            self.programs.append((str(pid), rows, float(arr)))

    def _check_fits(self, pid, rows, max_model_len: int, num_gpu_blocks: int, budget: int | None) -> None:
        ctx = drop = 0
        for r in rows:
            ctx += int(r["new_input_tokens"]) + int(r["output_tokens"]) - drop
            drop = dropped(r, int(r["output_tokens"]))
            # Without chunked prefill a call is admitted only whole, so one longer than the
            # token budget would wait forever; a preempted call recomputes up to ctx - 1
            # tokens. (vLLM refuses max_num_batched_tokens < max_model_len in that mode.)
            if budget is not None and ctx - 1 > budget:
                raise InputError(f"trace program {pid!r} turn {r['turn']}: context {ctx} tokens cannot be prefilled whole within "
                                 f"max_num_batched_tokens {budget} (chunked prefill is off); raise --max-num-batched-tokens "
                                 f"to at least {ctx - 1} or drop --no-enable-chunked-prefill")
            if ctx > max_model_len:
                raise InputError(f"trace program {pid!r} turn {r['turn']}: context {ctx} tokens exceeds max_model_len {max_model_len}; "
                                 f"use a profile/--max-model-len that fits or trim the trace")
            # KV for all but the last sampled token; vLLM keeps one block as its null block
            if -(-(ctx - 1) // self.block_size) > num_gpu_blocks - 1:
                raise InputError(f"trace program {pid!r} turn {r['turn']}: context {ctx} tokens needs more than the "
                                 f"{num_gpu_blocks - 1} usable KV blocks ({num_gpu_blocks} minus vLLM's null block); raise --num-gpu-blocks")

    def start(self, engine: Submits) -> None:
        """`engine`: anything with submit(call): a replica or a sim.cluster.cluster.Cluster."""
        self.engine = engine
        self.remaining = len(self.programs)  # programs whose last call has not finished
        for pid, rows, arr in self.programs:
            if arr < math.inf:
                self.env.process(self._program(pid, rows, arr))

    def finished(self, call: Call, now: float) -> None:
        if call.req.is_last_step:
            self.remaining -= 1
            if self._next:  # closed loop: the next program takes the finished one's place
                pid, rows = self._next.popleft()
                self.env.process(self._program(pid, rows, now))
        self._events.pop(id(call)).succeed()

    def _program(self, pid: str, rows: list[dict], arrival: float):
        env = self.env
        yield env.timeout(arrival - env.now)  # processes start at 0 (open loop) or at `arrival` (closed)
        prompt = prev_out = drop = 0
        carry = "cached"
        shared = int(rows[0].get("shared_prefix_tokens", 0) or 0)
        content = ContentKeys(self.block_size)
        for r in rows:
            if carry == "rerendered" or drop:  # the last output does not reach this prompt as generated
                content = carried(content, carry, prev_out - drop)
            prompt += prev_out - drop + int(r["new_input_tokens"])
            segs = r[segments.COLUMN] if self.by_content else None
            if not segments.is_unknown(segs):
                for s in segs:
                    content.append(s["id"], s["tokens"])
            elif r is rows[0]:  # without segments, programs share turn 0's shared prefix only
                content.append("<shared>", shared)
                content.append((pid, 0), int(r["new_input_tokens"]) - shared)
            else:
                content.append((pid, int(r["turn"])), int(r["new_input_tokens"]))
            last = r is rows[-1]
            req = Request(
                req_id=f"{pid}#{r['turn']}", program_id=pid, turn=int(r["turn"]), arrival=env.now,
                program_arrival=arrival, prompt_tokens=prompt, is_last_step=last,
                tool=None if last else r["tool"],
                true_tool_duration=None if last else float(r["tool_duration_s"]), hint=row_hint(r),
            )
            call = Call(req=req, prompt_len=prompt, max_output=int(r["output_tokens"]),
                        block_size=self.block_size, shared_prefix=shared, content=content)
            content.append_output(call.max_output)
            done = env.event()
            self._events[id(call)] = done
            self.engine.submit(call)
            yield done
            prev_out = call.num_output
            carry, drop = r.get("carry") or "cached", dropped(r, prev_out)
            if not last:
                yield env.timeout(float(r["tool_duration_s"]))
