"""`sim sweep` (a grid of runs into one parquet table) and `sim plot` (figures from it)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from sim.run.bound import parse_bound
from sim.study.sweep import RESULTS, RUN_AXES, canonical, check_grid_memory, expand_grid, load_results, parse_value, point_key, stopped_early, sweep
from agentsim.bounds import COUNT_MAX, int_flag
from agentsim.errors import InputError

PLOTS = {
    "jct": "mean JCT against load per policy (the paper's Fig. 8 form)",
    "tail": "P90 and P95 JCT against load per policy",
    "turns": "JCT and improvement against turns per program (Fig. 14 form; sweep turn_repeat)",
    "kv": "KV usage over time (sweep with --save-kv; pick points with --where)",
    "ttl": "mean TTL chosen per tool at one load",
}


def register(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of simulations into one parquet table (resumable)",
                       description="Run every point of a grid (cross product of the axes) not yet in DIR/results.parquet. "
                                   f"Run axes (the fields of a run config, `sim run --help` says what each means): "
                                   f"{', '.join(RUN_AXES)}; any parameter of a grid's policy is an axis too "
                                   "(e.g. max_ttl, pin_seconds, K). Ctrl-C once: no new points start, running ones "
                                   "finish and are kept; twice: stop now.")
    p.add_argument("--out", required=True, help="directory of the sweep table (results.parquet, kv/)")
    p.add_argument("--axis", action="append", default=[], metavar="NAME=V1,V2",
                   help="an axis and its values (repeatable); none, true/false, numbers or names")
    p.add_argument("--grid", default=None, help="JSON file: {axis: [values]} or a list of such objects (a union); --axis adds to each")
    p.add_argument("--reps", type=int_flag(1, COUNT_MAX), default=None, help="repetitions per point (arrival seeds derived from --axis seed)")
    p.add_argument("--workers", type=int_flag(1, 4096), default=1, help="local processes (default 1: in this process)")
    p.add_argument("--dask", default=None, metavar="ADDRESS", help="run on an existing Dask cluster (scheduler address, e.g. tcp://host:8786)")
    p.add_argument("--save-kv", action="store_true", help="also keep each point's KV usage samples (DIR/kv/KEY.parquet) for `sim plot kv`")
    p.add_argument("--bound", default=None, metavar="METRIC<=SECONDS",
                   help="each run stops as soon as it is known to exceed this, e.g. 'p95_jct<=60'; its row then has "
                        "stopped_early, stop_reason and the metric's lower bound (runs not stopped are exact)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_sweep)

    q = sub.add_parser("plot", help="figures from a sweep table",
                       description="; ".join(f"{k}: {v}" for k, v in PLOTS.items()))
    q.add_argument("kind", choices=list(PLOTS))
    q.add_argument("results", help="sweep directory (or its results.parquet)")
    q.add_argument("-o", "--out", required=True, help="PNG path; the plotted data goes beside it as .json")
    q.add_argument("--where", action="append", default=[], metavar="COL=V", help="keep only rows with this value (repeatable)")
    q.add_argument("--metric", default=None, help="jct/turns: the column to plot (default mean_jct)")
    q.add_argument("--policy", default="continuum", help="turns: the policy compared")
    q.add_argument("--base", default="vllm", help="turns: the baseline")
    q.add_argument("--jps", type=float, default=None, help="ttl: the load (default the highest with pins)")
    q.set_defaults(func=run_plot)


def _axes(items: list[str]) -> dict[str, list]:
    out = {}
    for it in items:
        name, sep, vals = it.partition("=")
        if not sep or not name.strip():
            raise InputError(f"--axis {it!r} is not NAME=V1,V2; write e.g. --axis jps=0.1,0.2")
        out[name.strip()] = [parse_value(v) for v in vals.split(",")]
    return out


def grid_from_args(args) -> list[dict]:
    specs: list[dict] = [{}]
    if args.grid:
        try:
            raw = json.loads(Path(args.grid).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"--grid {args.grid!r}: cannot read a JSON grid ({e}); write {{\"jps\": [0.1, 0.2], ...}}") from None
        specs = raw if isinstance(raw, list) else [raw]
        if not all(isinstance(s, dict) for s in specs):
            raise InputError(f"--grid {args.grid!r}: give an object of axis -> values, or a list of them")
    cli = _axes(args.axis)
    if args.reps is not None:
        check_grid_memory([{**s, **cli} for s in specs], args.reps)  # before the list of reps is made
        cli["rep"] = list(range(args.reps))
    return expand_grid([{**s, **cli} for s in specs])


def run_sweep(args) -> int:
    bound = parse_bound(args.bound) if args.bound is not None else None
    points = grid_from_args(args)
    t0 = time.perf_counter()
    rep = sweep(points, args.out, workers=args.workers, dask=args.dask, save_kv=args.save_kv,
                progress=not args.no_progress and sys.stderr.isatty(), bound=bound)
    print(f"{rep.points} points: {rep.skipped} already in {Path(args.out) / RESULTS}, {rep.ran} run in "
          f"{time.perf_counter() - t0:.1f} s; the table has {len(rep.table)} rows")
    if bound is not None:
        t = rep.table[rep.table["key"].isin({point_key(canonical(p)) for p in points})]
        n = int(stopped_early(t).sum())
        print(f"{n} of {len(t)} points stopped early, known to exceed {bound} (column stopped_early; their {bound.metric} "
              f"is a lower bound)")
    failed = rep.failed(points)
    if len(failed):
        print(f"warning: {len(failed)} of {rep.points} points failed (column `error` of the table); the first: "
              f"{failed['error'].iloc[0]}", file=sys.stderr)
    note = sweep_pressure_note(rep.table, points)
    if note:
        print(note)
    if rep.lost:  # not in the table: the same command runs them again
        print(f"error: {len(rep.lost)} points lost with their worker processes and not stored (the first, "
              f"{point_key(canonical(rep.lost[0][0]))}: {rep.lost[0][1]}); run the same sweep again to retry them",
              file=sys.stderr)
        return 1
    return 0


def sweep_pressure_note(table, points: list[dict]) -> str | None:
    """One line when the grid's points never put the KV pool under pressure (sim/commands/run.py's
    PRESSURE_PEAK): all of them (policies cannot differ anywhere) or some (not there)."""
    from sim.commands.run import PRESSURE_PEAK, pressure_note

    if table.empty or "peak_kv_usage" not in table:
        return None
    t = table[table["key"].isin({point_key(canonical(p)) for p in points})]
    low = t[t["peak_kv_usage"] < PRESSURE_PEAK]
    if low.empty:
        return None
    blocks = sorted(set(low["num_gpu_blocks"].astype(int)))
    pool = str(blocks[0]) if len(blocks) == 1 else f"{blocks[0]}-{blocks[-1]}"
    if len(low) == len(t):
        return pressure_note(float(low["peak_kv_usage"].max()), pool, f" in every one of the {len(t)} points",
                             flag="--axis num_gpu_blocks=N")
    return (f"note: in {len(low)} of {len(t)} points the KV pool was never under pressure (peak below "
            f"{PRESSURE_PEAK:.0%} of {pool} blocks), so retention policies cannot differ at those points")


def _where(table, items: list[str]):
    for it in items:
        col, sep, text = it.partition("=")
        if not sep or col not in table:
            raise InputError(f"--where {it!r}: give COL=V with COL one of {', '.join(table.columns)}")
        v, c = parse_value(text), table[col]
        if v is None:
            mask = c.isna()
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and c.dtype.kind in "iuf":
            mask = np.isclose(c.astype(float), float(v))
        else:
            mask = c.astype(str) == str(v)
        table = table[mask]
    return table


def run_plot(args) -> int:
    from sim.study import plot  # matplotlib only when plotting

    table = _where(load_results(args.results), args.where)
    if "error" in table:  # failed points have no summary to plot
        table = table[table["error"].isna()]
    table = table[~stopped_early(table)]  # a run its bound stopped has only a lower bound of one metric
    if table.empty:
        raise InputError(f"no sweep rows in {args.results!r}{' match --where' if args.where else ''}; run `sim sweep --out {args.results}` first")
    metric = args.metric or "mean_jct"
    if args.kind == "jct":
        fig = plot.jct_vs_load(table, (metric,))
    elif args.kind == "tail":
        fig = plot.jct_vs_load(table, ("p90_jct", "p95_jct"))
    elif args.kind == "turns":
        fig = plot.improvement_vs_turns(table, args.policy, args.base, metric)
    elif args.kind == "kv":
        d = Path(args.results)
        fig = plot.kv_over_time(d if d.is_dir() else d.parent, table)
    else:
        fig = plot.ttl_by_tool(table, args.jps)
    png, side = plot.save(fig, args.out)
    print(f"wrote {png} and {side}")
    return 0
