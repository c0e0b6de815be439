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
"""
from __future__ import annotations

import copy

from policies.base import Release
from sim.cpu_tier import TierSpec, build_tiers
from sim.engine import Engine
from sim.router import make_router
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

    def start(self, work) -> None:
        """After work.start(self): the proxy's periodic rounds, while programs remain."""
        self.work = work
        if self.controller is not None:
            self.env.process(self._rounds())

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
        if req.is_last_step:
            for e in self.engines:
                e.release_pin_later(req.program_id, Release.LAST)
        if self.controller is not None:
            self.controller.on_finish(req.program_id, call.prompt_len + call.num_output, req.is_last_step, now)
        if self.on_finish is not None:
            self.on_finish(call, now)
