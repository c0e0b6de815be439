"""`sim tune`: search policies and their parameters for one workload (sim/study/tune.py)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from sim.run.bound import BOUNDABLE, Bound, parse_limit
from sim.study.tune import ALIASES, OBJECTIVES, RUNS, SLO_METRICS, Question, fixed_axes, parse_objectives, parse_seeds, \
    policies_from
from sim.study.tune_report import markdown, tune
from sim.study.tune_space import SPAN, apply_param, derive_space
from agentsim.bounds import COUNT_MAX, SEED_MAX, int_flag
from agentsim.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("tune", help="search policies and their parameters for a workload (Optuna), checked on held-out seeds",
                       description="Trials: every searched policy at its defaults, then Optuna's choices (TPE; NSGA-II for "
                                   "several objectives) of a policy and its declared parameters (bools, choices, numbers "
                                   f"with a positive default over default/{SPAN:g}..default*{SPAN:g}, log; the rest held at "
                                   "their defaults unless --param says). A trial's value is the mean over --seeds; runs "
                                   "that cannot beat the best (or meet a bounded SLO) stop early (pruned). The chosen "
                                   "trial and the best fixed policy are rerun on --holdout-seeds. Writes DIR/config.json "
                                   "(`sim run --config` repeats the chosen trial at the first tuning seed), trials.parquet, "
                                   f"tune.md, result.json (the same for scripts), tune.png; runs go to DIR/{RUNS}/ (a rerun resumes). Deterministic given --seed, "
                                   "whatever --workers.")
    p.add_argument("--trace", default="swebench", help="bundled trace name or parquet path (e.g. from `sim trace gen`)")
    p.add_argument("--programs", type=int_flag(1, COUNT_MAX), default=None, help="the trace's first N programs")
    p.add_argument("--jps", type=float, required=True, help="load: programs per second (Poisson arrivals)")
    p.add_argument("--profile", default=None, help="hardware profile (bundled name or JSON path)")
    p.add_argument("--num-gpu-blocks", type=int_flag(1, COUNT_MAX), default=None, help="KV pool in blocks (at most the profile's)")
    p.add_argument("--replicas", type=int_flag(1, COUNT_MAX), default=None, help="replicas (default 1)")
    p.add_argument("--router", default=None, help="router across replicas (default round_robin)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=V",
                   help="any other run axis held for every trial, e.g. --set max_num_seqs=128 (repeatable)")
    p.add_argument("--policies", default=None,
                   help="comma-separated policies to search (default every registered one a deployment could run: not "
                        "oracle, and infercept with true_tool_time=false; a policy named here is searched as declared)")
    p.add_argument("--param", action="append", default=[], metavar="[POLICY.]NAME=SPEC",
                   help="a parameter's search: LO:HI or LO:HI:log (a range), V1,V2 (choices), V (held); for every "
                        "searched policy that has NAME, or POLICY's only (repeatable)")
    p.add_argument("--objective", default="mean_jct",
                   help=f"metric to optimise, or several comma-separated (multi-objective): "
                        f"{', '.join([*OBJECTIVES, *ALIASES])} (throughput = jobs_per_s; *_per_s higher is better)")
    p.add_argument("--slo", default=None, metavar="METRIC<=SECONDS",
                   help=f"a constraint on the mean over tuning seeds, e.g. 'p95_jct<=60' ({', '.join(SLO_METRICS)}); "
                        "a trial missing it is never chosen")
    p.add_argument("--trials", type=int_flag(1, COUNT_MAX), default=100, help="trials in all, the fixed policies included (default 100)")
    p.add_argument("--seeds", default="0,1", help="arrival seeds a trial runs on (default 0,1)")
    p.add_argument("--holdout-seeds", default="2,3,4", help="seeds for the held-out check, none of --seeds ('none': skip)")
    p.add_argument("--seed", type=int_flag(0, SEED_MAX), default=0, help="the sampler's seed (default 0)")
    p.add_argument("--batch", type=int_flag(1, COUNT_MAX), default=8, help="trials asked at a time (default 8; the search depends on it, "
                                                        "not on --workers)")
    p.add_argument("--workers", type=int_flag(1, 4096), default=1, help="local processes (default 1: in this process)")
    p.add_argument("--dask", default=None, metavar="ADDRESS", help="run on an existing Dask cluster (scheduler address)")
    p.add_argument("--no-early-stop", action="store_true",
                   help=f"run every run to its end (by default runs stop once they cannot win; {', '.join(BOUNDABLE)})")
    p.add_argument("-o", "--out", required=True, help="output directory")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_tune)


def question(args) -> Question:
    """The Question of the parsed flags; every refusal is one line (InputError)."""
    if args.workers < 1:
        raise InputError(f"--workers must be >= 1 (got {args.workers})")
    if args.dask is not None and args.workers != 1:
        raise InputError("--workers does not apply with --dask (the cluster's workers run the trials); drop one")
    if not args.jps > 0:
        raise InputError(f"--jps must be > 0 (got {args.jps})")
    objectives = parse_objectives(args.objective)
    slo = Bound(*parse_limit(args.slo, SLO_METRICS, "--slo")) if args.slo is not None else None
    spaces = {p: derive_space(p, deployed=args.policies is None) for p in policies_from(args.policies)}
    for text in args.param:
        apply_param(spaces, text)
    fixed = fixed_axes({"trace": args.trace, "programs": args.programs, "jps": args.jps, "profile": args.profile,
                        "num_gpu_blocks": args.num_gpu_blocks, "replicas": args.replicas, "router": args.router}, args.set)
    return Question(fixed, spaces, objectives, slo, parse_seeds(args.seeds, "--seeds"),
                    parse_seeds(args.holdout_seeds, "--holdout-seeds", empty=True), args.trials, args.batch,
                    args.seed, early_stop=not args.no_early_stop)


def run_tune(args) -> int:
    q = question(args)
    command = "sim tune " + " ".join(_quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["tune"] else None
    t0 = time.perf_counter()
    res = tune(q, args.out, workers=args.workers, dask=args.dask, progress=not args.no_progress and sys.stderr.isatty(),
               command=command)
    print(markdown(q, res, command), end="")
    out = Path(args.out)
    print(f"{len(res.trials)} trials in {time.perf_counter() - t0:.1f} s; wrote "
          + ", ".join(str(out / n) for n in (("config.json",) if res.config else ()) + ("trials.parquet", "tune.md", "result.json", "tune.png")))
    return 0


def _quote(a: str) -> str:
    return f"'{a}'" if any(ch in a for ch in "<>;* ") else a
