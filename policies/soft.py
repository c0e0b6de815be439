"""Soft retention policies (issue 53): what the engines' retention APIs (vLLM PR #38514,
TensorRT-LLM's TokenRangeRetentionConfig, SGLang #27970) let a policy or a client ask
for, next to the hard pins they would replace.

continuum-soft   Continuum's cost model (policies/continuum.py: tau* from Eq. 2 over the
                 tool's observed durations) chooses the duration; the priority is
                 100 * P(T <= tau*), the chance the tool returns within it (so the
                 retention most likely to be used is evicted last), at least
                 `min_priority`. The blocks stay evictable: no pin, no no-deadlock rule.
                 Its hard-pin twin is `continuum`.
client-ttl       what a client's cache_control {ttl} would send (Dynamo, the NeMo Agent
                 Toolkit, llm-d's retention plugin): a fixed TTL, one per tool, or one
                 learned online from a log-normal fit of each tool's observed inter-turn
                 gaps (the `quantile` of the fit; every tool's fit while a tool has fewer
                 than `min_samples`, `ttl` before that), retained softly at `priority`.
client-ttl-pin   the same TTL as a hard pin (its twin for comparison).
With `half_life`, the priority decays once the TTL ends (SGLang #27970's decaying form,
sim/kv/retention.py) instead of dropping to default at once.
Stdlib and numpy only: it runs inside vLLM.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from policies.base import FREE, Action, EngineView, Policy, Request, Retention
from policies.continuum import ContinuumPolicy
from policies.contextserve import NIG

TTL_MODES = ("fixed", "tool", "lognormal")


def parse_tool_ttls(text: str) -> dict[str, float]:
    """'pytest=30,sed=0.5' -> {'pytest': 30.0, 'sed': 0.5}; ValueError on a bad item."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        tool, sep, sec = item.rpartition("=")
        if not sep or not tool.strip():
            raise ValueError(f"{item!r} is not tool=seconds")
        t = float(sec)
        if not 0 <= t < math.inf:
            raise ValueError(f"{item!r}: seconds should be finite and >= 0")
        out[tool.strip()] = t
    return out


class ContinuumSoftPolicy(ContinuumPolicy):
    """Continuum's TTL as a soft retention whose priority is the chance it is used."""

    name = "continuum-soft"
    retains = True
    DECISIONS = ("retained",)

    def __init__(self, K: int = 100, T_window: int = 100, T_init: float = 0.0, cold_tool_mean: float = 1.0,
                 eta_min_programs: int = 2, max_ttl: float | None = None, min_priority: int = 1,
                 half_life: float | None = None) -> None:
        super().__init__(K=K, T_window=T_window, T_init=T_init, cold_tool_mean=cold_tool_mean,
                         eta_min_programs=eta_min_programs, max_ttl=max_ttl)
        self.min_priority = int(min_priority)
        self.half_life = None if half_life is None else float(half_life)

    def hit_chance(self, req: Request, ttl: float) -> float:
        """P(T <= ttl) from the distribution calc_ttl used (cold start: Exp(cold_tool_mean))."""
        if len(self._all) <= self.K:
            return 1.0 - math.exp(-ttl / self.cold_tool_mean)
        s = self.samples.get(req.tool) if req.tool is not None else None
        v = (s if s is not None and len(s) > self.K else self._all).values
        return float(np.searchsorted(v, ttl, side="right")) / len(v)

    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        ttl = self.calc_ttl(req, view)
        if not ttl > 0.0:
            return FREE
        prio = max(self.min_priority, min(100, round(100 * self.hit_chance(req, ttl))))
        return Retention(Action.RETAIN, ttl, prio, self.half_life)


class _LogGaps(NIG):
    """Running mean and variance of log gaps (Welford's update, as ContextServe's NIG keeps
    them), for a log-normal fit."""

    __slots__ = ()

    def quantile(self, z: float) -> float:
        sd = math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0
        return math.exp(self.mean + z * sd)


class ClientTTLPolicy(Policy):
    """A client-side TTL (fixed, per tool, or a learned log-normal quantile), soft."""

    name = "client-ttl"
    retains = True
    DECISIONS = ("retained",)
    _FLOOR = 1e-3  # s: a zero gap (a tool that returned within a step) logs as 1 ms

    def __init__(self, ttl_mode: str = "lognormal", ttl: float = 2.0, tool_ttls: str = "", quantile: float = 0.9,
                 min_samples: int = 10, priority: int = 50, half_life: float | None = None) -> None:
        super().__init__()
        if ttl_mode not in TTL_MODES:
            raise ValueError(f"ttl_mode should be one of {', '.join(TTL_MODES)}")
        self.ttl_mode, self.ttl, self.quantile = ttl_mode, float(ttl), float(quantile)
        self.tool_ttls = parse_tool_ttls(tool_ttls)
        self.min_samples, self.priority = int(min_samples), int(priority)
        self.half_life = None if half_life is None else float(half_life)
        self._z = NormalDist().inv_cdf(self.quantile)
        self.fits: dict[str | None, _LogGaps] = {}
        self._all = _LogGaps()

    def record_tool_time(self, tool: str | None, seconds: float) -> None:
        if self.ttl_mode != "lognormal":
            return
        x = math.log(max(self._FLOOR, float(seconds)))
        self._all.add(x)
        self.fits.setdefault(tool, _LogGaps()).add(x)

    def client_ttl(self, req: Request) -> float:
        """The TTL the client would send with this call."""
        if self.ttl_mode == "tool":
            return self.tool_ttls.get(req.tool, self.ttl)
        if self.ttl_mode == "lognormal":
            fit = self.fits.get(req.tool)
            if fit is None or fit.n < self.min_samples:
                fit = self._all
            if fit.n >= self.min_samples:
                return fit.quantile(self._z)
        return self.ttl

    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        ttl = self.client_ttl(req)
        if not ttl > 0.0:
            return FREE
        return Retention(Action.RETAIN, ttl, self.priority, self.half_life)


class ClientTTLPinPolicy(ClientTTLPolicy):
    """client-ttl's TTL as a hard pin (the twin a soft retention is compared with)."""

    name = "client-ttl-pin"
    retains = False
    DECISIONS = ()

    def __init__(self, ttl_mode: str = "lognormal", ttl: float = 2.0, tool_ttls: str = "", quantile: float = 0.9,
                 min_samples: int = 10) -> None:
        super().__init__(ttl_mode=ttl_mode, ttl=ttl, tool_ttls=tool_ttls, quantile=quantile, min_samples=min_samples)

    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        ttl = self.client_ttl(req)
        return Retention(Action.PIN, ttl) if ttl > 0.0 else FREE
