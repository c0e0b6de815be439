"""Simulated against real: replay one trace on a real vLLM and in the simulator, compare.

For each policy: start an engine whose scheduler is calibrate.policy_scheduler (the
very policy object code the simulator runs), warm it up, empty its prefix cache,
replay the trace in real time (calibrate/replay.py); then simulate the same trace,
the same arrivals and the engine's own limits (read back from it, not asked for) on
the profile. Without a profile the first engine is calibrated first (quick probes),
so the simulator runs on this machine's timings.

    run_validation(trace, ["vllm", "continuum"], jps=1.0, out="val/", num_gpu_blocks=48)

The report (report.json, report.md, jct_sim_vs_real.png) holds, per policy, mean and
p90 JCT on each side, per-program JCT MAPE, the cache hit ratio on each side, how full
the KV pool got, and whether the ranking of the policies agrees.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.engine import TINY_MODEL, start_engine
from calibrate.limits import read_limits
from calibrate.replay import TraceReplay, replay_in_process
from policies.registry import make_policy
from calibrate.run import write_profile
from sim.profile import Profile, load_profile, parse_profile
from sim.simulate import engine_config, run_simulation
from traces.errors import InputError
from traces.files import atomic_write

SCHEDULER_CLS = "calibrate.policy_scheduler.PolicyScheduler"
LIMIT_KEYS = ("num_gpu_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len")


def fit_trace(trace: pd.DataFrame, programs: int | None = None, max_turns: int | None = None,
              max_context: int | None = None, max_output: int | None = None,
              max_tool_s: float | None = None) -> pd.DataFrame:
    """A trace cut to what a small engine replays in minutes: the first `programs`
    programs, at most `max_turns` turns each, each program's new input scaled down so
    its final context stays within `max_context` tokens (shared prefix kept), outputs
    and tool times capped. The scaling is per program, so contexts keep their shapes."""
    t = trace.copy()
    if programs is not None:
        t = t[t["program_id"].isin(t["program_id"].drop_duplicates().iloc[:programs])]
    if max_turns is not None:
        t = t[t["turn"] < max_turns]
    if max_output is not None:
        t["output_tokens"] = t["output_tokens"].clip(upper=max_output)
    if max_tool_s is not None:
        t["tool_duration_s"] = t["tool_duration_s"].clip(upper=max_tool_s)
    if max_context is not None:
        shared = t["shared_prefix_tokens"] if "shared_prefix_tokens" in t.columns else pd.Series(0, index=t.index)
        own = t["new_input_tokens"] - np.where(t["turn"] == 0, shared, 0)
        ctx = (t["new_input_tokens"] + t["output_tokens"]).groupby(t["program_id"]).transform("sum")
        room = (max_context - shared - t["output_tokens"].groupby(t["program_id"]).transform("sum")).clip(lower=0)
        factor = (room / (ctx - shared - t["output_tokens"].groupby(t["program_id"]).transform("sum")).clip(lower=1)).clip(upper=1.0)
        scaled = np.maximum(1, np.floor(own * factor)).astype(int)
        t["new_input_tokens"] = scaled + np.where(t["turn"] == 0, shared, 0)
    # the last kept turn is the program's last: no tool after it
    last = t.groupby("program_id")["turn"].transform("max") == t["turn"]
    t.loc[last, "tool_duration_s"] = 0.0
    return t.reset_index(drop=True)


def _warm_up(llm, vocab: int, budget: int) -> None:
    """First steps of a fresh engine are slow (allocation, caches): run a few sizes, then
    empty the prefix cache so the replay starts from the state the simulator assumes."""
    from calibrate.engine import generate

    rng = np.random.default_rng(12345)
    for n, batch in ((budget // 2, 1), (256, 4), (32, 8)):
        generate(llm, [rng.integers(100, vocab, size=n).tolist() for _ in range(batch)], 8)
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache after the warm-up")


def real_run(trace: pd.DataFrame, arrivals: np.ndarray, policy: str, profile_ref: str | None, limits: dict,
             seed: int = 0, model=None, device: str = "cpu", policy_args: dict | None = None):
    """One policy on a fresh engine: (turns, programs, info). With profile_ref None the
    engine is profiled first (quick probes); info['profile'] holds that profile, and the
    policy inside the engine uses it too."""
    llm = start_engine(model or TINY_MODEL, device, seed=seed, scheduler_cls=SCHEDULER_CLS,
                       additional_config={"agentsim": {"policy": policy, "policy_args": policy_args or {},
                                                       "profile": profile_ref or "cpu-tiny-llama"}},
                       **{k: v for k, v in limits.items() if v is not None})
    try:
        info = {"limits": read_limits(llm)}
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        if profile_ref is None:
            from calibrate.run import calibrate_engine

            info["profile"] = calibrate_engine(llm, device, quick=True, progress=False)
            sched.profile = parse_profile(info["profile"], "calibrated")
        vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
        _warm_up(llm, vocab, info["limits"]["engine"]["max_num_batched_tokens"])
        sched.reset_stats()
        replay = TraceReplay(trace, arrivals, vocab, seed)
        info["wall_s"] = replay_in_process(llm, replay)
        info.update(sched.pin_report())
        info["steps"] = pd.DataFrame(sched.step_log, columns=["start", "seconds", "tokens", "seqs", "sum_qk",
                                                              "sum_k", "sum_qc"])
        turns, progs = replay.tables()
        return turns, progs, info
    finally:
        del llm
        gc.collect()


def sim_run(trace: pd.DataFrame, arrivals: np.ndarray, policy: str, profile: Profile, engine: dict,
            policy_args: dict | None = None):
    cfg = engine_config(profile, **{k: engine[k] for k in LIMIT_KEYS},
                        enable_chunked_prefill=bool(engine["enable_chunked_prefill"]),
                        reserve_full_prompt=bool(engine.get("scheduler_reserve_full_isl", True)))
    return run_simulation(trace, make_policy(policy, **(policy_args or {})), profile, cfg, arrivals)


def _side(progs: pd.DataFrame, turns: pd.DataFrame) -> dict:
    jct = progs["jct"].to_numpy()
    return {"mean_jct": float(jct.mean()), "p90_jct": float(np.percentile(jct, 90)),
            "cache_hit_ratio": float(turns["cached_tokens"].sum() / turns["prompt_tokens"].sum())}


def step_check(steps: pd.DataFrame, profile: Profile) -> dict:
    """The profile's step model on the real engine's own steps: where the time went."""
    pred = np.array([profile.step_time(*row) for row in
                     steps[["tokens", "seqs", "sum_qk", "sum_k", "sum_qc"]].itertuples(index=False)])
    real = steps["seconds"].to_numpy()
    return {"steps": int(len(steps)), "busy_s": float(real.sum()), "model_busy_s": float(pred.sum()),
            "step_model_error": float(pred.sum() / real.sum() - 1) if len(real) else float("nan")}


def compare(real: dict, sim: dict, profile: Profile) -> dict:
    """real[policy] = (turns, progs, info); sim[policy] = sim Result. Per policy and overall."""
    rows = {}
    for pol in real:
        rt, rp, info = real[pol]
        res = sim[pol]
        both = rp.merge(res.programs[["program_id", "jct"]], on="program_id", suffixes=("_real", "_sim"))
        r, s = _side(rp, rt), _side(res.programs, res.turns)
        rows[pol] = {
            "real": r, "sim": s,
            "mean_jct_error": (s["mean_jct"] - r["mean_jct"]) / r["mean_jct"],
            "p90_jct_error": (s["p90_jct"] - r["p90_jct"]) / r["p90_jct"],
            "program_jct_mape": float(np.mean(np.abs(both["jct_sim"] - both["jct_real"]) / both["jct_real"])),
            "real_peak_kv_usage": info["peak_kv_usage"], "sim_peak_kv_usage": res.summary["peak_kv_usage"],
            "real_pins": {k: info[k] for k in ("pins", "pins_hit", "pins_expired", "pins_victim")},
            "sim_pins": {k: res.summary[k] for k in ("pins", "pins_hit", "pins_expired", "pins_victim")},
            "real_wall_s": info["wall_s"],
            # engine busy time: real steps, the model on those steps, and the simulation's own
            "real_steps": step_check(info["steps"], profile), "sim_busy_s": res.summary["engine_busy_s"],
            "sim_steps": res.summary["steps"],
        }
    rank_real = sorted(rows, key=lambda p: rows[p]["real"]["mean_jct"])
    rank_sim = sorted(rows, key=lambda p: rows[p]["sim"]["mean_jct"])
    return {"policies": rows, "ranking_real": rank_real, "ranking_sim": rank_sim,
            "ranking_agrees": rank_real == rank_sim}


def render_markdown(rep: dict) -> str:
    lines = ["| policy | real mean JCT (s) | sim mean JCT (s) | error | real p90 | sim p90 | per-program MAPE | "
             "real hit ratio | sim hit ratio | real peak KV | sim peak KV | time scale | sim unscaled |", "|" + "---|" * 13]
    for pol, r in rep["policies"].items():
        lines.append(f"| {pol} | {r['real']['mean_jct']:.2f} | {r['sim']['mean_jct']:.2f} | {100 * r['mean_jct_error']:+.1f}% | "
                     f"{r['real']['p90_jct']:.2f} | {r['sim']['p90_jct']:.2f} | {100 * r['program_jct_mape']:.1f}% | "
                     f"{r['real']['cache_hit_ratio']:.3f} | {r['sim']['cache_hit_ratio']:.3f} | "
                     f"{100 * r['real_peak_kv_usage']:.0f}% | {100 * r['sim_peak_kv_usage']:.0f}% | "
                     f"{r.get('time_scale', 1.0):.3f} | {r.get('sim_unscaled_mean_jct', float('nan')):.2f} |")
    lines.append("")
    lines.append(f"ranking by mean JCT: real {' < '.join(rep['ranking_real'])}; sim {' < '.join(rep['ranking_sim'])} "
                 f"({'agrees' if rep['ranking_agrees'] else 'DISAGREES'})")
    return "\n".join(lines)


def _plot(path: Path, real: dict, sim: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    hi = 0.0
    for pol in real:
        both = real[pol][1].merge(sim[pol].programs[["program_id", "jct"]], on="program_id", suffixes=("_real", "_sim"))
        ax.scatter(both["jct_real"], both["jct_sim"], label=pol, s=18)
        hi = max(hi, float(both[["jct_real", "jct_sim"]].max().max()))
    ax.plot([0, hi], [0, hi], "k--", lw=0.8, label="sim = real")
    ax.set_xlabel("real JCT (s)")
    ax.set_ylabel("simulated JCT (s)")
    ax.set_title("per-program JCT, simulated vs real vLLM")
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def write_report(out: Path, rep: dict, real: dict, sim: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for pol in real:
        atomic_write(out / f"real_turns_{pol}.parquet", lambda p, t=real[pol][0]: t.to_parquet(p, index=False))
        atomic_write(out / f"sim_turns_{pol}.parquet", lambda p, t=sim[pol].turns: t.to_parquet(p, index=False))
        atomic_write(out / f"real_steps_{pol}.parquet", lambda p, t=real[pol][2]["steps"]: t.to_parquet(p, index=False))
    _plot(out / "jct_sim_vs_real.png", real, sim)
    atomic_write(out / "report.md", lambda p: Path(p).write_text(render_markdown(rep) + "\n"))
    atomic_write(out / "report.json", lambda p: Path(p).write_text(json.dumps(rep, indent=2) + "\n"))


def run_validation(trace: pd.DataFrame, policies: list[str], arrivals: np.ndarray, profile: str | None = None,
                   out: str | Path | None = None, seed: int = 0, model=None, device: str = "cpu",
                   log=print, policy_args: dict[str, dict] | None = None, **limits) -> dict:
    """The whole comparison. `profile`: a profile name or path; None = calibrate on the
    first engine (written to out/profile.json) and use it for the rest. `policy_args`:
    per policy name, its parameters (the same on both sides)."""
    policy_args = {p: dict((policy_args or {}).get(p) or {}) for p in policies}
    if not policies or len(set(policies)) != len(policies):
        raise InputError(f"--policy {','.join(policies)}: give one or more distinct policies")
    for pol in policies:
        make_policy(pol, **policy_args[pol])  # unknown names and parameters fail here, before any engine starts
    if profile is not None:
        load_profile(profile)  # a bad profile fails here too
    elif out is None:
        raise InputError("calibrating needs --out: the profile is written there for the next engines (or give --profile)")
    real, sim = {}, {}
    calibrated = None
    for pol in policies:
        t0 = time.perf_counter()
        ref = profile
        if ref is None and calibrated is not None:
            ref = str(Path(out) / "profile.json")
        # each engine in a fresh process: two in-process engines cannot live at once, and
        # a fresh process starts each replay from the same state
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            real[pol] = pool.submit(real_run, trace, arrivals, pol, ref, limits, seed, model, device,
                                    policy_args[pol]).result()
        info = real[pol][2]
        if "profile" in info:
            calibrated = info.pop("profile")
            write_profile(calibrated, Path(out) / "profile.json")
        log(f"{pol}: real replay {info['wall_s']:.1f} s (with engine start {time.perf_counter() - t0:.1f} s)")
    prof = parse_profile(calibrated, "calibrated") if calibrated is not None else load_profile(profile)
    scales = {}
    for pol in policies:
        # Shared machines drift between calibration and replay (the calibration keeps each
        # probe's fastest repeat; a replay lives through every slow spell). The simulator
        # runs on the profile scaled by the replay's own drift: its measured step time over
        # the step model on the very same steps. Unscaled JCT is reported beside it.
        check = step_check(real[pol][2]["steps"], prof)
        scales[pol] = 1.0 / (1.0 + check["step_model_error"])
        engine = real[pol][2]["limits"]["engine"]
        sim[pol] = sim_run(trace, arrivals, pol, dataclasses.replace(prof, step=tuple(c * scales[pol] for c in prof.step)),
                           engine, policy_args[pol])
        unscaled = sim_run(trace, arrivals, pol, prof, engine, policy_args[pol])
        real[pol][2]["sim_unscaled_mean_jct"] = float(unscaled.programs["jct"].mean())
    rep = compare(real, sim, prof)
    for pol in policies:
        rep["policies"][pol]["time_scale"] = scales[pol]
        rep["policies"][pol]["sim_unscaled_mean_jct"] = real[pol][2]["sim_unscaled_mean_jct"]
    rep["setup"] = {"programs": int(trace["program_id"].nunique()), "calls": int(len(trace)), "seed": seed,
                    "engine": real[policies[0]][2]["limits"]["engine"], "profile": prof.name,
                    "profile_device": prof.raw.get("device"),
                    "policy_args": {p: a for p, a in policy_args.items() if a}}
    if out:
        write_report(Path(out), rep, real, sim)
    return rep
