"""Mean and p95 JCT per policy at a low and a high load, under memory pressure.

    python benchmarks/policy_table.py [--trace swebench|bfcl|PATH|spec:NAME] [--programs 300]
                                      [--num-gpu-blocks 6000] [--loads 0.15,0.25] [--seeds 0,1,2]
                                      [--policies vllm,program-fcfs,...] [--profile NAME] [--workers 2]
                                      [--write-docs [PAGE]]

--trace spec:NAME runs on --programs programs sampled from a measured workload spec
(`sim trace gen --spec NAME --seed 0`: claude-code, codex, mini-swe-agent or a spec JSON).

Profile: --profile (default: the bundled default, llama3.1-8b-h100) with its
GPU KV pool cut to --num-gpu-blocks to create memory pressure. Arrivals are Poisson at
each JPS, one run per seed; every cell is the mean over the seeds. Prints a Markdown
table, then per load in how many seeds the paper's ablation order held for mean JCT
(Fig. 16: vllm > program-fcfs > static-ttl > continuum), whether continuum beat the
fork's heuristic (continuum-static) and whether the oracle beat continuum.

--write-docs puts that text into docs/reference/results.md (or PAGE) in place of the block marked
`<!-- policy_table: FLAGS -->` ... `<!-- end policy_table -->`, FLAGS being the flags that
define the table (trace, programs, num-blocks, profile, loads, seeds, and policies when
not the default), so the results page is written by this script, not by hand.
"""
from __future__ import annotations

import sys

import argparse
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, workload_trace, write_block
from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
from sim.study.sweep import map_points
from sim.hardware.profile import DEFAULT_PROFILE

DEFAULT_POLICIES = "vllm,program-fcfs,static-ttl,continuum-static,continuum,autellix,oracle"
ORDER = ("vllm", "program-fcfs", "static-ttl", "continuum")  # the paper's Fig. 16 ablation, worst first
RESULTS_PAGE = DOCS / "reference" / "results.md"


def one(args):
    trace_name, programs, num_gpu_blocks, jps, policy, seed, profile = args
    res = execute(build_run(SimConfig(
        workload=WorkloadConfig(trace=trace_name, programs=programs, jps=jps, seed=seed),
        policy=PolicyConfig(name=policy), engine=EngineLimits(profile=profile, num_gpu_blocks=num_gpu_blocks))))
    return (jps, policy, seed), res.summary


def table_key(a, loads: list[float], pols: list[str], seeds: list[int]) -> str:
    """The flags that define a table, as its docs marker names them (a command that redoes it)."""
    key = (f"--trace {a.trace} --programs {a.programs} --num-gpu-blocks {a.num_gpu_blocks} --profile {a.profile} "
           f"--loads {','.join(f'{j:g}' for j in loads)} --seeds {','.join(map(str, seeds))}")
    return key + ("" if ",".join(pols) == DEFAULT_POLICIES else f" --policies {','.join(pols)}")


def write_docs(path: str | Path, key: str, body: str) -> None:
    """Replace the table marked with key in path (a docs page), atomically."""
    write_block(path, "policy_table", key, body)


def render(a, loads: list[float], pols: list[str], seeds: list[int], res: dict) -> str:
    """The table as printed (and as written into the docs): a header line, the Markdown
    table, and with the ablation's policies the seed counts per load."""
    def cell(j, p, key):
        return float(np.mean([res[(j, p, s)][key] for s in seeds]))

    out = []
    seed_txt = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean over seeds {','.join(map(str, seeds))}"
    out.append(f"{a.trace}, {a.programs} programs, profile {a.profile} with {a.num_gpu_blocks} KV blocks "
               f"({a.num_gpu_blocks * 16} tokens), Poisson arrivals, {seed_txt}\n")
    out.append("| policy | " + " | ".join(f"JPS {j}: mean JCT (s) | p95 (s) | hit ratio" for j in loads) + " |")
    out.append("|" + "---|" * (1 + 3 * len(loads)))
    for p in pols:
        cells = []
        for j in loads:
            cells += [f"{cell(j, p, 'mean_jct'):.1f}", f"{cell(j, p, 'p95_jct'):.1f}", f"{cell(j, p, 'cache_hit_ratio'):.3f}"]
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    if all(p in pols for p in ORDER):
        out.append("")
        for j in loads:
            m = {s: {p: res[(j, p, s)]["mean_jct"] for p in pols} for s in seeds}
            held = sum(all(m[s][x] > m[s][y] for x, y in zip(ORDER, ORDER[1:])) for s in seeds)
            line = f"- JPS {j}: ablation order (mean JCT) held in {held}/{len(seeds)} seeds"
            if "continuum-static" in pols:  # the fork's heuristic, not one of the paper's bars
                line += f"; continuum < continuum-static in {sum(m[s]['continuum'] < m[s]['continuum-static'] for s in seeds)}/{len(seeds)}"
            if "oracle" in pols:
                line += f"; oracle <= continuum in {sum(m[s]['oracle'] <= m[s]['continuum'] for s in seeds)}/{len(seeds)}"
            out.append(line)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="swebench", help="swebench, bfcl, a trace parquet, or spec:NAME (sampled, seed 0)")
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--num-gpu-blocks", type=int, default=6000)
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help=f"bundled name or JSON (default {DEFAULT_PROFILE})")
    ap.add_argument("--loads", default="0.15,0.25")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--seeds", default="0", help="arrival seeds, comma-separated; cells are means over them")
    ap.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    ap.add_argument("--workers", type=int, default=2, help="processes (1: in this one)")
    ap.add_argument("--write-docs", nargs="?", const=str(RESULTS_PAGE), default=None, metavar="PAGE",
                    help="also replace this table in PAGE (default docs/reference/results.md) between "
                         "`<!-- policy_table: FLAGS -->` and `<!-- end policy_table -->`, FLAGS the ones that "
                         "define it (--trace ... --seeds ...); the rest of the page is kept byte for byte")
    a = ap.parse_args(argv)
    loads = [float(x) for x in a.loads.split(",")]
    pols = a.policies.split(",")
    seeds = [a.seed] if a.seed is not None else [int(x) for x in a.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="policy_table_") as tmp:
        trace = workload_trace(a.trace, a.programs, Path(tmp))
        jobs = [(trace, a.programs, a.num_gpu_blocks, j, p, s, a.profile) for j in loads for p in pols for s in seeds]
        res = dict(map_points(one, jobs, a.workers))
    text = render(a, loads, pols, seeds, res)
    print(text)
    if a.write_docs:
        key = table_key(a, loads, pols, seeds)
        write_docs(a.write_docs, key, text)
        print(f"\nwrote the table into {a.write_docs} (<!-- policy_table: {key} -->)")
    return text


if __name__ == "__main__":
    main()
