"""`sim tune`: the best policy and parameters for one workload, found by Optuna.

What is searched: sim/study/tune_space.py (from what each policy declares). What is
written: sim/study/tune_report.py. Here: the question, the trials and the search.

How. One trial's value is the mean over the tuning seeds of its runs' metric. The first
trials are every family at its defaults (the fixed policies the gain is measured against);
then Optuna asks (TPE; NSGA-II for several objectives) in batches of a fixed size, whose
runs go through sim.study.sweep on one pool of warm workers (local or Dask), into
DIR/runs/results.parquet (a rerun of the same command resumes from it). Batches are told
back in trial order, so the search is the same for any number of workers, given --seed.

Pruning. With a single objective that has a bound (sim/run/bound.py: mean_jct, p50-p99_jct,
max_jct) a trial must beat the best trial before its batch, B: its runs go seed by seed,
the run at each seed bounded by n x B less its earlier seeds' values (every value is >= 0,
so a sum above n x B puts the mean above B); a run that stops ends the trial, told PRUNED
with the lower bound. An SLO on a metric with a bound bounds the runs likewise until some
trial meets it (and with the objective's metric, always). Otherwise the SLO is a
constraint: a trial whose mean misses it is infeasible and never chosen.

Held-out seeds. The chosen trial and the best fixed (default-parameter) policy run on
seeds not used for tuning; the report gives the gain over the fixed policy on both seed
sets and how much of it survives.
"""
from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from policies.base import PolicyError
from policies.registry import POLICIES, load_plugins, policy_params
from sim.run.bound import BOUNDABLE, Bound
from sim.study.sweep import RUN_AXES, Workers, build_run, canonical, parse_value, point_key, stopped_early, sweep
from agentsim.errors import InputError
from sim.study.tune_space import Space, deployable, distribution

# Objectives: run-summary metrics (sim/run/metrics.py) and whether lower is better.
OBJECTIVES = {**{m: True for m in ("mean_jct", "p50_jct", "p90_jct", "p95_jct", "p99_jct", "max_jct", "mean_queue_delay",
                                  "mean_turn_latency", "p99_turn_latency", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms")},
              **{m: False for m in ("jobs_per_s", "output_tokens_per_s", "total_tokens_per_s")}}
ALIASES = {"throughput": "jobs_per_s"}
SLO_METRICS = tuple(m for m, low in OBJECTIVES.items() if low and m.endswith(("jct", "delay", "latency")))
# Run axes tune sets itself (seeds from --seeds/--holdout-seeds, the policy from the search).
OWN_AXES = ("policy", "seed", "rep")
RUNS = "runs"


# ---- the question and the search ------------------------------------------------------------

@dataclass
class Question:
    """A workload (run axes but policy and seed), the families searched, objectives and seeds."""
    fixed: dict                          # run axes (sim.study.sweep.RUN_AXES) held for every trial
    spaces: dict[str, Space]
    objectives: tuple[str, ...] = ("mean_jct",)
    slo: Bound | None = None             # METRIC<=SECONDS, a bound on the mean over the tuning seeds
    seeds: tuple[int, ...] = (0,)
    holdout: tuple[int, ...] = (1,)
    trials: int = 100
    batch: int = 8
    seed: int = 0                        # the sampler's
    early_stop: bool = True

    def point(self, policy: str, params: dict, seed: int) -> dict:
        return {**self.fixed, "policy": policy, **params, "seed": seed}

    def low(self, i: int = 0) -> bool:
        return OBJECTIVES[self.objectives[i]]

    def bound(self, best: float) -> Bound | None:
        """What a trial of the next batch must stay within, on the mean over the tuning seeds
        (module docstring); None where nothing bounds it."""
        if not self.early_stop:
            return None
        obj = self.objectives[0]
        limit = math.inf
        if len(self.objectives) == 1 and obj in BOUNDABLE and math.isfinite(best):
            limit = best
        if self.slo is not None and self.slo.metric in BOUNDABLE:
            if math.isinf(limit) or self.slo.metric == obj:
                limit, obj = min(limit, self.slo.limit), self.slo.metric
        return Bound(obj, limit) if math.isfinite(limit) else None


@dataclass
class Trial:
    number: int
    policy: str
    params: dict                         # every parameter of the policy (searched and held)
    searched: dict                       # Optuna's names (POLICY.NAME) -> value
    baseline: bool
    keys: list[str] = field(default_factory=list)
    state: str = "running"               # complete | pruned | failed
    values: dict = field(default_factory=dict)    # metric -> mean over seeds (a lower bound where pruned)
    by_seed: dict = field(default_factory=dict)   # metric -> per-seed values
    feasible: bool = True
    error: str | None = None
    bound: str | None = None


@dataclass
class TuneResult:
    trials: pd.DataFrame
    chosen: Trial | None
    fixed: Trial | None                  # the best default-parameter policy on the tuning seeds
    holdout: dict                        # "chosen" / "fixed" -> metric -> mean on the held-out seeds
    config: str | None                   # the chosen configuration, resolved (sim run --config)
    ran: int = 0
    resumed: int = 0
    wall_s: float = 0.0


def _points(q: Question, t: Trial, seeds) -> list[dict]:
    return [q.point(t.policy, t.params, s) for s in seeds]


def _metrics(q: Question) -> list[str]:
    ms = list(q.objectives)
    if q.slo is not None and q.slo.metric not in ms:
        ms.append(q.slo.metric)
    return ms


def _settle(q: Question, t: Trial, rows: pd.DataFrame) -> None:
    """A trial's state and values from its runs' rows (keyed; a seed not run is missing)."""
    mine = rows.reindex(t.keys)
    ran = mine.index.isin(rows.index)
    if "error" in mine and mine["error"].notna().any():
        t.state, t.error, t.feasible = "failed", str(mine["error"].dropna().iloc[0]), False
        return
    pruned = bool(stopped_early(mine[ran]).any()) or not ran.all()
    for m in _metrics(q):
        vals = [float(v) if v is not None and not pd.isna(v) else math.nan
                for v in (mine[m] if m in mine else [math.nan] * len(mine))]
        t.by_seed[m] = vals
        t.values[m] = float(np.mean(vals))
    if pruned:  # the bound's metric: a lower bound of the mean (stopped runs' lower bounds, 0 for seeds not run)
        t.state, t.feasible = "pruned", False
        b = t.bound.partition("<=")[0]
        t.values = {m: (float(np.nansum(t.by_seed[m])) / len(q.seeds) if m == b else math.nan) for m in t.values}
        return
    t.state = "complete"
    if q.slo is not None:
        t.feasible = bool(t.values[q.slo.metric] <= q.slo.limit)


def _true(v) -> bool:
    return isinstance(v, (bool, np.bool_)) and bool(v)


def _better(q: Question, a: float, b: float) -> bool:
    return a < b if q.low() else a > b


def _best(q: Question, trials: list[Trial], baseline: bool | None = None) -> Trial | None:
    """The best feasible complete trial by the first objective (ties: the earlier); multi-objective:
    the Pareto front's best in the first objective."""
    pool = [t for t in trials if t.state == "complete" and t.feasible and (baseline is None or t.baseline == baseline)]
    best = None
    for t in pool:
        if best is None or _better(q, t.values[q.objectives[0]], best.values[q.objectives[0]]):
            best = t
    return best


def _trial_constraints() -> bool:
    """Optuna 5 takes a trial's constraints from the trial (set_constraint); 4 from the sampler's constraints_func."""
    import optuna

    return hasattr(optuna.trial.Trial, "set_constraint")


def _sampler(q: Question):
    import optuna

    constraints = (lambda ft: ft.user_attrs.get("constraint", (0.0,))) if q.slo is not None and not _trial_constraints() \
        else None
    extra = {} if constraints is None else {"constraints_func": constraints}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if len(q.objectives) > 1:
            return optuna.samplers.NSGAIISampler(seed=q.seed, population_size=max(4, min(20, q.batch * 2)), **extra)
        return optuna.samplers.TPESampler(seed=q.seed, n_startup_trials=min(10, max(1, q.trials // 5)),
                                          constant_liar=True, **extra)


def _slo_excess(q: Question, t: Trial) -> float:
    """The SLO constraint (<= 0: met) of a trial; 1 where its metric is not known (pruned, failed)."""
    v = t.values.get(q.slo.metric, math.inf)
    return float(v - q.slo.limit) if math.isfinite(v) and t.state == "complete" else 1.0


def _tell(study, q: Question, ot, t: Trial) -> None:
    import optuna

    if q.slo is not None:
        if _trial_constraints():
            ot.set_constraint("slo", _slo_excess(q, t))
        else:
            ot.set_user_attr("constraint", (_slo_excess(q, t),))
    if t.state == "complete":
        study.tell(ot, [t.values[m] for m in q.objectives])
    elif t.state == "pruned":
        if len(q.objectives) == 1 and math.isfinite(t.values.get(q.objectives[0], math.nan)):
            ot.report(t.values[q.objectives[0]], 0)  # a lower bound: TPE ranks it among the pruned
        study.tell(ot, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(ot, state=optuna.trial.TrialState.FAIL)


def search(q: Question, out: Path, workers: int = 1, dask: str | None = None, progress: bool = False) -> TuneResult:
    import optuna
    from tqdm import tqdm

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    families = list(q.spaces)
    study = optuna.create_study(directions=["minimize" if OBJECTIVES[m] else "maximize" for m in q.objectives],
                                sampler=_sampler(q))
    trials: list[Trial] = []
    runs = out / RUNS
    ran = resumed = 0
    t0 = time.perf_counter()

    def run_batch(batch: list[Trial], bound: Bound | None) -> None:
        """The batch's runs, seed by seed: each trial's run at the next seed is bounded by what
        its earlier seeds left of n x the limit (a sum above it puts the mean above the
        limit, every value being >= 0); a trial whose run stops is not run further."""
        nonlocal ran, resumed
        n = len(q.seeds)
        spent = {}
        for t in batch:
            t.keys = [point_key(canonical(p)) for p in _points(q, t, q.seeds)]
            t.bound = None if bound is None else str(bound)
            spent[t.number] = 0.0
        alive = list(batch)
        rows = None
        for i, seed in enumerate(q.seeds):
            if not alive:
                break
            bounds = {t.keys[i]: Bound(bound.metric, max(0.0, bound.limit * n - spent[t.number])) for t in alive} \
                if bound is not None else None
            rep = sweep([q.point(t.policy, t.params, seed) for t in alive], runs, bound=bounds, pool=pool)
            ran, resumed = ran + rep.ran, resumed + rep.skipped
            if rep.lost:
                raise InputError(f"{len(rep.lost)} runs lost with their worker processes ({rep.lost[0][1]}); run the "
                                 f"same command again to retry them (finished runs are kept in {runs})")
            rows = rep.table.drop_duplicates("key", keep="last").set_index("key")
            keep = []
            for t in alive:
                r = rows.loc[t.keys[i]]
                if isinstance(r.get("error"), str) or _true(r.get("stopped_early")):
                    continue
                if bound is not None:
                    spent[t.number] += float(r[bound.metric])
                keep.append(t)
            alive = keep
        for t in batch:
            _settle(q, t, rows)

    def bound_now(done: list[Trial]) -> Bound | None:
        best = _best(q, done)
        return q.bound(best.values[q.objectives[0]] if best and len(q.objectives) == 1 else math.inf)

    with Workers(workers, dask) as pool, \
            tqdm(total=q.trials, desc="tune", unit="trial", disable=not progress, leave=False) as bar:
        # the fixed policies first: the reference of the gain, and the first best for pruning
        # (in batches too: a fixed policy that cannot beat an earlier one is not the reference either)
        base = [Trial(i, p, {**policy_params(p), **q.spaces[p].fixed}, {}, True) for i, p in enumerate(families)]
        for i in range(0, len(base), q.batch):
            run_batch(base[i:i + q.batch], bound_now(base[:i]))
            bar.update(len(base[i:i + q.batch]))
        for t in base:
            _record_fixed(study, q, t)
        trials += base
        while len(trials) < q.trials:
            bound = bound_now(trials)
            asked, batch = [], []
            for _ in range(min(q.batch, q.trials - len(trials))):
                ot = study.ask()
                fam = ot.suggest_categorical("policy", families)
                space = q.spaces[fam]
                searched = {d.key: d.suggest(ot) for d in space.dims}
                params = {**policy_params(fam), **space.held, **{k.split(".", 1)[1]: v for k, v in searched.items()}}
                asked.append(ot)
                batch.append(Trial(len(trials) + len(batch), fam, params, searched, False))
            run_batch(batch, bound)
            for ot, t in zip(asked, batch):
                _tell(study, q, ot, t)
            trials += batch
            bar.update(len(batch))
            b = _best(q, trials)
            if b is not None:
                bar.set_postfix_str(f"best {q.objectives[0]} {b.values[q.objectives[0]]:.4g} ({b.policy})")

        chosen = _front_pick(q, trials) if len(q.objectives) > 1 else _best(q, trials)
        fixed = _best(q, trials, baseline=True)
        holdout: dict = {}
        if q.holdout and chosen is not None:
            which = {"chosen": chosen, **({"fixed": fixed} if fixed is not None else {})}
            pts = [p for t in which.values() for p in _points(q, t, q.holdout)]
            rep = sweep(pts, runs, workers=workers, dask=dask, pool=pool)
            ran, resumed = ran + rep.ran, resumed + rep.skipped
            rows = rep.table.drop_duplicates("key", keep="last").set_index("key")
            for name, t in which.items():
                mine = rows.loc[[point_key(canonical(p)) for p in _points(q, t, q.holdout)]]
                if "error" in mine and mine["error"].notna().any():
                    holdout[name] = {"error": str(mine["error"].dropna().iloc[0])}
                    continue
                holdout[name] = {m: float(mine[m].astype(float).mean()) for m in _metrics(q)}
    config = None
    if chosen is not None:
        config = build_run(q.point(chosen.policy, chosen.params, q.seeds[0])).config.to_json()
    res = TuneResult(trial_table(q, trials), chosen, fixed, holdout, config, ran, resumed, time.perf_counter() - t0)
    return res



def _record_fixed(study, q: Question, t: Trial) -> None:
    """A fixed policy's trial, added to the study with its defaults as the trial's parameters
    where they lie in the searched ranges (a --param range may leave them out: then the
    sampler does not see it; it is still the reference of the gain)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    dims = q.spaces[t.policy].dims
    dists = {"policy": CategoricalDistribution(list(q.spaces)), **{d.key: distribution(d) for d in dims}}
    params = {"policy": t.policy, **{d.key: t.params[d.name] for d in dims}}
    if t.state == "failed" or not all(dists[k]._contains(dists[k].to_internal_repr(v)) for k, v in params.items()):
        return
    extra = {}
    if q.slo is not None and _trial_constraints():
        extra["constraints"] = {"slo": _slo_excess(q, t)}
    elif q.slo is not None:
        extra["system_attrs"] = {"constraints": [_slo_excess(q, t)]}  # where Optuna 4's samplers keep them
    if t.state == "complete":
        ft = optuna.trial.create_trial(params=params, distributions=dists, values=[t.values[m] for m in q.objectives],
                                       **extra)
    else:
        v = t.values.get(q.objectives[0], math.nan)
        inter = {0: v} if len(q.objectives) == 1 and math.isfinite(v) else {}
        ft = optuna.trial.create_trial(params=params, distributions=dists, state=optuna.trial.TrialState.PRUNED,
                                       intermediate_values=inter, **extra)
    study.add_trial(ft)


def _front_pick(q: Question, trials: list[Trial]) -> Trial | None:
    """Several objectives: of the feasible complete trials no other beats in every objective,
    the best in the first (ties: the earlier)."""
    pool = [t for t in trials if t.state == "complete" and t.feasible]

    def beats(a: Trial, b: Trial) -> bool:
        ge = all((a.values[m] <= b.values[m]) if OBJECTIVES[m] else (a.values[m] >= b.values[m]) for m in q.objectives)
        return ge and any(a.values[m] != b.values[m] for m in q.objectives)

    front = [t for t in pool if not any(beats(o, t) for o in pool)]
    return _best(q, front)



def trial_table(q: Question, trials: list[Trial]) -> pd.DataFrame:
    rows = []
    for t in trials:
        row = {"trial": t.number, "policy": t.policy, "baseline": t.baseline, "state": t.state,
               "pruned": t.state == "pruned", "feasible": t.feasible, "seeds": ",".join(map(str, q.seeds)),
               "params": json.dumps(t.params, sort_keys=True)}
        for m in _metrics(q):
            row[m] = t.values.get(m, math.nan)
            row[f"{m}_by_seed"] = json.dumps(t.by_seed.get(m, []))
        row.update({"bound": t.bound, "error": t.error, "run_keys": ",".join(t.keys)})
        row.update({k: v for k, v in t.searched.items()})
        rows.append(row)
    table = pd.DataFrame(rows)
    # searched parameters as columns POLICY.NAME (mixed types across trials: as JSON text where not numeric)
    for c in [c for c in table if "." in c]:
        if not pd.api.types.is_numeric_dtype(table[c]):
            table[c] = table[c].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else json.dumps(v))
    return table


# ---- input ----------------------------------------------------------------------------------

def parse_objectives(text: str) -> tuple[str, ...]:
    names = [ALIASES.get(x.strip(), x.strip()) for x in str(text).split(",") if x.strip()]
    bad = [x for x in names if x not in OBJECTIVES]
    if not names or bad:
        raise InputError(f"--objective {text!r}: give one or more of {', '.join([*OBJECTIVES, *ALIASES])}, comma-separated")
    if len(set(names)) != len(names):
        raise InputError(f"--objective {text!r} names a metric twice")
    return tuple(names)


def parse_seeds(text: str, flag: str, empty: bool = False) -> tuple[int, ...]:
    if empty and str(text).strip().lower() in ("", "none"):
        return ()
    try:
        seeds = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise InputError(f"{flag} {text!r}: give distinct comma-separated seeds >= 0, e.g. {flag} 0,1")
    return tuple(seeds)


def policies_from(text: str | None) -> list[str]:
    """--policies a,b,c, or every registered policy (plugins included) a deployment could
    run (Policy.deployable not False: the oracle is searched only when named)."""
    if text is None:
        load_plugins()
        return [p for p in POLICIES if deployable(p) is not False]
    names = list(dict.fromkeys(x.strip() for x in str(text).split(",") if x.strip()))
    if not names:
        raise InputError("--policies names no policy; give e.g. --policies continuum,static-ttl")
    for n in names:
        try:
            policy_params(n)
        except PolicyError as e:
            raise InputError(f"--policies: {e}") from None
    return names


def fixed_axes(values: dict, sets: list[str]) -> dict:
    """The run axes of every trial: the flags given and --set NAME=V (any run axis but the ones tune sets)."""
    fixed = {k: v for k, v in values.items() if v is not None}
    for it in sets:
        name, sep, v = it.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(f"--set {it!r} is not NAME=V; write e.g. --set max_num_seqs=128")
        if name in OWN_AXES:
            flag = {"policy": "--policies", "seed": "--seeds / --holdout-seeds", "rep": "--seeds"}[name]
            raise InputError(f"--set {it!r}: tune sets {name!r} itself; use {flag}")
        if name not in RUN_AXES:
            raise InputError(f"--set {it!r}: {name!r} is not a run axis; known: "
                             f"{', '.join(a for a in RUN_AXES if a not in OWN_AXES)}")
        fixed[name] = parse_value(v)
    return fixed


def check(q: Question) -> None:
    """Every refusal before anything runs (one line each)."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise InputError("sim tune needs Optuna; pip install 'agentsim[tune]'") from None
    if set(q.seeds) & set(q.holdout):
        both = sorted(set(q.seeds) & set(q.holdout))
        raise InputError(f"--holdout-seeds {','.join(map(str, q.holdout))} overlap --seeds {','.join(map(str, q.seeds))} "
                         f"(seed {both[0]}); held-out seeds must be others")
    if q.trials < len(q.spaces) + 1:
        raise InputError(f"--trials {q.trials}: give at least {len(q.spaces) + 1}: one per searched policy at its "
                         f"defaults ({len(q.spaces)}) and one searched")
    if q.batch < 1:
        raise InputError(f"--batch must be >= 1 (got {q.batch})")
    if q.fixed.get("mode") == "closed":
        raise InputError("--set mode=closed: a closed loop has no arrival seeds to tune and hold out; tune an open workload")
    for p in q.spaces:  # a bad workload, profile or parameter fails here, before anything runs
        build_run(q.point(p, {**policy_params(p), **q.spaces[p].held}, q.seeds[0]))
