"""Autellix PLAS (arXiv 2502.13965; reference/baselines.md): program-level
least-attained-service with multi-level queues and anti-starvation. No pins.

- Attained service of a program = seconds of model execution of its finished calls.
- On arrival a call snapshots its program's service; it enters queue i with
  bounds[i] <= snapshot + its own exec time < bounds[i+1]; FCFS (call arrival) inside
  a queue; queues are scanned Q1..QK by sorting on (level, arrival).
- Anti-starvation: (program wait + call wait) / (program service + call model time)
  >= beta moves the call to Q1 until it is admitted; then the program's wait counter
  restarts from 0 ("reset its counters", ours: service is kept, it is what PLAS ranks).
  Program wait = total queueing time (arrival -> first admission) of its calls so far;
  call wait = now - arrival - exec_time (time waiting, not running).
- Demotion of a running call past its queue's bound needs engine preemption: the
  engine may call should_demote(req, now) and preempt when True; the call re-enters
  at its new level because the level uses snapshot + req.exec_time.
"""
from __future__ import annotations

import bisect
import math
from collections import defaultdict

from policies.base import EngineView, Policy, Request, Retention


class AutellixPolicy(Policy):
    name = "autellix"
    order_depends_on_time = True  # anti-starvation moves waiting calls as time passes
    reads_exec_time = True  # attained service is seconds of execution

    def __init__(
        self,
        # Third-party defaults (not in the Autellix paper): boundaries in seconds of
        # attained service, Q1 starts at 0, QK unbounded; beta = 8.
        bounds: str = "0,0.02,0.04,0.08,0.16,0.32,0.64",
        beta: float = 8.0,
    ) -> None:
        super().__init__()
        b = [float(x) for x in bounds.split(",")] if isinstance(bounds, str) else [float(x) for x in bounds]
        self.bounds = [x for x in b if x != float("inf")]  # lower bounds of Q1..QK
        self.beta = float(beta)
        self.service: dict[str, float] = defaultdict(float)  # pid -> attained service, s
        self.wait: dict[str, float] = defaultdict(float)  # pid -> total queueing time, s
        self.snapshot: dict[str, float] = {}  # req_id -> program service at arrival
        self.promoted: set[str] = set()  # req_ids moved to Q1 by anti-starvation
        self.queued_at: dict[str, int] = {}  # req_id -> level at its last order_key

    def level_of(self, service: float) -> int:
        """0-based queue index whose [lo, hi) holds `service`."""
        return max(0, bisect.bisect_right(self.bounds, service) - 1)

    def on_arrival(self, req: Request, now: float) -> None:
        super().on_arrival(req, now)
        self.snapshot[req.req_id] = self.service[req.program_id]

    def starving(self, req: Request, now: float) -> bool:
        call_wait = max(0.0, now - req.arrival - req.exec_time)
        waited = self.wait[req.program_id] + call_wait
        served = self.snapshot.get(req.req_id, 0.0) + req.exec_time
        return waited >= self.beta * served if served > 0 else False  # service 0 is Q1 anyway

    def level(self, req: Request, now: float) -> int:
        if req.req_id not in self.promoted and self.starving(req, now):
            self.promoted.add(req.req_id)
        if req.req_id in self.promoted:
            lvl = 0
        else:
            lvl = self.level_of(self.snapshot.get(req.req_id, 0.0) + req.exec_time)
        self.queued_at[req.req_id] = lvl
        return lvl

    def order_key(self, req: Request, now: float, view: EngineView) -> tuple:
        # level(req, now) inlined, the same arithmetic: the engine sorts the waiting queue
        # with this every step (order_depends_on_time), so it is the policy's hot path
        rid = req.req_id
        if rid in self.promoted:
            lvl = 0
        else:
            ex = req.exec_time
            served = self.snapshot.get(rid, 0.0) + ex
            waited = self.wait[req.program_id] + max(0.0, now - req.arrival - ex)
            if served > 0 and waited >= self.beta * served:
                self.promoted.add(rid)
                lvl = 0
            else:
                lvl = max(0, bisect.bisect_right(self.bounds, served) - 1)
        self.queued_at[rid] = lvl
        return (lvl, req.arrival, rid)

    def order_fixed_until(self, now: float, waiting: list[Request]) -> float:
        """A waiting call's key moves only when anti-starvation promotes it: its service
        and its program's wait stay while it waits, so the promotion comes at the first
        `now` with wait + (now - arrival - exec) >= beta * served. Earliest of those,
        less a margin far above the rounding of order_key's arithmetic (ending a stretch
        early changes nothing; late would)."""
        t = math.inf
        for req in waiting:
            rid = req.req_id
            if rid in self.promoted:
                continue
            ex = req.exec_time
            served = self.snapshot.get(rid, 0.0) + ex
            if served > 0:
                w, b = self.wait.get(req.program_id, 0.0), self.beta * served
                due = b - w + req.arrival + ex
                t = min(t, due - 1e-9 * (abs(b) + abs(w) + abs(req.arrival) + ex + 1.0))
        return t

    def on_schedule(self, req: Request, now: float) -> None:
        if req.req_id in self.promoted:
            self.wait[req.program_id] = 0.0  # counters reset after a promotion
        else:
            self.wait[req.program_id] += max(0.0, now - req.arrival)

    def should_demote(self, req: Request, now: float) -> bool:
        """A running call whose program service + own exec time passed the upper
        bound of the queue it was admitted from (its quantum is used up)."""
        if req.req_id in self.promoted:
            return False  # ours: a promoted call keeps Q1 until it finishes
        lvl = self.queued_at.get(req.req_id, 0)
        return self.level_of(self.snapshot.get(req.req_id, 0.0) + req.exec_time) > lvl

    def on_finish(self, req: Request, now: float, view: EngineView) -> Retention:
        self.service[req.program_id] += req.exec_time
        self.snapshot.pop(req.req_id, None)
        self.promoted.discard(req.req_id)
        self.queued_at.pop(req.req_id, None)
        return super().on_finish(req, now, view)  # base: free, no pins

    def on_program_end(self, program_id: str, num_turns: int, now: float) -> None:
        super().on_program_end(program_id, num_turns, now)
        self.service.pop(program_id, None)
        self.wait.pop(program_id, None)
