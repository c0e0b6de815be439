"""One simulated vLLM replica as a SimPy process: schedule a step, let its time pass,
apply it, hand finished calls to the policy. It is also the policy's EngineView.

Speed: a batch of decodes that will run unchanged (no call finishes, no allocation
fails, nothing can be admitted, no arrival or pin expiry falls inside) is advanced as
one stretch of n steps with a single SimPy timeout. Step j of the stretch costs
A + B*j (every context grows by one token a step), so the stretch ends exactly where
the step-by-step engine would, at the first step that completes after the next event.
"""
from __future__ import annotations

import math
from collections import deque

import simpy

from policies.base import Policy
from sim.call import Call
from sim.profile import Profile
from sim.scheduler import EngineConfig, Scheduler


class Engine:
    def __init__(self, env: simpy.Environment, cfg: EngineConfig, profile: Profile, policy: Policy,
                 on_finish=None, fast_forward: bool = True) -> None:
        self.env = env
        self.cfg = cfg
        self.profile = profile
        self.policy = policy
        self.sched = Scheduler(cfg, policy)
        self.sched.view = self
        self.on_finish = on_finish  # callback(call, now) for metrics and program processes
        self.fast_forward = fast_forward
        self._wakeup = env.event()
        self._delays: deque[float] = deque(maxlen=100)
        self._blocks_sum = 0
        self._blocks_n = 0
        self.steps = 0
        self.busy_time = 0.0
        self.kv_samples: list[tuple[float, int, int]] = []  # (t, used, pinned) at step starts
        self._used_area = 0.0
        self.peak_used = 0
        self.process = env.process(self._loop())

    # --- EngineView ---------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def num_blocks(self) -> int:
        return self.cfg.num_gpu_blocks

    def free_blocks(self) -> int:
        return self.sched.pool.num_free

    def blocks_of(self, program_id: str) -> int:
        pinned = self.sched.pins.get(program_id)
        if pinned is not None:
            return len(pinned)
        return sum(len(c.blocks) for c in self.sched.running if c.req.program_id == program_id)

    def avg_request_blocks(self) -> float:
        return self._blocks_sum / self._blocks_n if self._blocks_n else 1.0

    def prefill_reload_time(self, tokens: int) -> float:
        return self.profile.prefill_time(tokens)

    def queue_delay(self) -> float:
        return sum(self._delays) / len(self._delays) if self._delays else 0.0

    # --- requests -------------------------------------------------------------------------
    def submit(self, call: Call) -> None:
        self.policy.on_arrival(call.req, self.env.now)
        self.sched.waiting.append(call)
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    # --- the step loop --------------------------------------------------------------------
    def _next_event(self) -> float:
        """Earliest time something outside the batch can change: an event in SimPy's
        queue (arrival, tool return) or a pin expiry."""
        expiry = min((p.expiry for p in self.policy.pins.values()), default=math.inf)
        return min(self.env.peek(), expiry)

    def _loop(self):
        env, sched, c = self.env, self.sched, self.profile.step
        while True:
            if not sched.running and not sched.waiting:
                self._wakeup = env.event()
                yield self._wakeup
                continue
            now = env.now
            scheduled = sched.schedule(now)
            if not scheduled:
                # Waiting calls blocked with nothing running: only an arrival or a pin
                # expiry can change that.
                nxt = self._next_event()
                if math.isinf(nxt):
                    raise RuntimeError(f"deadlock at t={now:.3f}: {len(sched.waiting)} waiting, "
                                       f"{sched.pinned_blocks} pinned blocks, nothing can run")
                self._wakeup = env.event()
                yield self._wakeup | env.timeout(max(nxt - now, 0.0))
                continue
            tokens = seqs = 0
            sum_qk = sum_k = sum_qc = 0.0
            for call, q in scheduled:
                k = call.num_computed + q
                tokens += q
                seqs += 1
                sum_qk += q * k
                sum_k += k
                sum_qc += q * call.num_computed
            dt = self.profile.step_time(tokens, seqs, sum_qk, sum_k, sum_qc)
            n = 1
            if self.fast_forward and tokens == seqs == len(sched.running) and self._steady(scheduled):
                n, dt = self._stretch(scheduled, dt, c, now)
            self._account(now, dt)
            yield env.timeout(dt)
            self.steps += n
            for call, _ in scheduled:
                call.req.exec_time += dt
            for call in sched.complete(scheduled, env.now, steps=n):
                self._finish(call)

    def _steady(self, scheduled) -> bool:
        """Would the next steps schedule the same batch? True when nothing waits, or the
        queue head is stuck on memory/seat limits that decode steps only tighten and the
        policy's order does not move with time."""
        if any(call.num_output == 0 for call, _ in scheduled):
            return False  # a prefill's last token: its first-token time is this step's end
        if not self.sched.waiting:
            return True
        return not self.policy.order_depends_on_time and not self.sched.pins

    def _stretch(self, scheduled, dt0: float, c, now: float) -> tuple[int, float]:
        r = len(scheduled)
        max_steps = min(call.max_output - call.num_output for call, _ in scheduled)
        gap = self._next_event() - now
        b = (c[2] + c[4] + c[5]) * r  # each step every context is one token longer
        if not math.isinf(gap):
            # smallest n with n*dt0 + b*n(n-1)/2 >= gap: the step in which the event lands
            if b > 0:
                n_ev = math.ceil(((-(2 * dt0 - b)) + math.sqrt((2 * dt0 - b) ** 2 + 8 * b * gap)) / (2 * b))
            else:
                n_ev = math.ceil(gap / dt0)
            n_ev = max(1, n_ev)
            while n_ev > 1 and (n_ev - 1) * dt0 + b * (n_ev - 1) * (n_ev - 2) / 2 >= gap:
                n_ev -= 1
            max_steps = min(max_steps, n_ev)
        n = self.sched.decode_stretch_limit(scheduled, max(1, max_steps))
        return n, n * dt0 + b * n * (n - 1) / 2

    def _account(self, now: float, dt: float) -> None:
        used = self.sched.pool.num_used
        self._used_area += used * dt
        self.busy_time += dt
        self.peak_used = max(self.peak_used, used)
        if not self.kv_samples or now - self.kv_samples[-1][0] >= 1.0:
            self.kv_samples.append((now, used, self.sched.pinned_blocks))

    def mean_used_blocks(self, horizon: float) -> float:
        return self._used_area / horizon if horizon > 0 else 0.0

    def _finish(self, call: Call) -> None:
        now = self.env.now
        req = call.req
        req.output_tokens = call.num_output
        if call.scheduled_at is not None:
            if req.turn > 0:
                self._delays.append(call.scheduled_at - req.arrival)
        self._blocks_sum += len(call.blocks)
        self._blocks_n += 1
        retention = self.policy.on_finish(req, now, self)
        self.sched.retire(call, retention, now)
        if req.is_last_step:
            self.sched.release_pin(req.program_id, now, "last")
            self.policy.on_program_end(req.program_id, req.turn + 1, now)
        if self.on_finish is not None:
            self.on_finish(call, now)
