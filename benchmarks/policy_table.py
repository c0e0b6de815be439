"""Mean and p95 JCT per policy at a low and a high load, under memory pressure.

    python benchmarks/policy_table.py [--trace swebench] [--programs 300] [--num-blocks 6000]
                                      [--loads 0.1,0.2] [--policies vllm,program-fcfs,...]

Profile: the bundled default (llama3.1-8b-a100-80gb, a roofline estimate) with its
GPU KV pool cut to --num-blocks to create memory pressure. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

from policies.registry import make_policy
from sim.profile import load_profile
from sim.simulate import arrivals_for, engine_config, run_simulation
from traces.schema import read_trace

DEFAULT_POLICIES = "vllm,program-fcfs,continuum-static,continuum,autellix,oracle"


def one(args):
    trace_name, programs, num_blocks, jps, policy, seed = args
    trace, _ = read_trace(trace_name)
    keep = trace["program_id"].drop_duplicates().iloc[:programs]
    trace = trace[trace["program_id"].isin(keep)]
    prof = load_profile()
    res = run_simulation(trace, make_policy(policy), prof, engine_config(prof, num_gpu_blocks=num_blocks),
                         arrivals_for(trace, jps, seed))
    return (jps, policy), res.summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="swebench")
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--num-blocks", type=int, default=6000)
    ap.add_argument("--loads", default="0.1,0.2")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    loads = [float(x) for x in a.loads.split(",")]
    pols = a.policies.split(",")
    jobs = [(a.trace, a.programs, a.num_blocks, j, p, a.seed) for j in loads for p in pols]
    with ProcessPoolExecutor(a.workers) as ex:
        res = dict(ex.map(one, jobs))
    print(f"{a.trace}, {a.programs} programs, default profile with {a.num_blocks} KV blocks "
          f"({a.num_blocks * 16} tokens), seed {a.seed}\n")
    head = "| policy | " + " | ".join(f"JPS {j}: mean JCT (s) | p95 (s) | hit ratio" for j in loads) + " |"
    print(head)
    print("|" + "---|" * (1 + 3 * len(loads)))
    for p in pols:
        cells = []
        for j in loads:
            s = res[(j, p)]
            cells += [f"{s['mean_jct']:.1f}", f"{s['p95_jct']:.1f}", f"{s['cache_hit_ratio']:.3f}"]
        print(f"| {p} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
