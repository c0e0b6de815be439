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
- cache_aware:  SGLang's router (SMG, `--policy cache_aware`): per replica an
                approximate tree of the prefixes the router sent there (its own
                record, not the replica's cache). If the load is imbalanced — max -
                min active requests > 64 and max > 1.5 x min — the least loaded;
                else the replica with the longest match if it covers more than 30%
                of the prompt, else the least loaded. Every 120 s of simulated time
                each tree is cut to its most recently used 2^26 tokens (SMG evicts
                by LRU every --eviction-interval 120 s down to --max-tree-size).
                Load = waiting + running calls. Defaults as SMG's documentation,
                docs/concepts/routing/cache-aware.md at lightseekorg/smg 18a6017.
"""
from __future__ import annotations

import functools

import inspect
import math

from agentsim.errors import InputError
from sim.kv.content import held_prefix


def least_loaded(engines) -> int:
    return min(range(len(engines)), key=lambda i: (*engines[i].load(), i))


class Router:
    name = "base"
    # True when route() reads of a replica only its queue lengths and used blocks
    # (sim/replica/base.py load, waiting_calls, running_calls): replicas may then run decode
    # stretches on their own clocks, since mid-stretch those read as step-by-step
    # (sim/cluster/cluster.py). A router reading the prefix cache, or anything else, leaves it False.
    reads_load_only = False

    def route(self, call, engines) -> int:
        raise NotImplementedError

    def finished(self, call) -> None:
        """A call finished (its program may end)."""


class RoundRobin(Router):
    name = "round_robin"
    reads_load_only = True

    def __init__(self) -> None:
        self.n = 0

    def route(self, call, engines) -> int:
        i = self.n % len(engines)
        self.n += 1
        return i


class LeastLoaded(Router):
    name = "least_loaded"
    reads_load_only = True

    def route(self, call, engines) -> int:
        return least_loaded(engines)


class Session(Router):
    name = "session"
    reads_load_only = True

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


class Prefix(Router):
    name = "prefix"

    def route(self, call, engines) -> int:
        def key(i):
            total, gpu = engines[i].cached_prefix_blocks(call)
            return (-total, -gpu, *engines[i].load(), i)
        return min(range(len(engines)), key=key)


class CacheAware(Router):
    name = "cache_aware"
    reads_load_only = True

    def __init__(self, cache_threshold: float = 0.3, balance_abs: int = 64, balance_rel: float = 1.5,
                 eviction_interval: float = 120.0, max_tree_tokens: int = 2**26) -> None:
        self.cache_threshold, self.balance_abs, self.balance_rel = cache_threshold, balance_abs, balance_rel
        self.eviction_interval, self.max_tree_tokens = eviction_interval, max_tree_tokens
        # per replica: block key -> when it was last routed there (a running count of keys)
        self.trees: list[dict[int, int]] = []
        self._pruned: list[bool] = []  # the tree lost keys to _evict: no longer prefix-closed
        self._routed = 0
        self._evicted_at = 0.0

    def route(self, call, engines) -> int:
        while len(self.trees) < len(engines):
            self.trees.append({})
            self._pruned.append(False)
        now = call.req.arrival
        if now - self._evicted_at >= self.eviction_interval:
            self._evict(self.max_tree_tokens // call.block_size)
            self._evicted_at = now
        keys = call.content.prefix(call.prompt_len // call.block_size)
        loads = [e.waiting_calls() + e.running_calls() for e in engines]
        hi, lo = max(loads), min(loads)
        least = min(range(len(engines)), key=lambda i: (loads[i], i))
        i = least
        if not (hi - lo > self.balance_abs and hi > self.balance_rel * lo):
            match = [self._match(r, keys) for r in range(len(engines))]
            best = min(range(len(engines)), key=lambda i: (-match[i], loads[i], i))
            if match[best] * call.block_size > self.cache_threshold * call.prompt_len:
                i = best
        self.trees[i].update(zip(keys, range(self._routed, self._routed + len(keys))))  # the most recent
        self._routed += len(keys)
        return i

    def _match(self, replica: int, keys: list) -> int:
        """How many of the prompt's leading block keys the replica's tree holds. Keys are
        chained and a route adds a prompt's whole prefix, so until _evict cuts a tree it
        holds the prefixes of all its keys and a binary search finds the end."""
        tree = self.trees[replica]
        if self._pruned[replica]:
            n = 0
            for k in keys:
                if k not in tree:
                    break
                n += 1
            return n
        return held_prefix(keys, tree)

    def _evict(self, keep: int) -> None:
        """Keep each tree's `keep` most recently routed keys."""
        for i, t in enumerate(self.trees):
            if len(t) > keep:
                cut = sorted(t.values())[len(t) - keep]
                self.trees[i] = {k: v for k, v in t.items() if v >= cut}
                self._pruned[i] = True


_CLASSES: dict[str, type[Router]] = {c.name: c for c in (RoundRobin, LeastLoaded, Session, Prefix, CacheAware)}


def register_router(cls: type[Router]) -> type[Router]:
    """Make a Router subclass available by its `name` (`cluster.router` in a run's config);
    usable as a class decorator (docs/extending.md)."""
    if not (isinstance(cls, type) and issubclass(cls, Router)) or not isinstance(cls.name, str) or cls.name == Router.name:
        raise TypeError("register_router takes a Router subclass with its own `name`")
    _CLASSES[cls.name.replace("-", "_")] = cls
    return cls


def make_router(name: str | None, args: dict | None = None) -> Router:
    """A fresh router by name with its parameters (`cluster.router_args`)."""
    cls = _router_class(name)
    return cls(**router_args(cls.name, args))


def _router_class(name: str | None) -> type[Router]:
    name = "round_robin" if name is None else str(name).replace("-", "_")
    if name not in _CLASSES:
        load_plugins()
    if name not in _CLASSES:
        raise InputError(f"--router {name!r} is not a router; choose one of {', '.join(_CLASSES)}")
    return _CLASSES[name]


def router_names() -> list[str]:
    """Every router by name, the registered ones (register_router) included."""
    return list(_CLASSES)


def router_params(name: str | None) -> dict[str, object]:
    """A router's parameters and their defaults: what `cluster.router_args`,
    `--router-arg` and sweep axes may set. InputError for one that is not a router."""
    return {k: p.default for k, p in inspect.signature(_router_class(name).__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def router_args(name: str | None, args: dict | None) -> dict:
    """`args` checked against the router's parameters, each as the type of its default (a
    config's number or a flag's string); one InputError line for the first that is not."""
    cls = _router_class(name)
    params = router_params(name)
    out = {}
    for k, v in (args or {}).items():
        if k not in params:
            raise InputError(f"router {cls.name} has no parameter {k!r}; its parameters: {', '.join(params) or 'none'}")
        kind = type(params[k])
        try:
            out[k] = _as(kind, v)
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"router {cls.name}: {k}={v!r} is not {_KIND_WORDS.get(kind, kind.__name__)}") from None
    return out


_KIND_WORDS = {int: "a whole number", float: "a finite number", str: "a string"}


def _as(kind: type, v):
    """`v` (a config's number or a flag's string) as `kind`; an int only from a whole number."""
    if isinstance(v, bool) or (kind is not str and isinstance(v, str) and not v.strip()):
        raise ValueError(v)
    if kind is int:
        f = float(v)
        if f != int(f):
            raise ValueError(v)
        return int(f)
    x = kind(v)
    if kind is float and not math.isfinite(x):
        raise ValueError(v)
    return x


@functools.cache
def load_plugins() -> tuple[str, ...]:
    """Register the installed packages' routers (entry-point group agentsim.routers,
    agentsim/plugins.py), once per process; a name lookup calls it."""
    from agentsim.plugins import ROUTER_GROUP, load_group

    return tuple(load_group(ROUTER_GROUP, lambda cls: _CLASSES.get(cls.name.replace("-", "_")) is cls or register_router(cls),
                            Router))
