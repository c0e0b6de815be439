"""Simulator speed: simulated seconds per wall second on the bundled SWE-bench trace.

    python benchmarks/sim_speed.py [--programs 500] [--jps 0.2] [--policy vllm]

Also times the same run with decode stretches off (step-by-step), on fewer programs,
and prints the ratio: both in one process, so machine noise mostly cancels.
"""
from __future__ import annotations

import argparse
import time

from policies.registry import make_policy
from sim.profile import load_profile
from sim.simulate import arrivals_for, engine_config, run_simulation
from traces.schema import read_trace


def timed(trace, policy, jps, seed, fast_forward, **knobs):
    prof = load_profile()
    cfg = engine_config(prof, **knobs)
    t0 = time.perf_counter()
    res = run_simulation(trace, make_policy(policy), prof, cfg, arrivals_for(trace, jps, seed), fast_forward=fast_forward)
    wall = time.perf_counter() - t0
    return res.summary["makespan_s"], wall, res.summary["steps"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=500)
    ap.add_argument("--jps", type=float, default=0.2)
    ap.add_argument("--policy", default="vllm")
    ap.add_argument("--compare-programs", type=int, default=100)
    a = ap.parse_args()
    trace, _ = read_trace("swebench")
    ids = trace["program_id"].drop_duplicates()
    full = trace[trace["program_id"].isin(ids.iloc[: a.programs])]
    sim_s, wall, steps = timed(full, a.policy, a.jps, 0, True)
    print(f"swebench {a.programs} programs, jps {a.jps}, policy {a.policy}, 1 replica (default A100 profile):")
    print(f"  {sim_s:.0f} simulated s in {wall:.2f} wall s = {sim_s / wall:.0f} simulated s per wall s ({steps} engine steps)")
    sub = trace[trace["program_id"].isin(ids.iloc[: a.compare_programs])]
    _, w_ff, _ = timed(sub, a.policy, a.jps, 0, True)
    _, w_step, _ = timed(sub, a.policy, a.jps, 0, False)
    print(f"  decode stretches vs step-by-step on {a.compare_programs} programs: {w_step / w_ff:.1f}x faster ({w_ff:.2f} s vs {w_step:.2f} s)")


if __name__ == "__main__":
    main()
