"""Continuum (arXiv 2511.02230): tool-aware KV-cache pinning with a cost-model TTL.

Paper sections cited: §4.1 utility model, §4.2 TTL (Eq. 2) and cold start, §4.3
priority, §5.2 unpinning and deadlock prevention. Decisions the paper leaves open
are marked "ours".
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from policies.base import FREE, Action, EngineView, Policy, Request, Retention, SlidingMean


_RANKS = np.arange(1, 1025, dtype=float)  # 1, 2, ...: Eq. 2's ranks, grown on demand


def best_ttl(samples: np.ndarray, benefit: float) -> float:
    """Eq. 2: argmax over τ in {0} ∪ samples of P(τ)·benefit − τ, P = empirical CDF.

    `samples` is sorted ascending. At position i, P(s[i]) >= (i+1)/n with equality at
    the last copy of a value, so the argmax over positions lands on the last copy,
    i.e. on the unique-value candidate with P = fraction of samples <= τ. Ties go to
    the smaller τ (ours: less memory for the same expected net benefit); τ = 0 wins
    ties, and its value is P(0)·benefit (covered by position i when s[i] = 0).

    Only samples <= benefit are scanned: beyond it (i+1)/n·benefit <= benefit < s[i],
    so their value is negative, in floating point too, and τ = 0 beats them. The values
    scanned are computed exactly as over the whole array ((i+1)/n, times benefit,
    minus s[i]), so the choice is the same to the last bit.
    """
    global _RANKS
    n = len(samples)
    if n == 0 or not benefit > 0.0:  # every value <= 0 (NaN: none > 0): τ = 0
        return 0.0
    m = int(samples.searchsorted(benefit, side="right"))
    if m == 0:
        return 0.0
    if m > len(_RANKS):
        _RANKS = np.arange(1, 2 * m + 1, dtype=float)
    vals = _RANKS[:m] / n
    vals *= benefit
    vals -= samples[:m]
    i = int(vals.argmax())
    return float(samples[i]) if vals[i] > 0.0 else 0.0


class PySortedSamples:
    """Tool durations kept sorted as they arrive, so Eq. 2 reads them with no full sort.
    An add only queues the sample; a read merges what was queued: one sample by inserting
    it (a memmove of the tail of a buffer that doubles when full), several by appending
    them and sorting. So a read after every add costs one insertion, and samples nobody
    reads (the global CDF once every tool has K of its own) cost nothing."""

    __slots__ = ("_buf", "_sorted", "_pending")

    def __init__(self) -> None:
        self._buf, self._sorted, self._pending = np.empty(16), 0, []

    def add(self, t: float) -> None:
        if t != t:
            raise ValueError("a tool time is NaN")
        self._pending.append(t)

    def _merge(self) -> None:
        pending, n, buf = self._pending, self._sorted, self._buf
        k = len(pending)
        if n + k > len(buf):
            buf = self._buf = np.concatenate([buf[:n], np.empty(max(n, k, 16))])
        if k == 1:
            t = pending[0]
            head = buf[:n]
            i = int(head.searchsorted(t))  # the method: no dispatch through np.searchsorted
            if i < n:
                buf[i + 1 : n + 1] = head[i:]  # numpy copies overlapping slices correctly
            buf[i] = t
        else:  # a sorted multiset of floats is the same array however it is built;
            # timsort on a sorted run plus a short tail is about linear (np.insert: 5-10x slower)
            buf[n : n + k] = pending
            buf[: n + k].sort(kind="stable")
        self._sorted = n + k
        pending.clear()

    @property
    def values(self) -> np.ndarray:
        """The samples, sorted (a view: valid until the next add)."""
        if self._pending:
            self._merge()
        return self._buf[: self._sorted]

    def __len__(self) -> int:
        return self._sorted + len(self._pending)

    def __iter__(self):
        return iter(self.values)

    def best_ttl(self, benefit: float) -> float:
        """Eq. 2 over the samples."""
        return best_ttl(self.values, benefit)


try:  # the same object compiled (policies/_samples.pyx, built on install): 3-6x cheaper a call
    from policies._samples import SortedSamples
except ImportError:  # not built (a source checkout without the install step)
    SortedSamples = PySortedSamples


def default_ttl(benefit: float, mean: float = 1.0) -> float:
    """§4.2 cold start T_default: Eq. 2 with tool time ~ Exp(mean) and η = 1.

    max_τ (1 − e^{−τ/mean})·B − τ: the objective is concave (second derivative
    −B/mean²·e^{−τ/mean} < 0), its derivative B/mean·e^{−τ/mean} − 1 vanishes at
    τ = mean·ln(B/mean), which is > 0 iff B > mean; otherwise τ* = 0. With mean = 1 s:
    τ* = ln B if B > 1 else 0.
    """
    return mean * math.log(benefit / mean) if benefit > mean else 0.0


class Memoryfulness:
    """§4.1 η = −Corr(k, N − k) over the requests of finished programs.

    A program of N calls contributes pairs (k, N − k) for k = 0..N−1. Sums are kept
    as exact integers in closed form, so each update is O(1).
    Undefined cases (ours): fewer than `min_programs` finished programs, or zero
    variance (e.g. every program has N = 1) -> η = `default` (1.0, the paper's
    cold-start assumption of a fully memoryful workload).
    """

    def __init__(self, min_programs: int = 2, default: float = 1.0) -> None:
        self.min_programs, self.default = min_programs, default
        self.programs = self.n = self.sk = self.sk2 = self.sm = self.sm2 = self.skm = 0
        self._eta: float | None = None  # read on every TTL, changed only at a program's end

    def add(self, N: int) -> None:
        if N < 1:
            return
        sk, sk2 = N * (N - 1) // 2, (N - 1) * N * (2 * N - 1) // 6  # k = 0..N-1
        sm, sm2 = N * (N + 1) // 2, N * (N + 1) * (2 * N + 1) // 6  # m = N-k = 1..N
        self.programs += 1
        self.n += N
        self.sk += sk
        self.sk2 += sk2
        self.sm += sm
        self.sm2 += sm2
        self.skm += N * sk - sk2  # Σ k(N − k)
        self._eta = None

    @property
    def eta(self) -> float:
        if self._eta is None:
            self._eta = self._compute()
        return self._eta

    def _compute(self) -> float:
        if self.programs < self.min_programs:
            return self.default
        n = self.n
        cov = n * self.skm - self.sk * self.sm  # n²·Cov, exact integers
        vk, vm = n * self.sk2 - self.sk**2, n * self.sm2 - self.sm**2
        if vk <= 0 or vm <= 0:
            return self.default
        return -cov / math.sqrt(vk * vm)


class ContinuumPolicy(Policy):
    """The paper's Continuum: TTL τ* from Eq. 2, TTL-aware program-level priority."""

    name = "continuum"

    def __init__(
        self,
        K: int = 100,  # §4.2 cold-start threshold on |S| and |S[f]| (paper: K = 100)
        T_window: int = 100,  # T = sliding mean over this many evicted requests (ours; paper gives no size)
        T_init: float = 0.0,  # §4.2: "initialize T as zero"
        cold_tool_mean: float = 1.0,  # §4.2: T_default assumes tool time ~ Exp(1 s)
        eta_min_programs: int = 2,  # η needs this many finished programs, else 1.0 (ours)
        max_ttl: float | None = None,  # optional cap on τ* (ours; None = paper, no cap)
        # §5.2 no-deadlock rule: drop pins for a blocked queue head only when nothing
        # runs (False: the deadlock the rule exists for; the fork's len(running) == 0),
        # or also while calls run if that lets the head in (True). See Policy.
        unpin_while_running: bool = False,
    ) -> None:
        super().__init__()
        self.unpin_while_running = bool(unpin_while_running)
        self.K = int(K)
        self.cold_tool_mean = float(cold_tool_mean)
        self.max_ttl = None if max_ttl in (None, "", "none", "None") else float(max_ttl)
        # S[f]: sorted durations per tool; S: all durations (Alg. 1 lines 3-5), both kept
        # sorted as they arrive (issue 20: no sort per call). A None tool (no tool
        # parsed) is recorded in the global S only and its TTL uses the global CDF
        # (ours: "unknown" is a mix of tools, not one tool).
        self.samples: dict[str, SortedSamples] = {}
        self._all = SortedSamples()
        self.T_window = SlidingMean(int(T_window), empty=float(T_init))
        self.memory = Memoryfulness(int(eta_min_programs))
        self.ttl_source: dict[str, int] = defaultdict(int)  # 'default' | 'global' | 'tool'

    # --- estimators ---------------------------------------------------------------
    def record_tool_time(self, tool: str | None, seconds: float) -> None:
        t = max(0.0, float(seconds))
        self._all.add(t)
        if tool is not None:
            s = self.samples.get(tool)
            if s is None:
                s = self.samples[tool] = SortedSamples()
            s.add(t)

    @property
    def all_samples(self) -> np.ndarray:
        """S, sorted: the global CDF's samples."""
        return self._all.values

    @property
    def T(self) -> float:
        """§4.2: sliding-window mean queueing delay of requests that had been evicted."""
        return self.T_window.mean

    @property
    def eta(self) -> float:
        return self.memory.eta

    def on_schedule(self, req: Request, now: float) -> None:
        # A later turn not served from a pin was evicted: its queueing delay is what
        # pinning would have saved (called before the engine releases the pin as 'hit').
        if req.turn >= 1 and req.program_id not in self.pins:
            self.T_window.append(max(0.0, now - req.arrival))

    def on_program_end(self, program_id: str, num_turns: int, now: float) -> None:
        super().on_program_end(program_id, num_turns, now)
        self.memory.add(num_turns)

    # --- TTL (§4.2) -----------------------------------------------------------------
    def benefit(self, req: Request, view: EngineView, eta: float | None = None) -> float:
        """Eq. 2's T·η + Prefill-Reload(r), in seconds."""
        eta = self.eta if eta is None else eta
        return self.T * eta + view.prefill_reload_time(req.context_tokens)

    def calc_ttl(self, req: Request, view: EngineView) -> float:
        if len(self._all) <= self.K:  # |S| <= K: fixed T_default (η = 1)
            src, ttl = "default", default_ttl(self.benefit(req, view, eta=1.0), self.cold_tool_mean)
        else:
            s = self.samples.get(req.tool) if req.tool is not None else None
            if s is None or len(s) <= self.K:  # |S[f]| <= K: global CDF
                src, s = "global", self._all
            else:
                src = "tool"
            ttl = s.best_ttl(self.benefit(req, view))
        self.ttl_source[src] += 1
        return ttl if self.max_ttl is None else min(ttl, self.max_ttl)

    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        ttl = self.calc_ttl(req, view)
        return Retention(Action.PIN, ttl) if ttl > 0.0 else FREE  # §5.2: pin only if τ* != 0

    # --- priority (§4.3) ------------------------------------------------------------
    def order_key(self, req: Request, now: float, view: EngineView) -> tuple:
        # Preempted first; then programs still holding their pin (a pin survives
        # past its TTL only while the program's next call waits, §5.2); then
        # program-level FCFS; ties by turn, call arrival, id.
        return (
            0 if req.preempted else 1,
            0 if req.program_id in self.pins else 1,
            req.program_arrival,
            req.turn,
            req.arrival,
            req.req_id,
        )

    # expired_pins (§5.2: expired and next turn not waiting), unpin_victims (§5.2:
    # latest program arrival first until the head fits; asked only in a deadlock, see
    # unpin_while_running) and preemption_victim (the engine's own) are the base class
    # defaults. The last step is never pinned (base on_finish) and on_program_end drops
    # any leftover pin.


class StaticTTLPolicy(ContinuumPolicy):
    """The paper's ablation "Static TTL" (Fig. 16): program-level FCFS with pins whose
    TTL is the cold-start T_default (§4.2: Eq. 2 with tool time ~ Exp(1 s), η = 1) for
    every tool, i.e. Continuum that never learns a tool's CDF. T (the queueing delay of
    evicted calls) is still measured, so the one TTL follows the load."""

    name = "static-ttl"

    def __init__(self, cold_tool_mean: float = 1.0, T_window: int = 100, unpin_while_running: bool = False) -> None:
        super().__init__(T_window=T_window, cold_tool_mean=cold_tool_mean, unpin_while_running=unpin_while_running)

    def record_tool_time(self, tool: str | None, seconds: float) -> None:
        """No CDFs: the TTL never reads tool times."""

    def calc_ttl(self, req: Request, view: EngineView) -> float:
        self.ttl_source["default"] += 1
        return default_ttl(self.benefit(req, view, eta=1.0), self.cold_tool_mean)
