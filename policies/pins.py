"""Pinned KV, as both engines keep it: which blocks each program's pin holds, and how
much memory pins take over time.

A pin keeps a finished call's blocks referenced until the program's next call (a hit)
or a release (expired, victim, discard, last). Pins share blocks (every program's copy
of the system prompt is one set of blocks), so pinned memory is the number of
*distinct* pinned blocks, and `block_seconds` is its integral over time. The policy
host both engines are (sim/replica/policy_host.py) keeps its pins in a PinTable; freeing
a released pin's blocks is each engine's block operation. Stdlib only: it runs inside vLLM.
"""
from __future__ import annotations

from typing import Callable, Iterator

from policies.base import Release


class PinTable:
    def __init__(self, now: float = 0.0, block_id: Callable[[object], int] | None = None) -> None:
        self._held: dict[str, list] = {}  # program -> its pin's blocks (engine objects)
        # block id -> pins holding it; a list, as ids are a pool's indices (a dict of
        # them was a tenth of the event loop under Continuum: every turn pins its context)
        self._refs: list[int] = []
        self._distinct = 0  # ids whose count is > 0
        self._id = block_id  # vLLM's KVCacheBlock -> its block_id (an attrgetter); the simulator's blocks are ints
        self.block_seconds = 0.0
        self._t = now

    def __contains__(self, pid: str) -> bool:
        return pid in self._held

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def get(self, pid: str) -> list | None:
        return self._held.get(pid)

    def items(self):
        return self._held.items()

    @property
    def distinct(self) -> int:
        """Blocks held by pins, each once."""
        return self._distinct

    def _advance(self, now: float) -> None:
        self.block_seconds += self._distinct * (now - self._t)
        self._t = now

    def _ids(self, blocks: list) -> list[int]:
        return blocks if self._id is None else list(map(self._id, blocks))  # map: no Python frame a block

    def add(self, pid: str, blocks: list, now: float) -> None:
        if pid in self._held:
            raise ValueError(f"program {pid!r} already holds a pin")  # an engine bug: one pin per program
        self._advance(now)
        self._held[pid] = blocks
        ids, refs, new = self._ids(blocks), self._refs, 0
        if ids and max(ids) >= len(refs):
            refs.extend([0] * (max(ids) + 1 - len(refs)))
        for k in ids:
            n = refs[k]
            if n == 0:
                new += 1
            refs[k] = n + 1
        self._distinct += new

    def pop(self, pid: str, now: float) -> list | None:
        """Remove the program's pin and return its blocks (None if it has none)."""
        blocks = self._held.pop(pid, None)
        if blocks is None:
            return None
        self._advance(now)
        refs, gone = self._refs, 0
        for k in self._ids(blocks):
            n = refs[k] - 1
            if n == 0:
                gone += 1
            refs[k] = n
        self._distinct -= gone
        return blocks

    def restart(self, now: float) -> None:
        """Start the integral again from `now` (a measured run after a warm-up)."""
        self.block_seconds, self._t = 0.0, now


def pin_counts(outcomes: dict) -> dict:
    """A policy's pin outcomes as both engines report them (`pin_outcomes`)."""
    return {"pins": sum(outcomes.values()), "pins_hit": outcomes.get(Release.HIT, 0),
            "pins_expired": outcomes.get(Release.EXPIRED, 0), "pins_victim": outcomes.get(Release.VICTIM, 0),
            "pins_discarded": outcomes.get(Release.DISCARD, 0), "pins_moved": outcomes.get(Release.MOVED, 0)}
