"""`sim tune`'s speed: a whole search timed as a user runs it, with the machine's load.

    python benchmarks/tune_speed.py [--programs 500] [--trials 200] [--workers 2] [--jps 0.5]
        [--num-gpu-blocks 6000] [--seeds 0] [--holdout-seeds 1,2] [--policies a,b] [--write-docs [PAGE]]

Runs `python -m agentsim.cli tune ...` in a fresh process into a fresh --out (so no run is
resumed) and prints the command, its wall time, the trials pruned and runs simulated, the
machine's load (the 1-minute load average sampled every 2 s while it ran, against its CPU
count: on a shared machine a search gets less than its cores), the CPU seconds the command
and its workers used (load-independent: wall time on idle cores is at least that over the
workers) and the search's own report
(the chosen configuration, the gain over the best fixed policy on tuning and held-out
seeds). The acceptance of issue 53: 200 trials on 500 programs within 5 minutes on 2 cores;
smaller --programs/--trials give a reduced version where the full one takes too long.
The machine is often shared, so the wall time measured says little about idle cores;
the table also gives an estimate for `--workers` idle cores: each run's CPU time (its
measured wall time scaled so that all runs sum to the CPU seconds measured) scheduled
as sim tune runs them (batch by batch and seed by seed, each sweep's runs handed to the
first free worker in order, the next sweep only after the last run of this one).
`--write-docs [PAGE]` writes the result into PAGE (default docs/reference/planning.md) between
`<!-- tune_speed: FLAGS -->` and
`<!-- end tune_speed -->` (a wall-clock figure: benchmarks/docs_tables.py does not redo it).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import write_block  # noqa: E402

LIMIT_S = 300.0  # the acceptance: 5 minutes


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="swebench")
    ap.add_argument("--programs", type=int, default=500)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jps", type=float, default=0.5)
    ap.add_argument("--num-gpu-blocks", type=int, default=6000)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--holdout-seeds", default="1,2")
    ap.add_argument("--policies", default=None, help="default: every registered policy")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--write-docs", nargs="?", const=str(ROOT / "docs" / "reference" / "planning.md"), default=None,
                    metavar="PAGE")
    a = ap.parse_args(argv)
    flags = ["--trace", a.trace, "--programs", str(a.programs), "--jps", f"{a.jps:g}", "--num-gpu-blocks", str(a.num_gpu_blocks),
             "--trials", str(a.trials), "--seeds", a.seeds, "--holdout-seeds", a.holdout_seeds, "--batch", str(a.batch),
             "--workers", str(a.workers)] + (["--policies", a.policies] if a.policies else [])
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(2.0):
            loads.append(os.getloadavg()[0])

    with tempfile.TemporaryDirectory(prefix="tune_speed_") as d:
        out = Path(d) / "out"
        before = os.getloadavg()[0]
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "agentsim.cli", "tune", *flags, "-o", str(out), "--no-progress"],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its workers, all reaped by now
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        done.set()
        th.join()
        if r.returncode != 0:
            raise SystemExit(f"sim tune failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
        res = json.loads((out / "result.json").read_text())
        idle = idle_estimate(out, a.batch, a.workers, cpu)
    mean_load = sum(loads) / len(loads) if loads else before
    full = a.programs >= 500 and a.trials >= 200 and a.workers <= 2
    verdict = ("reduced version" if not full else "met" if wall <= LIMIT_S else
               f"met on idle cores (estimate), not on this load" if idle <= LIMIT_S else "not met")
    m = res["objectives"][0]
    c, f, h, g = res["chosen"], res["fixed"], res["holdout"], res["gain"] or {}

    def params(t: dict | None) -> str:
        if t is None:
            return "-"
        p = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["params"].items() if v is not None)
        return f"{t['policy']} ({p})" if p else t["policy"]

    def val(d: dict | None) -> str:
        return "-" if not d or d.get(m) is None else f"{d[m]:.1f}"

    def pct(x) -> str:
        return "-" if x is None else f"{x:+.1%}"

    text = "\n".join([
        f"    sim tune {' '.join(shlex.quote(x) for x in flags)}",
        "",
        "| trials | pruned | runs | wall (s) | workers | CPUs | load before / mean / max | CPU s | on idle cores, at least (s) "
        "| on idle cores, estimated (s) | 200 x 500 in 300 s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {res['trials']} | {res['pruned']} | {res['runs_simulated']} | {wall:.0f} | {a.workers} | {os.cpu_count()} | "
        f"{before:.1f} / {mean_load:.1f} / {max(loads, default=before):.1f} | {cpu:.0f} | {cpu / a.workers:.0f} | "
        f"{idle:.0f} | {verdict} |",
        "",
        f"| | configuration | {m}, tuning seeds {','.join(map(str, res['seeds']))} | "
        f"{m}, held-out seeds {','.join(map(str, res['holdout_seeds']))} |",
        "|---|---|---|---|",
        f"| chosen | {params(c)} | {val(c and c['tuning'])} | {val(h.get('chosen'))} |",
        f"| best fixed | {params(f)} | {val(f and f['tuning'])} | {val(h.get('fixed'))} |",
        f"| gain | | {pct(g.get('tuning_gain'))} | {pct(g.get('holdout_gain'))} |",
    ])
    print(text)
    if a.write_docs:
        key = " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]) if x not in ("--write-docs", a.write_docs))
        write_block(a.write_docs, "tune_speed", key, text)
    return text


def idle_estimate(out: Path, batch: int, workers: int, cpu: float) -> float:
    """Wall seconds of the same search on `workers` idle cores (module docstring): the
    runs' CPU times in sim tune's order of sweeps, each sweep list-scheduled on the
    workers. The main process's own CPU (the sampler, tables, starting workers) is folded
    into the runs' shares, so it is counted as if it ran in parallel: an estimate, not a bound."""
    import heapq

    import pandas as pd

    trials = pd.read_parquet(out / "trials.parquet").sort_values("trial")
    runs = pd.read_parquet(out / "runs" / "results.parquet").drop_duplicates("key", keep="last").set_index("key")
    total = float(runs["wall_s"].sum())
    scale = cpu / total if total > 0 else 0.0
    used = set()
    sweeps: list[list[float]] = []
    base = trials[trials["baseline"]]
    rest = trials[~trials["baseline"]]
    groups = [base.iloc[i:i + batch] for i in range(0, len(base), batch)] + \
        [rest.iloc[i:i + batch] for i in range(0, len(rest), batch)]
    for g in groups:
        keys = [str(k).split(",") for k in g["run_keys"]]
        for i in range(max((len(k) for k in keys), default=0)):
            sw = [k[i] for k in keys if i < len(k) and k[i] in runs.index and k[i] not in used]
            used.update(sw)
            sweeps.append([float(runs.at[k, "wall_s"]) * scale for k in sw])
    sweeps.append([float(w) * scale for k, w in runs["wall_s"].items() if k not in used])  # the held-out runs
    wall = 0.0
    for sw in sweeps:
        free = [0.0] * workers
        for t in sw:
            heapq.heappush(free, heapq.heappop(free) + t)
        wall += max(free)
    return wall


if __name__ == "__main__":
    main()
