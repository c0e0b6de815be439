"""rebuild-priced-ttl (ours, issue 19): pin a paused call's KV for the TTL that pays
best when a pin is charged for the memory it actually holds, in units of the prefill
it saves.

Rule. After a non-last call with a context of C tokens, with S the sorted observed
durations of its tool (every tool's while it has fewer than `min_samples`) and
B = kappa * PrefillReload(C):
    tau* = argmax over tau in S of  P(T <= tau) * B  -  E[min(T, tau)]
    pin for tau* + `slack`  if that maximum is > 0, else free
(with a CPU tier, a freed context and an expired pin are written there first:
`demote`). The waiting order, the no-deadlock victims (only when nothing runs) and the
preemption victim are the fork's (`continuum-static`): pinned programs first, then
program FCFS.

Why. Continuum's Eq. 2 (argmax P(tau) * (T*eta + PR) - tau) charges a pin its whole
TTL and prices it in queueing delay. But a pin holds memory only until the tool
returns, E[min(T, tau)], and what it saves is a rebuild of C tokens; memory and prefill
both scale with C, so they are compared at one exchange rate, `kappa` seconds of
pinned context per second of prefill (12). Charging the full tau makes Continuum pick
knife-edge TTLs (`cat` 0.07 s on SWE-bench, 20% of its pins expire); charging E[min]
pins a tool for nearly all of its mass when most calls are short (python: ~2 s, like the
fork's fixed pin) and frees it when its mass is long compared with the rebuild (pytest,
pip on 6K-token contexts). On 36K-token real sessions the rebuild is 1.5 s, so Bash
(median 1.3 s, p90 8.7 s) is pinned where the fork frees it. Only observed tool times
are read: never the trace's future (`true_tool_duration`).
"""
from __future__ import annotations

import numpy as np

from policies.base import Action, EngineView, Policy, Release, Request, Retention
from policies.continuum import SortedSamples
from policies.static import ContinuumStaticPolicy


def priced_ttl(samples: np.ndarray, benefit: float) -> float | None:
    """argmax over tau in `samples` (sorted) of P(T <= tau) * benefit - E[min(T, tau)];
    None when no tau has a positive value (free the context)."""
    n = len(samples)
    if n == 0 or not benefit > 0.0:
        return None
    i = np.arange(n)
    value = (i + 1) / n * benefit - (np.cumsum(samples) + (n - 1 - i) * samples) / n
    k = int(value.argmax())  # ties of equal durations: the last copy (largest P)
    return float(samples[k]) if value[k] > 0.0 else None


class RebuildPricedTTLPolicy(Policy):
    name = "rebuild-priced-ttl"
    unpin_while_running = False  # drop pins for the queue head only in a deadlock (the fork's rule)

    def __init__(
        self,
        kappa: float = 12.0,  # seconds of pinned context worth one second of its prefill
        min_samples: int = 10,  # below this many samples of a tool, use every tool's
        slack: float = 0.1,  # s added to the TTL (the next call reaches the scheduler between steps)
        demote: bool = True,  # with a CPU tier: write a freed or expired context there first
    ) -> None:
        super().__init__()
        self.kappa, self.min_samples = float(kappa), int(min_samples)
        self.slack, self.demote = float(slack), bool(demote)
        self.samples: dict[str | None, SortedSamples] = {}
        self._all = SortedSamples()

    def record_tool_time(self, tool: str | None, seconds: float) -> None:
        t = max(0.0, float(seconds))
        self._all.add(t)
        self.samples.setdefault(tool, SortedSamples()).add(t)

    def durations(self, tool: str | None) -> np.ndarray:
        s = self.samples.get(tool)
        return (s if s is not None and len(s) >= self.min_samples else self._all).values

    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        s = self.durations(req.tool)
        if len(s) == 0:  # nothing seen yet: hold across the step boundary only
            return Retention(Action.PIN, self.slack)
        ttl = priced_ttl(s, self.kappa * view.prefill_reload_time(req.context_tokens))
        if ttl is None:
            return Retention(Action.OFFLOAD if self.demote else Action.FREE)
        return Retention(Action.PIN, ttl + self.slack)

    # the fork's waiting order (pinned programs first, then program FCFS), no-deadlock
    # victims (latest expiry first) and preemption victim (latest program's non-last call)
    order_key = ContinuumStaticPolicy.order_key
    unpin_victims = ContinuumStaticPolicy.unpin_victims
    preemption_victim = ContinuumStaticPolicy.preemption_victim
    preemption_order = ContinuumStaticPolicy.preemption_order

    def release_action(self, program_id: str, reason: Release) -> Action:
        return Action.OFFLOAD if self.demote else Action.FREE
