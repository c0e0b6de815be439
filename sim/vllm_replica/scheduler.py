"""A vLLM scheduler that runs any policy of `policies/`, loaded with no change to vLLM.

    LLM(..., scheduler_cls="sim.vllm_scheduler.PolicyScheduler",
        additional_config={"agentsim": {"policy": "continuum", "policy_args": {},
                                        "profile": "cpu-tiny-llama"}})

(no "profile": the bundled one of the shipped model the engine runs, calibrate/engine.py)

(`--scheduler-cls` / `--additional-config` on the OpenAI server). Requests carry
their program in `extra_args` (`vllm_xargs` on the server; see sim/replica/job_meta.py).

It follows the call protocol of policies/base.py exactly as sim/simpy_replica/scheduler.py does
(both are the policy host of sim/replica/policy_host.py, which holds the view, the pins and
their rules), so a policy makes the same decisions in both engines:
- Pin: a finished call whose policy says "pin" keeps its blocks: they are taken out of
  the KV manager (`pop_blocks_for_free`) with their references held, so they cannot
  be evicted, yet stay in the prefix cache for the next turn to hit. Releasing a pin
  returns them to the block pool (`free_blocks`, tail block first).
- Order: the waiting queue (vLLM's FCFS deque) is kept in the policy's order_key
  order (see _place); vLLM then admits from its head and stops at the first request
  that cannot be allocated (head-of-line), as the simulator does.
- No deadlock: a waiting request's failed allocation drops the policy's victim pins
  and retries once (while requests run, only for policies with unpin_while_running
  and only if dropping them lets it in).
- Expiry: checked at every step and at every arrival (the engine does not step while
  idle, and a pin that expired during the idle time must not count as a hit).
Time is the scheduler's `clock`: time.monotonic() seconds inside a real engine; the
simulator's vLLM engine (sim/vllm_replica/engine.py) passes its simulated clock, its own policy
object and profile, and the policy's record of each call (`records`), so that the one
implementation of the policy protocol here runs both. Policies see plain records, never
vLLM objects.
"""
from __future__ import annotations

import bisect
import logging
import operator
import time
from collections import deque
from dataclasses import dataclass

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from policies.base import Action, Policy, PolicyError, Release, Request
from policies.pins import pin_counts
from policies.registry import make_policy
from sim.kv.tiers import NO_TIER
from sim.vllm_replica.retention import read_hint, retain_request
from sim.replica.job_meta import parse_job_meta
from sim.replica.policy_host import PolicyHost
from sim.hardware.profile import Profile, load_profile, step_features
from sim.hardware.shipped_models import bundled_profile_name
from agentsim.errors import InputError

logger = logging.getLogger("agentsim.scheduler")
CONFIG_KEY = "agentsim"
_NORMAL_FINISH = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


@dataclass(slots=True)
class _Call:
    req: Request
    seq: int  # arrival order, the tie-breaker
    scheduled_at: float | None = None


class _Asked:
    """A container whose membership is a predicate: for a policy that asks about a few
    members of a set too large to build before every step."""

    __slots__ = ("_pred",)

    def __init__(self, pred) -> None:
        self._pred = pred

    def __contains__(self, x) -> bool:
        return self._pred(x)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_profile_matches(profile: Profile, model_config, parallel_config) -> None:
    """A profile from another model would price reloads wrongly: refuse it."""
    want = {"num_layers": model_config.get_num_layers(parallel_config),
            "num_kv_heads": model_config.get_num_kv_heads(parallel_config),
            "head_dim": model_config.get_head_size()}
    for key, v in want.items():
        have = profile.model.get(key)
        if have is not None and int(have) != int(v):
            raise InputError(f"profile {profile.name!r} is for a model with {key}={have} but the engine runs "
                             f"{key}={v}; calibrate this model with `sim calibrate` and pass its profile")


class PolicyScheduler(PolicyHost, Scheduler):
    def __init__(self, vllm_config, *args, policy: Policy | None = None, profile: Profile | None = None,
                 clock=None, **kwargs) -> None:
        """vLLM builds it with its own arguments; the simulator's vLLM engine also passes
        `policy` (the object to run), `profile` (its step model and limits, not checked
        against the config's model, which is a stand-in there) and `clock` (simulated
        seconds)."""
        super().__init__(vllm_config, *args, **kwargs)
        conf = dict((vllm_config.additional_config or {}).get(CONFIG_KEY) or {})
        self.clock = time.monotonic if clock is None else clock
        try:
            self._policy_conf = (str(conf.get("policy", "vllm")), dict(conf.get("policy_args") or {}))
            policy = make_policy(self._policy_conf[0], **self._policy_conf[1]) if policy is None else policy
            if profile is None:
                ref = conf.get("profile") or bundled_profile_name(vllm_config.model_config.model)
                if ref is None:
                    raise InputError(f"no profile for model {vllm_config.model_config.model!r}: calibrate it with "
                                     "`sim calibrate` and pass it as additional_config agentsim.profile")
                profile = load_profile(ref)
                check_profile_matches(profile, vllm_config.model_config, vllm_config.parallel_config)
            self.profile = profile
        except (PolicyError, InputError) as err:  # vLLM shows this at start-up
            raise ValueError(f"agentsim scheduler: {err}") from None
        if self.scheduler_config.policy != "fcfs":
            raise ValueError("agentsim scheduler: the policy orders the queue itself; "
                             "run vLLM with its default --scheduling-policy fcfs")
        self.calls: dict[str, _Call] = {}  # request id -> call, while in the engine
        self.inflight: dict[str, str] = {}  # program -> its request in the engine
        self.programs: dict[str, tuple[float, int]] = {}  # program -> (first arrival, turns seen)
        self.init_host(policy, block_id=operator.attrgetter("block_id"))  # pins hold KVCacheBlocks
        self._seq = 0
        self._warned: set[str] = set()
        # (when it was scheduled, its step-model features) of each timed step not yet updated:
        # with async scheduling the next step is scheduled before this one's output arrives
        self._timed: deque[tuple[float, tuple]] = deque()
        self._last_update = 0.0
        # (start, seconds, tokens, seqs, sum q*k, sum k, sum q*(k-q)) per step, kept only
        # when a caller sets it to a list (validation compares it with the step model)
        self.step_log: list[tuple] | None = None
        self.kv_peak = 0  # blocks in use (running + pinned), over steps: how full the pool got
        self.preemptions = 0
        # request id -> the clock when it reached the scheduler (validation: late arrivals)
        self.arrival_log: dict[str, float] = {}
        # request id -> the policy's record of the call, given by a caller that keeps its own
        # (the simulator's vLLM engine); without one it is built from the request's metadata
        self.records: dict[str, Request] = {}
        # request id -> when the policy is told it arrived, where that is not now: a call a
        # prefill replica handed over came to its decode replica at its arrival (sim/cluster/disagg.py)
        self.arrived: dict[str, float] = {}
        self._kv_sum = self._kv_steps = 0
        # offload tiers (the simulator's --offload; none inside a real engine): `tier` answers
        # the view's reload questions and stores what the policy offloads, `block_keys(pid,
        # blocks)` names a context's blocks for it (sim/vllm_replica/engine.py sets both)
        self.tier = NO_TIER
        self.block_keys = None
        self._hooks()
        # steps are timed only for a policy that reads exec_time or while validation logs them
        self.timed_steps = False
        if self.policy.reads_exec_time:
            self._time_steps()
        # The waiting deque is kept in policy order incrementally: a request's key is
        # computed when it arrives and again only when its program's pin changes or it
        # is preempted (what policy keys depend on), so a step with hundreds waiting
        # and no such event costs nothing. Keys that move with time are re-sorted per step.
        self._keys: dict[str, tuple] = {}
        self._next_expiry = float("inf")  # at most the earliest pin expiry: the per-step check is O(1)
        self._waiting_programs = _Asked(self._next_call_waits)
        allocate = self.kv_cache_manager.allocate_slots

        def allocate_slots(request, num_new_tokens, *a, **kw):
            blocks = allocate(request, num_new_tokens, *a, **kw)
            if blocks is None and self.pins and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                if self._unpin_for(request, num_new_tokens, kw):
                    blocks = allocate(request, num_new_tokens, *a, **kw)
            return blocks

        # installed on the KV manager only while pins exist (a wrapper costs every call)
        self._allocate_with_unpin = allocate_slots

    # --- the block operations of the policy host (sim/replica/policy_host.py HostedEngine) ---
    @property
    def num_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.num_gpu_blocks - 1  # minus vLLM's null block

    def count_free(self) -> int:
        return self.kv_cache_manager.block_pool.get_num_free_blocks()

    def running_blocks(self, program_id: str) -> int:
        rid = self.inflight.get(program_id)
        if rid is None or rid not in self.requests:
            return 0
        return sum(len(g) for g in self.kv_cache_manager.get_block_ids(rid))

    def running_rows(self) -> list[tuple[int, int]]:
        # blocks as the simulator counts them, so that a request admitted earlier in this
        # step, whose tokens are not computed yet, counts as running (the twin check)
        ids = self.kv_cache_manager.get_block_ids
        return [(r.num_tokens - r.num_computed_tokens, len(ids(r.request_id)[0])) for r in self.running]

    def running_requests(self) -> list[Request]:
        calls = self.calls
        return [calls[r.request_id].req for r in self.running]

    def waiting_programs(self) -> _Asked:
        return self._waiting_programs

    def count_sole(self, blocks: list) -> int:
        return sum(1 for b in blocks if b.ref_cnt == 1)

    def free_pinned(self, blocks: list, now: float) -> None:
        self.kv_cache_manager.block_pool.free_blocks(reversed(blocks))  # tail block evicted first

    # block_keys(pid, blocks): set by the simulator's vLLM engine (offload tiers only)

    def pins_changed(self, pid: str, now: float) -> None:
        manager = self.kv_cache_manager
        if self.pins:
            manager.allocate_slots = self._allocate_with_unpin
        else:
            manager.__dict__.pop("allocate_slots", None)  # back to the class's own method
        pin = self.policy.pins.get(pid) if pid in self.pins else None
        if pin is not None:  # a new pin; a released one leaves the bound early, which is safe
            self._next_expiry = min(self._next_expiry, pin.expiry)
        rid = self.inflight.get(pid)
        request = self.requests.get(rid) if rid is not None else None
        if request is not None and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self._place(request, now)

    def _key(self, call: _Call, now: float) -> tuple:
        return (self.policy.order_key(call.req, now, self), call.seq)

    def _place(self, request, now: float) -> None:
        """(Re)insert a waiting request at its policy position."""
        call = self.calls.get(request.request_id)
        if call is None:
            return
        queue, keys = self.waiting, self._keys
        key = keys[request.request_id] = self._key(call, now)
        if queue and queue[-1] is request:  # just appended (an arrival): usually already in place
            if len(queue) == 1 or keys.get(queue[-2].request_id, ()) <= key:
                return
            queue.pop()
        else:
            try:
                queue.remove(request)
            except ValueError:
                return  # not in the plain waiting queue (e.g. vLLM holds it elsewhere)
        at = bisect.bisect_right(queue, key, key=lambda r: keys.get(r.request_id, ()))
        queue.insert(at, request)

    def _expire(self, now: float) -> None:
        """Release the pins whose TTL ran out, then bound the next expiry again (pins
        released since the last bound only made it early: one extra call here)."""
        self.expire_pins(now)
        self._next_expiry = min((p.expiry for p in self.policy.pins.values()), default=float("inf"))

    def _next_call_waits(self, pid: str) -> bool:
        """A pinned program whose next call waits: a request of ours not running is in
        self.waiting (waiting or preempted). Asked only of expired pins, not of hundreds."""
        r = self.requests.get(self.inflight.get(pid))
        return r is not None and r.status != RequestStatus.RUNNING and pid in self.pins

    def _unpin_for(self, request, num_new_tokens: int, kw: dict) -> bool:
        """Continuum's no-deadlock rule for a request whose allocation failed (PolicyHost.drop_pins_for)."""
        call = self.calls.get(request.request_id)
        pid = call.req.program_id if call else None
        hits = kw.get("new_computed_blocks")
        hit = list(hits.blocks[0]) if hits is not None and hits.blocks else []
        free = self.free_blocks() - sum(1 for b in hit if b.ref_cnt == 0)
        tokens = request.num_tokens if kw.get("full_sequence_must_fit") else (
            request.num_computed_tokens + kw.get("num_new_computed_tokens", 0) + num_new_tokens)
        short = max(1, _cdiv(min(tokens, self.max_model_len), self.block_size) - len(hit) - free)
        return self.drop_pins_for(pid, short, self.clock())

    # --- requests --------------------------------------------------------------------------
    def _warn(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("agentsim scheduler: %s", msg)

    def add_request(self, request) -> None:
        now = self.clock()
        rid = request.request_id
        if rid not in self.calls:
            req = self.records.pop(rid, None)
            params = request.sampling_params
            hint = read_hint(getattr(params, "extra_args", None) if params is not None else None, self._warn, rid)
            if req is not None:  # the caller's own record (the simulator's vLLM engine)
                req.hint = hint  # as a real engine reads it: from the request's extra_args
                pid = req.program_id
                first, turns = self.programs.get(pid, (now, 0))
                self.programs[pid] = (first, turns + 1)
            else:
                meta = parse_job_meta(getattr(params, "extra_args", None) if params is not None else None, rid)
                for p in meta.problems:
                    self._warn(p, f"request {rid}: {p}")
                pid = meta.program_id
                if pid in self.inflight:  # two calls of one program at once: serve this one on its own
                    self._warn(f"concurrent:{pid}", f"program {pid!r} sent request {rid} while {self.inflight[pid]} "
                               "is still in the engine; it is served as a one-turn program")
                    pid, meta.is_last_step, meta.tool = f"<anon>{rid}", True, None
                first, turns = self.programs.get(pid, (now, 0))
                self.programs[pid] = (first, turns + 1)
                req = Request(req_id=rid, program_id=pid, turn=turns, arrival=now, program_arrival=first,
                              prompt_tokens=request.num_prompt_tokens, is_last_step=meta.is_last_step, tool=meta.tool,
                              true_tool_duration=None if meta.is_last_step else meta.tool_duration_s, hint=hint)
            if now >= self._next_expiry:  # pins that ran out while the engine idled go before this arrival
                self._expire(now)
            self.policy.on_arrival(req, self.arrived.pop(rid, now))
            self._seq += 1
            self.calls[rid] = _Call(req, self._seq)
            self.inflight[pid] = rid
            if self.step_log is not None:
                self.arrival_log[rid] = now
        super().add_request(request)
        self._place(request, now)

    def schedule(self, *args, **kwargs):
        now = self.clock()
        if now >= self._next_expiry:
            self._expire(now)
        self.drop_reviewed_pins(now)  # InferCept re-judges its pins before each step
        if self.policy.order_depends_on_time and len(self.waiting) > 1:
            for r in self.waiting:
                self._keys[r.request_id] = self._key(self.calls[r.request_id], now)
            order = sorted(self.waiting, key=lambda r: self._keys[r.request_id])
            self.waiting.clear()
            self.waiting.extend(order)
        if self._custom_victim and len(self.running) > 1:
            self._order_running_for_victims()
        out = super().schedule(*args, **kwargs)
        calls, on_schedule, pinned = self.calls, self._on_schedule, self.pins
        for new in out.scheduled_new_reqs:  # a first admission is always a new request
            call = calls.get(new.req_id)
            if call is not None and call.scheduled_at is None:
                call.scheduled_at = now
                if on_schedule is not None:
                    on_schedule(call.req, now)  # before the pin is consumed (protocol)
                if call.req.program_id in pinned:
                    self.release_pin(call.req.program_id, now, Release.HIT)
        feat = ()
        if self.step_log is not None:  # validation statistics, off by default (cost per step)
            feat = self.features(out)
            used = self.num_blocks - self.free_blocks()
            self.kv_peak = max(self.kv_peak, used)
            self._kv_sum += used
            self._kv_steps += 1
        if self.timed_steps:
            self._timed.append((self.clock(), feat))
        return out

    def features(self, out) -> tuple:
        """The step model's inputs (sim/hardware/profile.py) for this step: tokens, seqs, sum q*k,
        sum k, sum q*(k-q); k counts the chunk (num_computed_tokens is already advanced)."""
        requests = self.requests
        return step_features((q, requests[rid].num_computed_tokens)
                             for rid, q in out.num_scheduled_tokens.items() if rid in requests)

    def _order_running_for_victims(self) -> None:
        """vLLM preempts the tail of `running`: put the policy's victims there, in order."""
        self.running[:] = self.victim_ordered()

    def _timed_update_from_output(self, scheduler_output, model_runner_output):
        """update_from_output, installed on the instance only when steps are timed (an
        override would cost every step)."""
        now, (start, feat) = self.clock(), self._timed.popleft() if self._timed else (self._last_update, ())
        start = max(start, self._last_update)  # a step scheduled ahead runs once the one before it ended
        scheduled, dt, self._last_update = scheduler_output.num_scheduled_tokens, now - start, now
        if self.step_log is not None and scheduled:
            self.step_log.append((start, dt, *feat))
        if self.policy.reads_exec_time:
            calls = self.calls
            for rid in scheduled:
                call = calls.get(rid)
                if call is not None:
                    call.req.exec_time += dt
        return super().update_from_output(scheduler_output, model_runner_output)

    def _preempt_request(self, request, *args, **kwargs) -> None:
        call = self.calls.get(request.request_id)
        if call is not None:
            call.req.preempted = True
        self.preemptions += 1
        super()._preempt_request(request, *args, **kwargs)
        self._place(request, self.clock())

    def _free_request_blocks(self, request) -> None:
        """Called on preemption and on finish; on a normal finish the policy decides."""
        call = self.calls.pop(request.request_id, None) if request.is_finished() else None
        self._keys.pop(request.request_id, None)
        if call is None:
            super()._free_request_blocks(request)
            return
        now = self.clock()
        req = call.req
        pid = req.program_id
        if self.inflight.get(pid) == request.request_id:
            del self.inflight[pid]
        if request.status not in _NORMAL_FINISH:  # aborted or failed: no pin, program ends
            super()._free_request_blocks(request)
            self._end_program(req, now)
            return
        ret = self.call_finished(req, request.num_output_tokens, now, call.scheduled_at,
                                 _cdiv(request.num_computed_tokens, self.block_size))
        action = ret.action
        if action is Action.RETAIN:  # soft retention: specs on its blocks, then freed below (sim/vllm_replica/retention.py)
            retain_request(self, request, ret, now)
        if action == Action.OFFLOAD and self.tier.enabled:  # its full chunks to the tier, then free
            self.offload_finished(pid, self.kv_cache_manager.get_blocks(request.request_id).blocks[0], now)
        if action is Action.PIN:
            held = self._request_blocks_can_be_freed(request)  # else a step in flight may still write them
            self.hold_pin(pid, self.kv_cache_manager.pop_blocks_for_free(request) if held else None, now)
        else:
            held = False
        if not held:
            super()._free_request_blocks(request)
        if req.is_last_step:
            self._end_program(req, now)

    def _end_program(self, req: Request, now: float) -> None:
        """The program's last call finished, or its call failed (PolicyHost.end_program)."""
        self.programs.pop(req.program_id, None)
        self.end_program(req, now)

    def _hooks(self) -> None:
        """Per-call hooks the policy does not override are not called (the adapter runs
        per request; a no-op call still costs)."""
        self._on_schedule = None if type(self.policy).on_schedule is Policy.on_schedule else self.policy.on_schedule

    def _time_steps(self) -> None:
        self.timed_steps = True
        self.update_from_output = self._timed_update_from_output

    def reset_stats(self) -> None:
        """Start a measured run (after a warm-up, calibration or clock probes): a fresh
        policy and fresh statistics, as a simulation starts, then log steps. The earlier
        requests were one-turn programs without job ids; a policy that learned from them
        would carry that into the run (Continuum's eta went negative from the probes'
        one-turn programs and it pinned half as often as in the simulator)."""
        if self.calls:
            raise RuntimeError("reset_stats with requests in the engine")
        for pid in list(self.pins):  # programs of the earlier phase are over
            self.release_pin(pid, self.clock(), Release.LAST)
        self.pins.restart(self.clock())
        self.use_policy(make_policy(self._policy_conf[0], **self._policy_conf[1]))
        self._hooks()
        self.programs.clear()
        self._next_expiry = float("inf")
        self.step_log = []
        self._timed.clear()
        self._last_update = self.clock()
        self._time_steps()
        self.kv_peak = self._kv_sum = self._kv_steps = self.preemptions = 0
        self.arrival_log = {}

    def pin_report(self) -> dict:
        """Pin counters for the replay report (same names as `sim run`)."""
        return {**pin_counts(self.policy.pin_outcomes),
                "preemptions": self.preemptions, "pinned_block_seconds": self.pinned_block_seconds,
                "pinned_blocks_now": self.pinned_blocks,
                "peak_kv_usage": self.kv_peak / self.num_blocks,
                "mean_kv_usage_per_step": self._kv_sum / max(self._kv_steps, 1) / self.num_blocks}


class AsyncPolicyScheduler(PolicyScheduler, AsyncScheduler):
    """PolicyScheduler over vLLM's AsyncScheduler, for an engine that schedules
    asynchronously (vLLM 0.32's default on GPU: the next step is scheduled while the
    current one runs, its decode tokens as placeholders):

        LLM(..., scheduler_cls="sim.vllm_scheduler.AsyncPolicyScheduler", additional_config=...)

    The plain PolicyScheduler there would run with async scheduling half off (vLLM warns).
    The simulator's vLLM engine runs it with `engine.async_scheduling` (sim/vllm_replica/engine.py)."""
