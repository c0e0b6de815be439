"""Closed-loop rollouts in the form of the Continuum paper's Table 5 (issue 35 item 3): agent
steps (LLM calls) per minute of each policy with N programs in flight (`sim run --workload
closed --concurrency N`), a new program starting when one finishes, on one replica.

    python benchmarks/closed_loop_table.py [--trace swebench] [--programs 500] [--num-gpu-blocks 6000]
        [--concurrency 16,32,64,128] [--policies vllm,thunderagent,continuum] [--profile NAME]
        [--write-docs [PAGE]]

Prints one Markdown table: a row per concurrency, a column per policy, each cell the run's
steps per minute, its ratio to the first policy's, and its preemptions. A closed loop draws
nothing at random (programs start in trace order), so each cell is one run. --write-docs
puts the table into docs/reference/results.md (or PAGE) between `<!-- closed_loop_table: FLAGS -->`
and `<!-- end closed_loop_table -->` (benchmarks/docs_tables.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402

from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute  # noqa: E402
from sim.hardware.profile import DEFAULT_PROFILE  # noqa: E402


def run(trace: str, programs: int, num_gpu_blocks: int, concurrency: int, policy: str, profile: str) -> dict:
    cfg = SimConfig(workload=WorkloadConfig(trace=trace, programs=programs, mode="closed", concurrency=concurrency),
                    policy=PolicyConfig(name=policy), engine=EngineLimits(profile=profile, num_gpu_blocks=num_gpu_blocks))
    return execute(build_run(cfg)).summary


def table(a) -> str:
    conc = [int(c) for c in a.concurrency.split(",")]
    pols = a.policies.split(",")
    head = (f"Table: {Path(a.trace).name}, {a.programs} programs, {a.num_gpu_blocks} KV blocks, one replica of profile "
            f"`{a.profile}`; agent steps per minute (x {pols[0]}; preemptions)")
    lines = [head, "", "| programs in flight | " + " | ".join(pols) + " |", "|---|" + "---|" * len(pols)]
    for n in conc:
        s = {p: run(a.trace, a.programs, a.num_gpu_blocks, n, p, a.profile) for p in pols}
        base = s[pols[0]]["steps_per_minute"]
        cells = [f"{s[p]['steps_per_minute']:.1f} (x{s[p]['steps_per_minute'] / base:.2f}; {s[p]['preemptions']})" for p in pols]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="swebench")
    ap.add_argument("--programs", type=int, default=500)
    ap.add_argument("--num-gpu-blocks", type=int, default=6000)
    ap.add_argument("--concurrency", default="16,32,64,128")
    ap.add_argument("--policies", default="vllm,thunderagent,continuum")
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "results.md"), default=None, metavar="PAGE")
    a = ap.parse_args(argv)
    text = table(a)
    print(text)
    if a.write_docs:
        key = (f"--trace {a.trace} --programs {a.programs} --num-gpu-blocks {a.num_gpu_blocks} --concurrency {a.concurrency} "
               f"--policies {a.policies} --profile {a.profile}")
        write_block(a.write_docs, "closed_loop_table", key, text)
    return text


if __name__ == "__main__":
    main()
