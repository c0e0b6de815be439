"""continuum-offload (ours, not in the paper): Continuum, but a pin that expires is
*demoted* to the offload (CPU) tier instead of dropped.

Why it might help: with LMCache write-through the CPU already holds a context's
prompt chunks, but not the tokens the call just generated (decode tokens are not
saved) nor chunks the CPU LRU has since evicted. Demotion writes the pinned
context's full chunks the CPU lacks (mostly the last turn's output) before the GPU
blocks are freed, so a program whose tool outlived its TTL reloads its whole
context rather than recomputing the tail; the copy (GPU -> CPU, over PCIe) overlaps
the replica's next step. Victims of the no-deadlock rule are demoted too only with
`demote_victims` (they are dropped because the queue head needs the memory now).
Without an offload tier it is exactly `continuum`. Everything else — TTL (where
Prefill-Reload(r) becomes the reload time once a tier exists), priority, expiry,
victims — is ContinuumPolicy's.
"""
from __future__ import annotations

from policies.base import Action, Release
from policies.continuum import ContinuumPolicy


class ContinuumOffloadPolicy(ContinuumPolicy):
    name = "continuum-offload"

    def __init__(
        self,
        demote_victims: bool = False,  # ours: also demote pins dropped for the queue head
        K: int = 100,  # continuum's parameters, same defaults
        T_window: int = 100,
        T_init: float = 0.0,
        cold_tool_mean: float = 1.0,
        eta_min_programs: int = 2,
        max_ttl: float | None = None,
    ) -> None:
        super().__init__(K, T_window, T_init, cold_tool_mean, eta_min_programs, max_ttl)
        self.demote_victims = bool(demote_victims)

    def release_action(self, program_id: str, reason: Release) -> Action:
        if reason == Release.EXPIRED or (reason == Release.VICTIM and self.demote_victims):
            return Action.OFFLOAD
        return Action.FREE
