"""A cluster of simulated vLLM replicas behind a router (or ThunderAgent's proxy).

Why this shape:
- Each replica is a full `SimpyReplica` (own scheduler, GPU block pool, offload tiers and
  its own copy of the policy, as N vLLM servers each run the scheduler plugin); they
  share one SimPy clock. With one replica the cluster is a pass-through and the run
  is identical to a bare engine's.
- The router decides per call from what a load balancer could see (sim/cluster/router.py).
  A policy that is a proxy in front of the engines (ThunderAgent: `make_controller`)
  replaces the router: it places programs and holds back paused programs' requests,
  and runs a round every `interval` seconds while programs remain.
- A pin lives on one replica. When a program's next call is routed to another one
  the pin can never be hit, so it is released there (reason 'moved'; ours — a sticky
  router never does this); when a program ends, any pin it still holds on any
  replica is released ('last'), so nothing outlives a program. Such releases wait
  for the end of the other replica's step in flight (SimpyReplica.release_pin_later).
- Own clocks: alone, or behind a router that reads only queue lengths and used blocks
  (`Router.reads_load_only`: session, round_robin, least_loaded, cache_aware), a
  replica's decode stretch is planned up to the calls known to reach it (its programs'
  tool returns; alone, the first arrivals) and its pin expiries, not to every other
  replica's step. A call that reaches it mid-stretch anyway (routed there) cuts the
  stretch at the end of the step it landed in (SimpyReplica.submit), where step-by-step would
  see it, as does a pin released from outside (a program moved or ended,
  SimpyReplica.release_pin_later). Mid-stretch the queues do not change (a stretch ends at
  a call's finish; arrivals wait for the step's end) and used blocks are answered as
  step-by-step would (SimpyReplica.used_blocks), so the router decides as step-by-step; the
  results are those of step-by-step. The prefix router reads the prefix cache, which a
  stretch fills only at its end: it and the proxy keep one clock for all.
- Prefill/decode disaggregation (`disagg`, sim/cluster/disagg.py): the first x engines are
  prefill replicas, the other y decode replicas; the router and the proxy choose among
  the decode replicas, and a call whose prefill runs remotely goes to the least loaded
  prefill replica, then, after the KV transfer, to its decode replica. Replicas then
  keep one clock (a prefill's end starts a transfer that lands on a decode replica).
"""
from __future__ import annotations

import copy
import dataclasses
import heapq
import math

from policies.base import Release
from sim.replica.call import Call
from sim.kv.tiers import TierSpec, build_tiers
from sim.cluster.disagg import Disagg, PrefillOnly, check_replicas
from sim.replica.base import Replica
from sim.cluster.router import Router, least_loaded, make_router
from agentsim.errors import InputError


class Cluster:
    def __init__(self, env, cfg, profile, policy, replicas: int = 1, router: Router | None = None,
                 tiers: tuple[TierSpec, ...] = (), fast_forward: bool = True, on_finish=None,
                 disagg: Disagg | None = None, *, replica_cls: type[Replica]) -> None:
        """`router`: a fresh Router (sim.run.config.build_run makes it; None = round robin).
        `replica_cls`: the replica class (sim.simpy_replica.engine.SimpyReplica, or for --scheduler vllm
        sim.vllm_replica.engine.VllmReplica); the cluster imports neither engine."""
        if not isinstance(replicas, int) or replicas < 1:
            raise InputError(f"--replicas must be an integer >= 1 (got {replicas!r})")
        self.env, self.on_finish = env, on_finish
        self.disagg = disagg
        n_prefill = 0
        if disagg is not None:
            check_replicas(disagg.spec, (disagg.prefill, disagg.decode), replicas)
            n_prefill, replicas = disagg.prefill, disagg.decode
        self.router = make_router(None) if router is None else router

        def engine(i, p, done):
            return replica_cls(env, cfg, profile, p, on_finish=done, fast_forward=fast_forward,
                          tiers=build_tiers(tiers, profile, cfg.block_size) if tiers else None, index=i)

        # prefill replicas first (none without disaggregation), then the decode replicas,
        # which serve calls to the end: fresh copies of the policy before anything runs
        self.prefill = [engine(i, PrefillOnly(), self._prefilled) for i in range(n_prefill)]
        policies = [policy] + [copy.deepcopy(policy) for _ in range(replicas - 1)]
        self.decode = [engine(n_prefill + i, p, self._finished) for i, p in enumerate(policies)]
        self.engines = self.prefill + self.decode
        if disagg is not None:
            for e in self.decode:
                e.accept_handoffs()  # admits handed-over calls with their KV present
            self.kv_bytes_per_block = profile.kv_bytes_per_block
            self._handoffs: dict[int, tuple[Call, Replica]] = {}  # id(prefill call) -> (call, its decode replica)
            self._prefilled_by: dict[int, Call] = {}  # id(call) -> its prefill call, until the call finishes
            self.dstats = {"remote_prefills": 0, "local_prefills": 0, "transfer_blocks": 0, "transfer_s": 0.0}
            self.pstats = [{"prefills": 0, "prompt_tokens": 0, "cached_tokens": 0} for _ in self.prefill]
        self.controller = policy.make_controller(replicas, cfg.num_gpu_blocks * cfg.block_size)
        self.held: dict[str, object] = {}  # program -> its request held back by the proxy
        self.own_clocks = (fast_forward and self.controller is None and disagg is None
                           and (replicas == 1 or self.router.reads_load_only))

    def start(self, work) -> None:
        """After work.start(self): the proxy's periodic rounds, while programs remain."""
        self.work = work
        if self.controller is not None:
            self.env.process(self._rounds())
        if self.own_clocks:
            # Only a call reaching a replica ends its stretch (SimpyReplica.submit cuts it). Those
            # known in advance bound the stretch as it is planned, so that fewer step
            # times are computed for nothing: its programs' tool returns, and alone, the
            # programs' first arrivals (several replicas: where one goes is known only
            # when the router places it).
            lone = len(self.engines) == 1
            self._first = sorted((arrival for _, _, arrival in work.programs), reverse=True) if lone else []  # popped from the end
            self._returns: list[list[float]] = [[] for _ in self.engines]  # per replica: tool returns due
            for e in self.engines:
                e.horizon = lambda i=e.index: self._horizon(i)
                e.read_horizon = lambda: math.inf  # reads are answered as step-by-step would (SimpyReplica.used_blocks)

    def _horizon(self, i: int) -> float:
        """The next call known to reach replica i: a tool return of one of its programs,
        or alone, a first arrival (one at now counts: it may not have reached it yet)."""
        now, first, due = self.env.now, self._first, self._returns[i]
        while first and first[-1] < now:
            first.pop()
        while due and due[0] < now:
            heapq.heappop(due)
        return min(first[-1] if first else math.inf, due[0] if due else math.inf)

    def state(self, but: int | None = None) -> str:
        """Every replica (but replica `but`) on one line, with the calls the proxy holds
        back and those between a prefill and a decode replica (SimpyReplica.state)."""
        parts = [e.state() for e in self.engines if e.index != but]
        if self.held:
            parts.append(f"held by the proxy: {', '.join(sorted(self.held))}")
        if self.in_flight():
            parts.append(f"{self.in_flight()} calls between a prefill and a decode replica")
        return "; ".join(parts)

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
            self._send(call, 0 if len(self.decode) == 1 else self.router.route(call, self.decode))
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
        """Serve `call` on decode replica r (the r-th of self.decode; without
        disaggregation every replica is one)."""
        pid = call.req.program_id
        target = self.decode[r]
        for e in self.decode:
            if e is not target and pid in e.sched.pins:
                e.release_pin_later(pid, Release.MOVED)
        if self.disagg is None or not self._prefill_remotely(call, target):
            target.submit(call)
            return
        # a remote prefill: the prompt with one output token, on the least loaded prefill replica
        pre = Call(req=dataclasses.replace(call.req), prompt_len=call.prompt_len, max_output=1,
                   block_size=call.block_size, shared_prefix=call.shared_prefix, content=call.content)
        self._handoffs[id(pre)] = (call, target)
        self.prefill[least_loaded(self.prefill)].submit(pre)

    def _prefill_remotely(self, call, d: Replica) -> bool:
        """Dynamo's conditional disaggregation, asked on the call's decode replica `d`:
        the tokens it would compute (prompt minus what it can serve without recompute)
        and the calls waiting for a prefill replica (sim/cluster/disagg.py)."""
        gpu = len(d.sched.prefix_hit(call))
        cpu = d.tier.prefix_blocks(call)
        uncached = call.num_tokens - max(gpu, cpu) * d.cfg.block_size
        queued = sum(len(e.sched.waiting) + len(e.arrived_mid_step) for e in self.prefill)
        remote = self.disagg.remote(uncached, queued)
        self.dstats["remote_prefills" if remote else "local_prefills"] += 1
        return remote

    def _prefilled(self, pre, now: float) -> None:
        """A prefill replica finished `pre`: the prompt's full blocks the decode replica
        lacks cross the link, then the call goes to it with them (sim/kv/tiers.py Inbox)."""
        call, d = self._handoffs.pop(id(pre))
        full = (call.prompt_len - 1) // call.block_size  # the decode replica computes the rest (>= 1 token)
        n = full - min(len(d.sched.prefix_hit(call)), full)
        dt = self.disagg.link.time(n * self.kv_bytes_per_block)
        call.received_blocks = full
        call.prefilled_on = pre.replica
        call.req.exec_time += pre.req.exec_time
        self._prefilled_by[id(call)] = pre
        s = self.dstats
        s["transfer_blocks"] += n
        s["transfer_s"] += dt
        p = self.pstats[pre.replica]
        p["prefills"] += 1
        p["prompt_tokens"] += pre.prompt_len
        p["cached_tokens"] += pre.cached_tokens
        ev = self.env.timeout(dt)
        ev.callbacks.append(lambda _ev: d.submit(call))

    def in_flight(self) -> int:
        """Calls between a prefill replica and their decode replica (0 at a run's end)."""
        return len(self._handoffs) + len(self._prefilled_by) if self.disagg is not None else 0

    def disagg_summary(self) -> dict:
        d, s = self.disagg, self.dstats
        return {"spec": d.spec, "link": d.link.name, "link_GBps": d.link.bandwidth / 1e9, "link_latency_s": d.link.latency,
                "max_local_prefill": d.max_local_prefill, "max_prefill_queue": d.max_prefill_queue,
                "remote_prefills": s["remote_prefills"], "local_prefills": s["local_prefills"],
                "transfer_blocks": s["transfer_blocks"], "transfer_bytes": s["transfer_blocks"] * self.kv_bytes_per_block,
                "transfer_s": s["transfer_s"], "received_tokens": sum(e.received_tokens for e in self.decode)}

    def _finished(self, call, now: float) -> None:
        pre = self._prefilled_by.pop(id(call), None) if self.disagg is not None else None
        if pre is not None:  # the call's record: first admitted, cached and computed where it was prefilled
            call.scheduled_at = pre.scheduled_at
            call.cached_tokens = pre.cached_tokens
            rows, done = pre.admission_rows() + call.admission_rows(), 0  # the prefill replica's, then the decode replica's
            call.admissions = []
            for c, ld, n in rows:
                call.admissions.append([c, ld, done])
                done += n
            call.computed_prompt_tokens += pre.computed_prompt_tokens
            call.loaded_tokens += pre.loaded_tokens  # reloads on either replica: reloaded_tokens_total
            call.reload_s += pre.reload_s
            call.preemptions += pre.preemptions
        self.router.finished(call)
        req = call.req
        if self.own_clocks and not req.is_last_step:
            # the program's next call arrives when its tool returns: now + the tool's
            # time, the float sim/run/workload.py's timeout lands on; its home replica must
            # know before its next step is planned (the program's process runs later)
            heapq.heappush(self._returns[call.replica], now + req.true_tool_duration)
        if req.is_last_step:
            for e in self.engines:
                e.release_pin_later(req.program_id, Release.LAST)
        if self.controller is not None:
            self.controller.on_finish(req.program_id, call.prompt_len + call.num_output, req.is_last_step, now)
        if self.on_finish is not None:
            self.on_finish(call, now)
