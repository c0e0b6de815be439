"""oracle: Continuum's cost model with the true next tool duration (simulator only).

Pins for the tool's duration + `epsilon` iff pinning pays off with
certainty: T·η + Prefill-Reload(r) > duration (Eq. 2 with P = 1 at τ = duration, vs
τ = 0). Same T and η estimators, waiting order, expiry and deadlock rules as
continuum; without a true duration (req.true_tool_duration None) it is continuum.
An upper bound for TTL policies, not a real policy.
"""
from __future__ import annotations

from policies.base import FREE, Action, EngineView, Request, Retention
from policies.continuum import ContinuumPolicy


class OraclePolicy(ContinuumPolicy):
    name = "oracle"
    deployable = False  # the true next tool duration

    def __init__(
        self,
        # ours: the pin must outlive the next call's arrival, which reaches the scheduler
        # only when the step in progress ends (vLLM takes requests between steps). The pin
        # is released when that call is admitted, so the slack is never held beyond that lag.
        epsilon: float = 1.0,
        K: int = 100,  # continuum's parameters, same defaults (used when no true duration)
        T_window: int = 100,
        T_init: float = 0.0,
        cold_tool_mean: float = 1.0,
        eta_min_programs: int = 2,
        max_ttl: float | None = None,
        unpin_while_running: bool = False,
    ) -> None:
        super().__init__(K, T_window, T_init, cold_tool_mean, eta_min_programs, max_ttl, unpin_while_running)
        self.epsilon = float(epsilon)

    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        d = req.true_tool_duration
        if d is None:
            return super().retention(req, now, view)
        return Retention(Action.PIN, d + self.epsilon) if self.benefit(req, view) > d else FREE
