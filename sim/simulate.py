"""run_simulation: one trace, one policy, one replica → per-turn/program tables and a summary."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy

from policies.base import Policy
from sim.engine import Engine
from sim.metrics import Recorder, program_table, summarize, turn_table
from sim.profile import Profile
from sim.scheduler import EngineConfig
from sim.workload import Workload, poisson_arrivals


@dataclass
class Result:
    turns: pd.DataFrame
    programs: pd.DataFrame
    kv_usage: pd.DataFrame
    summary: dict


def engine_config(profile: Profile, **overrides) -> EngineConfig:
    """The profile's engine limits, with explicit overrides (None = keep the profile's)."""
    e = profile.engine
    cfg = dict(num_gpu_blocks=int(e["num_gpu_blocks"]), block_size=int(e["block_size"]),
               max_num_batched_tokens=int(e["max_num_batched_tokens"]), max_num_seqs=int(e["max_num_seqs"]),
               enable_chunked_prefill=bool(e.get("enable_chunked_prefill", True)), max_model_len=int(e["max_model_len"]),
               reserve_full_prompt=bool(e.get("scheduler_reserve_full_isl", True)))
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    return EngineConfig(**cfg)


def arrivals_for(trace: pd.DataFrame, jps: float | None, seed: int) -> np.ndarray:
    """Trace arrivals when it has them and no --jps is given, else seeded Poisson."""
    n = trace["program_id"].nunique()
    if jps is None and "arrival_s" in trace.columns:
        a = trace.groupby("program_id", sort=False)["arrival_s"].first().to_numpy(dtype=float)
        return a - a.min()
    return poisson_arrivals(n, 0.2 if jps is None else jps, seed)


def run_simulation(trace: pd.DataFrame, policy: Policy, profile: Profile, cfg: EngineConfig,
                   arrivals: np.ndarray, fast_forward: bool = True, progress=None) -> Result:
    env = simpy.Environment()
    rec = Recorder()
    work = Workload(env, trace, arrivals, cfg.block_size, cfg.max_model_len, cfg.num_gpu_blocks)

    def on_finish(call, now):
        rec.record(call, now)
        work.finished(call, now)
        if progress is not None and call.req.is_last_step:
            progress.update(1)

    engine = Engine(env, cfg, profile, policy, on_finish=on_finish, fast_forward=fast_forward)
    work.start(engine)
    env.run()
    sched = engine.sched
    if sched.waiting or sched.running:
        raise RuntimeError(f"run ended with {len(sched.waiting)} waiting and {len(sched.running)} running calls")
    if sched.pins:  # the last turn always frees; anything left is a bug
        raise RuntimeError(f"pins outlived their programs: {sorted(sched.pins)}")
    sched.pool.check()

    turns = turn_table(rec)
    progs = program_table(turns)
    span = float(progs["finish"].max())
    outcomes = dict(policy.pin_outcomes)
    extra = {
        "policy": policy.name, "num_gpu_blocks": cfg.num_gpu_blocks, "block_size": cfg.block_size,
        "steps": engine.steps, "engine_busy_s": engine.busy_time,
        "mean_kv_usage": engine.mean_used_blocks(span) / cfg.num_gpu_blocks,
        "peak_kv_usage": engine.peak_used / cfg.num_gpu_blocks,
        "pinned_block_seconds": sched.pinned_block_seconds,
        "pins": sum(outcomes.values()), "pins_hit": outcomes.get("hit", 0),
        "pins_expired": outcomes.get("expired", 0), "pins_victim": outcomes.get("victim", 0),
        "ttl_by_tool": {t: {"pins": len(v), "mean_ttl_s": float(np.mean(v))} for t, v in sorted(policy.ttls.items())},
    }
    kv = pd.DataFrame(engine.kv_samples, columns=["t", "used_blocks", "pinned_blocks"])
    return Result(turns, progs, kv, summarize(turns, progs, extra))
