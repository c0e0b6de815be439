"""Routers: which replica serves a call, in a cluster of simulated replicas.

Why this shape: a router sees only what a load balancer in front of vLLM servers
can see (the call, each replica's queue and cache state) and decides per call;
ties always go to the lowest replica index, so runs stay deterministic.

- round_robin:  call i goes to replica i mod N (per call, not per program).
- least_loaded: fewest calls waiting + running, then fewest used KV blocks.
- session:      sticky per program (what the Continuum paper's experiments use:
                a session-aware router); a program's first call goes least_loaded.
- prefix:       the replica holding the most cached blocks of the program: the
                longest prefix of its context in the GPU prefix cache, or in the
                offload tier if longer, not counting the prefix shared by all
                programs; ties (a new program) least_loaded.
"""
from __future__ import annotations

from traces.errors import InputError

ROUTERS = ("round_robin", "least_loaded", "session", "prefix")


def _load(engine) -> tuple[int, int]:
    s = engine.sched
    return (len(s.waiting) + len(s.running), s.pool.num_used)


def least_loaded(engines) -> int:
    return min(range(len(engines)), key=lambda i: (*_load(engines[i]), i))


class Router:
    name = "base"

    def route(self, call, engines) -> int:
        raise NotImplementedError

    def finished(self, call) -> None:
        """A call finished (its program may end)."""


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self) -> None:
        self.n = 0

    def route(self, call, engines) -> int:
        i = self.n % len(engines)
        self.n += 1
        return i


class LeastLoaded(Router):
    name = "least_loaded"

    def route(self, call, engines) -> int:
        return least_loaded(engines)


class Session(Router):
    name = "session"

    def __init__(self) -> None:
        self.home: dict[str, int] = {}

    def route(self, call, engines) -> int:
        pid = call.req.program_id
        if pid not in self.home:
            self.home[pid] = least_loaded(engines)
        return self.home[pid]

    def finished(self, call) -> None:
        if call.req.is_last_step:
            self.home.pop(call.req.program_id, None)


def cached_prefix_blocks(engine, call) -> tuple[int, int]:
    """(blocks of the program's own context the replica can serve without recompute,
    GPU part). Blocks of the prefix shared by every program do not count: every warm
    replica has them, and counting them sends every new program to one replica."""
    shared = call.shared_prefix // engine.cfg.block_size
    gpu = max(0, len(engine.sched._prefix_hit(call)) - shared)
    tier = engine.tier
    cpu = max(0, tier.prefix_blocks(call) - shared) if tier is not None else 0
    return max(gpu, cpu), gpu


class Prefix(Router):
    name = "prefix"

    def route(self, call, engines) -> int:
        def key(i):
            total, gpu = cached_prefix_blocks(engines[i], call)
            return (-total, -gpu, *_load(engines[i]), i)
        return min(range(len(engines)), key=key)


def make_router(name: str | None) -> Router:
    name = "round_robin" if name is None else str(name).replace("-", "_")
    classes = {c.name: c for c in (RoundRobin, LeastLoaded, Session, Prefix)}
    if name not in classes:
        raise InputError(f"--router {name!r} is not a router; choose one of {', '.join(ROUTERS)}")
    return classes[name]()
