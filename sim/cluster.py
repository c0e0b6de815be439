"""A cluster of simulated vLLM replicas behind a router (or ThunderAgent's proxy).

Why this shape:
- Each replica is a full `Engine` (own scheduler, GPU block pool, offload tiers and
  its own copy of the policy, as N vLLM servers each run the scheduler plugin); they
  share one SimPy clock. With one replica the cluster is a pass-through and the run
  is identical to a bare engine's.
- The router decides per call from what a load balancer could see (sim/router.py).
  A policy that is a proxy in front of the engines (ThunderAgent: `make_controller`)
  replaces the router: it places programs and holds back paused programs' requests,
  and runs a round every `interval` seconds while programs remain.
- A pin lives on one replica. When a program's next call is routed to another one
  the pin can never be hit, so it is released there (reason 'moved'; ours — a sticky
  router never does this); when a program ends, any pin it still holds on any
  replica is released ('last'), so nothing outlives a program. Such releases wait
  for the end of the other replica's step in flight (Engine.release_pin_later).
- Own clocks: behind the session router a replica's decode stretch stops only at
  events that can touch it (a first arrival, which the router routes by every
  replica's load; a tool return of one of its own programs; its pin expiries), not at
  every other replica's step. Sticky programs never move, so nothing else on another
  replica reads or changes it; the results are those of step-by-step. Other routers
  (any arrival may land anywhere) and the proxy keep one clock for all.
"""
from __future__ import annotations

import copy
import heapq
import math

from policies.base import Release
from sim.cpu_tier import TierSpec, build_tiers
from sim.engine import Engine
from sim.router import Session, make_router
from agentsim.errors import InputError


class Cluster:
    def __init__(self, env, cfg, profile, policy, replicas: int = 1, router: str | None = None,
                 tiers: tuple[TierSpec, ...] = (), fast_forward: bool = True, on_finish=None) -> None:
        if not isinstance(replicas, int) or replicas < 1:
            raise InputError(f"--replicas must be an integer >= 1 (got {replicas!r})")
        self.env, self.on_finish = env, on_finish
        self.router = make_router(router)
        # fresh copies before anything runs: every replica starts from the same state
        policies = [policy] + [copy.deepcopy(policy) for _ in range(replicas - 1)]
        self.engines = [Engine(env, cfg, profile, p, on_finish=self._finished, fast_forward=fast_forward,
                               tiers=build_tiers(tiers, profile, cfg.block_size) if tiers else None, index=i)
                        for i, p in enumerate(policies)]
        self.controller = policy.make_controller(replicas, cfg.num_gpu_blocks * cfg.block_size)
        self.held: dict[str, object] = {}  # program -> its request held back by the proxy
        self.own_clocks = replicas > 1 and fast_forward and self.controller is None and isinstance(self.router, Session)

    def start(self, work) -> None:
        """After work.start(self): the proxy's periodic rounds, while programs remain."""
        self.work = work
        if self.controller is not None:
            self.env.process(self._rounds())
        if self.own_clocks:
            self._first = sorted(arrival for _, _, arrival in work.programs)
            self._next_first = 0
            self._returns: list[list[float]] = [[] for _ in self.engines]  # per replica: tool returns due
            for e in self.engines:
                e.horizon = lambda i=e.index: self._horizon(i)

    def _horizon(self, i: int) -> float:
        """The next event that can touch replica i: a program's first arrival (routed by
        every replica's load) or a tool return of a program homed there. Events before
        now have happened; one at now may not have yet, so it counts."""
        now, first = self.env.now, self._first
        while self._next_first < len(first) and first[self._next_first] < now:
            self._next_first += 1
        nxt = first[self._next_first] if self._next_first < len(first) else math.inf
        due = self._returns[i]
        while due and due[0] < now:
            heapq.heappop(due)
        return min(nxt, due[0]) if due else nxt

    def _rounds(self):
        ctl = self.controller
        while self.work.remaining > 0:
            yield self.env.timeout(ctl.interval)
            for pid, r in ctl.tick(self.env.now):
                call = self.held.pop(pid, None)
                if call is not None:
                    self._send(call, r)

    def submit(self, call) -> None:
        ctl = self.controller
        if ctl is None:
            self._send(call, 0 if len(self.engines) == 1 else self.router.route(call, self.engines))
            return
        pid, now = call.req.program_id, self.env.now
        if pid not in ctl.progs:
            r = ctl.on_new(pid, call.prompt_len, call.shared_prefix, now)
        else:
            r = ctl.on_ready(pid, call.prompt_len, now)
        if r is None:
            self.held[pid] = call
        else:
            self._send(call, r)

    def _send(self, call, r: int) -> None:
        pid = call.req.program_id
        for e in self.engines:
            if e.index != r and pid in e.sched.pins:
                e.release_pin_later(pid, Release.MOVED)
        self.engines[r].submit(call)

    def _finished(self, call, now: float) -> None:
        self.router.finished(call)
        req = call.req
        if self.own_clocks and not req.is_last_step:
            # the program's next call arrives when its tool returns: now + the tool's
            # time, the float sim/workload.py's timeout lands on; its home replica must
            # know before its next step is planned (the program's process runs later)
            heapq.heappush(self._returns[call.replica], now + req.true_tool_duration)
        if req.is_last_step:
            for e in self.engines:
                e.release_pin_later(req.program_id, Release.LAST)
        if self.controller is not None:
            self.controller.on_finish(req.program_id, call.prompt_len + call.num_output, req.is_last_step, now)
        if self.on_finish is not None:
            self.on_finish(call, now)
