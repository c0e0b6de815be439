"""`sim tune`'s report: tune.md, result.json, the figure of the search and the gain
over the best fixed policy on the tuning and the held-out seeds."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.study.tune import OBJECTIVES, RUNS, Question, Trial, TuneResult, check, search
from agentsim.files import atomic_write, check_output


def pareto_mask(q: Question, table: pd.DataFrame) -> pd.Series:
    """Rows of the trial table on the Pareto front (feasible complete trials)."""
    ok = (table["state"] == "complete") & table["feasible"]
    vals = table.loc[ok, list(q.objectives)].to_numpy(dtype=float)
    sign = np.array([1.0 if OBJECTIVES[m] else -1.0 for m in q.objectives])
    v = vals * sign
    on = [not any(np.all(o <= x) and np.any(o < x) for o in v) for x in v]
    mask = pd.Series(False, index=table.index)
    mask.loc[table.index[ok]] = on
    return mask


def _gain(q: Question, fixed: float, tuned: float) -> float:
    """The tuned value's gain over the fixed one, as a fraction (positive: better)."""
    if not (math.isfinite(fixed) and fixed != 0):
        return math.nan
    return (fixed - tuned) / fixed if q.low() else (tuned - fixed) / fixed


def survival(q: Question, res: TuneResult) -> dict:
    """Gains of the chosen over the best fixed policy on the tuning and the held-out seeds."""
    m = q.objectives[0]
    if res.chosen is None or res.fixed is None or "fixed" not in res.holdout or "chosen" not in res.holdout \
            or m not in res.holdout["fixed"] or m not in res.holdout["chosen"]:
        return {}
    tune_gain = _gain(q, res.fixed.values[m], res.chosen.values[m])
    held_gain = _gain(q, res.holdout["fixed"][m], res.holdout["chosen"][m])
    kept = held_gain / tune_gain if tune_gain > 0 else math.nan
    return {"metric": m, "tuning_gain": tune_gain, "holdout_gain": held_gain, "survived": kept}


def _params_text(t: Trial, searched_only: bool = False) -> str:
    p = {k.split(".", 1)[1]: v for k, v in t.searched.items()} if searched_only else t.params
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items()) or "no parameters"


def markdown(q: Question, res: TuneResult, command: str | None = None) -> str:
    t = res.trials
    n_pruned, n_failed = int((t["state"] == "pruned").sum()), int((t["state"] == "failed").sum())
    m = q.objectives[0]
    fixed_txt = ", ".join(f"{k}={v}" for k, v in q.fixed.items() if v is not None)
    lines = [f"Tune: {fixed_txt}; objective {', '.join(q.objectives)}"
             + (f", SLO {q.slo.metric}<={q.slo.limit:g} (mean over seeds)" if q.slo else "")
             + f"; tuning seeds {','.join(map(str, q.seeds))}, held-out seeds {','.join(map(str, q.holdout)) or 'none'}; "
             f"{len(t)} trials ({n_pruned} pruned, {n_failed} failed), sampler seed {q.seed}.", ""]
    if command:
        lines += ["    " + command, ""]
    lines.append("Searched: " + "; ".join(f"{p} ({', '.join(d.describe() for d in s.dims) or 'nothing to search'})"
                                         for p, s in q.spaces.items()) + ".")
    lines.append("")
    c, f = res.chosen, res.fixed
    if c is None:
        lines.append("Chosen: no trial completed" + (" within the SLO" if q.slo else "") + ".")
    else:
        vals = ", ".join(f"{k} {c.values[k]:.4g}" for k in q.objectives)
        lines.append(f"Chosen (trial {c.number}): {c.policy}, {_params_text(c)}; on the tuning seeds {vals}.")
    if f is not None:
        lines.append(f"Best fixed policy (defaults): {f.policy}, {m} {f.values[m]:.4g} on the tuning seeds.")
    for name, h in res.holdout.items():
        txt = h["error"] if "error" in h else ", ".join(f"{k} {v:.4g}" for k, v in h.items())
        lines.append(f"Held-out seeds, {'chosen' if name == 'chosen' else 'best fixed'}: {txt}.")
    s = survival(q, res)
    if s:
        kept = (f"{s['survived']:.0%} of the gain survives" if math.isfinite(s["survived"])
                else "there was no gain on the tuning seeds to keep")
        lines.append(f"Gain in {m} over the best fixed policy: {s['tuning_gain']:+.1%} on the tuning seeds, "
                     f"{s['holdout_gain']:+.1%} on the held-out seeds; {kept}.")
    lines += ["", f"Runs: {res.ran} simulated, {res.resumed} found in {RUNS}/; {res.wall_s:.1f} s."]
    return "\n".join(lines) + "\n"


def figure(q: Question, res: TuneResult):
    """The first objective by trial (complete, pruned: a lower bound, the fixed policies) with
    the best so far; with several objectives also the first two against each other and the
    Pareto front."""
    from matplotlib.figure import Figure

    t = res.trials
    multi = len(q.objectives) > 1
    fig = Figure(figsize=(11 if multi else 7, 4.5))
    ax = fig.add_subplot(1, 2 if multi else 1, 1)
    m = q.objectives[0]
    done = t["state"] == "complete"
    for mask, mark, name in ((done & ~t["baseline"], "o", "trial"), (t["state"] == "pruned", "^", "pruned (a lower bound)"),
                             (done & t["baseline"], "s", "fixed policy (defaults)")):
        d = t[mask]
        if len(d):
            ax.plot(d["trial"], d[m], mark, linestyle="none", alpha=0.6, label=name)
    ok = done & t["feasible"]
    if ok.any():
        v = t[m].where(ok).to_numpy(dtype=float)
        run = np.fmin.accumulate(np.where(np.isnan(v), np.inf, v)) if q.low() else \
            np.fmax.accumulate(np.where(np.isnan(v), -np.inf, v))
        keep = np.isfinite(run)
        ax.plot(t["trial"][keep], run[keep], "-", drawstyle="steps-post", color="k", label="best so far")
    if q.slo is not None and q.slo.metric == m:
        ax.axhline(q.slo.limit, color="r", linestyle="--", label=f"SLO {m}<={q.slo.limit:g}")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"{m} (mean over tuning seeds)")
    if done.any() and (t.loc[done, m] > 0).all():
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("search")
    if multi:
        bx = fig.add_subplot(1, 2, 2)
        m2 = q.objectives[1]
        d = t[done]
        bx.plot(d[m], d[m2], "o", linestyle="none", alpha=0.5, label="complete trials")
        front = t[pareto_mask(q, t)].sort_values(m)
        bx.plot(front[m], front[m2], "-o", color="k", label="Pareto front")
        if res.chosen is not None:
            bx.plot([res.chosen.values[m]], [res.chosen.values[m2]], "*", markersize=14, color="gold",
                    markeredgecolor="k", linestyle="none", label="chosen")
        bx.set_xlabel(m)
        bx.set_ylabel(m2)
        bx.legend(fontsize=8)
        bx.set_title("Pareto front")
    fig.tight_layout()
    return fig


def write_outputs(q: Question, res: TuneResult, out: Path, command: str | None = None) -> list[Path]:
    from sim.study import plot

    written = []
    if res.config is not None:
        written.append(atomic_write(out / "config.json", lambda p: Path(p).write_text(res.config)))
    written.append(atomic_write(out / "trials.parquet", lambda p: res.trials.to_parquet(p, index=False)))
    written.append(atomic_write(out / "tune.md", lambda p: Path(p).write_text(markdown(q, res, command))))
    text = json.dumps(_finite(result(q, res)), indent=1, sort_keys=True) + "\n"
    written.append(atomic_write(out / "result.json", lambda p: Path(p).write_text(text)))
    written.append(plot.save(figure(q, res), out / "tune.png")[0])
    return written


def _finite(v):
    """JSON has no NaN: None for a value not known."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return None if isinstance(v, float) and not math.isfinite(v) else v


def result(q: Question, res: TuneResult) -> dict:
    """What tune.md says, for scripts: the chosen and the best fixed trial, their held-out
    values, the gains and counts."""
    def trial(t: Trial | None):
        return None if t is None else {"trial": t.number, "policy": t.policy, "params": t.params,
                                       "tuning": {m: v for m, v in t.values.items() if math.isfinite(v)}}
    t = res.trials
    return {"objectives": list(q.objectives), "seeds": list(q.seeds), "holdout_seeds": list(q.holdout),
            "trials": len(t), "pruned": int((t["state"] == "pruned").sum()), "failed": int((t["state"] == "failed").sum()),
            "runs_simulated": res.ran, "runs_resumed": res.resumed, "wall_s": res.wall_s,
            "chosen": trial(res.chosen), "fixed": trial(res.fixed), "holdout": res.holdout, "gain": survival(q, res)}


def tune(q: Question, out: str | Path, workers: int = 1, dask: str | None = None, progress: bool = False,
         command: str | None = None) -> TuneResult:
    """The search (sim/study/tune.py) and its outputs in `out`: what `sim tune` runs."""
    out = check_output(out, "dir")
    check(q)
    out.mkdir(parents=True, exist_ok=True)
    res = search(q, out, workers=workers, dask=dask, progress=progress)
    write_outputs(q, res, out, command)
    return res
