"""ThunderAgent (arXiv 2602.13692; reference/baselines.md): program-aware admission
in front of the engines, with its public code's defaults.

ThunderAgent is a proxy, not an engine policy: the engines run vLLM's defaults
(request FCFS, free at the end of a turn, prefix-cache LRU) and the proxy decides
which *programs* may send requests. "Pausing" a program holds back its next request;
the engine's own LRU then evicts its KV. So the policy class is vLLM's, and
`make_controller` builds the proxy (`ThunderAgentController`), which the simulator's
cluster layer (sim/cluster/cluster.py) consults on every request and every `interval`.

Controller rules (program states: REASONING = a request in flight, ACTING = its tool
runs, PAUSED = held back; c_p = the program's total tokens, i.e. its context):
- Capacity per replica C = num_gpu_blocks * block_size tokens;
  used = sum_R c + w*sum_A c - shared + reserve*n (w = 1.0, reserve = 100 tokens,
  n = active programs, a prefix shared by all programs counted once).
- New program: admitted at once if no program is paused and some replica has room
  for its prompt + reserve, on the replica with the fewest active tokens; else queued.
- Every `interval` (5 s): a replica over capacity pauses ACTING programs smallest
  first, then marks REASONING ones (smallest first) to pause when their request
  finishes; then paused programs resume from one global queue in groups
  REASONING (a request ready, step > 1) > NEW > ACTING (tool still running),
  ascending tokens within a group, while sum(c + reserve) fits the free capacity of
  all replicas; the selected are placed largest first, each on the replica with the
  most free capacity. A program paused for `force_resume_s` (1,800 s) resumes anyway.
- Ours: if nothing is active anywhere and nothing fits, the head of the queue resumes
  (a program larger than C - reserve would otherwise wait 1,800 s on an idle
  cluster). The paper's 2^-t decay of acting tokens is off by default in the code
  and not implemented.
"""
from __future__ import annotations

from dataclasses import dataclass

from policies.base import Policy

NEW, REASONING, ACTING, PAUSED = "new", "reasoning", "acting", "paused"


@dataclass
class Program:
    pid: str
    tokens: int  # c_p: the program's context so far
    shared: int  # leading tokens shared with every program
    state: str = NEW
    replica: int | None = None
    ready: bool = True  # a request is waiting to be sent (paused programs only)
    steps: int = 0  # finished calls
    paused_since: float = 0.0
    pause_after: bool = False  # marked: pause when the request in flight finishes


class ThunderAgentController:
    """The proxy's decisions; plain data in, (program, replica) out; no SimPy."""

    def __init__(self, replicas: int, capacity_tokens: int, interval: float = 5.0, acting_weight: float = 1.0,
                 reserve_tokens: int = 100, force_resume_s: float = 1800.0) -> None:
        self.replicas, self.capacity = int(replicas), int(capacity_tokens)
        self.interval, self.w = float(interval), float(acting_weight)
        self.reserve, self.force_resume_s = int(reserve_tokens), float(force_resume_s)
        self.progs: dict[str, Program] = {}
        self.stats = {"queued": 0, "paused": 0, "marked": 0, "resumed": 0, "forced": 0}

    # --- capacity -------------------------------------------------------------------------
    def active(self, r: int) -> list[Program]:
        return [p for p in self.progs.values() if p.replica == r and p.state in (REASONING, ACTING)]

    def used(self, r: int, skip_marked: bool = False) -> float:
        act = [p for p in self.active(r) if not (skip_marked and p.pause_after)]
        if not act:
            return 0.0
        tokens = sum(p.tokens if p.state == REASONING else self.w * p.tokens for p in act)
        shared = sum(p.shared for p in act) - max(p.shared for p in act)
        return tokens - shared + self.reserve * len(act)

    def active_tokens(self, r: int) -> int:
        return sum(p.tokens for p in self.active(r))

    def _queue(self) -> list[Program]:
        def group(p: Program) -> int:
            if p.ready and p.steps > 0:
                return 0  # REASONING: its next request waits
            return 1 if p.steps == 0 else 2  # NEW, then ACTING (tool still running)
        return sorted((p for p in self.progs.values() if p.state in (NEW, PAUSED)),
                      key=lambda p: (group(p), p.tokens, p.pid))

    # --- events ---------------------------------------------------------------------------
    def on_new(self, pid: str, tokens: int, shared: int, now: float) -> int | None:
        """A program's first request: the replica to send it to, or None (queued)."""
        p = self.progs[pid] = Program(pid, int(tokens), int(shared), paused_since=now)
        if all(q is p for q in self._queue()):  # nobody else queued or paused
            room = [r for r in range(self.replicas) if self.capacity - self.used(r) >= p.tokens + self.reserve]
            if room:
                r = min(room, key=lambda r: (self.active_tokens(r), r))
                p.state, p.replica = REASONING, r
                return r
        self.stats["queued"] += 1
        return None

    def on_ready(self, pid: str, tokens: int, now: float) -> int | None:
        """The program's tool returned and its next request is ready: where to send it,
        or None while the program is paused."""
        p = self.progs[pid]
        p.tokens = int(tokens)
        if p.state == ACTING:
            p.state = REASONING
            return p.replica
        p.ready = True
        return None

    def on_finish(self, pid: str, tokens: int, last: bool, now: float) -> None:
        p = self.progs[pid]
        if last:
            del self.progs[pid]
            return
        p.tokens, p.steps = int(tokens), p.steps + 1
        if p.pause_after:
            self._pause(p, now)
        else:
            p.state = ACTING

    def _pause(self, p: Program, now: float) -> None:
        p.state, p.ready, p.paused_since, p.pause_after = PAUSED, False, now, False
        self.stats["paused"] += 1

    def tick(self, now: float) -> list[tuple[str, int]]:
        """Every `interval`: pause on over-capacity replicas, then resume from the queue.
        Returns the programs whose held request may now go, with their replica."""
        C = self.capacity
        for r in range(self.replicas):
            if self.used(r) <= C:
                continue
            for p in sorted((p for p in self.active(r) if p.state == ACTING), key=lambda p: (p.tokens, p.pid)):
                self._pause(p, now)
                if self.used(r) <= C:
                    break
            for p in sorted((p for p in self.active(r) if p.state == REASONING and not p.pause_after),
                            key=lambda p: (p.tokens, p.pid)):
                if self.used(r, skip_marked=True) <= C:
                    break
                p.pause_after = True
                self.stats["marked"] += 1

        queue = self._queue()
        free = [C - self.used(r) for r in range(self.replicas)]
        budget, acc, chosen = sum(max(0.0, f) for f in free), 0.0, []
        for p in queue:
            need = p.tokens + self.reserve
            if acc + need > budget:
                break
            chosen.append(p)
            acc += need
        forced = [p for p in queue if p not in chosen and now - p.paused_since >= self.force_resume_s]
        self.stats["forced"] += len(forced)
        if queue and not chosen and not forced and not any(self.active(r) for r in range(self.replicas)):
            chosen = [queue[0]]
        out = []
        for p in sorted(chosen, key=lambda p: (-p.tokens, p.pid)) + forced:
            r = max(range(self.replicas), key=lambda r: (free[r], -r))
            free[r] -= p.tokens + self.reserve
            p.replica = r
            self.stats["resumed"] += 1
            if p.ready:
                p.state = REASONING
                out.append((p.pid, r))
            else:
                p.state = ACTING  # its tool still runs; the next request goes to r
        return out


class ThunderAgentPolicy(Policy):
    """Engine side: vLLM's defaults. The proxy is `make_controller`'s."""

    name = "thunderagent"

    def __init__(
        self,
        interval: float = 5.0,  # code: Δt between pause/resume rounds, s
        acting_weight: float = 1.0,  # code: w for ACTING programs' tokens (decay off)
        reserve_tokens: int = 100,  # code: per-program headroom in the capacity sum
        force_resume_s: float = 1800.0,  # code: forced resume after this long paused
    ) -> None:
        super().__init__()
        self.interval, self.acting_weight = float(interval), float(acting_weight)
        self.reserve_tokens, self.force_resume_s = int(reserve_tokens), float(force_resume_s)

    def make_controller(self, replicas: int, capacity_tokens: int) -> ThunderAgentController:
        return ThunderAgentController(replicas, capacity_tokens, self.interval, self.acting_weight,
                                      self.reserve_tokens, self.force_resume_s)
