"""Sweeps: run a grid of simulation points, one row per point in one parquet table.

A point whose simulation cannot go on (a deadlock, the progress watchdog's frozen clock;
agentsim.errors.SimulationError) is a row with its one-line `error` and no summary, and
the sweep goes on; a rerun skips it as any finished point (the simulator is deterministic).

A point is a flat dict of axes: the leaf fields of a run's config (RUN_AXES: `trace`,
`jps`, `num_gpu_blocks`, `router`, ...; sim/run/config.py) plus the parameters of its policy
(e.g. `max_ttl` for continuum) and of its router (e.g. `cache_threshold` for cache_aware).
`point_config` makes it a SimConfig and `build_run` a simulation, as for `sim run`. Each point has a stable key (a hash of its axes, defaults
filled in), stored in the table. DIR/results.parquet is rewritten atomically after every
finished point, so an interrupted sweep keeps everything that finished and a rerun skips
those keys. Points run serially, on local processes, or on an existing Dask cluster
(`dask=ADDRESS`) — no distribution layer of our own.

Dying cleanly: local workers are spawned (not forked, so they never hold the lock) and
die with the sweep (PR_SET_PDEATHSIG, and a parent check); only as many points as there
are workers are started at a time, so a first Ctrl-C starts nothing more and keeps what
finishes, and a second stops at once. DIR/.lock names its owner, so a lock still held
after its owner died is taken over.

Faults: a point whose worker process dies (killed, out of memory) runs again: Dask
reschedules it itself (KilledWorker when it gives up); a broken local pool is replaced
and the points in flight run again, each alone, and one whose worker dies TRIES times
alone is reported lost (not stored, so a rerun retries it). A table or KV file that
cannot be written (a full disk) is one line; the file is the previous one, never half
written (agentsim.files.atomic_write).

Warm workers: a worker (a local process or a Dask worker) imports once and runs many
points, keeping what does not depend on a point's policy or seed (the trace, read and cut;
the profile) for the next; `Workers` keeps one pool across sweep() calls (the planner's
whole search), and `more` feeds a sweep as its points finish.

Bounds: with `bound` ('p95_jct<=60', sim/run/bound.py) each run stops as soon as the bound is
known to fail; its row says `stopped_early` and holds the metric's lower bound. A run not
stopped is the row it would be without a bound (plus `bound`, `stopped_early` false).

Resuming trusts the key: after changing simulator code, sweep into a new DIR.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
from concurrent.futures.process import BrokenProcessPool
import contextlib
import ctypes
import fcntl
import functools
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from policies.registry import POLICIES, policy_params
from sim.run.bound import Bound, parse_bound
from sim.run.config import Run, SimConfig, build_run as build_config_run, check_limits, execute, from_flat, leaves, parse_config
from sim.hardware.profile import DEFAULT_PROFILE, Profile, load_profile
from sim.hardware.engine_config import RENAMED_FIELDS
from sim.cluster.router import router_names, router_params
from agentsim.errors import InputError, SimulationError
from agentsim.resources import SWEEP_POINT_BYTES, check_memory
from agentsim.files import atomic_write, check_output

# name -> (type, default): the leaf fields of SimConfig (sim/run/config.py), whose help says
# what each means. None as a default means "the trace's / the profile's".
# Not block_size: it can only be the profile's, and the table keeps the summary's column of that name.
RUN_AXES: dict[str, tuple[type, object]] = {name: (kind, default) for name, (_, _, kind, default, _) in leaves().items()
                                            if name != "block_size"}
RESULTS = "results.parquet"


def axis_columns() -> list[str]:
    """Every column of the table that is an axis: run axes, then all policies' and routers'
    parameters."""
    params = {k for name in POLICIES for k in policy_params(name)} | set(router_axes())
    return list(RUN_AXES) + sorted(params - set(RUN_AXES))


def router_axes() -> list[str]:
    """The routers' parameters, as axes."""
    return sorted({k for name in router_names() for k in router_params(name)})


def _params(policy: str, router: str | None) -> dict[str, object]:
    """The parameters (and defaults) a point of this policy and router takes beside the run
    axes; a name both have would be ambiguous as an axis."""
    pol, rout = policy_params(policy), router_params(router)  # PolicyError / InputError for an unknown name
    both = sorted(set(pol) & set(rout))
    if both:
        raise InputError(f"policy {policy} and router {router} both have a parameter {both[0]!r}; "
                         f"an axis cannot tell them apart: sweep them in separate grids")
    return {**pol, **rout}


def parse_value(text: str):
    """A CLI axis value: none/null, true/false, an int, a float, else the string."""
    low = text.strip().lower()
    if low in ("none", "null", ""):
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def _coerce(name: str, value, kind: type | None, default):
    if kind is str and value == "" == default:  # an empty text parameter (client-ttl's tool_ttls) is not none
        return value
    if isinstance(value, str) and value.strip().lower() in ("none", "null", ""):
        value = None
    if value is None:
        if default is not None:
            raise InputError(f"axis {name!r} cannot be none; give a value or leave the axis out (default {default!r})")
        return None
    if isinstance(value, np.generic):
        value = value.item()
    try:
        if kind is bool:
            if isinstance(value, str):
                value = parse_value(value)
            if value not in (True, False, 0, 1):
                raise ValueError
            return bool(value)
        if kind is int:
            v = parse_value(value) if isinstance(value, str) else value
            if isinstance(v, bool) or float(v) != int(v):
                raise ValueError
            return int(v)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind is str:
            return str(value)
    except (TypeError, ValueError):
        article = "an" if kind.__name__[0] in "aeiou" else "a"
        raise InputError(f"axis {name!r} value {value!r} is not {article} {kind.__name__}; give e.g. {name}={default if default is not None else 1}") from None
    return parse_value(value) if isinstance(value, str) else value  # a parameter whose default is None


def canonical(point: dict) -> dict:
    """The point with every run axis and every parameter of its policy filled in and typed."""
    policy = _coerce("policy", point.get("policy", "vllm"), str, "vllm")
    router = _coerce("router", point.get("router"), str, None)
    params = _params(policy, router)
    unknown = [k for k in point if k not in RUN_AXES and k not in params]
    if unknown:
        raise InputError(f"unknown axis {unknown[0]!r} for policy {policy!r} and router {router or 'round_robin'!r}; "
                         f"known axes: {', '.join(RUN_AXES)}; their parameters: {', '.join(params) or 'none'}")
    out = {name: _coerce(name, point.get(name, default), kind, default) for name, (kind, default) in RUN_AXES.items()}
    out.update({name: _coerce(name, point.get(name, d), None if d is None else type(d), d) for name, d in params.items()})
    return out


def point_key(point: dict) -> str:
    """Stable across runs and machines; 2 and 2.0 are the same value. Axes at their default
    are left out, so adding an axis later keeps the keys of existing tables."""
    c = canonical(point)
    defaults = {**{k: d for k, (_, d) in RUN_AXES.items()}, **_params(c["policy"], c["router"])}
    norm = {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for k, v in c.items() if v != defaults[k] or k == "policy"}
    return hashlib.sha256(json.dumps(norm, sort_keys=True).encode()).hexdigest()[:16]


def check_grid_memory(specs: list[dict], times: int = 1) -> None:
    """A grid's points (the product of its axes' lengths, `times` over) are made and kept
    in memory: refused before they are when they cannot fit (agentsim/resources.py)."""
    n = times * sum(math.prod(len(v) if isinstance(v, (list, tuple)) else 1 for v in s.values())
                    for s in specs if isinstance(s, dict))
    check_memory(n * SWEEP_POINT_BYTES, f"{n:,} sweep points", "give fewer axis values or --reps")


def expand_grid(spec: dict | list[dict]) -> list[dict]:
    """Cross product of each dict's axes (a list or one value each); a list of dicts is a union.

    A policy parameter applies to the grid's policies that have it and is dropped for the
    others (vllm runs once however many TTL caps the grid lists); a router parameter
    likewise. Duplicates are dropped.
    """
    specs = spec if isinstance(spec, list) else [spec]
    check_grid_memory(specs)
    points, seen = [], set()
    for s in specs:
        if not isinstance(s, dict):
            raise InputError(f"a grid is an object of axis -> values (or a list of them), not {type(s).__name__}")
        axes = {k: v if isinstance(v, (list, tuple)) else [v] for k, v in s.items()}
        for k, v in axes.items():
            if not v:
                raise InputError(f"axis {k!r} has no values; give at least one")
        pols = [_coerce("policy", p, str, "vllm") for p in axes.get("policy", ["vllm"])]
        routs = [_coerce("router", r, str, None) for r in axes.get("router", [None])]
        params = {k for p in pols for k in policy_params(p)} | {k for r in routs for k in router_params(r)}
        for k in axes:
            if k in RENAMED_FIELDS:
                raise InputError(f"axis {k!r} is now {RENAMED_FIELDS[k]!r}; rename it")
            if k not in RUN_AXES and k not in params:
                raise InputError(f"unknown axis {k!r}; known axes: {', '.join(RUN_AXES)}; parameters of "
                                 f"{', '.join(pols + [r for r in routs if r])}: {', '.join(sorted(params)) or 'none'}")
        for combo in itertools.product(*axes.values()):
            p = dict(zip(axes, combo))
            own = _params(_coerce("policy", p.get("policy", "vllm"), str, "vllm"), _coerce("router", p.get("router"), str, None))
            c = canonical({k: v for k, v in p.items() if k in RUN_AXES or k in own})
            key = point_key(c)
            if key not in seen:
                seen.add(key)
                points.append(c)
    return points


def point_config(point: dict) -> SimConfig:
    """The SimConfig of a point (axes are leaf field names; the rest its policy's parameters)."""
    p = canonical(point)
    for name, low in (("seed", 0), ("rep", 0), ("replicas", 1)):
        if p[name] < low:
            raise InputError(f"axis {name!r} must be >= {low} (got {p[name]})")
    # a point holds every axis: one away from its default is the one given (agentsim/requires.py)
    data = from_flat({k: p[k] for k, (_, d) in RUN_AXES.items() if p[k] != d}, {k: p[k] for k in policy_params(p["policy"])},
                     router_args={k: p[k] for k in router_params(p["router"])})
    return parse_config(data, "sweep point", style="axis")


def build_run(point: dict) -> Run:
    """The one translation of a point into a simulation (a worker calls it too). What does
    not depend on the point's policy or seed is kept by the process for the next point:
    the trace (read, cut and repeated once: sim.run.config's cache) and the profile (below)."""
    config = point_config(point)
    profile = _profile(config.engine.profile or DEFAULT_PROFILE)
    check_limits(profile, config.engine)
    return build_config_run(config, profile=profile)


_PROFILES: dict[tuple, Profile] = {}


def _profile(name: str) -> Profile:
    """load_profile, kept per process while the file is unchanged (a bundled name or a path).
    Sharing is safe: a run never changes its profile (its one memo, prefill times, is a
    function of the token count)."""
    path = Path(name)
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = (name, None, None)  # a bundled name: files of the installed package
    if key not in _PROFILES:
        if len(_PROFILES) >= 16:
            _PROFILES.clear()
        _PROFILES[key] = load_profile(name)
    return _PROFILES[key]


def run_point(point: dict, save_kv: bool = False, bound: Bound | str | None = None) -> tuple[dict, pd.DataFrame | None]:
    """One table row (key, axes, summary; dicts as JSON) and, if asked, the KV usage samples.
    A simulation that cannot go on (SimulationError: a deadlock, the progress watchdog)
    gives a failed row instead: key, axes, `error` (the one-line state), no summary.

    `bound` ('p95_jct<=60', sim/run/bound.py): the run stops once the bound is known to fail;
    its row then has `stopped_early` true, `stop_reason`, and the metric's lower bound in
    the metric's column (no other metrics). A run not stopped is the same row as without
    a bound, plus `bound` and `stopped_early` false."""
    p = canonical(point)
    if isinstance(bound, str):
        bound = parse_bound(bound)
    t0 = time.perf_counter()
    try:
        res = execute(build_run(p), watch=None if bound is None else bound.watcher())
    except SimulationError as e:
        return {"key": point_key(p), **p, "error": str(e), "wall_s": time.perf_counter() - t0}, None
    summary = dict(res.summary)
    summary["n_programs"] = summary.pop("programs")  # `programs` is the axis (first N)
    if bound is not None:
        summary.setdefault("bound", str(bound))
        summary.setdefault("stopped_early", False)
    out = {k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
           for k, v in summary.items() if p.get(k) is None}  # an axis left at its default: the run's resolved value
    row = {"key": point_key(p), **p, **out, "wall_s": time.perf_counter() - t0}
    stopped = bool(summary.get("stopped_early"))
    return row, (res.kv_usage if save_kv and not stopped else None)


@dataclass(frozen=True)
class _PerPoint:
    """run_point with each point's own bound (a module-level class: it pickles to workers)."""
    bounds: dict
    save_kv: bool = False

    def __call__(self, point: dict):
        return run_point(point, save_kv=self.save_kv, bound=self.bounds.get(point_key(point)))


def stopped_early(table: pd.DataFrame) -> pd.Series:
    """Rows of runs a bound stopped early (their metric is a lower bound)."""
    if "stopped_early" not in table:
        return pd.Series(False, index=table.index)
    return table["stopped_early"].fillna(False).astype(bool)


def reusable(table: pd.DataFrame, bound: Bound | None) -> pd.Series:
    """Rows a sweep (under `bound`, or none) takes as done: every run not stopped early; a
    stopped one only for a bound on the same metric that its lower bound already fails."""
    stopped = stopped_early(table)
    if bound is None or not stopped.any() or bound.metric not in table:
        return ~stopped
    same = table["bound"].map(lambda b: isinstance(b, str) and parse_bound(b).metric == bound.metric)
    return ~stopped | (same & (table[bound.metric].astype(float) > bound.limit))


def load_results(out: str | Path) -> pd.DataFrame:
    """The sweep table of DIR (or a results.parquet path); empty if none yet."""
    path = Path(out)
    path = path / RESULTS if path.is_dir() or not path.suffix else path
    if not path.exists():
        return pd.DataFrame({"key": pd.Series([], dtype=object)})
    return pd.read_parquet(path)


def load_kv(out: str | Path, key: str) -> pd.DataFrame:
    path = Path(out) / "kv" / f"{key}.parquet"
    if not path.exists():
        raise InputError(f"no KV samples for point {key} in {out}; sweep with --save-kv")
    return pd.read_parquet(path)


def _identity(pid: int) -> str | None:
    """Who `pid` is: its start time (so a reused pid is not taken for the owner), '-'
    where there is no /proc; None when no such process lives (a zombie is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "-"
    fields = stat.rsplit(")", 1)[1].split()  # fields[0] is the state (field 3), fields[19] the start time (22)
    return None if fields[0] in ("Z", "X") else fields[19]


def _dead_owner(text: str) -> int | None:
    """The pid a lock file names, if that process is gone; None if alive or unnamed."""
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit():
        return None  # no owner written (another tool, or an older version): assume alive
    pid, ident = int(parts[0]), _identity(int(parts[0]))
    return pid if ident is None or (ident != "-" and parts[1] != "-" and ident != parts[1]) else None


def _take_lock(out: Path):
    path = out / ".lock"
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        owner = fh.read()
        fh.close()
        dead = _dead_owner(owner)
        if dead is None:
            who = f" (pid {owner.split()[0]})" if owner.split() else ""
            raise InputError(f"another sweep{who} is writing {out}; wait for it or give another --out") from None
        # Its owner died and left the lock held (by processes it started): a new file takes its place.
        tmp = out / f".lock.{os.getpid()}"
        fh = open(tmp, "a+")
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(tmp, path)
        print(f"warning: took over {path} from sweep pid {dead}, which is no longer running", file=sys.stderr)
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()} {_identity(os.getpid())}\n")
    fh.flush()
    return fh


@contextlib.contextmanager
def _lock(out: Path):
    """One sweep per DIR: a flock on DIR/.lock, which names its owner (pid and start time)
    so that a lock left held after its owner died is taken over, not obeyed forever.
    Taking it is serialised by a flock on DIR itself (held for a moment)."""
    dfd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        fh = _take_lock(out)
    finally:
        os.close(dfd)  # releases the directory's flock
    try:
        yield
    finally:
        fh.close()


class _Interrupts:
    """Ctrl-C during a sweep: the first starts no more points (running ones finish and
    are kept); the second raises KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.count = 0
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def _handle(self, signum, frame) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        print("interrupted: no new points start; running ones finish and are kept (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _worker_init(parent: int) -> None:
    """A local worker dies with the sweep that started it, and leaves Ctrl-C to it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()  # where prctl is missing


def _stop_now(ex: cf.ProcessPoolExecutor) -> None:
    """Kill a local pool's workers: nobody will keep what they are computing."""
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            proc.kill()
    ex.shutdown(wait=False, cancel_futures=True)


# A point whose worker process died (killed, out of memory) is run again on a fresh
# worker, up to this many runs in all; then it is reported lost (not stored: a rerun of
# the sweep retries it). Dask retries on its own (its `allowed-failures`, 3 by default)
# and reports KilledWorker when it gives up.
TRIES = 3


def _worker_lost(e: BaseException) -> bool:
    """Did the point fail because its worker process died (not because of the point)?"""
    if isinstance(e, BrokenProcessPool):
        return True
    return type(e).__name__ == "KilledWorker" and type(e).__module__.startswith("distributed")


class Workers:
    """Where points run, kept across sweep() calls (the planner's rounds): in this process
    (one worker, no Dask), on local spawned processes, or on a Dask cluster. A worker
    imports once and runs many points, keeping what does not depend on a point's policy or
    seed (the trace, the profiles; build_run) for the next. Use as a context manager, or
    close(); sweep() makes its own when given none."""

    def __init__(self, workers: int = 1, dask: str | None = None):
        self.workers, self.dask = workers, dask
        self.client = None
        self.ex = None
        self.slots = max(1, workers)

    @property
    def inline(self) -> bool:
        return self.dask is None and self.workers <= 1

    def executor(self):
        """The executor, started on first use."""
        if self.ex is not None:
            return self.ex
        if self.dask is not None:
            try:
                from distributed import Client
            except ImportError:
                raise InputError("--dask needs dask.distributed; pip install 'agentsim[dask]'") from None
            try:
                self.client = Client(self.dask, timeout="20s")
            except (OSError, TimeoutError) as e:
                raise InputError(f"cannot reach the Dask scheduler at {self.dask!r} ({e}); give its address, e.g. tcp://host:8786") from None
            self.ex = self.client.get_executor(pure=False)
            self.slots = max(1, sum(self.client.nthreads().values()))
        else:
            self.ex = _local_pool(self.workers)
            self.slots = self.workers
        return self.ex

    def renew(self):
        """A broken local pool's replacement (its surviving workers are killed)."""
        self.ex = _renew(self.ex, self.workers)
        return self.ex

    def close(self, now: bool = False) -> None:
        """Shut the workers down: wait for them, or (`now`) kill local ones at once."""
        ex, client = self.ex, self.client
        self.ex = self.client = None
        if client is not None:
            client.close()  # releases (and so cancels) the cluster's tasks
        elif ex is not None:
            if now:
                _stop_now(ex)
            else:
                ex.shutdown(wait=True)

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(now=exc_type is not None)


def map_points(fn, items: list, workers: int = 1, dask: str | None = None) -> list:
    """fn over items where a sweep's points run (in this process for one worker, else on
    spawned local processes or a Dask cluster), results in the items' order: the pool the
    table scripts under benchmarks/ use. fn and the items must pickle (a module-level
    function); an item's exception is raised here."""
    with Workers(workers, dask) as pool:
        if pool.inline:
            return [fn(x) for x in items]
        ex = pool.executor()
        return [f.result() for f in [ex.submit(fn, x) for x in items]]


def _completed(todo: list[dict], fn, workers: int = 1, dask: str | None = None, pool: Workers | None = None):
    """(point, fn(point), None), or (point, None, error) for a point lost with its worker,
    in completion order: in-process, on local worker processes, or on a Dask cluster
    (`pool`'s, kept open; else workers/dask, closed at the end). At most as many points
    as there are workers are started at a time, so an interrupt (see _Interrupts) leaves
    the rest unstarted."""
    own = pool is None
    pool = Workers(workers, dask) if own else pool
    queue = todo if isinstance(todo, collections.deque) else collections.deque(todo)  # the caller may add to a deque
    with _Interrupts() as stop:
        if pool.inline:
            while queue and not stop.count:
                p = queue.popleft()
                yield p, fn(p), None
        else:
            yield from _on_pool(queue, fn, pool, stop)
            if own:
                pool.close()
        if stop.count:
            raise KeyboardInterrupt


def _submit(ex, fn, point, spawns: bool) -> cf.Future:
    """ex.submit; a local pool may start a worker here, which then inherits SIGINT
    ignored, so a Ctrl-C in the terminal (sent to the whole process group) reaches
    only the sweep, even while the worker is still importing."""
    if not spawns or threading.current_thread() is not threading.main_thread():
        return ex.submit(fn, point)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return ex.submit(fn, point)
    finally:
        signal.signal(signal.SIGINT, old)


def _on_pool(queued: collections.deque, fn, pool: Workers, stop: _Interrupts):
    """`queued`: taken from the left; a point to run again goes back there; the consumer
    of this generator may append more while it runs."""
    ex = pool.executor()
    dask = pool.client is not None
    slots = pool.slots
    deaths: dict[str, int] = {}  # point key -> local worker deaths while it ran alone
    suspects: set[str] = set()  # points in flight when a local pool broke: each runs alone next
    running: dict[cf.Future, dict] = {}
    finished = False
    try:
        while True:
            while not stop.count and len(running) < slots and queued:
                alone = point_key(queued[0]) in suspects
                if running and (alone or any(point_key(q) in suspects for q in running.values())):
                    break  # a suspect runs alone, so that a death is its own
                p = queued.popleft()
                try:
                    running[_submit(ex, fn, p, spawns=not dask)] = p
                except BrokenProcessPool:  # the pool broke since the last check
                    queued.appendleft(p)
                    ex = pool.renew()
            if not running:
                break
            done, _ = cf.wait(running, timeout=0.5, return_when=cf.FIRST_COMPLETED)
            hit: list[tuple[dict, BaseException]] = []  # points whose local worker died
            for f in done:
                p = running.pop(f)
                try:
                    result = f.result()
                except Exception as e:  # noqa: BLE001 - only a lost worker is handled, the rest re-raised
                    if not _worker_lost(e):
                        raise
                    if dask:  # Dask ran it again on its own and gave up
                        yield p, None, f"its worker died each time it ran ({type(e).__name__}: {_first_line(e)})"
                    else:
                        hit.append((p, e))
                    continue
                suspects.discard(point_key(p))
                yield p, result, None
            if hit:  # a local worker died: the pool is unusable; the points in flight run again
                hit += [(p, hit[0][1]) for p in running.values()]  # their futures fail too
                running.clear()
                ex = pool.renew()
                if len(hit) == 1:  # it ran alone: the death is its own
                    p, e = hit[0]
                    k = point_key(p)
                    deaths[k] = deaths.get(k, 0) + 1
                    if deaths[k] >= TRIES:
                        suspects.discard(k)
                        yield p, None, f"its worker died {deaths[k]} times running it alone ({type(e).__name__}: {_first_line(e)})"
                        continue
                for p, _ in hit:
                    suspects.add(point_key(p))
                    queued.appendleft(p)
        finished = True
    finally:
        if not finished:  # an error, a second Ctrl-C, or the caller stopped reading: nobody keeps these
            for f in running:
                f.cancel()
            pool.close(now=True)


def _renew(ex: cf.ProcessPoolExecutor, workers: int) -> cf.ProcessPoolExecutor:
    """A broken local pool's replacement (its surviving workers are killed)."""
    _stop_now(ex)
    return _local_pool(workers)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else "killed"


def _local_pool(workers: int) -> cf.ProcessPoolExecutor:
    # spawned, not forked: a forked worker would inherit (and so hold) the sweep's lock
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_worker_init, initargs=(os.getpid(),))


@dataclass
class SweepReport:
    points: int
    skipped: int
    ran: int
    table: pd.DataFrame
    lost: list[tuple[dict, str]] = dataclasses.field(default_factory=list)  # (point, why): not in the table

    def failed(self, points: list[dict] | None = None) -> pd.DataFrame:
        """The table's failed rows (a non-null `error`), of `points` only if given."""
        t = self.table
        if "error" not in t:
            return t.iloc[:0]
        t = t[t["error"].notna()]
        return t if points is None else t[t["key"].isin({point_key(canonical(p)) for p in points})]


def sweep(points: list[dict], out: str | Path, workers: int = 1, dask: str | None = None,
          save_kv: bool = False, progress: bool = False, bound: Bound | str | dict[str, Bound] | None = None,
          pool: Workers | None = None, more=None) -> SweepReport:
    """Run the points not yet in DIR/results.parquet; each finished point is saved at once.

    `bound` ('p95_jct<=60'): each run stops once the bound is known to fail (run_point);
    a row stopped early is taken as done only by a sweep whose bound it fails too, and is
    replaced when its point runs again. A dict {point key: Bound} gives each point its own
    (`sim tune`: each trial's next seed bounded by what its earlier seeds left); a point
    not in it has none. `pool`: workers kept across calls (Workers; else
    this call starts and closes its own from workers/dask). `more(key, table, lost)`: called
    once per point as it is settled (run now, found in the table, or lost with its worker:
    `lost` the reason), with the table so far; it returns more points to run in this sweep
    (the planner feeds its search this way, so no worker waits for a round to end)."""
    if isinstance(bound, str):
        bound = parse_bound(bound)
    out = check_output(out, "dir")
    out.mkdir(parents=True, exist_ok=True)
    with _lock(out):
        table = load_results(out)
        if isinstance(bound, dict):
            done = {k for b in set(bound.values()) for k in table["key"][reusable(table, b)] if bound.get(k) == b}
            done |= set(table["key"][reusable(table, None)]) - set(bound)
        else:
            done = set(table["key"][reusable(table, bound)])
        todo: collections.deque = collections.deque()
        seen: set[str] = set()
        ready: list[str] = []  # asked for and already in the table (or settled in this sweep): settled at once
        delivered: set[str] = set()  # keys `more` has been told of
        asked = 0

        def add(pts: list[dict]) -> None:
            nonlocal asked
            for p in pts:
                asked += 1
                c = canonical(p)
                k = point_key(c)
                if k in seen:  # queued or running: settled once, when it finishes
                    if k in delivered:
                        ready.append(k)
                    continue
                seen.add(k)
                if k in done:
                    ready.append(k)
                    continue
                build_run(c)  # bad points fail here, before anything runs
                todo.append(c)

        def settle(key: str, why: str | None = None) -> None:
            keys = [key]
            while keys:
                k = keys.pop()
                delivered.add(k)
                add(more(k, table, why))
                why = None
                keys += ready
                ready.clear()

        add(points)
        if more is not None and ready:
            first = list(ready)
            ready.clear()
            for k in first:
                settle(k)
        new: list[dict] = []
        lost: list[tuple[dict, str]] = []
        if isinstance(bound, dict):
            fn = _PerPoint(bound, save_kv)
        else:
            fn = functools.partial(run_point, save_kv=save_kv, **({} if bound is None else {"bound": bound}))
        with tqdm(total=len(todo), desc="sweep", unit="pt", disable=not progress, leave=False) as bar:
            runs = _completed(todo, fn, workers, dask) if pool is None else _completed(todo, fn, pool=pool)
            for p, res, why in runs:
                bar.update(1)
                if res is None:
                    lost.append((p, why))
                else:
                    row, kv = res
                    if kv is not None:  # before its row: a row in the table always has its samples
                        _write(out, f"kv/{row['key']}.parquet", lambda t, kv=kv: kv.to_parquet(t, index=False), len(table))
                    new.append(row)
                    table = _append(out, table, new[-1:])
                if more is not None:
                    settle(point_key(p), why)
                    bar.total = len(new) + len(lost) + len(todo)
    return SweepReport(points=asked, skipped=asked - len(new) - len(lost), ran=len(new), table=table, lost=lost)


def _write(out: Path, name: str, write, kept: int) -> None:
    """atomic_write of DIR/name, a failure (a full disk) as one line: the file is as it
    was before, never half written."""
    try:
        atomic_write(out / name, write)
    except OSError as e:
        raise InputError(f"cannot write {str(out / name)!r} ({e.strerror or e}); {out / RESULTS} keeps the "
                         f"{kept} points written before; make room and run the same sweep again to resume") from None


def _append(out: Path, table: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """The table with `rows` added; a row replaces an older one of its key (a point run
    again because a bound had stopped it early)."""
    add = pd.DataFrame(rows)
    if not table.empty:
        table = table[~table["key"].isin(add["key"])]
    new = add if table.empty else pd.concat([table, add], ignore_index=True)
    axes = [c for c in axis_columns() if c in new]
    new = new[["key", *axes, *(c for c in new if c != "key" and c not in axes)]]  # axes first, for reading
    _write(out, RESULTS, lambda t: new.to_parquet(t, index=False), len(table))
    return new
