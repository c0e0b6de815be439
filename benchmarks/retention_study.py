"""Hard pin vs soft retention vs client TTL vs tuned (issue 53), written into docs/reference/retention.md.

    python benchmarks/retention_study.py [--study full|quick] [--workers 2] [--write-docs [PAGE]]

Per workload (the bundled synthetic `swebench`; `mini-swe-agent`, generated here by
`sim trace gen --spec mini-swe-agent` with measured turns and tool times), three KV pools
(tight: the largest program barely fits; then about 2x and 4x) and two loads, every
policy below runs on the held-out arrival seeds; a cell is the mean over them.

- vllm: no retention (the baseline);
- continuum / continuum-soft: Continuum's TTL as a hard pin / as soft retention (its twin);
- client-ttl-pin / client-ttl: a client's learned log-normal TTL as a pin / soft;
- client-ttl fixed: a fixed 2 s client TTL, soft;
- tuned: `sim tune` (sim/study/tune.py) over those five families and their parameters on
  the tuning seed, its chosen configuration then run on the held-out seeds.

Printed (and written into the page between `<!-- retention_study: --study NAME -->` and
`<!-- end retention_study -->`): per workload a table of mean / p95 JCT per cell with the
winner, then soft against its hard twin with what explains it (prefix hit ratio,
preemptions, retained blocks evicted under pressure). `--study quick` is one small cell
(tests/test_retention_study.py regenerates it).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from argparse import Namespace
from importlib.metadata import version
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block
from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
from sim.study.sweep import map_points

PAGE = DOCS / "reference" / "retention.md"
FAMILIES = "vllm,continuum,continuum-soft,client-ttl-pin,client-ttl"
# column label -> (policy, args); the twins are (hard, soft) pairs of these labels
POLICIES = {
    "vllm": ("vllm", {}),
    "continuum": ("continuum", {}),
    "continuum-soft": ("continuum-soft", {}),
    "client-ttl-pin": ("client-ttl-pin", {}),
    "client-ttl": ("client-ttl", {}),
    "client-ttl fixed": ("client-ttl", {"ttl_mode": "fixed", "ttl": 2.0}),
}
TWINS = (("continuum", "continuum-soft"), ("client-ttl-pin", "client-ttl"))
# workload -> programs, pools (KV blocks), loads (programs/s)
STUDIES = {
    "full": dict(workloads={"swebench": (80, (1100, 2000, 4000), (0.2, 0.4)),
                            "mini-swe-agent": (30, (4500, 8000, 16000), (0.02, 0.04))},
                 seeds=(1, 2), tune_seeds=(0,), trials=8),
    "quick": dict(workloads={"swebench": (30, (1100,), (0.4,))}, seeds=(1,), tune_seeds=(0,), trials=6),
}


def trace_path(workload: str, programs: int, tmp: Path) -> str:
    """A bundled trace's name, or a generated spec's parquet (seed 0)."""
    if workload == "swebench":
        return workload
    out = tmp / f"{workload}.parquet"
    subprocess.run([sys.executable, "-m", "sim.cli", "trace", "gen", "--spec", workload, "--programs", str(programs),
                    "--seed", "0", "-o", str(out)], check=True, stdout=subprocess.DEVNULL,
                   cwd=Path(__file__).resolve().parents[1])
    return str(out)


def one(job):
    key, trace, programs, blocks, jps, seed, policy, args = job
    s = execute(build_run(SimConfig(
        workload=WorkloadConfig(trace=trace, programs=programs, jps=jps, seed=seed),
        policy=PolicyConfig(name=policy, args=args), engine=EngineLimits(num_gpu_blocks=blocks)))).summary
    return key, {"mean": s["mean_jct"], "p95": s["p95_jct"], "hit": s["cache_hit_ratio"],
                 "preempt": s["preemptions"], "evicted": s.get("retention", {}).get("evicted", 0)}


def tuned(trace: str, programs: int, blocks: int, jps: float, spec: dict, workers: int, tmp: Path) -> tuple[str, dict]:
    """`sim tune`'s chosen (policy, params) for one cell, searched on the tuning seeds."""
    from sim.commands.tune import question
    from sim.study.tune_report import tune
    q = question(Namespace(trace=trace, programs=programs, jps=jps, profile=None, num_gpu_blocks=blocks, replicas=None,
                           router=None, set=[], policies=FAMILIES, param=[], objective="mean_jct", slo=None,
                           trials=spec["trials"], seeds=",".join(map(str, spec["tune_seeds"])), holdout_seeds="none",
                           seed=0, batch=5, workers=workers, dask=None, no_early_stop=False))
    res = tune(q, tmp / f"tune-{Path(trace).stem}-{blocks}-{jps:g}", workers=workers)
    return res.chosen.policy, dict(res.chosen.params)


def label_params(policy: str, params: dict) -> str:
    from policies.registry import params_model  # the defaults, to name only what the search changed
    defaults = params_model(policy)().model_dump()
    diff = {k: v for k, v in params.items() if defaults.get(k) != v}
    text = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in diff.items())
    return f"{policy}({text})" if text else policy


def run(study: str, workers: int) -> str:
    spec = STUDIES[study]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cells, chosen, jobs = [], {}, []
        for wl, (programs, pools, loads) in spec["workloads"].items():
            trace = trace_path(wl, programs, tmp)
            for b in pools:
                for j in loads:
                    cell = (wl, b, j)
                    cells.append(cell)
                    chosen[cell] = tuned(trace, programs, b, j, spec, workers, tmp)
                    pols = {**POLICIES, "tuned": chosen[cell]}
                    jobs += [((cell, lab, s), trace, programs, b, j, s, p, a)
                             for lab, (p, a) in pols.items() for s in spec["seeds"]]
        res = dict(map_points(one, jobs, workers))
    labels = [*POLICIES, "tuned"]

    def m(cell, lab, k):
        return float(np.mean([res[(cell, lab, s)][k] for s in spec["seeds"]]))

    seeds = ",".join(map(str, spec["seeds"]))
    for wl, (programs, pools, loads) in spec["workloads"].items():
        mine = [c for c in cells if c[0] == wl]
        out.append(f"**{wl}**, {programs} programs, llama3.1-8b-h100, Poisson arrivals; mean / p95 JCT (s), mean over "
                   f"held-out seeds {seeds}; tuned: {spec['trials']} trials of `sim tune` on seed "
                   f"{','.join(map(str, spec['tune_seeds']))} (optuna {version('optuna')}: its sampler picks the trials)\n")
        out.append("| KV blocks | JPS | " + " | ".join(labels) + " | winner (mean) | winner (p95) |")
        out.append("|" + "---|" * (len(labels) + 4))
        for c in mine:
            row = [f"{m(c, lab, 'mean'):.1f} / {m(c, lab, 'p95'):.1f}" for lab in labels]
            win = min(labels, key=lambda lab: m(c, lab, "mean"))
            win95 = min(labels, key=lambda lab: m(c, lab, "p95"))
            out.append(f"| {c[1]} | {c[2]:g} | " + " | ".join(row) + f" | {win} | {win95} |")
        out.append("")
        out.append("Soft vs its hard twin: mean JCT change (negative: soft faster), prefix hit ratio hard → soft, "
                   "preemptions hard → soft, retained blocks evicted under pressure (soft); the tuned choice and its "
                   "held-out gain over the best fixed policy\n")
        out.append("| KV blocks | JPS | continuum-soft vs continuum | hits | preemptions | evicted | "
                   "client-ttl vs client-ttl-pin | hits | preemptions | evicted | tuned | gain |")
        out.append("|" + "---|" * 12)
        for c in mine:
            row = []
            for hard, soft in TWINS:
                row += [f"{m(c, soft, 'mean') / m(c, hard, 'mean') - 1:+.1%}",
                        f"{m(c, hard, 'hit'):.2f} → {m(c, soft, 'hit'):.2f}",
                        f"{m(c, hard, 'preempt'):.0f} → {m(c, soft, 'preempt'):.0f}", f"{m(c, soft, 'evicted'):.0f}"]
            best = min(POLICIES, key=lambda lab: m(c, lab, "mean"))
            gain = 1 - m(c, "tuned", "mean") / m(c, best, "mean")
            row += [label_params(*chosen[c]), f"{gain:+.1%} vs {best}"]
            out.append(f"| {c[1]} | {c[2]:g} | " + " | ".join(row) + " |")
        out.append("")
    for hard, soft in TWINS:
        won = {wl: sum(m(c, soft, "mean") < m(c, hard, "mean") for c in cells if c[0] == wl) for wl in spec["workloads"]}
        n = {wl: sum(c[0] == wl for c in cells) for wl in spec["workloads"]}
        out.append(f"- {soft} faster than {hard} (mean JCT): " + ", ".join(f"{wl} {won[wl]}/{n[wl]} cells" for wl in won))
    gains = [1 - m(c, "tuned", "mean") / min(m(c, lab, "mean") for lab in POLICIES) for c in cells]
    out.append(f"- tuned at least 10% below the best fixed policy's mean JCT on the held-out seeds: "
               f"{sum(g >= 0.10 for g in gains)}/{len(cells)} cells (gain {min(gains):+.1%} to {max(gains):+.1%})")
    return "\n".join(out).rstrip("\n")


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", choices=sorted(STUDIES), default="full", help="the full study or one small cell (quick)")
    ap.add_argument("--workers", type=int, default=2, help="processes (1: in this one)")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), default=None, metavar="PAGE",
                    help="also replace this study's block in PAGE (default docs/reference/retention.md) between "
                         "`<!-- retention_study: --study NAME -->` and `<!-- end retention_study -->`")
    a = ap.parse_args(argv)
    if a.workers < 1:
        ap.error(f"--workers must be >= 1 (got {a.workers})")
    text = run(a.study, a.workers)
    print(text)
    if a.write_docs:
        write_block(a.write_docs, "retention_study", f"--study {a.study}", text)
        print(f"\nwrote the table into {a.write_docs} (<!-- retention_study: --study {a.study} -->)")
    return text


if __name__ == "__main__":
    main()
