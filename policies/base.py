"""The policy interface shared by the simulator and the vLLM scheduler adapter.

A policy decides three things for multi-turn agent programs: what happens to a
finished call's KV cache (free, pin for a TTL, offload), the order of the waiting
queue, and which pins to drop under memory pressure. It never touches SimPy or vLLM
objects: engines pass plain `Request` records, an explicit `now` (seconds) and a
small `EngineView`, so the same object makes the same decisions in both engines and
can be replayed from a recorded event sequence.

Call protocol (both engines follow it):
  on_arrival(req, now)            a call arrives (tool time of the previous turn is
                                  now - previous finish, recorded per tool via
                                  record_tool_time(tool, seconds); tool may be None)
  on_schedule(req, now)           the call is admitted for the first time, BEFORE the
                                  engine releases the program's pin as 'hit': so
                                  `req.program_id in self.pins` says whether the call
                                  was served from a pin; now - req.arrival is its
                                  queueing delay
  on_finish(req, now, view)       returns a Retention; a pin is recorded in self.pins
                                  (req.exec_time, req.tool, req.is_last_step are final)
  pin_released(pid, now, reason)  the engine dropped or consumed a program's pin;
                                  reason: a Release (hit, expired, victim, ...)
  on_program_end(pid, turns, now) the program's last call finished (any pin still
                                  held is dropped as 'last')
Each scheduling step:
  expired_pins(now, waiting)      programs whose pins the engine must drop now
  order_key(req, now, view)       waiting order, smaller first; admit in order
  unpin_victims(need, view, exclude=head's program)
                                  pins to drop so the queue head fits (no deadlock);
                                  asked while calls run only if `unpin_while_running`
  preemption_victim(running, view)
  preemption_order(running, view) every victim in the order preemption_victim would
                                  pick them one by one (an engine that must order its
                                  running list up front, the vLLM adapter, asks once)
  req.preempted is set by the engine when a call is preempted.
Optional, for offload tiers and per-step retention (defaults change nothing; an engine
without them may ignore them):
  review_pins(now, view)          only if `reviews_pins`: programs whose pins to drop
                                  now (reason 'discard'); called before each step
  review_steady()                 after review_pins: no later review drops a pin while
                                  the running calls only decode (an engine may then
                                  fast-forward decode stretches; default False)
  order_fixed_until(now, waiting) with `order_depends_on_time`: no waiting order key
                                  changes before it (default now: no promise)
  release_action(pid, reason)     FREE | OFFLOAD: with an offload tier, what to
                                  do with a pin dropped as 'expired'/'victim'/'discard'
  Retention(Action.OFFLOAD)       write the finished call's full chunks to the
                                  offload tier, then free (no tier: same as free)
  Retention(Action.RETAIN, ttl, priority, half_life)
                                  soft retention (sim/kv/retention.py): free, but the
                                  blocks are evicted after unretained ones, by priority,
                                  for ttl seconds (then, with half_life, a decaying
                                  priority); no pin is recorded. A call's client hint
                                  (Request.hint) asks for it where the policy frees.
"""
from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Container
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class PolicyError(ValueError):
    """Bad policy name or parameter; the message is shown to the user as is."""


HINT_PRIORITY = 50  # a hint that gives a TTL but no priority (Dynamo's cache_control has none)


@dataclass(frozen=True, slots=True)
class RetentionHint:
    """A client's retention hint, shaped like vLLM's KvHintsEnvelope and Dynamo's
    `cache_control`: a priority 0-100, a TTL in seconds (None: until evicted), a session."""

    priority: int = HINT_PRIORITY
    ttl: float | None = None
    session: str | None = None


@dataclass(slots=True)  # slots: one is made per call in both engines, cheaply
class Request:
    """What a policy knows about one LLM call (one turn of a program)."""

    req_id: str
    program_id: str
    turn: int
    arrival: float  # this call's arrival, s
    program_arrival: float  # the program's first arrival, s
    prompt_tokens: int  # context at arrival
    output_tokens: int = 0  # generated so far (final at finish)
    is_last_step: bool = False
    tool: str | None = None  # tool run after this call (parsed or hinted)
    preempted: bool = False
    exec_time: float = 0.0  # seconds of model execution spent on this call
    # Only the simulator knows the future: the oracle and InferCept's public-code
    # form read it; a real engine leaves it None.
    true_tool_duration: float | None = None
    hint: RetentionHint | None = None  # the client's retention hint for this call's KV

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


class Action(StrEnum):
    """What to do with a finished call's KV cache."""

    FREE = "free"
    PIN = "pin"  # keep it referenced for a TTL
    OFFLOAD = "offload"  # write its full chunks to the offload tier, then free
    RETAIN = "retain"  # free, soft-retained: evictable under pressure (sim/kv/retention.py)


class Release(StrEnum):
    """Why an engine dropped or consumed a program's pin."""

    HIT = "hit"  # the program's next call was admitted onto it
    EXPIRED = "expired"
    VICTIM = "victim"  # dropped so the queue's head fits (or the engine could not hold it)
    DISCARD = "discard"  # review_pins chose to drop it
    LAST = "last"  # the program ended
    MOVED = "moved"  # a cluster moved the program to another replica


@dataclass(frozen=True)
class Retention:
    """What to do with a finished call's KV cache."""

    action: Action = Action.FREE
    ttl: float = 0.0  # seconds, for Action.PIN and Action.RETAIN (RETAIN: inf = until evicted)
    priority: int = 0  # Action.RETAIN: 0-100, higher is evicted later
    half_life: float | None = None  # Action.RETAIN: the priority halves every half_life s once ttl ends

    def __post_init__(self) -> None:  # "pin" works too; a typo fails here, not silently later
        if type(self.action) is not Action:  # a member already is one (Action(m) costs a lookup)
            object.__setattr__(self, "action", Action(self.action))
        if self.action is Action.RETAIN and not (0 <= self.priority <= 100 and self.ttl >= 0
                                                  and (self.half_life is None or self.half_life > 0)):
            raise ValueError(f"soft retention needs priority 0-100, ttl >= 0, half_life > 0: {self}")


FREE = Retention(Action.FREE)
OFFLOAD = Retention(Action.OFFLOAD)


@dataclass
class Pin:
    expiry: float
    program_arrival: float
    since: float
    tool: str | None


class EngineView(Protocol):
    """The few engine facts a policy may read."""

    block_size: int
    num_blocks: int

    def free_blocks(self) -> int: ...  # free or evictable-cached blocks
    def blocks_of(self, program_id: str) -> int: ...  # blocks a program holds (running or pinned)
    def avg_request_blocks(self) -> float: ...  # the paper's M, in blocks
    def prefill_reload_time(self, tokens: int) -> float: ...  # seconds to rebuild a context
    def queue_delay(self) -> float: ...  # recent mean queueing delay, s


class OffloadView(Protocol):
    """Engine facts a policy MAY read with getattr (the simulator has them; a view
    without them means: no offload tier, and the policy falls back to its defaults)."""

    def offload_enabled(self) -> bool: ...  # an offload (CPU) tier is configured
    def reload_time(self, tokens: int) -> float: ...  # seconds to reload a context from it
    def running_tokens(self) -> tuple[int, int]: ...  # (tokens per step, KV tokens) of running calls
    def linear_step(self) -> tuple[float, float]: ...  # (c0 s, c1 s/token): step ~ c0 + c1*tokens


class SlidingMean:
    """The mean of the last `size` values appended (`empty` before any), computed as
    sum / count on the first read after an append, so reads between appends are free."""

    __slots__ = ("_window", "_empty", "_mean")

    def __init__(self, size: int, empty: float) -> None:
        self._window: deque[float] = deque(maxlen=size)
        self._empty, self._mean = empty, None

    def append(self, x: float) -> None:
        self._window.append(x)
        self._mean = None

    @property
    def mean(self) -> float:
        if self._mean is None:
            w = self._window
            self._mean = sum(w) / len(w) if w else self._empty
        return self._mean

    def __len__(self) -> int:
        return len(self._window)


class Policy:
    """Defaults = vLLM: request-level FCFS, free at end of turn, preempt the newest."""

    name = "base"
    # True when order_key changes with `now` alone (e.g. anti-starvation); the engine then
    # re-sorts every step instead of fast-forwarding decode stretches behind a stuck queue.
    order_depends_on_time = False
    # True when review_pins must run before every step (it reads `now` and the batch);
    # the engine then does not fast-forward decode stretches while pins are held.
    reviews_pins = False
    # When the waiting queue's head cannot be allocated, the engine asks unpin_victims
    # for pins to drop. True: also while calls are running, if dropping the pins lets
    # the head in. False: only when nothing runs, i.e. in a true deadlock (Continuum
    # §5.2's rule exists for that case; the authors' fork checks len(running) == 0).
    unpin_while_running = True
    # True when unpin_victims, having named no pin while calls run, names none while they
    # only decode and time passes (no pin comes or goes, review_pins drops none): the
    # engine may then fast-forward decode stretches behind a head blocked on memory.
    unpin_victims_steady = False
    # True when the policy reads Request.exec_time; an engine may skip the per-step
    # accounting otherwise (the vLLM adapter does, to stay cheap per step).
    reads_exec_time = False
    # True when the policy asks for soft retention (Action.RETAIN): an engine that cannot
    # retain softly refuses it at the start (a hinted call's RETAIN is refused when it comes).
    retains = False
    # Names of the decisions the policy counts in `self.decisions` (sim run reports them).
    DECISIONS: tuple[str, ...] = ()
    # Whether a deployment could run it: True; False where it reads what only the
    # simulator knows (the trace's future: Request.true_tool_duration) whatever its
    # parameters; {parameter: value} where it can with those values. `sim tune`'s default
    # search keeps to what a deployment can run.
    deployable: bool | dict = True

    def __init__(self) -> None:
        self.pins: dict[str, Pin] = {}
        self.last_finish: dict[str, tuple[float, str | None]] = {}  # pid -> (t, tool)
        # Reported by `sim run`: pins hit / expired / dropped, TTLs chosen per tool.
        self.pin_outcomes: dict[str, int] = defaultdict(int)
        self.ttls: dict[str, list[float]] = defaultdict(list)
        self.decisions: dict[str, int] = defaultdict(int)

    # --- events -----------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> None:
        prev = self.last_finish.pop(req.program_id, None)
        if prev is not None:
            self.record_tool_time(prev[1], now - prev[0])

    def record_tool_time(self, tool: str | None, seconds: float) -> None:
        """A tool's observed wall time (arrival - previous finish). Hook for learners."""

    def on_schedule(self, req: Request, now: float) -> None:
        """The call was admitted (first time); now - req.arrival is its queueing delay."""

    def on_finish(self, req: Request, now: float, view: EngineView) -> Retention:
        if req.is_last_step:
            return FREE
        self.last_finish[req.program_id] = (now, req.tool)
        ret = self.retention(req, now, view)
        if ret.action is Action.FREE and req.hint is not None:  # the client's hint, where the policy frees
            h = req.hint
            ret = Retention(Action.RETAIN, float("inf") if h.ttl is None else h.ttl, h.priority)
        if ret.action == Action.PIN:
            self.ttls[req.tool or "<unknown>"].append(ret.ttl)
            self.pins[req.program_id] = Pin(now + ret.ttl, req.program_arrival, now, req.tool)
        elif ret.action == Action.RETAIN:
            if ret.ttl < float("inf"):
                self.ttls[req.tool or "<unknown>"].append(ret.ttl)
            self.decisions["retained"] += 1
        return ret

    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        return FREE

    def pin_released(self, program_id: str, now: float, reason: Release) -> None:
        """The engine dropped or consumed the program's pin (see Release)."""
        if self.pins.pop(program_id, None) is not None:
            self.pin_outcomes[reason] += 1

    def on_program_end(self, program_id: str, num_turns: int, now: float) -> None:
        self.last_finish.pop(program_id, None)
        self.pin_released(program_id, now, Release.LAST)  # no pin outlives its program

    # --- decisions ----------------------------------------------------------------
    def order_key(self, req: Request, now: float, view: EngineView) -> tuple:
        return (0 if req.preempted else 1, req.arrival)

    def expired_pins(self, now: float, waiting_programs: Container[str]) -> list[str]:
        """TTL passed and the program's next turn is not already waiting (the engine may
        answer membership without building the set: ask, do not iterate)."""
        return [p for p, pin in self.pins.items() if now >= pin.expiry and p not in waiting_programs]

    def unpin_victims(self, need_blocks: int, view: EngineView, exclude: str | None = None) -> list[str]:
        """Pins to drop, latest program arrival first, until `need_blocks` are freed."""
        victims, freed = [], 0
        for pid in sorted(self.pins, key=lambda p: self.pins[p].program_arrival, reverse=True):
            if freed >= need_blocks:
                break
            if pid == exclude:
                continue
            victims.append(pid)
            freed += view.blocks_of(pid)
        return victims

    def review_pins(self, now: float, view: EngineView) -> list[str]:
        """Pins to drop before this step (released with reason 'discard')."""
        return []

    def review_steady(self) -> bool:
        """After this step's review_pins: would no later review drop a pin while time only
        passes and the running calls only decode (their KV grows; none finishes, none is
        admitted, no pin comes or goes)? True lets an engine run decode stretches with
        pins held (sim/simpy_replica/engine.py _steady); False (default) is always safe."""
        return False

    def order_fixed_until(self, now: float, waiting: list[Request]) -> float:
        """With `order_depends_on_time`: a time before which no order_key of `waiting`
        changes while only time passes (the same keys at every `now` earlier than it);
        an engine may run decode stretches behind a blocked queue until then. `now`
        (default): no promise."""
        return now

    def release_action(self, program_id: str, reason: Release) -> Action:
        """With an offload tier: OFFLOAD writes a dropped pin's full chunks to it
        before its blocks are freed; FREE (default) just frees them."""
        return Action.FREE

    def make_controller(self, replicas: int, capacity_tokens: int):
        """A cluster-level proxy that routes and holds programs (ThunderAgent's); None:
        the cluster's router alone decides."""
        return None

    def preemption_victim(self, running: list[Request], view: EngineView) -> Request:
        """vLLM FCFS preempts the most recently scheduled running request."""
        return running[-1]

    def preemption_order(self, running: list[Request], view: EngineView) -> list[Request]:
        """All of `running`, first victim first: preemption_victim asked again on what is
        left each time (a policy may override it with one sort that gives the same list)."""
        rest, order = list(running), []
        while rest:
            chosen = self.preemption_victim(rest, view)
            order.append(rest.pop(next(i for i, r in enumerate(rest) if r is chosen)))  # by identity
        return order
