"""Simulator speed: simulated seconds per wall second on the bundled SWE-bench trace.

    python benchmarks/sim_speed.py [--programs 500] [--jps 0.2] [--policy vllm]

Also times the same run with decode stretches off (step-by-step), on fewer programs,
and prints the ratio: both in one process, so machine noise mostly cancels.
"""
from __future__ import annotations

import argparse
import time

from sim.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
from sim.profile import DEFAULT_PROFILE


def timed(programs, policy, jps, seed, fast_forward):
    r = build_run(SimConfig(workload=WorkloadConfig(trace="swebench", programs=programs, jps=jps, seed=seed),
                            policy=PolicyConfig(name=policy), engine=EngineLimits(fast_forward=fast_forward)))
    t0 = time.perf_counter()
    res = execute(r)
    wall = time.perf_counter() - t0
    return res.summary["makespan_s"], wall, res.summary["steps"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=500)
    ap.add_argument("--jps", type=float, default=0.2)
    ap.add_argument("--policy", default="vllm")
    ap.add_argument("--compare-programs", type=int, default=100)
    a = ap.parse_args()
    sim_s, wall, steps = timed(a.programs, a.policy, a.jps, 0, True)
    print(f"swebench {a.programs} programs, jps {a.jps}, policy {a.policy}, 1 replica (default profile {DEFAULT_PROFILE}):")
    print(f"  {sim_s:.0f} simulated s in {wall:.2f} wall s = {sim_s / wall:.0f} simulated s per wall s ({steps} engine steps)")
    _, w_ff, _ = timed(a.compare_programs, a.policy, a.jps, 0, True)
    _, w_step, _ = timed(a.compare_programs, a.policy, a.jps, 0, False)
    print(f"  decode stretches vs step-by-step on {a.compare_programs} programs: {w_step / w_ff:.1f}x faster ({w_ff:.2f} s vs {w_step:.2f} s)")


if __name__ == "__main__":
    main()
