"""Memory tiers: mean JCT per policy with LMCache-like CPU offload on the bundled traces,
and a sweep over GPU memory size: where does offload without pinning overtake pinning?

    python benchmarks/offload_table.py [--programs 300] [--traces swebench,bfcl] [--jps 0.25,0.12]
        [--num-gpu-blocks 6000] [--offload cpu:100GB] [--policies vllm,autellix,infercept,continuum,...]
        [--sweep-trace swebench] [--sweep-blocks 2000,3000,4000,6000,9000,12000,18000,28303]
        [--profile NAME] [--seeds 0,1,2] [--workers 2] [--write-docs [PAGE]]

--traces are bundled names or trace parquet paths; --jps is one rate per trace (BFCL's
contexts are ~2.5x SWE-bench's, so it saturates at a lower rate). --sweep-blocks ""
skips the memory sweep.
Profile: --profile (default: the bundled default, llama3.1-8b-h100), its GPU KV pool
cut to --num-gpu-blocks; 100 GB of CPU DRAM per GPU as the paper gives its A100 runs.
Cells are means over --seeds (Poisson arrival seeds; default --seed 0).
Prints two Markdown tables; --write-docs also puts them into docs/reference/results.md (or PAGE) in
place of the block marked `<!-- offload_table: FLAGS -->` ... `<!-- end offload_table -->`
(benchmarks/docs_tables.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import argparse

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block
from sim.run.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
from sim.study.sweep import map_points
from sim.hardware.profile import DEFAULT_PROFILE


def one(job):
    trace_name, programs, blocks, jps, policy, offload, seed, profile = job
    res = execute(build_run(SimConfig(
        workload=WorkloadConfig(trace=trace_name, programs=programs, jps=jps, seed=seed),
        policy=PolicyConfig(name=policy), engine=EngineLimits(profile=profile, num_gpu_blocks=blocks),
        cluster=ClusterConfig(offload=offload))))
    return job, res.summary


def table_key(a) -> str:
    """The flags that define the tables, as their docs marker names them."""
    seeds = f"--seeds {a.seeds}" if a.seeds else f"--seed {a.seed}"
    sweep = a.sweep_blocks or '""'
    return (f"--programs {a.programs} --traces {a.traces} --jps {a.jps} --num-gpu-blocks {a.num_gpu_blocks} "
            f"--offload {a.offload} --policies {a.policies} --sweep-trace {a.sweep_trace} "
            f"--sweep-blocks {sweep} {seeds} --profile {a.profile}")


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--jps", default="0.25,0.12", help="programs/s, one per trace")
    ap.add_argument("--num-gpu-blocks", type=int, default=6000)
    ap.add_argument("--offload", default="cpu:100GB")
    ap.add_argument("--traces", default="swebench,bfcl")
    ap.add_argument("--policies", default="vllm,autellix,infercept,continuum,continuum-offload,thunderagent")
    ap.add_argument("--sweep-trace", default="swebench")
    ap.add_argument("--sweep-blocks", default="2000,3000,4000,6000,9000,12000,18000,28303")
    ap.add_argument("--seed", type=int, default=0, help="one arrival seed (default 0)")
    ap.add_argument("--seeds", default=None, help="arrival seeds, comma-separated; cells are means over them")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help=f"bundled name or JSON (default {DEFAULT_PROFILE})")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "results.md"), default=None, metavar="PAGE",
                    help="also replace the tables in PAGE (default docs/reference/results.md) between "
                         "`<!-- offload_table: FLAGS -->` and `<!-- end offload_table -->`")
    a = ap.parse_args(argv)
    traces, pols = a.traces.split(","), a.policies.split(",")
    rates = [float(j) for j in str(a.jps).split(",")]
    jps = dict(zip(traces, rates if len(rates) == len(traces) else rates[:1] * len(traces)))
    jps.setdefault(a.sweep_trace, rates[0])
    sweep = [int(b) for b in a.sweep_blocks.split(",")] if a.sweep_blocks else []
    sweep_cfgs = [("vllm", a.offload), ("continuum", None), ("continuum", a.offload), ("vllm", None)]
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else [a.seed]
    jobs = [(t, a.programs, a.num_gpu_blocks, jps[t], p, off, sd, a.profile)
            for t in traces for p in pols for off in (None, a.offload) for sd in seeds]
    jobs += [(a.sweep_trace, a.programs, b, jps[a.sweep_trace], p, off, sd, a.profile)
             for b in sweep for p, off in sweep_cfgs for sd in seeds]
    jobs = list(dict.fromkeys(jobs))
    res = dict(map_points(one, jobs, a.workers))

    def s(t, b, p, off):
        runs = [res[(t, a.programs, b, jps[t], p, off, sd, a.profile)] for sd in seeds]
        return {k: float(np.mean([r[k] for r in runs])) for k in ("mean_jct", "p95_jct", "cpu_hit_ratio")}

    seed_txt = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean over seeds {','.join(map(str, seeds))}"
    out = [f"Table: {a.programs} programs per trace, JPS " + ", ".join(f"{t} {jps[t]:g}" for t in traces) +
           f", {seed_txt}; profile `{a.profile}` with {a.num_gpu_blocks} GPU KV blocks ({a.num_gpu_blocks * 16} tokens); "
           f"offload {a.offload}, 1 replica", "",
           "| policy | " + " | ".join(f"{t}: mean JCT, offload (s) | p95 (s) | CPU hit | no offload (s)" for t in traces) + " |",
           "|" + "---|" * (1 + 4 * len(traces))]
    for p in pols:
        cells = []
        for t in traces:
            on, off = s(t, a.num_gpu_blocks, p, a.offload), s(t, a.num_gpu_blocks, p, None)
            cells += [f"{on['mean_jct']:.1f}", f"{on['p95_jct']:.1f}", f"{on['cpu_hit_ratio']:.2f}", f"{off['mean_jct']:.1f}"]
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    if sweep:
        out += ["", f"Table: GPU memory sweep, {a.sweep_trace} at JPS {jps[a.sweep_trace]:g}, {a.programs} programs, "
                    f"{seed_txt}, profile `{a.profile}`, mean JCT (s): offload without pinning (vllm + {a.offload}) "
                    "vs pinning (continuum, no offload)", "",
                "| GPU KV blocks (tokens) | vllm + offload | continuum | continuum + offload | vllm | offload beats pinning |",
                "|---|---|---|---|---|---|"]
        for b in sweep:
            vo, c, co, v = (s(a.sweep_trace, b, p, off)["mean_jct"] for p, off in sweep_cfgs)
            verdict = "tie" if abs(vo - c) <= 0.01 * c else "yes" if vo < c else "no"
            out.append(f"| {b} ({b * 16 // 1000}K) | {vo:.1f} | {c:.1f} | {co:.1f} | {v:.1f} | {verdict} |")
    text = "\n".join(out)
    print(text)
    if a.write_docs:
        write_block(a.write_docs, "offload_table", table_key(a), text)
        print(f"\nwrote the tables into {a.write_docs}")
    return text

if __name__ == "__main__":
    main()
