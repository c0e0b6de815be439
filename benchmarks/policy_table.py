"""Mean and p95 JCT per policy at a low and a high load, under memory pressure.

    python benchmarks/policy_table.py [--trace swebench|bfcl|PATH] [--programs 300]
                                      [--num-blocks 6000] [--loads 0.15,0.25] [--seeds 0,1,2]
                                      [--policies vllm,program-fcfs,...] [--profile NAME] [--workers 2]

Profile: --profile (default: the bundled default, llama3.1-8b-h100) with its
GPU KV pool cut to --num-blocks to create memory pressure. Arrivals are Poisson at
each JPS, one run per seed; every cell is the mean over the seeds. Prints a Markdown
table, then per load in how many seeds the paper's ablation order held for mean JCT
(Fig. 16: vllm > program-fcfs > static-ttl > continuum), whether continuum beat the
fork's heuristic (continuum-static) and whether the oracle beat continuum.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from sim.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
from sim.profile import DEFAULT_PROFILE

DEFAULT_POLICIES = "vllm,program-fcfs,static-ttl,continuum-static,continuum,autellix,oracle"
ORDER = ("vllm", "program-fcfs", "static-ttl", "continuum")  # the paper's Fig. 16 ablation, worst first


def one(args):
    trace_name, programs, num_blocks, jps, policy, seed, profile = args
    res = execute(build_run(SimConfig(
        workload=WorkloadConfig(trace=trace_name, programs=programs, jps=jps, seed=seed),
        policy=PolicyConfig(name=policy), engine=EngineLimits(profile=profile, num_blocks=num_blocks))))
    return (jps, policy, seed), res.summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="swebench")
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--num-blocks", type=int, default=6000)
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help=f"bundled name or JSON (default {DEFAULT_PROFILE})")
    ap.add_argument("--loads", default="0.15,0.25")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--seeds", default="0", help="arrival seeds, comma-separated; cells are means over them")
    ap.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    loads = [float(x) for x in a.loads.split(",")]
    pols = a.policies.split(",")
    seeds = [a.seed] if a.seed is not None else [int(x) for x in a.seeds.split(",")]
    jobs = [(a.trace, a.programs, a.num_blocks, j, p, s, a.profile) for j in loads for p in pols for s in seeds]
    with ProcessPoolExecutor(a.workers) as ex:
        res = dict(ex.map(one, jobs))

    def cell(j, p, key):
        return float(np.mean([res[(j, p, s)][key] for s in seeds]))

    seed_txt = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean over seeds {','.join(map(str, seeds))}"
    print(f"{a.trace}, {a.programs} programs, profile {a.profile} with {a.num_blocks} KV blocks "
          f"({a.num_blocks * 16} tokens), Poisson arrivals, {seed_txt}\n")
    head = "| policy | " + " | ".join(f"JPS {j}: mean JCT (s) | p95 (s) | hit ratio" for j in loads) + " |"
    print(head)
    print("|" + "---|" * (1 + 3 * len(loads)))
    for p in pols:
        cells = []
        for j in loads:
            cells += [f"{cell(j, p, 'mean_jct'):.1f}", f"{cell(j, p, 'p95_jct'):.1f}", f"{cell(j, p, 'cache_hit_ratio'):.3f}"]
        print(f"| {p} | " + " | ".join(cells) + " |")
    if all(p in pols for p in ORDER):
        print()
        for j in loads:
            m = {s: {p: res[(j, p, s)]["mean_jct"] for p in pols} for s in seeds}
            held = sum(all(m[s][x] > m[s][y] for x, y in zip(ORDER, ORDER[1:])) for s in seeds)
            line = f"- JPS {j}: ablation order (mean JCT) held in {held}/{len(seeds)} seeds"
            if "continuum-static" in pols:  # the fork's heuristic, not one of the paper's bars
                line += f"; continuum < continuum-static in {sum(m[s]['continuum'] < m[s]['continuum-static'] for s in seeds)}/{len(seeds)}"
            if "oracle" in pols:
                line += f"; oracle <= continuum in {sum(m[s]['oracle'] <= m[s]['continuum'] for s in seeds)}/{len(seeds)}"
            print(line)


if __name__ == "__main__":
    main()
