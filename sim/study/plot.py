"""Figures from a sweep table (sim/study/sweep.py).

Functions return matplotlib Figures built without pyplot (no global state, any backend;
a notebook shows them with `display(fig)`). `save` writes the PNG and a JSON sidecar
holding the data read back from the figure's own lines and bars, so a test can check
what was drawn against the sweep table.

Series: one per policy and per setting of the other axes that vary in the table (a
policy parameter such as pin_seconds, the trace, the block count...); seeds and
repetitions are averaged.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from policies.registry import POLICIES, policy_params
from sim.study.sweep import RUN_AXES, load_kv, router_axes
from agentsim.errors import InputError
from agentsim.files import atomic_write

METRICS = {"mean_jct": "mean JCT (s)", "p50_jct": "P50 JCT (s)", "p90_jct": "P90 JCT (s)",
           "p95_jct": "P95 JCT (s)", "p99_jct": "P99 JCT (s)",
           "p99_turn_latency": "P99 turn latency (s)"}
_ORDER = {name: i for i, name in enumerate(POLICIES)}


def _null(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _fmt(v) -> str:
    if _null(v):
        return "none"
    return f"{v:g}" if isinstance(v, (float, np.floating)) else str(v)


def _distinct(values) -> int:
    return len({_fmt(v) for v in values})


def row_labels(table: pd.DataFrame, exclude=()) -> tuple[list[str], list[str]]:
    """Per row: a label (policy, the parameters of its policy that vary among its rows or
    are off their default, then the other axes that vary, in brackets) and the bracketed
    context alone (to pair policies run under equal settings)."""
    skip = {"policy", *exclude}
    run = [c for c in (*RUN_AXES, *router_axes()) if c in table and c not in skip and _distinct(table[c]) > 1]
    par = {pol: [c for c, d in policy_params(pol).items()
                 if c in table and c not in skip and ({_fmt(v) for v in g[c]} != {_fmt(d)})]
           for pol, g in table.groupby("policy")}
    labels, contexts = [], []
    for r in table.to_dict("records"):
        p = ", ".join(f"{c}={_fmt(r[c])}" for c in par[r["policy"]])
        ctx = ", ".join(f"{c}={_fmt(r[c])}" for c in run)
        labels.append(" ".join(filter(None, [r["policy"], p])) + (f" ({ctx})" if ctx else ""))
        contexts.append(ctx)
    return labels, contexts


def _values(values) -> str:
    """Distinct values, ascending: up to three listed, more as a range."""
    vals = sorted({v for v in values if not _null(v)}, key=lambda v: (isinstance(v, str), v))
    if not vals:
        return "?"
    if len(vals) > 3 and all(isinstance(v, (int, float, np.integer, np.floating)) for v in vals):
        return f"{_fmt(vals[0])}-{_fmt(vals[-1])}"
    return "/".join(_fmt(v) for v in vals)


def _trace_name(v) -> str:
    return Path(str(v)).stem if ("/" in str(v) or str(v).endswith(".parquet")) else str(v)


def runs_subtitle(table: pd.DataFrame) -> str:
    """What runs a figure shows, from the sweep table (the runs' own summaries): the trace,
    how many programs each ran and the KV pool size (blocks per replica), e.g.
    `trace swebench, 20 programs, KV pool 6000 blocks`; profile and replicas when set."""
    parts = []
    if "trace" in table:
        parts.append(f"trace {_values(_trace_name(v) for v in table['trace'] if not _null(v))}")
    if "n_programs" in table:
        parts.append(f"{_values(table['n_programs'].astype(int))} programs")
    if "num_gpu_blocks" in table:
        parts.append(f"KV pool {_values(table['num_gpu_blocks'].astype(int))} blocks")
    if "replicas" in table and (table["replicas"].fillna(1) > 1).any():
        parts.append(f"{_values(table['replicas'].fillna(1).astype(int))} replicas")
    if "profile" in table and table["profile"].notna().any():
        parts.append(f"profile {_values(_trace_name(v) if not _null(v) else 'default' for v in table['profile'])}")
    return ", ".join(parts)


def _subtitle(fig: Figure, table: pd.DataFrame) -> Figure:
    fig.suptitle(runs_subtitle(table), fontsize=9)
    return fig


@dataclass
class Line:
    label: str
    policy: str
    context: str
    x: np.ndarray
    y: np.ndarray


def series(table: pd.DataFrame, x: str, y: str, exclude=()) -> list[Line]:
    """y against x per series, averaged over seeds and repetitions, x ascending."""
    for col in (x, y):
        if col not in table:
            raise InputError(f"the sweep table has no column {col!r}; columns: {', '.join(table.columns)}")
    labels, contexts = row_labels(table, exclude=(x, "seed", "rep", *exclude))
    t = table.assign(_label=labels, _ctx=contexts)
    out = []
    for (label, pol, ctx), g in t.groupby(["_label", "policy", "_ctx"], sort=False):
        m = g.groupby(x)[y].mean().sort_index()
        out.append(Line(label, pol, ctx, m.index.to_numpy(float), m.to_numpy(float)))
    return sorted(out, key=lambda s: (_ORDER.get(s.policy, len(_ORDER)), s.label))


def _need_rows(table: pd.DataFrame, what: str) -> None:
    if table.empty:
        raise InputError(f"no sweep rows to plot {what}; run `sim sweep` first or loosen --where")


def jct_vs_load(table: pd.DataFrame, metrics=("mean_jct",)) -> Figure:
    """The paper's Fig. 8 form (mean JCT against JPS per policy); P90/P95 with metrics=."""
    _need_rows(table, "JCT against load")
    fig = Figure(figsize=(5.5 * len(metrics), 4), layout="constrained")
    for ax, m in zip(np.atleast_1d(fig.subplots(1, len(metrics))), metrics):
        for s in series(table, "jps", m):
            ax.plot(s.x, s.y, marker="o", label=s.label)
        name = METRICS.get(m, m)
        ax.set(xlabel="load (programs/s)", ylabel=name, title=f"{name.split(' (')[0]} against load")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _subtitle(fig, table)


def improvement_vs_turns(table: pd.DataFrame, policy: str = "continuum", base: str = "vllm", metric: str = "mean_jct") -> Figure:
    """The paper's Fig. 14 form: sweep turn_repeat (turns xN, tokens /N); left the metric per
    policy against turns per program, right the policy's improvement over the base, in %."""
    t = table[table["policy"].isin([policy, base])]
    for name in (policy, base):
        if not (t["policy"] == name).any():
            raise InputError(f"the sweep table has no {name!r} rows; sweep policy={policy},{base} over turn_repeat")
    t = t.assign(turns_per_program=t["calls"] / t["n_programs"])
    lines = series(t, "turns_per_program", metric, exclude=("turn_repeat",))
    fig = Figure(figsize=(11, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    for s in lines:
        left.plot(s.x, s.y, marker="o", label=s.label)
    bases = {s.context: s for s in lines if s.policy == base}
    for s in lines:
        b = bases.get(s.context)
        if s.policy != policy or b is None:
            continue
        both = pd.concat([pd.Series(s.y, s.x), pd.Series(b.y, b.x)], axis=1, join="inner")
        right.plot(both.index, 100 * (1 - both[0] / both[1]), marker="o", label=s.label)
    right.axhline(0, color="grey", lw=0.8)
    name = METRICS.get(metric, metric)
    left.set(xlabel="turns per program", ylabel=name, title=f"{name.split(' (')[0]} against turns")
    right.set(xlabel="turns per program", ylabel=f"{policy} improvement over {base} (%)",
              title=f"{name.split(' (')[0]} improvement against turns")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _subtitle(fig, t)


def kv_over_time(out: str | Path, table: pd.DataFrame, max_points: int = 12) -> Figure:
    """KV pool usage (solid) and pinned share (dashed) over simulated time, one line per
    point of the table (sweep with --save-kv)."""
    _need_rows(table, "KV usage")
    if len(table) > max_points:
        raise InputError(f"{len(table)} points would make {len(table)} KV lines; pick at most {max_points} with --where")
    labels, _ = row_labels(table)
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    for label, r in zip(labels, table.to_dict("records")):
        kv = load_kv(out, r["key"])
        line, = ax.plot(kv["t"], kv["used_blocks"] / r["num_gpu_blocks"], lw=1, label=label)
        if kv["pinned_blocks"].any():
            ax.plot(kv["t"], kv["pinned_blocks"] / r["num_gpu_blocks"], ls="--", lw=1, color=line.get_color(), label=f"{label} pinned")
    ax.set(xlabel="simulated time (s)", ylabel="share of KV blocks", title="KV cache usage over time", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _subtitle(fig, table)


def _ttl_rows(table: pd.DataFrame, jps: float | None) -> tuple[float, pd.DataFrame]:
    """The load (default: the highest with pins) and the table's pinning rows at it."""
    t = table[table["pins"] > 0]
    if t.empty:
        raise InputError("no point of the sweep pinned anything; sweep a TTL policy (continuum, continuum-static, oracle)")
    jps = float(t["jps"].max()) if jps is None else float(jps)
    t = t[np.isclose(t["jps"].astype(float), jps)]
    if t.empty:
        raise InputError(f"no pinning point at load {jps:g}; give one of {sorted(set(table['jps']))}")
    return jps, t


def ttl_table(table: pd.DataFrame, jps: float | None = None) -> tuple[float, pd.DataFrame]:
    """Mean TTL chosen per tool (pin-weighted over seeds and repetitions) at one load (default:
    the highest with pins): rows = series label, columns = tools by pins, most first."""
    jps, t = _ttl_rows(table, jps)
    labels, _ = row_labels(t, exclude=("jps", "seed", "rep"))
    recs = [(lab, tool, v["pins"], v["pins"] * v["mean_ttl_s"])
            for lab, raw in zip(labels, t["ttl_by_tool"]) for tool, v in json.loads(raw).items()]
    df = pd.DataFrame(recs, columns=["label", "tool", "pins", "ttl_x_pins"]).groupby(["label", "tool"]).sum()
    ttl = (df["ttl_x_pins"] / df["pins"]).unstack("tool")
    tools = df["pins"].groupby("tool").sum().sort_values(ascending=False, kind="stable").index
    return jps, ttl[list(tools)]


def ttl_by_tool(table: pd.DataFrame, jps: float | None = None, top: int = 12) -> Figure:
    """Grouped bars: the mean TTL each series chose per tool at one load."""
    jps, ttl = ttl_table(table, jps)
    ttl = ttl.iloc[:, :top]
    fig = Figure(figsize=(max(6, 0.7 * ttl.shape[1] * max(1, len(ttl)) ** 0.5 + 2), 4), layout="constrained")
    ax = fig.subplots()
    w = 0.8 / len(ttl)
    for j, (label, row) in enumerate(ttl.iterrows()):
        ax.bar(np.arange(ttl.shape[1]) + (j - (len(ttl) - 1) / 2) * w, row.to_numpy(float), w, label=label)
    ax.set_xticks(np.arange(ttl.shape[1]), list(ttl.columns), rotation=45, ha="right")
    ax.set(xlabel="tool", ylabel="mean TTL chosen (s)", title=f"TTL chosen per tool at load {jps:g} programs/s")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _subtitle(fig, _ttl_rows(table, jps)[1])


def figure_data(fig: Figure) -> list[dict]:
    """What each axes draws: its title, the figure's subtitle (which runs: `runs_subtitle`),
    labelled lines (x, y) and bar groups (category, height)."""
    out = []
    for ax in fig.axes:
        d = {"title": ax.get_title(), "subtitle": fig.get_suptitle(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
             "lines": {}, "bars": {}}
        for ln in ax.get_lines():
            if not ln.get_label().startswith("_"):
                d["lines"][ln.get_label()] = {"x": np.asarray(ln.get_xdata(), float).tolist(),
                                              "y": np.asarray(ln.get_ydata(), float).tolist()}
        ticks = np.asarray(ax.get_xticks(), float)
        names = [t.get_text() for t in ax.get_xticklabels()]
        for c in ax.containers:
            centers = [p.get_x() + p.get_width() / 2 for p in c.patches]
            d["bars"][c.get_label()] = {"x": [names[int(np.argmin(abs(ticks - x)))] for x in centers],
                                        "y": [float(p.get_height()) for p in c.patches]}
        out.append(d)
    return out


def save(fig: Figure, path: str | Path, dpi: int = 120) -> tuple[Path, Path]:
    """PNG at path and its data at path with .json, both written atomically."""
    path = Path(path)
    data = json.dumps(figure_data(fig), indent=1)
    atomic_write(path, lambda t: fig.savefig(t, format=path.suffix.lstrip(".") or "png", dpi=dpi))
    side = atomic_write(path.with_suffix(".json"), lambda t: Path(t).write_text(data + "\n"))
    return path, side
