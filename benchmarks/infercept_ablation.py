"""InferCept against Continuum without offload: which of InferCept's ingredients makes
the difference? Mean JCT of continuum, infercept, infercept with each ingredient
switched off one at a time, and with all of them off (which is exactly continuum).

    python benchmarks/infercept_ablation.py [--traces swebench,bfcl] [--programs 300]
        [--num-gpu-blocks 6000,12000] [--jps 0.5,0.3] [--seeds 0,1,2] [--profile NAME]
        [--one-on] [--workers 1] [--write-docs [PAGE]]

--num-gpu-blocks and --jps give one value per trace. The ingredients (InferceptPolicy's
switches, policies/infercept.py), each switched off towards Continuum:
  true tool time       true_tool_time=0: remaining tool time from the tool's mean observed
                       duration instead of the trace's true duration (an oracle)
  preserve until return  preserve=continuum-ttl: pin only for Continuum's Eq. 2 TTL
  discard (W_d < W_p)  discard=0: never discard a preserved program by its waste estimates
  unpin while running  unpin_while_running=0: drop pins for a blocked queue head only
                       when nothing runs (Continuum's no-deadlock rule)
  resume order         resume_order=continuum: preempted, pinned, program arrival
--one-on adds rows with all ingredients off but one. No offload (there are no swaps).
Each cell is the mean JCT over the seeds (Poisson arrivals). Prints a Markdown table;
--write-docs also puts it into docs/reference/results.md (or PAGE) in place of the block marked
`<!-- infercept_ablation: FLAGS -->` ... `<!-- end infercept_ablation -->`
(benchmarks/docs_tables.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import argparse

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block
from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
from sim.study.sweep import map_points
from sim.hardware.profile import DEFAULT_PROFILE

# ingredient -> the switch that turns it off (towards Continuum)
OFF = {
    "true tool time": {"true_tool_time": False},
    "preserve until return": {"preserve": "continuum-ttl"},
    "discard (W_d < W_p)": {"discard": False},
    "unpin while running": {"unpin_while_running": False},
    "resume order": {"resume_order": "continuum"},
}
ALL_OFF = {k: v for d in OFF.values() for k, v in d.items()}


def variants(one_on: bool) -> list[tuple[str, str, dict]]:
    """(row label, policy, parameters)."""
    rows = [("continuum", "continuum", {}), ("infercept", "infercept", {})]
    rows += [(f"infercept without {k}", "infercept", dict(v)) for k, v in OFF.items()]
    rows.append(("infercept, all off (= continuum)", "infercept", dict(ALL_OFF)))
    if one_on:
        for k in OFF:
            kw = {n: v for name, d in OFF.items() if name != k for n, v in d.items()}
            rows.append((f"all off but {k}", "infercept", kw))
    return rows


def one(job):
    trace_name, programs, blocks, jps, policy, kw, seed, profile = job
    res = execute(build_run(SimConfig(
        workload=WorkloadConfig(trace=trace_name, programs=programs, jps=jps, seed=seed),
        policy=PolicyConfig(name=policy, args=dict(kw)), engine=EngineLimits(profile=profile, num_gpu_blocks=blocks))))
    return res.summary["mean_jct"]


def table_key(a) -> str:
    """The flags that define the table, as its docs marker names them."""
    return (f"--traces {a.traces} --programs {a.programs} --num-gpu-blocks {a.num_gpu_blocks} --jps {a.jps} "
            f"--seeds {a.seeds} --profile {a.profile}" + (" --one-on" if a.one_on else ""))


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="swebench,bfcl")
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--num-gpu-blocks", default="6000,12000", help="GPU KV blocks, one per trace")
    ap.add_argument("--jps", default="0.5,0.3", help="programs/s, one per trace")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help=f"bundled name or JSON (default {DEFAULT_PROFILE})")
    ap.add_argument("--one-on", action="store_true", help="also all ingredients off but one")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "results.md"), default=None, metavar="PAGE",
                    help="also replace the table in PAGE (default docs/reference/results.md) between "
                         "`<!-- infercept_ablation: FLAGS -->` and `<!-- end infercept_ablation -->`")
    a = ap.parse_args(argv)
    traces = a.traces.split(",")
    blocks = [int(x) for x in a.num_gpu_blocks.split(",")]
    rates = [float(x) for x in a.jps.split(",")]
    if len(blocks) != len(traces) or len(rates) != len(traces):
        ap.error("--num-gpu-blocks and --jps need one value per trace")
    seeds = [int(x) for x in a.seeds.split(",")]
    rows = variants(a.one_on)
    jobs = [(t, a.programs, b, j, pol, tuple(sorted(kw.items())), s, a.profile)
            for t, b, j in zip(traces, blocks, rates) for _, pol, kw in rows for s in seeds]
    res = dict(zip(jobs, map_points(one, jobs, a.workers)))

    def mean(t, b, j, pol, kw):
        return float(np.mean([res[(t, a.programs, b, j, pol, tuple(sorted(kw.items())), s, a.profile)] for s in seeds]))

    out = [f"Table: profile `{a.profile}`, no offload, {a.programs} programs, mean JCT (s) over seeds "
           f"{','.join(map(str, seeds))}", "",
           "| variant | " + " | ".join(f"{t} ({b} blocks, JPS {j:g})" for t, b, j in zip(traces, blocks, rates)) + " |",
           "|---|" + "---|" * len(traces)]
    for label, pol, kw in rows:
        cells = []
        for t, b, j in zip(traces, blocks, rates):
            m = mean(t, b, j, pol, kw)
            c, i = mean(t, b, j, "continuum", {}), mean(t, b, j, "infercept", {})
            share = f" ({(m - i) / (c - i):+.0%})" if label not in ("continuum", "infercept") and abs(c - i) > 1e-9 else ""
            cells.append(f"{m:.1f}{share}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    text = "\n".join(out)
    print(text)
    print("\nIn brackets: the share of the continuum - infercept gap that switching the ingredient off gives back.")
    if a.write_docs:
        write_block(a.write_docs, "infercept_ablation", table_key(a), text)
        print(f"wrote the table into {a.write_docs}")
    return text

if __name__ == "__main__":
    main()
