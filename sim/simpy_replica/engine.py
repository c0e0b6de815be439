"""One simulated vLLM replica as a SimPy process: schedule a step, let its time pass,
apply it, hand finished calls to the policy. Its scheduler is the policy's host and view
(sim/replica/policy_host.py).

Speed: a batch of decodes that will run unchanged (no call finishes, no allocation
fails, nothing can be admitted) is advanced as one stretch of n steps with a single
SimPy timeout. Step j of the stretch costs A + B*j (every context grows by one token a
step), so the stretch ends exactly where the step-by-step engine would: at the end of
the step in which the next arrival or pin expiry lands (the engine hears of it only
then), or before the step in which an event lands that reads the replica mid-step. A
call that reaches the replica mid-stretch cuts it at the end of that step (submit).

Offload (sim/kv/tiers.py): a step's transfer time is charged to that step — reloads
of calls admitted in it add to it (LMCache's synchronous retrieve), offload copies
still in flight when it starts overlap it (step = max(compute, copies) + loads) — and
no transfer outlives its step. A step that carries transfer time is never the start of
a stretch (fast-forward is skipped for it), so stretches stay exact. Policies that
review pins every step (`reviews_pins`, InferCept) get stretches while pins exist only
when the review says no later one drops a pin (`review_steady`); an order that moves
with time (Autellix) ends a stretch where the policy says it moves (`order_fixed_until`).

Asynchronous scheduling (`cfg.async_scheduling`, vLLM 0.32's default on a GPU) runs
`_loop_async`, vLLM's EngineCore.step_with_batch_queue: two steps in flight, the next
scheduled as soon as the queue has room, from the state before the running step's output.
Its stretches (`_stretch_async`) leave their last step in flight: step-by-step, a step is
scheduled while the one before it runs, so a call that lands in step j joins step j + 2.
"""
from __future__ import annotations

import math
from collections import deque

import simpy

from policies.base import Policy
from sim.hardware import stretch
from agentsim.errors import SimulationError
from sim.replica.call import Call
from sim.replica.base import Replica
from sim.kv.tiers import NO_TIER, Inbox, KVOffload, Tier
from sim.replica.clock import slot_passed, step_end
from sim.hardware.profile import Profile, step_features
from sim.hardware.engine_config import EngineConfig
from sim.simpy_replica.scheduler import Scheduler


# The progress watchdog: passes of a replica's loop at one simulated instant before the
# run is stopped as stalled. A pass that runs a step moves the clock (step times are > 0),
# so legitimate passes at one instant are the few that admit arrivals or drop pins; a
# loop whose clock is frozen makes ~10^5 passes a wall second, so it stops within 0.1 s.
STALL_PASSES = 10_000


def _listed(items: list[str], most: int = 6) -> str:
    return ", ".join(items[:most]) + (f", ... ({len(items)} in all)" if len(items) > most else "") if items else "none"


class SimpyReplica(Replica):
    def __init__(self, env: simpy.Environment, cfg: EngineConfig, profile: Profile, policy: Policy,
                 on_finish=None, fast_forward: bool = True, tiers: list[Tier] | None = None, index: int = 0) -> None:
        self.env = env
        self.index = index  # replica number in a cluster
        self.cfg = cfg
        self.profile = profile
        self.policy = policy
        self.sched = Scheduler(cfg, policy, profile)
        self.tier = KVOffload(tiers, cfg.block_size) if tiers else NO_TIER
        self.sched.tier = self.tier
        self.sched.connector = bool(tiers)  # vLLM admits tiers' KV through a KV connector (sim/vllm_replica/connector.py)
        self._in_step = False
        self._deferred: list[tuple[str, str]] = []  # pin releases asked for mid-step
        self.arrived_mid_step: list[Call] = []  # calls that arrived mid-step, delivered at its end
        # the steps in flight: when they began, their times, the batch, the event of their
        # end, and the KV and busy-time figures from before they were counted (_cut_stretch)
        self._start, self._dts, self._batch, self._end, self._kept = 0.0, [], [], None, None
        self.on_finish = on_finish  # callback(call, now) for metrics and program processes
        self.fast_forward = fast_forward
        # When the next outside event that can change this replica lands: a stretch runs
        # through the step it falls in (the replica hears of it at that step's end).
        # Default: every event in SimPy's queue; behind the session router or alone, the
        # calls known to reach it (sim/cluster/cluster.py): another call cuts the stretch (submit).
        self.horizon = env.peek
        # When the next event that may read this replica's state mid-step lands (a router
        # reading its prefix cache): a stretch stops before the step it falls in, since a
        # stretch applies its steps' allocations and cache entries only at its end.
        # Default: any event may read; none behind the session router, whose reads of
        # used blocks are answered as step-by-step would (used_blocks).
        self.read_horizon = env.peek
        self._wakeup = env.event()
        self._spin_t, self._spins = -1.0, 0  # the progress watchdog (_pass_begins)
        self._arrived = 0  # calls delivered so far: their order is the waiting queue's tie-breaker
        self._start_accounting()
        self.process = env.process(self._loop_async() if cfg.async_scheduling else self._loop())

    def accept_handoffs(self) -> None:
        """Be a disaggregated decode replica: admit calls with the KV a prefill replica
        handed over (sim/kv/tiers.py Inbox)."""
        self.sched.tier = Inbox(self.tier)
        self.sched.connector = True  # the handed-over KV comes through vLLM's KV connector

    @property
    def received_tokens(self) -> int:
        """Tokens admitted from handoffs (0 unless accept_handoffs)."""
        return getattr(self.sched.tier, "received_tokens", 0)

    # --- requests -------------------------------------------------------------------------
    def submit(self, call: Call) -> None:
        """vLLM's engine core takes new requests only between steps: a call that arrives
        mid-step reaches the scheduler (and the policy) when the step ends, after the
        step's finished calls were retired and after pins that ran out meanwhile expired
        (a pin whose TTL ends inside the step is not a hit)."""
        call.replica = self.index
        if self._in_step:
            self.arrived_mid_step.append(call)
            if len(self._dts) > 1:
                self._cut_stretch()
            return
        # between steps (idle, or blocked): pins that ran out meanwhile expire before the
        # call reaches the scheduler, as at a step's end (the adapter does so at
        # add_request); else an idle replica kept an expired pin for its next call (a hit)
        self.sched.expire_pins(self.env.now)
        self._deliver(call)

    def _deliver(self, call: Call) -> None:
        # A call prefilled on a prefill replica (sim/cluster/disagg.py) reaches this decode replica
        # after its prefill and KV transfer, but the request came to it at req.arrival
        # (Dynamo routes a request to its decode worker first): the policy learns the tool's
        # time from that arrival, not lengthened by the remote prefill.
        self.policy.on_arrival(call.req, self.env.now if call.prefilled_on is None else call.req.arrival)
        # vLLM breaks the policy's ties by the order requests reached this engine: a handed-over
        # call queues behind a call that reached the decode replica before it, whatever their
        # order in the workload
        call.seq_no, self._arrived = self._arrived, self._arrived + 1
        self.sched.waiting.append(call)
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def release_pin_later(self, program_id: str, reason: str) -> None:
        """Release a pin from outside the engine (a cluster moving or ending a program).
        Mid-step it waits for the step's end, so a decode stretch and step-by-step
        see the pool change at the same point; otherwise it happens now."""
        if program_id not in self.sched.pins:
            return
        if self._in_step:
            self._deferred.append((program_id, reason))
            if len(self._dts) > 1:
                self._cut_stretch()
            return
        self.sched.release_pin(program_id, self.env.now, reason)
        if self.sched.waiting and not self._wakeup.triggered:
            self._wakeup.succeed()  # the freed memory may let a blocked head in

    def used_blocks(self) -> int:
        """Used KV blocks as step-by-step shows them now. A stretch allocates its later
        steps' blocks when it lands (Scheduler.complete, complete_async_stretch);
        step-by-step allocates each step's when it is scheduled, so mid-stretch the blocks
        of the steps scheduled so far are added."""
        used = self.sched.pool.num_used
        if self._in_step and len(self._dts) > 1:
            m, bs = self._steps_kept() - 1, self.cfg.block_size  # steps 1..m are allocated by now
            for call, _ in self._batch:
                first = -self.sched.stretch_base(call) % bs or bs  # step j writes position base + j
                if first <= m:
                    used += (m - first) // bs + 1
        return used

    def _steps_kept(self) -> int:
        """The steps of the stretch that step-by-step has scheduled by now: synchronously
        those begun before now (the first always has: events at its start that the engine
        has not seen yet reach it at its end), asynchronously one more (each step is
        scheduled when the one before it begins; an event that lands before the first
        begins reaches the engine with the step in flight ahead of it). A step that begins
        exactly now has begun only if this instant's step ends have passed this replica's
        place (step_end's order): what asks from an arrival or a tool return fires before
        them, what a later replica's step end sets off after."""
        t, now, k = self._start, self.env.now, 0
        passed = slot_passed(self.env, self.index)
        for d in self._dts:
            if t > now or t == now and not passed:
                break
            k += 1
            t += d
        return min(k + 1, len(self._dts)) if self.cfg.async_scheduling else max(k, 1)

    def _wake(self, end: float = math.nan) -> float:
        """When the process wakes from a stretch whose steps end at `end`: then; with
        asynchronous scheduling, at the end of the step before the last, which stays in
        flight (the same float as step-by-step: the step times added one by one)."""
        return stretch.add_in_order(self._start, self._dts[:-1]) if self.cfg.async_scheduling else end

    def _cut_stretch(self) -> None:
        """Something reached this replica mid-stretch (a call, a pin release): step-by-step
        it would be seen at the end of the step in which it landed, so the stretch ends
        there: its KV and busy time are counted again for the steps that stay, and the
        process waits on a new event (the old one fires with nothing on it)."""
        k = self._steps_kept()
        if k < len(self._dts):
            self._dts = self._dts[:k]
            self._used_area, self.busy_time, self.peak_used, counted = self._kept
            del self.kv_samples[counted:]  # counted again for the steps that stay
            end = step_end(self.env, self._wake(self._account(self._start, self._dts, self._batch)), self.index)
            end.callbacks, self._end.callbacks = self._end.callbacks, []
            self.process._target = self._end = end

    # --- the step loop --------------------------------------------------------------------
    def _next_event(self, horizon) -> float:
        """Earliest time something outside the batch can change: an event `horizon()`
        names (arrival, tool return), a pin expiry or a change of soft retention's order.
        A pin whose TTL ran out by now is one its program's waiting call keeps (expire_pins
        dropped the others as this step was scheduled): it stays until that call is
        admitted, which ends the stretch anyway, so its past expiry changes nothing (_wake_at)."""
        now = self.env.now
        expiry = min((p.expiry for p in self.policy.pins.values() if p.expiry > now), default=math.inf)
        if self.sched.retaining:
            expiry = min(expiry, self.sched.pool.next_change())
        if self.policy.order_depends_on_time and self.sched.waiting:  # the waiting order moves then (_steady)
            expiry = min(expiry, self.policy.order_fixed_until(now, [c.req for c in self.sched.waiting]))
        return min(horizon(), expiry)

    def state(self) -> str:
        """This replica now, on one line: what waits (blocks each needs), what runs (blocks
        held), what is pinned and for whom (blocks, expiry), free blocks."""
        sched, bs = self.sched, self.cfg.block_size
        pols = self.policy.pins
        waiting = [f"{c.req.program_id}#{c.req.turn} ({-(-c.num_tokens // bs)} blocks)" for c in sched.waiting]
        running = [f"{c.req.program_id}#{c.req.turn} ({len(c.blocks)} blocks)" for c in sched.running]
        pinned = [f"{pid} ({len(blks)} blocks" + (f", expires t={pols[pid].expiry:.3f})" if pid in pols else ")")
                  for pid, blks in sched.pins.items()]
        return (f"replica {self.index}: waiting {_listed(waiting)}; running {_listed(running)}; "
                f"pinned {sched.pinned_blocks} blocks for {_listed(pinned)}; free {sched.pool.num_free} of {self.num_blocks} blocks")

    def _error(self, what: str) -> SimulationError:
        e = SimulationError(f"{what} at t={self.env.now:.3f}: {self.state()}")
        e.replica = self.index  # the cluster adds the other replicas' state (sim/run/simulate.py)
        return e

    def _wake_at(self, now: float) -> float:
        """When a replica blocked with nothing running may next change: any event (pins
        elsewhere may be released), or one of its pins' expiry. A pin whose TTL ran out
        is kept while its program waits; its expiry has passed and changes nothing."""
        return min(self.env.peek(), min((p.expiry for p in self.policy.pins.values() if p.expiry > now), default=math.inf))

    def _pass_begins(self, now: float) -> None:
        """Each pass of a step loop: the progress watchdog (passes at one simulated instant),
        then the pin releases asked for during the step."""
        if now != self._spin_t:
            self._spin_t, self._spins = now, 0
        else:
            self._spins += 1
            if self._spins >= STALL_PASSES:
                raise self._error(f"no progress ({self._spins} passes of the event loop without the simulated clock advancing)")
        for pid, reason in self._deferred:
            self.sched.release_pin(pid, now, reason)
        self._deferred.clear()

    def _loop(self):
        env, sched = self.env, self.sched
        finished = False  # the last step finished calls: vLLM's finished_req_ids
        while True:
            now = env.now
            self._pass_begins(now)
            if not sched.running and not sched.waiting and not finished:
                self._wakeup = env.event()
                yield self._wakeup
                continue
            # vLLM's engine core schedules once more after a step that finished requests,
            # even with none left (EngineCore.step: scheduler.has_requests() counts the
            # finished ones until the next schedule() reports them); a policy reviews its pins there
            finished = False
            sched.drop_reviewed_pins(now)
            pins = len(sched.pins)
            scheduled = sched.schedule(now)
            if not scheduled:
                if sched.preempted_now:
                    continue  # it preempted every running call: schedule again at once, as vLLM
                if not sched.running and (len(sched.pins) < pins or not sched.waiting):
                    # Pins were dropped for the blocked head but it still does not fit
                    # (a victim's blocks shared with other holders free less than the
                    # policy counted): drop more now rather than idle (ours). Or the pass
                    # after finished requests found nothing to run: idle above.
                    continue
                # Waiting calls blocked with nothing running: only an arrival or a pin
                # expiry can change that.
                nxt = self._wake_at(now)
                if math.isinf(nxt):
                    raise self._error("deadlock (nothing can run and nothing will change)")
                self._wakeup = env.event()
                yield self._wakeup | env.timeout(max(nxt - now, 0.0))
                continue
            features = step_features([(q, call.num_computed + q) for call, q in scheduled])
            dt, moved = self.tier.price_step(self.profile.step_time(*features), now)
            dts = [dt]
            if self.fast_forward and not moved and features[0] == features[1] == len(sched.running) and self._steady(scheduled):
                dts = self._stretch(scheduled, dt, now, *features[2:5])
            self._start, self._dts, self._batch = now, dts, scheduled
            self._kept = (self._used_area, self.busy_time, self.peak_used, len(self.kv_samples))
            self._end = step_end(env, self._account(now, dts, scheduled), self.index)
            self._in_step = True
            yield self._end
            self._in_step = False
            dts = self._dts  # a call that arrived mid-stretch may have cut it short
            n = len(dts)
            self.steps += n
            if n == 1:
                dt = dts[0]
                for call, _ in scheduled:
                    call.req.exec_time += dt
            else:
                for call, _ in scheduled:
                    call.req.exec_time = stretch.add_in_order(call.req.exec_time, dts)  # one by one, as step-by-step
            for call in sched.complete(scheduled, env.now, steps=n):
                self._finish(call)
                finished = True
            if self.arrived_mid_step:
                self._take_arrivals()

    def _take_arrivals(self) -> None:
        """At a step's end: the calls that arrived during it reach the scheduler, after the
        pins that ran out meanwhile expired (submit)."""
        self.sched.expire_pins(self.env.now)
        for call in self.arrived_mid_step:
            self._deliver(call)
        self.arrived_mid_step.clear()

    def _loop_async(self):
        """vLLM's engine core with a batch queue of two (EngineCore.step_with_batch_queue):
        schedule while the queue has room (the next step from the state before the running
        one's output, to start when it ends), else wait for the oldest step and apply it.
        Arrivals and releases during a step are taken after it is applied."""
        env, sched = self.env, self.sched
        in_flight: deque = deque()  # (batch, schedule()'s rows, step time, end), oldest first
        empty_behind = False  # an empty pass queued behind the step in flight (vLLM queues empty outputs too)
        finished = False  # calls finished since the last schedule (vLLM's has_requests counts them)
        while True:
            now = env.now
            self._pass_begins(now)
            if len(in_flight) + empty_behind < 2 and (sched.running or sched.waiting or finished):
                finished = False
                sched.drop_reviewed_pins(now)
                before = (sched.preemptions, len(sched.pins), sched.pool.num_free)
                scheduled = sched.schedule(now)
                if scheduled:
                    start = in_flight[-1][3] if in_flight else now
                    # vLLM's computed tokens count this step's (Call.in_flight)
                    features = step_features([(q, call.num_computed + call.in_flight) for call, q in scheduled])
                    dt, moved = self.tier.price_step(self.profile.step_time(*features), start)
                    if not moved and self.fast_forward and in_flight and self._steady_async(in_flight[0], scheduled):
                        dts = self._stretch_async(scheduled, dt, start, *features[2:5])
                        if len(dts) > 1:  # it lands at the end of its step before the last (_land_stretch)
                            self._start, self._dts, self._batch = start, dts, scheduled
                            self._kept = (self._used_area, self.busy_time, self.peak_used, len(self.kv_samples))
                            self._account(start, dts, scheduled)
                            dt = None  # its in-flight entry is made when it lands
                    in_flight.append((scheduled, sched.rows, dt, None if dt is None else self._account(start, [dt], scheduled)))
                    if len(in_flight) < 2:
                        continue  # the queue has room: schedule the next step at once
                elif in_flight:
                    empty_behind = True  # it takes the queue's last place: nothing is scheduled before that step ends
                elif (sched.preemptions, len(sched.pins), sched.pool.num_free) != before:
                    continue  # it preempted every running call or dropped pins: schedule again at once
            if not in_flight:
                if not sched.running and not sched.waiting:
                    self._wakeup = env.event()
                    yield self._wakeup
                    continue
                nxt = self._wake_at(now)  # blocked: only an arrival or a pin expiry changes that
                if math.isinf(nxt):
                    raise self._error("deadlock (nothing can run and nothing will change)")
                self._wakeup = env.event()
                yield self._wakeup | env.timeout(max(nxt - now, 0.0))
                continue
            stretching = len(in_flight) == 2 and in_flight[1][2] is None
            self._in_step = True
            self._end = step_end(env, self._wake() if stretching else in_flight[0][3], self.index)
            yield self._end
            self._in_step = False
            scheduled, rows, dt, _ = in_flight.popleft()
            empty_behind = False
            self.steps += 1
            for call, _ in scheduled:
                call.req.exec_time += dt
            for call in sched.complete_async(scheduled, rows, env.now):
                self._finish(call)
                finished = True
            if stretching:
                in_flight[0] = self._land_stretch(in_flight[0][1])
            if self.arrived_mid_step:
                self._take_arrivals()

    def _steady_async(self, ahead, scheduled) -> bool:
        """Would the next steps schedule the same batch, asynchronously? As `_steady`, and
        the step in flight ahead of it is one decode step of the same calls in the same
        order: every row decodes one token and samples it (no prefill chunk, no stale
        output, no call left out)."""
        batch, rows = ahead[0], ahead[1]
        return (len(scheduled) == len(batch) == len(self.sched.running)
                and all(q == 1 and c is b for (c, q), (b, _) in zip(scheduled, batch))
                and all(q == 1 for _, q in batch)
                and all(sample for _, sample in rows) and all(sample for _, sample in self.sched.rows)
                and self._steady(scheduled))

    def _stretch_async(self, scheduled, dt0: float, start: float, sum_qk: float, sum_k: float, sum_qc: float) -> list[float]:
        """The step times of an asynchronous decode stretch that starts at `start` (the end
        of the step in flight ahead of it). Step-by-step, step i + 1 is scheduled when step i
        begins, so the stretch lands at the end of its step before the last, which stays in
        flight: its steps up to that one are those a synchronous stretch would run (until
        the next outside event, a failing allocation, before a read); one more follows. A
        call's steps in flight reaching its last token leave it out of the next step (vLLM),
        so no call may reach its last token but in the step left in flight."""
        r = len(scheduled)
        nxt = self._next_event(self.horizon)
        reader = self.read_horizon()
        most = min(call.max_output - call.num_output for call, _ in scheduled) - 1
        if most < 2 or not start < nxt or not start + dt0 < reader:
            return [dt0]
        most = self.sched.decode_stretch_limit(scheduled, most)
        if most < 2:
            return [dt0]
        dts = [dt0] + self.profile.step.decode_stretch(r, sum_qk + r, sum_k + r, sum_qc + r, start + dt0, nxt,
                                                       reader, most - 2)
        m = len(dts)  # the step left in flight: m decodes past the first
        dts.append(self.profile.step_time(r, r, sum_qk + m * r, sum_k + m * r, sum_qc + m * r))
        return dts

    def _land_stretch(self, rows: list[tuple[int, bool]]) -> tuple:
        """The process woke from an asynchronous stretch (its step in flight ahead was just
        applied): its steps but the last are applied and the steps after the first were
        scheduled, as step-by-step; the last stays in flight. Returns its in-flight entry."""
        dts, batch = self._dts, self._batch
        self._dts = []
        if len(dts) > 1:
            self.steps += len(dts) - 1
            for call, _ in batch:
                call.req.exec_time = stretch.add_in_order(call.req.exec_time, dts[:-1])
            rows = self.sched.complete_async_stretch(batch, len(dts))
        return batch, rows, dts[-1], self.env.now + dts[-1]

    def _steady(self, scheduled) -> bool:
        """Would the next steps schedule the same batch? True when nothing waits, or the
        queue head is stuck on memory/seat limits that decode steps only tighten, and the
        policy's pins and order stay as they are until an event _next_event knows."""
        if any(call.num_output == 0 for call, _ in scheduled):
            return False  # a prefill's last token: its first-token time is this step's end
        if self.policy.reviews_pins and self.sched.pins and not self.policy.review_steady():
            return False  # the policy may drop pins at any step
        sched = self.sched
        if sched.order_moved and sched.victim_ordered() != sched.running:
            # the next step puts the running calls in another order (tied calls swap every
            # step) and so allocates blocks in another order than a stretch would. A step
            # whose ordering moved nothing holds no ties, and stays ordered while it decodes.
            return False
        if not self.sched.waiting:
            return True
        if self.sched.preempted_now:
            return False  # the step admitted nothing because it preempted: the next one may
        # a pin changes the order or lets the head in only by expiring (_next_event ends the
        # stretch there), by a hit (an admission) or by the no-deadlock rule, which a policy
        # that keeps its pins while calls run (unpin_while_running False) never applies
        # mid-stretch, nor one whose head dropping every other pin would not let in
        # (pins_hold); an order that moves with time moves at order_fixed_until (_next_event)
        return not self.sched.pins or self.sched.pins_hold

    def _stretch(self, scheduled, dt0: float, now: float, sum_qk: float, sum_k: float, sum_qc: float) -> list[float]:
        """The step times of a decode stretch: until a call finishes, a block allocation
        would fail, through the step in which the next outside event lands (horizon), or
        before the step in which an event that reads the replica lands (read_horizon: that
        step runs alone, as step-by-step). Each step's time is the profile's for that step
        (every context one token longer), so the stretch ends at the same float time as
        step-by-step, and events keep their order (a different last bit reorders arrivals
        across replicas)."""
        r = len(scheduled)
        max_steps = min(call.max_output - call.num_output for call, _ in scheduled)
        max_steps = self.sched.decode_stretch_limit(scheduled, max(1, max_steps))
        nxt = self._next_event(self.horizon)
        return [dt0] + self.profile.step.decode_stretch(r, sum_qk + r, sum_k + r, sum_qc + r, now + dt0, nxt,
                                                        self.read_horizon(), max_steps - 1)

    def _account(self, now: float, dts: list[float], scheduled) -> float:
        """KV use and busy time per step, as step-by-step records them (inside a stretch
        step j also holds the blocks steps 1..j allocated, applied at the stretch's end),
        so no figure depends on where stretches end. Returns the end of the last step:
        the step times added one by one, the float step-by-step reaches."""
        used, pinned = self.sched.pool.num_used, self.sched.pinned_blocks
        samples = self.kv_samples
        n, bs = len(dts), self.cfg.block_size
        grow = [0] * n
        if n > 1:
            for call, _ in scheduled:  # step j writes position base + j
                for j in range(-self.sched.stretch_base(call) % bs or bs, n, bs):
                    grow[j] += 1
        used, self._used_area, self.busy_time, t = stretch.account_steps(
            dts, grow, used, self._used_area, self.busy_time, now, samples[-1][0] if samples else -math.inf, samples, pinned)
        self.peak_used = max(self.peak_used, used)
        return t

    def _finish(self, call: Call) -> None:
        now, req, sched = self.env.now, call.req, self.sched
        sched.retire(call, sched.call_finished(req, call.num_output, now, call.scheduled_at, len(call.blocks)), now)
        if req.is_last_step:
            sched.end_program(req, now)
        if self.on_finish is not None:
            self.on_finish(call, now)
