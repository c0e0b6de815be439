"""Sweeps: run a grid of simulation points, one row per point in one parquet table.

A point is a dict of axes: RUN_AXES below plus the parameters of its policy (e.g.
`max_ttl` for continuum, `pin_seconds` for continuum-static). `build_run` is the one
place a point becomes a simulation. Each point has a stable key (a hash of its axes,
defaults filled in), stored in the table. DIR/results.parquet is rewritten atomically
after every finished point, so an interrupted sweep keeps everything that finished and
a rerun skips those keys. Points run serially, on local processes, or on an existing
Dask cluster (`dask=ADDRESS`) — no distribution layer of our own.

Resuming trusts the key: after changing simulator code, sweep into a new DIR.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import fcntl
import functools
import hashlib
import inspect
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
from tqdm import tqdm

from policies.base import Policy
from policies.registry import POLICIES, make_policy, policy_params
from sim.profile import Profile, load_profile
from sim.run_cmd import check_knobs
from sim.scheduler import EngineConfig
from sim.simulate import arrivals_for, engine_config, run_simulation
from traces.errors import InputError
from traces.files import atomic_write
from traces.schema import read_trace
from traces.transform import repeat_turns

# name -> (type, default). None as a default means "the trace's / the profile's".
RUN_AXES: dict[str, tuple[type, object]] = {
    "trace": (str, "swebench"),        # bundled name or parquet path (a Dask worker must see it)
    "programs": (int, None),           # the trace's first N programs
    "turn_repeat": (int, 1),           # the paper's Fig. 14: turns xN, tokens /N (traces/transform.py)
    "policy": (str, "vllm"),
    "jps": (float, None),              # as `sim run --jps`: None = the trace's arrivals, else 0.2
    "seed": (int, 0),                  # arrival seed
    "rep": (int, 0),                   # repetition: rep r > 0 draws arrivals from SeedSequence([seed, r])
    "profile": (str, None),
    "num_blocks": (int, None),
    "max_num_batched_tokens": (int, None),
    "max_num_seqs": (int, None),
    "max_model_len": (int, None),
    "chunked_prefill": (bool, None),
    "replicas": (int, 1),              # these three pass to run_simulation where it takes them
    "router": (str, None),
    "offload": (str, None),            # tiers per replica, e.g. cpu:200GiB (sim run --offload)
}
RESULTS = "results.parquet"


def axis_columns() -> list[str]:
    """Every column of the table that is an axis: run axes, then all policies' parameters."""
    params = sorted({k for name in POLICIES for k in policy_params(name)} - set(RUN_AXES))
    return list(RUN_AXES) + params


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
    params = policy_params(policy)  # PolicyError for an unknown policy
    unknown = [k for k in point if k not in RUN_AXES and k not in params]
    if unknown:
        raise InputError(f"unknown axis {unknown[0]!r} for policy {policy!r}; known axes: {', '.join(RUN_AXES)}; "
                         f"{policy}'s parameters: {', '.join(params) or 'none'}")
    out = {name: _coerce(name, point.get(name, default), kind, default) for name, (kind, default) in RUN_AXES.items()}
    out.update({name: _coerce(name, point.get(name, d), None if d is None else type(d), d) for name, d in params.items()})
    return out


def point_key(point: dict) -> str:
    """Stable across runs and machines; 2 and 2.0 are the same value. Axes at their default
    are left out, so adding an axis later keeps the keys of existing tables."""
    c = canonical(point)
    defaults = {**{k: d for k, (_, d) in RUN_AXES.items()}, **policy_params(c["policy"])}
    norm = {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for k, v in c.items() if v != defaults[k] or k == "policy"}
    return hashlib.sha256(json.dumps(norm, sort_keys=True).encode()).hexdigest()[:16]


def expand_grid(spec: dict | list[dict]) -> list[dict]:
    """Cross product of each dict's axes (a list or one value each); a list of dicts is a union.

    A policy parameter applies to the grid's policies that have it and is dropped for the
    others (vllm runs once however many TTL caps the grid lists). Duplicates are dropped.
    """
    specs = spec if isinstance(spec, list) else [spec]
    points, seen = [], set()
    for s in specs:
        if not isinstance(s, dict):
            raise InputError(f"a grid is an object of axis -> values (or a list of them), not {type(s).__name__}")
        axes = {k: v if isinstance(v, (list, tuple)) else [v] for k, v in s.items()}
        for k, v in axes.items():
            if not v:
                raise InputError(f"axis {k!r} has no values; give at least one")
        pols = [_coerce("policy", p, str, "vllm") for p in axes.get("policy", ["vllm"])]
        params = {k for p in pols for k in policy_params(p)}
        for k in axes:
            if k not in RUN_AXES and k not in params:
                raise InputError(f"unknown axis {k!r}; known axes: {', '.join(RUN_AXES)}; "
                                 f"parameters of {', '.join(pols)}: {', '.join(sorted(params)) or 'none'}")
        for combo in itertools.product(*axes.values()):
            p = dict(zip(axes, combo))
            own = policy_params(_coerce("policy", p.get("policy", "vllm"), str, "vllm"))
            c = canonical({k: v for k, v in p.items() if k in RUN_AXES or k in own})
            key = point_key(c)
            if key not in seen:
                seen.add(key)
                points.append(c)
    return points


@dataclass
class Run:
    trace: pd.DataFrame
    policy: Policy
    profile: Profile
    cfg: EngineConfig
    arrivals: np.ndarray
    options: dict  # run_simulation's keyword options (replicas, router, offload) away from their defaults


class _Knobs(SimpleNamespace):
    """check_knobs reads `sim run`'s flags; a flag a point does not set is None."""

    def __getattr__(self, name):
        return None


@functools.lru_cache(maxsize=8)
def _trace(name: str, programs: int | None, turn_repeat: int) -> pd.DataFrame:
    trace, _ = read_trace(name)
    if programs is not None:
        trace = trace[trace["program_id"].isin(trace["program_id"].drop_duplicates().iloc[:programs])]
    return repeat_turns(trace, turn_repeat)


def build_run(point: dict) -> Run:
    """The one translation of a point into a simulation (a worker calls it too)."""
    p = canonical(point)
    for name, low in (("seed", 0), ("rep", 0), ("replicas", 1)):
        if p[name] < low:
            raise InputError(f"axis {name!r} must be >= {low} (got {p[name]})")
    options = {k: p[k] for k in ("replicas", "router", "offload") if p[k] != RUN_AXES[k][1]}
    takes = inspect.signature(run_simulation).parameters
    for k in options:
        if k not in takes:
            raise InputError(f"axis {k!r}: this simulator has no {k} option yet; leave the axis out (default {RUN_AXES[k][1]})")
    policy = make_policy(p["policy"], **{k: p[k] for k in policy_params(p["policy"])})
    profile = load_profile(p["profile"])
    check_knobs(profile, _Knobs(**{k: p[k] for k in (
        "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "programs", "replicas")}))
    trace = _trace(p["trace"], p["programs"], p["turn_repeat"])
    cfg = engine_config(profile, num_gpu_blocks=p["num_blocks"], max_num_batched_tokens=p["max_num_batched_tokens"],
                        max_num_seqs=p["max_num_seqs"], max_model_len=p["max_model_len"],
                        enable_chunked_prefill=p["chunked_prefill"])
    seed = p["seed"] if p["rep"] == 0 else int(np.random.SeedSequence([p["seed"], p["rep"]]).generate_state(1)[0])
    return Run(trace, policy, profile, cfg, arrivals_for(trace, p["jps"], seed), options)


def run_point(point: dict, save_kv: bool = False) -> tuple[dict, pd.DataFrame | None]:
    """One table row (key, axes, summary; dicts as JSON) and, if asked, the KV usage samples."""
    p = canonical(point)
    t0 = time.perf_counter()
    r = build_run(p)
    res = run_simulation(r.trace, r.policy, r.profile, r.cfg, r.arrivals, **r.options)
    summary = dict(res.summary)
    summary["n_programs"] = summary.pop("programs")  # `programs` is the axis (first N)
    out = {k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
           for k, v in summary.items() if k not in p}
    row = {"key": point_key(p), **p, **out, "wall_s": time.perf_counter() - t0}
    return row, (res.kv_usage if save_kv else None)


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


@contextlib.contextmanager
def _lock(out: Path):
    with open(out / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another sweep is writing {out}; wait for it or give another --out") from None
        yield


def _completed(todo: list[dict], fn, workers: int, dask: str | None):
    """fn(point) results in completion order: in-process, a process pool, or a Dask cluster."""
    if dask is None and workers <= 1:
        for p in todo:
            yield fn(p)
        return
    client = None
    if dask is not None:
        try:
            from distributed import Client
        except ImportError:
            raise InputError("--dask needs dask.distributed; pip install 'agentsim[dask]'") from None
        try:
            client = Client(dask, timeout="20s")
        except (OSError, TimeoutError) as e:
            raise InputError(f"cannot reach the Dask scheduler at {dask!r} ({e}); give its address, e.g. tcp://host:8786") from None
        ex = client.get_executor(pure=False)
    else:
        ex = cf.ProcessPoolExecutor(workers)
    futures: list[cf.Future] = []
    try:
        futures = [ex.submit(fn, p) for p in todo]
        for f in cf.as_completed(futures):
            yield f.result()
    finally:  # on an error or an interrupt, drop what has not started
        for f in futures:
            f.cancel()
        if client is not None:
            client.close()  # releases (and so cancels) the cluster's tasks
        else:
            ex.shutdown(wait=True)


@dataclass
class SweepReport:
    points: int
    skipped: int
    ran: int
    table: pd.DataFrame


def sweep(points: list[dict], out: str | Path, workers: int = 1, dask: str | None = None,
          save_kv: bool = False, progress: bool = False) -> SweepReport:
    """Run the points not yet in DIR/results.parquet; each finished point is saved at once."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r} is a file; give a directory for the sweep table")
    out.mkdir(parents=True, exist_ok=True)
    with _lock(out):
        table = load_results(out)
        done = set(table["key"])
        todo, seen = [], set()
        for p in points:
            c = canonical(p)
            k = point_key(c)
            if k not in done and k not in seen:
                build_run(c)  # bad points fail here, before anything runs
                seen.add(k)
                todo.append(c)
        new: list[dict] = []
        fn = functools.partial(run_point, save_kv=save_kv)
        with tqdm(total=len(todo), desc="sweep", unit="pt", disable=not progress, leave=False) as bar:
            for row, kv in _completed(todo, fn, workers, dask):
                if kv is not None:  # before its row: a row in the table always has its samples
                    atomic_write(out / "kv" / f"{row['key']}.parquet", lambda t, kv=kv: kv.to_parquet(t, index=False))
                new.append(row)
                table = _append(out, table, new[-1:])
                bar.update(1)
    return SweepReport(points=len(points), skipped=len(points) - len(todo), ran=len(new), table=table)


def _append(out: Path, table: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    add = pd.DataFrame(rows)
    table = add if table.empty else pd.concat([table, add], ignore_index=True)
    axes = [c for c in axis_columns() if c in table]
    table = table[["key", *axes, *(c for c in table if c != "key" and c not in axes)]]  # axes first, for reading
    atomic_write(out / RESULTS, lambda t: table.to_parquet(t, index=False))
    return table
