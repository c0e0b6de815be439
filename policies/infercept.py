"""InferCept (ICML 2024; reference/baselines.md): preserve / discard / swap a paused
call's KV by comparing memory-waste estimates, in the form of its public code (the
'V' policy of WukLab/InferCept's scheduler_v2).

- A call that pauses for a tool is *preserved* (pinned until its program's next call
  is admitted: no TTL).
- Before every step, per preserved program with C tokens on GPU (tokens x seconds):
    W_p = remaining tool time * C
    W_d = f_s*(1+n)*n/2*c_h + f_ch*n*R + a*last*(R + last)
  with c_h = max(S - batch, 1) the recompute chunk left in a saturated step of S
  tokens, n = ceil(C/c_h) - 1 extra chunks, last = C mod c_h, R = KV tokens held by the
  running calls, batch = tokens the running calls put in a step, an iteration costing
  c + a*tokens: f_s = a*S + c, f_ch = a*c_h. Programs with W_d < W_p are discarded now
  (freed; in vLLM v1 the blocks stay prefix-cached until evicted) except those with
  the largest W_d, which become *swap targets*: when the waiting queue's head needs
  memory they are swapped out (offloaded to the CPU tier) within a per-step budget.
- Remaining tool time: the public code reads the **true** tool duration from its
  trace (remaining = duration - elapsed); so does this policy (`true_tool_duration`,
  the simulator's oracle). Without it (`true_tool_time=False`, or a real engine) we use the
  tool's mean observed duration (ours; the paper's estimator is not in the code).
- Resume order: preserved programs first, then swapped ones, then returning
  (discarded or preempted) calls, then new programs; program arrival within each.
- Ablation switches (ours; defaults are the code's form above, benchmarks/infercept_ablation.py
  turns them off one at a time): `true_tool_time` (the oracle remaining time),
  `preserve` ("until-return", or "continuum-ttl": pin only for Continuum's Eq. 2 TTL),
  `discard` (the W_d < W_p re-judgement), `unpin_while_running` (swap targets dropped
  for the queue head while calls run) and `resume_order` ("infercept", or "continuum":
  preempted, pinned, program arrival). All off is exactly `continuum`.
- Ours: S, a, c and the swap budget come from the simulated engine: a, c from the
  profile's step model (the code hard-codes a = 0.0279 ms, c = 15.4 ms for a 13B model
  on its GPU: used when the view cannot tell); the swap budget is the blocks one
  saturated step (S tokens) can move over PCIe (the code fits t_swap_out = (1+a')S +
  b' - free/2 on its GPU). With LMCache write-through most of a context is already in
  CPU when it is swapped, so a swap moves little more than the last turn's output —
  the Continuum paper's reimplementation notes the same ("non-blocking" offload).
  Without an offload tier a swap target is discarded instead. When no swap target
  can free memory and nothing runs, preserved programs are dropped latest program
  arrival first (the no-deadlock rule every pinning policy here shares).
"""
from __future__ import annotations

import math
from collections import defaultdict

from policies.base import FREE, Action, EngineView, Pin, Policy, PolicyError, Release, Request, Retention
from policies.continuum import ContinuumPolicy

CODE_A_MS, CODE_C_MS = 0.0279, 15.4  # scheduler_v2.discard_waste (13B model)
PRESERVE = ("until-return", "continuum-ttl")  # values of `preserve`
RESUME_ORDERS = ("infercept", "continuum")  # values of `resume_order`


def discard_waste(C: int, c_h: int, R: int, a: float, c: float, S: int) -> float:
    """InferCept's W_d in token-seconds (a in s/token, c in s)."""
    n = max(-(-C // c_h) - 1, 0)
    f_s, f_ch = a * S + c, a * c_h
    last = C % c_h
    return f_s * (1 + n) * n / 2 * c_h + f_ch * n * R + a * last * (R + last)


class InferceptPolicy(Policy):
    name = "infercept"
    deployable = {"true_tool_time": False}  # else the true tool duration (the simulator's oracle)
    reviews_pins = True
    # while calls run it names swap targets only, and those only shrink while the running
    # calls decode (review_steady)
    unpin_victims_steady = True
    DECISIONS = ("preserve", "discard", "swap")

    def __init__(
        self,
        S: int = 384,  # code: the GPU saturation point (tokens per step)
        a_ms: float = 0.0,  # ms per token of a step; 0 = from the engine's profile
        c_ms: float = 0.0,  # ms fixed per step; 0 = from the engine's profile
        swap_budget_blocks: int = -1,  # per step; -1 = what one saturated step can move over PCIe
        true_tool_time: bool = True,  # code: remaining time from the true tool duration
        # code: a pause is preserved until its program resumes; "continuum-ttl" (ablation):
        # pinned only for Continuum's Eq. 2 TTL (freed at the finish when it is 0)
        preserve: str = "until-return",
        discard: bool = True,  # code: discard when W_d < W_p; False (ablation): never, pins end by return, expiry or deadlock
        # code: swap targets are dropped for a blocked queue head while calls run;
        # False (ablation): only when nothing runs, Continuum's no-deadlock rule
        unpin_while_running: bool = True,
        # code: preserved, swapped, returning, new; "continuum" (ablation): Continuum's
        # preempted, pinned, program arrival
        resume_order: str = "infercept",
    ) -> None:
        super().__init__()
        self.S, self.a_ms, self.c_ms = int(S), float(a_ms), float(c_ms)
        self.swap_budget_blocks = int(swap_budget_blocks)
        self.true_tool_time = bool(true_tool_time)
        if preserve not in PRESERVE or resume_order not in RESUME_ORDERS:
            raise PolicyError(f"preserve in {PRESERVE}, resume_order in {RESUME_ORDERS}")
        self.preserve, self.resume_order = preserve, resume_order
        self.discard = bool(discard)
        self.reviews_pins = self.discard  # nothing to re-judge without discards
        self.unpin_while_running = bool(unpin_while_running)
        # Continuum's TTL estimator (its tool CDFs, T, eta), sharing our pins so that its
        # T counts the calls not served from a pin
        self.ttl_model: ContinuumPolicy | None = None
        if preserve == "continuum-ttl":
            self.ttl_model = ContinuumPolicy()
            self.ttl_model.pins = self.pins
        self.tool_end: dict[str, float] = {}  # pid -> when its tool returns (estimate)
        self.blocks: dict[str, int] = {}  # pid -> GPU blocks at the last review
        self.swap_targets: list[str] = []
        self.swapped: set[str] = set()  # programs whose KV was swapped out, until re-admitted
        self.swap_left = 0
        self.offload_on = False
        self._tool_sum: dict[str | None, float] = defaultdict(float)
        self._tool_n: dict[str | None, int] = defaultdict(int)

    # --- estimators -------------------------------------------------------------------
    def record_tool_time(self, tool: str | None, seconds: float) -> None:
        self._tool_sum[tool] += seconds
        self._tool_n[tool] += 1
        if self.ttl_model is not None:
            self.ttl_model.record_tool_time(tool, seconds)

    def expected_tool_time(self, req: Request) -> float:
        if self.true_tool_time and req.true_tool_duration is not None:
            return float(req.true_tool_duration)
        n = self._tool_n.get(req.tool, 0)
        return self._tool_sum[req.tool] / n if n else 0.0

    def step_model(self, view: EngineView) -> tuple[float, float]:
        """(a s/token, c s) of an iteration's time c + a*tokens."""
        if self.a_ms > 0 or self.c_ms > 0:
            return self.a_ms / 1e3, self.c_ms / 1e3
        lin = getattr(view, "linear_step", None)
        if lin is None:
            return CODE_A_MS / 1e3, CODE_C_MS / 1e3
        c, a = lin()
        return a, c

    def budget(self, view: EngineView, a: float, c: float) -> int:
        if self.swap_budget_blocks >= 0:
            return self.swap_budget_blocks
        rt = getattr(view, "reload_time", None)
        if rt is None or not self.offload_on:
            return 0
        bs = view.block_size
        per_block = (rt(1000 * bs) - rt(0)) / 1000  # transfer time of one block, latency aside
        return int((a * self.S + c) / per_block) if per_block > 0 else 0

    # --- events -----------------------------------------------------------------------
    def on_finish(self, req: Request, now: float, view: EngineView) -> Retention:
        if req.is_last_step:
            return FREE
        pid = req.program_id
        self.last_finish[pid] = (now, req.tool)
        self.tool_end[pid] = now + self.expected_tool_time(req)
        ttl = math.inf  # preserved until resumed
        if self.ttl_model is not None:
            ttl = self.ttl_model.calc_ttl(req, view)
            if ttl <= 0.0:
                return FREE
            self.ttls[req.tool or "<unknown>"].append(ttl)
        self.pins[pid] = Pin(now + ttl, req.program_arrival, now, req.tool)
        self.decisions["preserve"] += 1
        return Retention(Action.PIN, ttl)

    def on_schedule(self, req: Request, now: float) -> None:
        self.swapped.discard(req.program_id)
        if self.ttl_model is not None:
            self.ttl_model.on_schedule(req, now)  # before the engine releases the pin: T

    def pin_released(self, program_id: str, now: float, reason: str) -> None:
        super().pin_released(program_id, now, reason)
        self.blocks.pop(program_id, None)
        if program_id in self.swap_targets:
            self.swap_targets.remove(program_id)

    def on_program_end(self, program_id: str, num_turns: int, now: float) -> None:
        super().on_program_end(program_id, num_turns, now)
        self.tool_end.pop(program_id, None)
        self.swapped.discard(program_id)
        if self.ttl_model is not None:
            self.ttl_model.memory.add(num_turns)  # eta

    # --- decisions ----------------------------------------------------------------------
    def review_pins(self, now: float, view: EngineView) -> list[str]:
        """Discard preserved programs with W_d < W_p, keep the largest-W_d ones as swap targets."""
        self.offload_on = bool(getattr(view, "offload_enabled", lambda: False)())
        a, c = self.step_model(view)
        self.swap_left = self.budget(view, a, c)
        rt = getattr(view, "running_tokens", None)
        batch, R = rt() if rt is not None else (0, 0)
        if not self.discard:
            self.swap_targets = []
            return []
        c_h = max(self.S - batch, 1)
        bs = view.block_size
        cands: dict[str, float] = {}
        for pid in self.pins:
            b = view.blocks_of(pid)
            self.blocks[pid] = b
            C = b * bs
            w_p = max(0.0, self.tool_end.get(pid, now) - now) * C
            w_d = discard_waste(C, c_h, R, a, c, self.S)
            if w_d < w_p:
                cands[pid] = w_d
        if not cands:
            self.swap_targets = []
            return []
        top = max(cands.values())
        self.swap_targets = [p for p, w in cands.items() if w >= top]
        discard = [p for p, w in cands.items() if w < top]
        self.decisions["discard"] += len(discard)
        return discard

    def review_steady(self) -> bool:
        """While time passes and the running calls only decode, W_p only falls (less tool
        time left) and W_d only grows (R, the running calls' KV, grows; the batch and C stay),
        so a pin kept as a non-candidate stays one, and a swap target (W_d == top) stops
        being a candidate or stays one. Targets holding equal blocks keep equal W_d, so none
        of them falls below the top: no later review discards anything."""
        return len({self.blocks[p] for p in self.swap_targets}) <= 1

    def _swappable(self, pid: str, left: int) -> bool:
        return not self.offload_on or self.blocks.get(pid, 0) <= left

    def unpin_victims(self, need_blocks: int, view: EngineView, exclude: str | None = None) -> list[str]:
        """Swap targets first (the last one first, as the code pops victim_group[-1]),
        within the swap budget; with nothing running, then any preserved program."""
        victims, freed, left = [], 0, self.swap_left
        for pid in reversed(self.swap_targets):
            if freed >= need_blocks:
                break
            if pid == exclude or pid not in self.pins or not self._swappable(pid, left):
                continue
            if self.offload_on:
                left -= self.blocks.get(pid, 0)
            victims.append(pid)
            freed += view.blocks_of(pid)
        rt = getattr(view, "running_tokens", None)
        if freed < need_blocks and (rt is None or rt()[1] == 0):
            for pid in super().unpin_victims(need_blocks - freed, view, exclude):
                if pid not in victims:
                    victims.append(pid)
        return victims

    def release_action(self, program_id: str, reason: Release) -> Action:
        if reason == Release.VICTIM and program_id in self.swap_targets and self.offload_on \
                and self._swappable(program_id, self.swap_left):
            self.swap_left -= self.blocks.get(program_id, 0)
            self.swapped.add(program_id)
            self.decisions["swap"] += 1
            return Action.OFFLOAD
        return Action.FREE

    def order_key(self, req: Request, now: float, view: EngineView) -> tuple:
        pid = req.program_id
        if self.resume_order == "continuum":  # ContinuumPolicy.order_key
            return (0 if req.preempted else 1, 0 if pid in self.pins else 1,
                    req.program_arrival, req.turn, req.arrival, req.req_id)
        if pid in self.pins:
            group = 0  # preserved: resumes straight into the running batch
        elif pid in self.swapped:
            group = 1  # swapped queue
        elif req.turn > 0 or req.preempted:
            group = 2  # recomputed requests resume at the front of waiting
        else:
            group = 3
        return (group, req.program_arrival, req.turn, req.arrival, req.req_id)
