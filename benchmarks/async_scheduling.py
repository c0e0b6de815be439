"""What vLLM's asynchronous scheduling changes: one run spec, synchronous against
asynchronous.

    python benchmarks/async_scheduling.py [--trace swebench] [--programs 300] [--jps 0.5]
        [--num-gpu-blocks 6000] [--policies vllm,continuum] [--seeds 0] [--profile NAME]
        [--scheduler simpy|vllm] [--write-docs [PAGE]]

vLLM 0.32 schedules asynchronously by default on a GPU (a batch queue of two: the next
step is scheduled while one runs, from the state before that one's output, its decodes
as placeholders). Both runs use the same engine (the SimPy replica by default; `--scheduler
vllm`: vLLM's own scheduler, the same figures, as the twin check's async tests assert)
and the same step model, so the difference is the scheduling mode alone: a call that arrives during a step is admitted a step later, and a finished
call's blocks return a step later. Per policy, means over the seeds: mean and p95 JCT,
mean TTFT and TPOT, steps, preemptions, pins hit, synchronous / asynchronous; and the
range over seeds of the mean-JCT difference.

--write-docs puts the table into docs/reference/validation.md (or PAGE) between
`<!-- async_scheduling: FLAGS -->` and `<!-- end async_scheduling -->`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402


KEYS = ("mean_jct", "p95_jct", "mean_ttft_ms", "mean_tpot_ms", "steps", "preemptions", "pins_hit")


def run(spec: dict, policy: str, asynchronous: bool, seed: int, engine: str = "simpy") -> dict:
    from sim.run.config import SimConfig, build_run, execute

    cfg = {**spec, "workload": {**spec["workload"], "seed": seed}, "policy": {"name": policy},
           "engine": {**spec["engine"], "scheduler": engine, "async_scheduling": asynchronous}}
    s = execute(build_run(SimConfig.model_validate(cfg))).summary
    return {k: s[k] for k in KEYS}


def table(rows: dict) -> str:
    """rows: policy -> [(sync summary, async summary) per seed]."""
    out = ["| policy | mean JCT sync / async (s) | diff (range over seeds) | p95 JCT sync / async (s) "
           "| mean TTFT sync / async (ms) | mean TPOT sync / async (ms) | steps | preemptions | pins hit |",
           "|---|---|---|---|---|---|---|---|---|"]
    for pol, pairs in rows.items():
        a, b = ({k: sum(p[i][k] for p in pairs) / len(pairs) for k in KEYS} for i in (0, 1))
        diffs = [100 * (y["mean_jct"] - x["mean_jct"]) / x["mean_jct"] for x, y in pairs]
        out.append(f"| {pol} | {a['mean_jct']:.2f} / {b['mean_jct']:.2f} | {100 * (b['mean_jct'] - a['mean_jct']) / a['mean_jct']:+.1f}% "
                   f"({min(diffs):+.1f} to {max(diffs):+.1f}%) | {a['p95_jct']:.2f} / {b['p95_jct']:.2f} "
                   f"| {a['mean_ttft_ms']:.0f} / {b['mean_ttft_ms']:.0f} | {a['mean_tpot_ms']:.1f} / {b['mean_tpot_ms']:.1f} "
                   f"| {a['steps']:.0f} / {b['steps']:.0f} | {a['preemptions']:.0f} / {b['preemptions']:.0f} "
                   f"| {a['pins_hit']:.0f} / {b['pins_hit']:.0f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="swebench")
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--jps", type=float, default=0.5)
    ap.add_argument("--num-gpu-blocks", type=int, default=6000)
    ap.add_argument("--policies", default="vllm,continuum")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--scheduler", choices=("simpy", "vllm"), default="simpy")
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "validation.md"), default=None, metavar="PAGE")
    a = ap.parse_args(argv)
    spec = {"workload": {"trace": a.trace, "programs": a.programs, "jps": a.jps},
            "engine": {"num_gpu_blocks": a.num_gpu_blocks, **({"profile": a.profile} if a.profile else {})}}
    rows = {}
    for pol in a.policies.split(","):
        rows[pol] = []
        for seed in map(int, a.seeds.split(",")):
            rows[pol].append((run(spec, pol, False, seed, a.scheduler), run(spec, pol, True, seed, a.scheduler)))
            s, y = rows[pol][-1]
            print(f"{pol} seed {seed}: mean JCT {s['mean_jct']:.3f} / {y['mean_jct']:.3f} s", file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if a.write_docs:
        key = (f"--trace {a.trace} --programs {a.programs} --jps {a.jps:g} --num-gpu-blocks {a.num_gpu_blocks} "
               f"--policies {a.policies} --seeds {a.seeds}" + (f" --profile {a.profile}" if a.profile else ""))
        write_block(a.write_docs, "async_scheduling", key, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
