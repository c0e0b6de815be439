"""Two rules around a policy's decisions, for the policy host both engines are
(sim/replica/policy_host.py): which pins to drop for a blocked head, and whether a
dropped pin is offloaded first. Stdlib only: it runs inside vLLM.
"""
from __future__ import annotations

from collections.abc import Callable, Container

from policies.base import Action, EngineView, Policy, Release


def no_deadlock_victims(policy: Policy, view: EngineView, pins: Container[str], head: str | None, short: int,
                        running: bool, releasable: Callable[[], int]) -> list[str]:
    """Continuum's no-deadlock rule: the programs whose pins to drop so that the waiting
    queue's head (program `head`, `short` blocks short) can be allocated.

    While calls run no deadlock is possible (they free memory when they finish): a policy
    with `unpin_while_running` False (Continuum's family, as the authors' fork) then keeps
    its pins; otherwise pins are dropped only if dropping every other pin would let the
    head in (`releasable()`: the blocks that would free), else they would be lost for
    nothing. With nothing running and no other pin to drop, the head's own pin goes last:
    a pinned block it cannot hit (its partly written last block, or one past what fits
    beside the rest) keeps it out, and nothing else can free memory; its blocks stay
    prefix-cached, so the head still hits them."""
    if running:
        if not policy.unpin_while_running or releasable() < short:
            return []
    victims = policy.unpin_victims(short, view, exclude=head)
    if not victims and not running and head in pins:
        victims = [head]
    return victims


def offloads_dropped_pin(policy: Policy, program_id: str, reason: Release) -> bool:
    """With an offload tier: is a pin dropped for `reason` written to it before its blocks
    are freed? The policy's `release_action` decides, except that a pin its own program's
    next call consumed (a hit) or whose program ended is never written."""
    return reason not in (Release.HIT, Release.LAST) and policy.release_action(program_id, reason) == Action.OFFLOAD
