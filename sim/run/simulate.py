"""`execute`: a built run (sim.run.config.build_run, the one way to make one) simulated: one
trace, one policy, N replicas with optional offload tiers -> per-turn/program tables and a
summary."""
from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import numpy as np
import simpy

from agentsim.errors import InputError, SimulationError
from policies.base import Policy
from policies.pins import pin_counts
from sim.run.bound import Stopped
from sim.cluster.cluster import Cluster
from sim.kv.tiers import TierSpec
from sim.cluster.disagg import Disagg
from sim.run.metrics import Recorder, client_view, kv_table, program_table, request_metrics, summarize, turn_columns, turn_table
from sim.hardware.profile import Profile
from sim.cluster.router import Router
from sim.hardware.engine_config import EngineConfig
from sim.run.workload import Workload, poisson_arrivals

if TYPE_CHECKING:
    from traces.schema import Columns

SECONDS_MAX = 1e10  # traces/schema.py's bound on a trace's times (not imported: it needs pyarrow)


class Result:
    """A run's summary, and its tables as DataFrames built on first use: a caller that
    wants only the summary never imports pandas."""

    def __init__(self, turns: list[dict], kv_samples: list[tuple[int, list]], summary: dict):
        self._turns, self._kv, self.summary = turns, kv_samples, summary

    @cached_property
    def turns(self):
        """One row per call, by program and turn."""
        return turn_table(self._turns)

    @cached_property
    def programs(self):
        return program_table(self.turns)

    @cached_property
    def kv_usage(self):
        return kv_table(self._kv)


def engine_config(profile: Profile, **overrides) -> EngineConfig:
    """The profile's engine limits, with explicit overrides (None = keep the profile's)."""
    return replace(profile.engine, **{k: v for k, v in overrides.items() if v is not None})


def arrivals_for(trace, jps: float | None, seed: int) -> np.ndarray:
    """Trace arrivals when it has them and no --jps is given, else seeded Poisson.
    `trace`: checked columns (traces.schema.Columns) or a DataFrame."""
    _, first = np.unique(np.asarray(trace["program_id"]), return_index=True)
    first.sort()  # each program's first row, programs in trace order
    if jps is None and "arrival_s" in trace:
        a = np.asarray(trace["arrival_s"], dtype=float)[first]
        return a - a.min()
    a = poisson_arrivals(len(first), 0.2 if jps is None else jps, seed)
    if len(a) and not a[-1] <= SECONDS_MAX:  # past it the float clock stops moving by a step's time
        raise InputError(f"--jps {jps:g} puts the last of {len(a)} programs at t={a[-1]:.3g} s, beyond {SECONDS_MAX:.0e} s "
                         f"(a float clock there cannot move by a step's time); give a larger --jps")
    return a


class BuiltRun(Protocol):
    """What `execute` reads of a run (sim.run.config.Run, built by build_run)."""

    trace: Columns
    policy: Policy
    profile: Profile
    cfg: EngineConfig
    arrivals: np.ndarray
    tiers: tuple[TierSpec, ...]
    router: Router
    disagg: Disagg | None
    scheduler: str  # "simpy" or "vllm" (EngineLimits.scheduler)
    replicas: int
    fast_forward: bool
    metrics_at: str  # "engine" or "client" (sim/run/metrics.client_view)


def execute(run: BuiltRun, progress=None, watch=None) -> Result:
    """Replay the run's trace on its replicas (each its own engine, pool, offload tiers and
    copy of the policy; the policy itself serves replica 0) behind its router, or x prefill
    + y decode replicas (sim/cluster/disagg.py); scheduler "vllm": each replica's scheduling is the
    installed vLLM's own Scheduler (sim/vllm_replica/engine.py), else the SimPy replica.
    `progress` (tqdm-like) counts finished programs; `watch` (sim.run.bound.Watcher) stops the
    run once its bound is known to fail, its summary then the watcher's (a run it does not
    stop is unchanged)."""
    trace, policy, profile, cfg = run.trace, run.policy, run.profile, run.cfg
    engine = run.scheduler
    if engine == "vllm":  # build_run checked that vLLM's scheduler can run it
        from sim.vllm_replica.engine import VllmReplica as replica_cls
    else:
        from sim.simpy_replica.engine import SimpyReplica as replica_cls
    env = simpy.Environment()
    rec = Recorder()
    work = Workload(env, trace, run.arrivals, cfg.block_size, cfg.max_model_len, cfg.num_gpu_blocks,
                    None if cfg.enable_chunked_prefill else cfg.max_num_batched_tokens)

    def on_finish(call, now):
        rec.record(call, now)
        work.finished(call, now)
        if progress is not None and call.req.is_last_step:
            progress.update(1)
        if watch is not None and watch.finished(call, now):
            raise Stopped()

    cluster = Cluster(env, cfg, profile, policy, replicas=run.replicas, router=run.router,
                      tiers=run.tiers, fast_forward=run.fast_forward, on_finish=on_finish,
                      disagg=run.disagg, replica_cls=replica_cls)
    work.start(cluster)
    cluster.start(work)
    if watch is not None:
        watch.start(work.programs, profile)
    try:
        env.run()
    except Stopped:  # the bound is known to fail: what is known so far, nothing else
        s = watch.summary()
        s.update({"policy": policy.name, "scheduler": engine, "num_gpu_blocks": cfg.num_gpu_blocks,
                  "block_size": cfg.block_size, "replicas": len(cluster.engines),
                  "router": "thunderagent-proxy" if cluster.controller is not None else cluster.router.name})
        return Result(rec.sorted_turns(), [], s)
    except SimulationError as e:  # a replica stopped (deadlock, watchdog): name the others' state too
        # SimPy raises a copy of a process's exception, the original as its __cause__
        rest = cluster.state(but=getattr(e, "replica", getattr(e.__cause__, "replica", None)))
        raise SimulationError(f"{e}; {rest}" if rest else str(e)) from None
    check_end(cluster, rec, trace)

    rows = rec.sorted_turns()
    turns = turn_columns(rows)
    span = float(turns["finish"].max())
    engines = cluster.engines
    pols = [e.policy for e in engines]
    outcomes: dict[str, int] = {}
    ttls: dict[str, list[float]] = {}
    for p in pols:
        for k, v in p.pin_outcomes.items():
            outcomes[k] = outcomes.get(k, 0) + v
        for t, v in p.ttls.items():
            ttls.setdefault(t, []).extend(v)
    per_replica = [replica_stats(e, turns, span) for e in engines]
    offload_stats = tier_totals([e.tier for e in engines if e.tier.enabled])
    extra = {
        "policy": policy.name, "scheduler": engine, "num_gpu_blocks": cfg.num_gpu_blocks, "block_size": cfg.block_size,
        "scheduling": "asynchronous" if cfg.async_scheduling else "synchronous",
        "host_time": ("overlapped" if cfg.async_scheduling else "added") if profile.step.has_host else "none",
        "sampling": profile.sampling or "as the profile's steps",
        "replicas": len(engines), "router": "thunderagent-proxy" if cluster.controller is not None else cluster.router.name,
        "offload": ",".join(f"{t.name}:{t.capacity_bytes / 2**30:g}GiB" for t in run.tiers) or None,
        "steps": sum(e.steps for e in engines), "engine_busy_s": sum(e.busy_time for e in engines),
        "mean_kv_usage": float(np.mean([r["mean_kv_usage"] for r in per_replica])),
        "peak_kv_usage": max(r["peak_kv_usage"] for r in per_replica),
        "pinned_block_seconds": sum(e.sched.pinned_block_seconds for e in engines),
        **pin_counts(outcomes),
        "ttl_by_tool": {t: {"pins": len(v), "mean_ttl_s": float(np.mean(v))} for t, v in sorted(ttls.items())},
        **offload_stats,
        "per_replica": per_replica,
    }
    if cluster.disagg is not None:  # prefill/decode disaggregation: roles, prefills, transfers
        for e, r in zip(engines, per_replica):
            r["role"] = "prefill" if e.index < len(cluster.prefill) else "decode"
            if r["role"] == "prefill":
                p = cluster.pstats[e.index]
                r.update(prefills=p["prefills"], cache_hit_ratio=p["cached_tokens"] / p["prompt_tokens"] if p["prompt_tokens"] else 0.0)
        extra["disaggregation"] = cluster.disagg_summary()
    if policy.DECISIONS:  # InferCept: preserve / discard / swap counts
        extra["decisions"] = {k: sum(p.decisions.get(k, 0) for p in pols) for k in policy.DECISIONS}
    if cluster.controller is not None:  # ThunderAgent's proxy
        extra["proxy"] = dict(cluster.controller.stats)
    held = [r for r in map(retainer_of, engines) if r is not None]
    if held:  # soft retention (sim/kv/retention.py): retained blocks evicted under pressure, expired while free
        extra["retention"] = {"evicted": sum(r.evicted for r in held), "expired": sum(r.expired for r in held)}
    summary = summarize(turns, extra)
    if getattr(run, "metrics_at", "engine") == "client":  # after the run, from the engine's timestamps
        seen = client_view(turns, profile.server)
        summary.update(request_metrics(seen), metrics_at="client")
        for row, f, e in zip(rows, seen["first_token"], seen["finish"]):
            n = row["output_tokens"]
            row.update(ttft=float(f) - row["arrival"], e2el=float(e) - row["arrival"],
                       tpot=(float(e) - float(f)) / (n - 1) if n > 1 else float("nan"))
    return Result(rows, [(e.index, e.kv_samples) for e in engines], summary)


def retainer_of(engine):
    """A replica's soft retention set (sim/kv/retention.py Retainer), either engine; None
    while no call asked for soft retention."""
    core = getattr(engine, "core", None)  # the vLLM engine's scheduler
    pool = core.kv_cache_manager.block_pool if core is not None else engine.sched.pool
    return getattr(pool, "retainer", None)


def check_end(cluster: Cluster, rec: Recorder, trace) -> None:
    """Conservation at the end of a run: every call finished exactly once, nothing
    waits or runs, no pin outlived its program, no block leaked in any pool or tier."""
    for e in cluster.engines:
        sched = e.sched
        if sched.waiting or sched.running:
            raise SimulationError(f"replica {e.index}: run ended with {len(sched.waiting)} waiting and {len(sched.running)} running calls")
        if sched.pins:  # the last turn always frees; anything left is a bug
            raise SimulationError(f"replica {e.index}: pins outlived their programs: {sorted(sched.pins)}")
        sched.pool.check()
        e.tier.check()
    if cluster.in_flight():
        raise SimulationError(f"{cluster.in_flight()} calls still between a prefill and a decode replica")
    if cluster.held:
        raise SimulationError(f"requests still held by the proxy: {sorted(cluster.held)}")
    done = [(t["program_id"], t["turn"]) for t in rec.turns]
    if len(done) != len(trace) or len(set(done)) != len(done):
        raise SimulationError(f"{len(done)} calls finished ({len(set(done))} distinct) for {len(trace)} in the trace")


def replica_stats(e, turns: dict[str, np.ndarray], span: float) -> dict:
    """`turns`: sim.run.metrics.turn_columns."""
    mine = turns["replica"] == e.index
    calls = int(mine.sum())
    blocks = e.num_blocks  # usable blocks, as the vLLM adapter divides by
    out = {
        "replica": e.index, "calls": calls, "steps": e.steps, "busy_s": e.busy_time,
        "mean_kv_usage": e.mean_used_blocks(span) / blocks, "peak_kv_usage": e.peak_used / blocks,
        "preemptions": e.sched.preemptions,
        "cache_hit_ratio": float(turns["cached_tokens"][mine].sum() / turns["prompt_tokens"][mine].sum()) if calls else 0.0,
    }
    if e.tier.enabled:
        out["offload"] = e.tier.stats()
    return out


def tier_totals(tiers: list) -> dict:
    """Offload figures summed over replicas (zeros without offload, so tables keep one shape)."""
    loaded = sum(t.loaded_tokens for t in tiers)
    miss = sum(t.miss_tokens for t in tiers)
    out = {
        "cpu_hit_ratio": loaded / miss if miss else 0.0, "offload_loaded_tokens": loaded,
        "reload_s": sum(t.reload_s for t in tiers), "offload_loads": sum(t.loads for t in tiers),
        "writethrough_bytes": sum(t.writethrough_bytes for t in tiers),
        "offload_bytes": sum(t.offload_bytes for t in tiers),
    }
    names = sorted({tier.name for t in tiers for tier in t.tiers})
    out["tiers"] = {n: {k: sum(tier.__dict__[k] for t in tiers for tier in t.tiers if tier.name == n)
                        for k in ("bytes_written", "bytes_read", "read_s", "stored", "evicted")} for n in names}
    return out
