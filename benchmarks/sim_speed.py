"""Simulator speed: this tree against a baseline commit, interleaved, as ratios.

    python benchmarks/sim_speed.py [--baseline HEAD~1] [--reps 3] [--points 1x500,4x2000]
                                   [--policies vllm,continuum] [--jps-per-replica 0.2] [--async-scheduling]

Each point `RxN` is N synthetic SWE-bench programs (`sim trace gen swebench --seed 0`,
written once to a temporary file both trees read) on R replicas behind the session
router at `--jps-per-replica` x R programs/s, the default profile. Every point runs in a
fresh Python process, alternating between this tree and the baseline (checked out with
`git worktree add` under /tmp) rep by rep, so machine noise hits both alike. Printed per
point and tree, medians over the reps:
  - whole process: wall seconds of the child process (imports, trace read, run, nothing
    written), and simulated seconds per wall second on that clock;
  - event loop: seconds inside `execute(build_run(...))` only;
then the baseline/current ratio of each, and for each tree the growth exponent of wall
time in programs (points with one replica) and in replicas (points at fixed programs per
replica): wall ~ size^k.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_PAGE = ROOT / "docs" / "reference" / "results.md"

# Runs inside the tree under test (its own sim package first on sys.path); prints one JSON line.
CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
try:
    from sim.run.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
except ImportError:  # a baseline from before sim/ had sub-packages
    from sim.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
trace, programs, replicas, jps, policy = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
engine = {"engine": EngineLimits(async_scheduling=True)} if sys.argv[7] == "async" else {}
cfg = SimConfig(workload=WorkloadConfig(trace=trace, programs=programs, jps=jps, seed=0), policy=PolicyConfig(name=policy),
                cluster=ClusterConfig(replicas=replicas, router="session" if replicas > 1 else None), **engine)
t0 = time.perf_counter()
s = execute(build_run(cfg)).summary
print(json.dumps({"loop_s": time.perf_counter() - t0, "sim_s": s["makespan_s"], "steps": s["steps"], "mean_jct": s["mean_jct"]}))
"""


def worktree(rev: str) -> Path:
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"agentsim-baseline-{sha}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(path), sha], cwd=ROOT, check=True, capture_output=True)
    if (path / "setup.py").exists():  # its compiled parts, built in place as `pip install -e .` builds this tree's
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path, check=True, capture_output=True)
    return path


def run_point(tree: Path, trace: Path, programs: int, replicas: int, jps: float, policy: str, asynchronous: bool = False) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(trace), str(programs), str(replicas), str(jps), policy,
                        "async" if asynchronous else "sync"], cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{tree}: point {replicas}x{programs} {policy} failed:\n{r.stderr[-2000:]}")
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "wall_s": wall}


def exponent(sizes: list[float], walls: list[float]) -> float | None:
    """Least-squares slope of log(wall) on log(size)."""
    if len(sizes) < 2:
        return None
    xs, ys = [math.log(s) for s in sizes], [math.log(w) for w in walls]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="HEAD~1", help="git revision to compare with (default HEAD~1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--points", default="1x500,4x2000", help="replicas x programs, comma-separated (e.g. 1x500,1x2000,1x8000,16x8000)")
    ap.add_argument("--policies", default="vllm,continuum")
    ap.add_argument("--jps-per-replica", type=float, default=0.2)
    ap.add_argument("--async-scheduling", action="store_true", help="both trees schedule asynchronously (vLLM's GPU default)")
    ap.add_argument("--write-docs", nargs="?", const=str(RESULTS_PAGE), default=None, metavar="PAGE",
                    help=f"also write the table into PAGE (default {RESULTS_PAGE.relative_to(ROOT)}) between its "
                         "`<!-- sim_speed: FLAGS -->` and `<!-- end sim_speed -->` lines")
    a = ap.parse_args(argv)
    points = [tuple(int(x) for x in p.split("x")) for p in a.points.split(",")]
    trees = {"current": ROOT, "baseline": worktree(a.baseline)}
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "swebench.parquet"
        _gen(trace, max(n for _, n in points))
        res: dict = {}
        for rep in range(a.reps):
            for policy in a.policies.split(","):
                for r, n in points:
                    for name in (("current", "baseline") if rep % 2 == 0 else ("baseline", "current")):
                        out = run_point(trees[name], trace, n, r, a.jps_per_replica * r, policy, a.async_scheduling)
                        res.setdefault((policy, r, n, name), []).append(out)
                        print(f"  rep {rep} {policy} {r}x{n} {name}: {out['wall_s']:.1f} s", file=sys.stderr, flush=True)
    out = [f"baseline {a.baseline} ({trees['baseline'].name}) against this tree; synthetic swebench, session router, "
           f"{a.jps_per_replica} programs/s per replica, " + ("asynchronous scheduling, " if a.async_scheduling else "")
           + f"medians of {a.reps} interleaved reps, 2-core machine",
           "",
           "| policy | replicas x programs | simulated s | tree | whole process s | sim s / wall s | event loop s | steps |",
           "|---|---|---|---|---|---|---|---|"]
    for policy in a.policies.split(","):
        for r, n in points:
            med = {}
            for name in ("baseline", "current"):
                runs = res[(policy, r, n, name)]
                med[name] = {k: statistics.median(x[k] for x in runs) for k in ("wall_s", "loop_s", "sim_s", "steps")}
                m = med[name]
                out.append(f"| {policy} | {r}x{n} | {m['sim_s']:.0f} | {name} | {m['wall_s']:.2f} | {m['sim_s'] / m['wall_s']:.0f} | "
                           f"{m['loop_s']:.2f} | {m['steps']:.0f} |")
            ref = res[(policy, r, n, "baseline")][0]
            same = all((x["mean_jct"], x["steps"]) == (ref["mean_jct"], ref["steps"]) for x in res[(policy, r, n, "current")])
            out.append(f"| {policy} | {r}x{n} | | **ratio** | **{med['baseline']['wall_s'] / med['current']['wall_s']:.2f}x** | | "
                       f"**{med['baseline']['loop_s'] / med['current']['loop_s']:.2f}x** | same steps and mean JCT: {same} |")
    out.append("")
    for name in ("baseline", "current"):
        for policy in a.policies.split(","):
            one = [(n, statistics.median(x["wall_s"] for x in res[(policy, r, n, name)])) for r, n in points if r == 1]
            per = {}
            for r, n in points:
                per.setdefault(n // r, []).append((r, statistics.median(x["wall_s"] for x in res[(policy, r, n, name)])))
            k_prog = exponent([n for n, _ in one], [w for _, w in one])
            k_rep = [exponent([r for r, _ in v], [w for _, w in v]) for v in per.values() if len(v) > 1]
            growth = ([f"wall ~ programs^{k_prog:.2f}"] if k_prog is not None else []) + \
                [f"wall ~ replicas^{k:.2f} at fixed programs per replica" for k in k_rep]
            if growth:
                out.append(f"- {name}, {policy}: " + "; ".join(growth))
    text = "\n".join(out).rstrip("\n")
    print(text)
    if a.write_docs:
        sys.path.insert(0, str(ROOT))  # as a script: the repository root, for `benchmarks.`
        from benchmarks.docs_tables import write_block

        flags = (f"--baseline {a.baseline} --reps {a.reps} --points {a.points} --policies {a.policies}"
                 + (" --async-scheduling" if a.async_scheduling else ""))
        write_block(a.write_docs, "sim_speed", flags, text)
    return text


def _gen(path: Path, programs: int) -> None:
    from traces.generate import generate
    from traces.schema import write_trace

    df, meta = generate("swebench", programs=programs, seed=0)
    write_trace(df, path, meta)


if __name__ == "__main__":
    main()
