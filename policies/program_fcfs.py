"""program-fcfs: program-level FCFS with end-of-turn eviction (ablation: Continuum's
order without its pins)."""
from __future__ import annotations

from policies.base import EngineView, Policy, Request


class ProgramFCFSPolicy(Policy):
    name = "program-fcfs"

    def order_key(self, req: Request, now: float, view: EngineView) -> tuple:
        # Preempted first (as vLLM), then the program's first arrival.
        return (0 if req.preempted else 1, req.program_arrival, req.turn, req.arrival, req.req_id)
