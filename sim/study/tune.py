"""`sim tune`: the best policy and parameters for one workload, found by Optuna.

What is searched. A trial is a policy family and a value for each of its parameters. The
parameters come from the policy's constructor, as a sweep's axes do (policies.registry:
`params_model`, with the declared types and RANGES): a bool is searched over both values,
a text parameter with fixed choices over them, a number with a positive default over
[default / SPAN, default x SPAN] (log scale) clipped to its declared range. A number whose
default is 0, negative or None has no scale to search around and a free text parameter
nothing to choose from: each is held at its default unless `--param` gives a range, a
list or a value. So a policy registered anywhere (a plugin included) is searched as it
declares itself, with no list here.

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
from policies.registry import POLICIES, load_plugins, params_model, policy_params
from sim.run.bound import BOUNDABLE, Bound
from sim.run.config import scalar_kind
from sim.study.sweep import RUN_AXES, Workers, build_run, canonical, parse_value, point_key, stopped_early, sweep
from agentsim.errors import InputError
from agentsim.files import atomic_write, check_output
from traces.validation import validated

SPAN = 8.0  # a number with a positive default is searched over [default / SPAN, default x SPAN]
# Objectives: run-summary metrics (sim/run/metrics.py) and whether lower is better.
OBJECTIVES = {**{m: True for m in ("mean_jct", "p50_jct", "p90_jct", "p95_jct", "p99_jct", "max_jct", "mean_queue_delay",
                                  "mean_turn_latency", "p99_turn_latency", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms")},
              **{m: False for m in ("jobs_per_s", "output_tokens_per_s", "total_tokens_per_s")}}
ALIASES = {"throughput": "jobs_per_s"}
SLO_METRICS = tuple(m for m, low in OBJECTIVES.items() if low and m.endswith(("jct", "delay", "latency")))
# Run axes tune sets itself (seeds from --seeds/--holdout-seeds, the policy from the search).
OWN_AXES = ("policy", "seed", "rep")
RUNS = "runs"


# ---- the search space, from what each policy declares -----------------------------------

@dataclass(frozen=True)
class Dim:
    """One searched parameter of one policy."""
    policy: str
    name: str
    kind: str                      # "int", "float" or "cat"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple = ()

    @property
    def key(self) -> str:
        return f"{self.policy}.{self.name}"

    def suggest(self, trial):
        if self.kind == "cat":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, log=self.log)

    def describe(self) -> str:
        if self.kind == "cat":
            return f"{self.name} in {{{', '.join(map(str, self.choices))}}}"
        return f"{self.name} in [{self.low:g}, {self.high:g}]{' log' if self.log else ''}"


@dataclass
class Space:
    """A policy's searched dimensions and the parameters held (name -> value); `fixed`:
    the values its fixed (reference) trial takes other than its defaults."""
    policy: str
    dims: list[Dim]
    held: dict[str, object]
    fixed: dict[str, object] = field(default_factory=dict)


def _limits(metadata) -> tuple[float, bool, float, bool]:
    """(low, low exclusive, high, high exclusive) of a field's declared range."""
    lo, lo_ex, hi, hi_ex = -math.inf, False, math.inf, False
    for m in metadata:
        for attr, ex in (("ge", False), ("gt", True)):
            if getattr(m, attr, None) is not None:
                lo, lo_ex = float(getattr(m, attr)), ex
        for attr, ex in (("le", False), ("lt", True)):
            if getattr(m, attr, None) is not None:
                hi, hi_ex = float(getattr(m, attr)), ex
    return lo, lo_ex, hi, hi_ex


def _choices(metadata) -> tuple:
    for m in metadata:
        opts = getattr(getattr(m, "func", None), "options", None)  # policies.registry._choice
        if opts:
            return tuple(opts)
    return ()


def deployable(policy: str) -> bool | dict:
    """Policy.deployable of a registered policy: True, False (it reads what only the
    simulator knows) or {parameter: value} (deployable with those values)."""
    return getattr(POLICIES[policy], "deployable", True)


def derive_space(policy: str, deployed: bool = False) -> Space:
    """The default search space of a policy, from its declared parameters (module docstring);
    `deployed`: the parameters a deployment must hold (Policy.deployable) are held at
    those values, in its fixed trial too."""
    dims, held = [], {}
    must = deployable(policy) if deployed else True
    fixed = dict(must) if isinstance(must, dict) else {}
    for name, f in params_model(policy).model_fields.items():
        if name in fixed:
            held[name] = fixed[name]
            continue
        kind, d = scalar_kind(f.annotation), f.default
        lo, lo_ex, hi, hi_ex = _limits(f.metadata)
        choices = _choices(f.metadata)
        if kind is bool:
            dims.append(Dim(policy, name, "cat", choices=(False, True)))
        elif choices:
            dims.append(Dim(policy, name, "cat", choices=choices))
        elif kind in (int, float) and isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0:
            low, high = d / SPAN, d * SPAN
            if low <= lo:
                low = lo + (d - lo) / SPAN if lo_ex else lo
            if high >= hi:
                high = hi - (hi - d) / SPAN if hi_ex else hi
            if kind is int:
                low, high = math.ceil(low - 1e-9), math.floor(high + 1e-9)
                low = max(low, math.floor(lo) + 1 if lo_ex else math.ceil(lo)) if math.isfinite(lo) else low
            if high > low:
                dims.append(Dim(policy, name, "int" if kind is int else "float", low, high, log=low > 0))
            else:
                held[name] = d
        else:
            held[name] = d
    return Space(policy, dims, held, fixed)


def _check_value(policy: str, name: str, value, text: str):
    """A value of a policy's parameter, converted and range-checked as --policy-arg's."""
    m = validated(params_model(policy), {name: value}, f"--param {text!r}", error=InputError)
    return getattr(m, name)


def apply_param(spaces: dict[str, Space], text: str) -> None:
    """`--param [POLICY.]NAME=SPEC`: SPEC LO:HI (or LO:HI:log) a range, V1,V2,... a choice,
    V a held value; for every searched policy that has NAME, or POLICY's alone."""
    target, sep, spec = text.partition("=")
    target, spec = target.strip(), spec.strip()
    if not sep or not target or not spec:
        raise InputError(f"--param {text!r} is not [POLICY.]NAME=SPEC; write e.g. --param max_ttl=0.5:20, "
                         f"--param continuum.K=50,100 or --param unpin_while_running=true")
    pol, dot, name = target.rpartition(".")
    if dot:
        if pol not in spaces:
            raise InputError(f"--param {text!r}: policy {pol!r} is not searched; searched: {', '.join(spaces)}")
        names = [pol]
        if name not in policy_params(pol):
            raise InputError(f"--param {text!r}: policy {pol!r} has no parameter {name!r}; known: "
                             f"{', '.join(policy_params(pol)) or 'none'}")
    else:
        names = [p for p in spaces if name in policy_params(p)]
        if not names:
            raise InputError(f"--param {text!r}: none of the searched policies ({', '.join(spaces)}) has a parameter "
                             f"{name!r}")
    for p in names:
        s = spaces[p]
        f = params_model(p).model_fields[name]
        kind = scalar_kind(f.annotation)
        s.dims = [d for d in s.dims if d.name != name]
        s.held.pop(name, None)
        s.fixed.pop(name, None)  # the user's search of it: the fixed trial at its declared default
        parts = spec.split(":")
        if len(parts) in (2, 3) and kind in (int, float) and (len(parts) == 2 or parts[2].strip().lower() == "log"):
            low, high = (_check_value(p, name, v.strip(), text) for v in parts[:2])
            log = len(parts) == 3
            if not high > low or (log and not low > 0):
                raise InputError(f"--param {text!r}: give LO < HI" + (" and LO > 0 for a log range" if log else ""))
            s.dims.append(Dim(p, name, "int" if kind is int else "float", low, high, log=log))
        elif "," in spec and (kind is not str or _choices(f.metadata)):
            vals = list(dict.fromkeys(_check_value(p, name, parse_value(v), text) for v in spec.split(",")))
            s.dims.append(Dim(p, name, "cat", choices=tuple(vals)))
        else:
            s.held[name] = _check_value(p, name, spec if kind is str else parse_value(spec), text)


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


def _distribution(d: Dim):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if d.kind == "cat":
        return CategoricalDistribution(list(d.choices))
    if d.kind == "int":
        return IntDistribution(int(d.low), int(d.high), log=d.log)
    return FloatDistribution(d.low, d.high, log=d.log)


def _record_fixed(study, q: Question, t: Trial) -> None:
    """A fixed policy's trial, added to the study with its defaults as the trial's parameters
    where they lie in the searched ranges (a --param range may leave them out: then the
    sampler does not see it; it is still the reference of the gain)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    dims = q.spaces[t.policy].dims
    dists = {"policy": CategoricalDistribution(list(q.spaces)), **{d.key: _distribution(d) for d in dims}}
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


# ---- the report -------------------------------------------------------------------------

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


def tune(q: Question, out: str | Path, workers: int = 1, dask: str | None = None, progress: bool = False,
         command: str | None = None) -> TuneResult:
    out = check_output(out, "dir")
    check(q)
    out.mkdir(parents=True, exist_ok=True)
    res = search(q, out, workers=workers, dask=dask, progress=progress)
    write_outputs(q, res, out, command)
    return res
