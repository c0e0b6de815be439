"""The policy host: what both engines do around a policy, written once. The SimPy
replica's scheduler (sim/simpy_replica/scheduler.py) and the vLLM adapter
(sim/vllm_replica/scheduler.py) inherit it and provide the few block operations of
`HostedEngine`; the host holds the rest:
- the EngineView a policy reads (policies/base.py): the host is the view;
- the pins (policies/pins.py PinTable): holding one, releasing one (offloaded first when
  the policy says so), expiry, the policy's per-step review, Continuum's no-deadlock rule;
- the running list in the policy's victim order;
- the statistics of finished calls (FinishStats) and a program's end.
So a policy reads the same numbers and its pins follow the same rules in both engines.
Stdlib and policies only: it runs inside vLLM.
"""
from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Protocol

from policies.base import Policy, Release, Request, Retention, SlidingMean
from policies.pins import PinTable
from policies.runtime import no_deadlock_victims, offloads_dropped_pin


class FinishStats:
    """The two running statistics an EngineView reports: queue_delay() = mean queueing
    delay of the last `window` non-first calls (the paper's T; a first call never had a
    cache to lose), avg_request_blocks() = mean blocks a call held at its finish (the
    paper's M)."""

    def __init__(self, window: int = 100) -> None:
        self._delays = SlidingMean(window, empty=0.0)
        self._blocks_sum = 0
        self._blocks_n = 0

    def record(self, req: Request, queue_delay: float | None, blocks: int) -> None:
        if queue_delay is not None and req.turn > 0:
            self._delays.append(queue_delay)
        self._blocks_sum += blocks
        self._blocks_n += 1

    def queue_delay(self) -> float:
        return self._delays.mean

    def avg_request_blocks(self) -> float:
        return self._blocks_sum / self._blocks_n if self._blocks_n else 1.0


class HostedEngine(Protocol):
    """What an engine provides its PolicyHost: its limits, its running list, the tier and
    profile the view prices contexts with, and a few block operations."""

    block_size: int
    num_blocks: int  # usable KV blocks
    running: list  # the engine's running calls, in its order
    tier: object  # sim/kv/tiers.py: KVOffload or NoTier (or a disaggregated replica's Inbox)
    profile: object  # sim/hardware/profile.py Profile

    def count_free(self) -> int: ...  # free or evictable-cached blocks
    def running_blocks(self, program_id: str) -> int: ...  # blocks of the program's running call, 0 if none
    def running_rows(self) -> Iterable[tuple[int, int]]: ...  # per running call: (tokens not computed, blocks held)
    def running_requests(self) -> list[Request]: ...  # the policy's record of each running call, in running order
    def waiting_programs(self) -> Container[str]: ...  # programs whose next call waits (asked, not iterated)
    def count_sole(self, blocks: list) -> int: ...  # of a pin's blocks, those nothing else references
    def block_keys(self, program_id: str, blocks: list) -> list: ...  # content key per block (None: not cached)
    def free_pinned(self, blocks: list, now: float) -> None: ...  # a released pin's blocks back to the pool
    def pins_changed(self, program_id: str, now: float) -> None: ...  # after a pin was held or released


class PolicyHost:
    """The policy's side of an engine (the module's docstring). An engine calls
    init_host once it can answer HostedEngine's operations."""

    policy: Policy

    def init_host(self, policy: Policy, block_id=None) -> None:
        """`block_id`: a pinned block's id (vLLM's KVCacheBlock -> block_id; None: blocks
        are ids, as in the SimPy replica)."""
        self.pins = PinTable(block_id=block_id)  # program -> blocks held by its pin
        # False once the no-deadlock rule, asked in this step (drop_pins_for), did anything
        # but keep the pins for a reason that lasts while the running calls only decode
        # (the engine resets it per step: sim/simpy_replica/engine.py _steady)
        self.pins_hold = True
        self.use_policy(policy)

    def use_policy(self, policy: Policy) -> None:
        """Run `policy` from now on, with fresh finish statistics."""
        self.policy = policy
        self.stats = FinishStats()
        # a policy with its own victims has the running list put in its order before each step
        self._custom_victim = type(policy).preemption_victim is not Policy.preemption_victim

    # --- EngineView (policies/base.py) --------------------------------------------------
    def free_blocks(self) -> int:
        return self.count_free()

    def blocks_of(self, program_id: str) -> int:
        pinned = self.pins.get(program_id)
        return len(pinned) if pinned is not None else self.running_blocks(program_id)

    def avg_request_blocks(self) -> float:
        return self.stats.avg_request_blocks()

    def queue_delay(self) -> float:
        return self.stats.queue_delay()

    def prefill_reload_time(self, tokens: int) -> float:
        """Prefill, or with an offload tier the reload from it (the paper's Prefill-Reload)."""
        return self.tier.reload_time(tokens) if self.tier.enabled else self.profile.prefill_time(tokens)

    # optional view facts (policies.base.OffloadView)
    def offload_enabled(self) -> bool:
        return self.tier.enabled

    def reload_time(self, tokens: int) -> float:
        return self.tier.reload_time(tokens)

    def running_tokens(self) -> tuple[int, int]:
        """(tokens the running calls put in a step, KV tokens they hold: their blocks x
        block size, so a call admitted earlier in this step, whose tokens are not computed
        yet, counts as running: InferCept's "nothing running" rule)."""
        tokens = blocks = 0
        for todo, held in self.running_rows():
            tokens += max(1, todo)
            blocks += held
        return tokens, blocks * self.block_size

    def linear_step(self) -> tuple[float, float]:
        return self.profile.linear_step()

    # --- pins -------------------------------------------------------------------------
    @property
    def pinned_blocks(self) -> int:
        """Distinct blocks held by pins (a block shared by several pins counts once)."""
        return self.pins.distinct

    @property
    def pinned_block_seconds(self) -> float:
        return self.pins.block_seconds

    def hold_pin(self, program_id: str, blocks: list | None, now: float) -> None:
        """Pin a finished call's blocks for its program. None: the engine cannot hold them
        now (vLLM defers a free a step in flight may still write), and the policy hears
        of the pin as a victim."""
        if blocks is None:
            self.policy.pin_released(program_id, now, Release.VICTIM)
            return
        if program_id in self.pins:  # never two pins for one program
            self.release_pin(program_id, now, Release.EXPIRED)
        self.pins.add(program_id, blocks, now)
        self.pins_changed(program_id, now)

    def release_pin(self, program_id: str, now: float, reason: Release) -> None:
        """Drop the program's pin (nothing if it has none): written to the offload tier
        first if the policy says so, its blocks freed, the policy told."""
        blocks = self.pins.pop(program_id, now)
        if blocks is None:
            return
        if self.tier.enabled and offloads_dropped_pin(self.policy, program_id, reason):
            self.tier.offload(self.block_keys(program_id, blocks), now)
        self.free_pinned(blocks, now)
        self.policy.pin_released(program_id, now, reason)
        self.pins_changed(program_id, now)

    def expire_pins(self, now: float) -> None:
        """Drop pins whose TTL ran out, except those whose program's next call waits."""
        if self.policy.pins:  # the policy's dict: a C-level test, where the table's len() is a call
            for pid in self.policy.expired_pins(now, self.waiting_programs()):
                self.release_pin(pid, now, Release.EXPIRED)

    def drop_reviewed_pins(self, now: float) -> None:
        """A policy that reviews its pins before each step (InferCept) drops some."""
        if self.policy.reviews_pins and self.pins:
            for pid in self.policy.review_pins(now, self):
                self.release_pin(pid, now, Release.DISCARD)

    def drop_pins_for(self, program_id: str | None, short: int, now: float) -> bool:
        """Continuum's no-deadlock rule (policies/runtime.py): drop the pins it names so
        the waiting queue's head (of `program_id`, `short` blocks short) fits. Whether
        any was dropped."""
        running, below = bool(self.running), False

        def releasable() -> int:
            nonlocal below
            n = self.releasable(program_id, short)
            below = n < short
            return n
        victims = no_deadlock_victims(self.policy, self, self.pins, program_id, short, running, releasable)
        # The rule keeps the pins while calls run, and keeps doing so while they only decode,
        # when the policy keeps pins while calls run, when dropping every other pin would not
        # let the head in (decode steps only take free blocks, so short grows, and leave the
        # pinned blocks' references as they are), or when the policy says its victims stay none
        policy = self.policy
        if victims or not running or (policy.unpin_while_running and not below and not policy.unpin_victims_steady):
            self.pins_hold = False
        for victim in victims:
            self.release_pin(victim, now, Release.VICTIM)
        return bool(victims)

    def releasable(self, program_id: str | None, short: int) -> int:
        """The blocks dropping every pin but `program_id`'s would free (their blocks nothing
        else references), counted only until they reach `short`: the rule asks whether they
        do. At most the distinct pinned blocks, so with fewer than `short` of those no pin
        is looked at (it is asked at every step a head waits on memory)."""
        pins = self.pins
        if pins.distinct < short:
            return pins.distinct
        n = 0
        for pid, blocks in pins.items():
            if pid != program_id:
                n += self.count_sole(blocks)
                if n >= short:
                    break
        return n

    def offload_finished(self, program_id: str, blocks: list, now: float) -> None:
        """Retention OFFLOAD: a finished call's full chunks go to the offload tier (without
        one, nothing); the engine frees the blocks."""
        if self.tier.enabled:
            self.tier.offload(self.block_keys(program_id, blocks), now)

    # --- victims ----------------------------------------------------------------------
    def victim_ordered(self) -> list:
        """The running list in the policy's victim order, last victim first (the engine
        preempts its tail). Calls the policy ties (a stable sort) keep their list order in
        the victim order, so the list comes back reversed among them: the order of tied
        calls flips every step."""
        running, reqs = self.running, self.running_requests()
        order = self.policy.preemption_order(reqs, self)
        entry = dict(zip(map(id, reqs), running))
        return list(map(entry.__getitem__, map(id, reversed(order))))

    # --- finished calls ---------------------------------------------------------------
    def call_finished(self, req: Request, output_tokens: int, now: float, scheduled_at: float | None,
                      blocks: int) -> Retention:
        """A call finished normally holding `blocks` blocks: its statistics recorded, the
        policy's decision on its KV returned (the engine then holds, offloads or frees)."""
        req.output_tokens = output_tokens
        self.stats.record(req, None if scheduled_at is None else scheduled_at - req.arrival, blocks)
        return self.policy.on_finish(req, now, self)

    def end_program(self, req: Request, now: float) -> None:
        """The program's last call finished (or failed): any pin still held goes as 'last';
        it ran req.turn + 1 turns (the request's own count: a cluster's other replicas
        may have served turns too)."""
        pid = req.program_id
        self.release_pin(pid, now, Release.LAST)
        self.policy.on_program_end(pid, req.turn + 1, now)
