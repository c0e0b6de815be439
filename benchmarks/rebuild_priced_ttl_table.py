"""rebuild-priced-ttl against the other retention policies: mean and p95 JCT per trace,
load and memory tier (GPU only, or with an LMCache-like CPU tier), mean over seeds.

    python benchmarks/rebuild_priced_ttl_table.py [--cells swebench:6000:0.3,0.5 bfcl:12000:0.2,0.3 PATH:26124:0.1]
        [--programs 300] [--seeds 0,1,2] [--offload cpu:100GiB] [--tiers gpu,cpu] [--policies ...]
        [--write-docs [PAGE]]

A cell is TRACE:BLOCKS:JPS[,JPS...] (TRACE a bundled name or a parquet path; the KV pool
cut to BLOCKS on the default profile). InferCept runs without its oracle tool time
(`true_tool_time=0`), as a deployment would. Runs one simulation at a time. Prints one
Markdown table per trace: rows are policies, each cell "mean (p95)" in seconds, and a
last row with rebuild-priced-ttl's gain over the best other policy (positive = lower JCT).
--write-docs puts each table into docs/reference/policies.md (or PAGE) in place of the block marked
`<!-- rebuild_priced_ttl_table: FLAGS -->` ... `<!-- end rebuild_priced_ttl_table -->`,
FLAGS the flags that define that table (benchmarks/docs_tables.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import argparse
import os
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block
from sim.run.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute

OURS = "rebuild-priced-ttl"
POLICIES = f"{OURS},continuum,continuum-static,infercept,thunderagent,vllm"
ARGS = {"infercept": {"true_tool_time": False}}  # no oracle


def run(trace, programs, blocks, jps, policy, offload, seed):
    res = execute(build_run(SimConfig(
        workload=WorkloadConfig(trace=trace, programs=programs, jps=jps, seed=seed),
        policy=PolicyConfig(name=policy, args=ARGS.get(policy, {})),
        engine=EngineLimits(num_gpu_blocks=blocks), cluster=ClusterConfig(offload=offload))))
    return res.summary["mean_jct"], res.summary["p95_jct"]


def render(trace: str, blocks: int, cols: list, pols: list[str], res: dict, a) -> str:
    """One cell's table as printed (and as written into the docs)."""
    out = [f"Table: {os.path.basename(trace)}, {a.programs} programs, {blocks} KV blocks, mean over seeds {a.seeds}; "
           f"mean JCT (p95) in s; cpu = offload {a.offload}", "",
           "| policy | " + " | ".join(f"JPS {j:g} {t}" for j, t, _ in cols) + " |",
           "|" + "---|" * (1 + len(cols))]
    for p in pols:
        label = "infercept (no oracle)" if p == "infercept" else p
        out.append(f"| {label} | " + " | ".join(f"{res[(j, t, p)][0]:.1f} ({res[(j, t, p)][1]:.1f})" for j, t, _ in cols) + " |")
    if OURS in pols and len(pols) > 1:
        gains = []
        for j, t, _ in cols:
            best = min((res[(j, t, p)][0], p) for p in pols if p != OURS)
            gains.append(f"{100 * (1 - res[(j, t, OURS)][0] / best[0]):+.1f}% vs {best[1]}")
        out.append(f"| gain of {OURS} | " + " | ".join(gains) + " |")
    return "\n".join(out)


def table_key(cell: str, a) -> str:
    """The flags that define one cell's table, as its docs marker names them."""
    key = f"--cells {cell} --programs {a.programs} --seeds {a.seeds} --offload {a.offload} --tiers {a.tiers}"
    return key + ("" if a.policies == POLICIES else f" --policies {a.policies}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="+", default=["swebench:6000:0.3,0.5", "bfcl:12000:0.2,0.3"])
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--offload", default="cpu:100GiB")
    ap.add_argument("--tiers", default="gpu,cpu", help="gpu: no offload; cpu: with --offload")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "policies.md"), default=None, metavar="PAGE",
                    help="also replace each cell's table in PAGE (default docs/reference/policies.md) between "
                         "`<!-- rebuild_priced_ttl_table: FLAGS -->` and `<!-- end rebuild_priced_ttl_table -->`")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    pols = a.policies.split(",")
    tiers = [(t, None if t == "gpu" else a.offload) for t in a.tiers.split(",")]
    t0 = time.time()
    for cell in a.cells:
        trace, blocks, loads = cell.rsplit(":", 2)
        blocks, loads = int(blocks), [float(j) for j in loads.split(",")]
        cols = [(j, t, off) for j in loads for t, off in tiers]
        res = {(j, t, p): np.mean([run(trace, a.programs, blocks, j, p, off, s) for s in seeds], axis=0)
               for j, t, off in cols for p in pols}
        text = render(trace, blocks, cols, pols, res, a)
        print(text)
        if a.write_docs:
            write_block(a.write_docs, "rebuild_priced_ttl_table", table_key(cell, a), text)
            print(f"\nwrote the table into {a.write_docs}")
        print(f"\n({len(cols) * len(pols) * len(seeds)} runs, {time.time() - t0:.0f} s so far)\n", flush=True)


if __name__ == "__main__":
    main()
