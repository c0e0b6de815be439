"""`sim run`: replay a trace under a policy on simulated replicas and report JCTs."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field
from tqdm import tqdm

from policies.base import PolicyError
from policies.registry import POLICIES, make_policy
from sim.cpu_tier import build_tiers, parse_offload
from sim.metrics import write_results
from sim.profile import DEFAULT_PROFILE, Profile, load_profile
from sim.router import ROUTERS, make_router
from sim.simulate import arrivals_for, engine_config, run_simulation
from traces.errors import InputError
from traces.schema import read_trace
from traces.validation import Model, validated


def register(sub) -> None:
    p = sub.add_parser("run", help="simulate a trace under a policy")
    p.add_argument("--trace", default="swebench", help="bundled name (swebench, bfcl) or parquet path")
    p.add_argument("--policy", default="vllm", help=f"one of: {', '.join(sorted(POLICIES))}")
    p.add_argument("--policy-arg", action="append", default=[], metavar="K=V", help="policy parameter (repeatable)")
    p.add_argument("--jps", type=float, default=None, help="program arrivals per second (Poisson); default: the trace's arrivals, else 0.2")
    p.add_argument("--programs", type=int, default=None, help="use only the first N programs")
    p.add_argument("--seed", type=int, default=0, help="arrival seed")
    p.add_argument("--profile", default=None, help=f"hardware profile JSON or bundled name (default {DEFAULT_PROFILE})")
    p.add_argument("--out", default=None, help="directory for turns/programs/kv_usage parquet and summary.json")
    g = p.add_argument_group("engine knobs (default: the profile's)")
    g.add_argument("--num-blocks", type=int, default=None, help="GPU KV blocks (at most the profile's)")
    g.add_argument("--block-size", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--no-chunked-prefill", action="store_true", help="admit only whole prompts")
    c = p.add_argument_group("memory tiers and clusters")
    c.add_argument("--offload", default=None, metavar="SPEC",
                   help="offload tiers per replica, LMCache-like: cpu:200GiB, cpu:200GiB,ssd:1TiB (optional @GB/s: cpu:100GiB@25)")
    c.add_argument("--replicas", type=int, default=1, help="replicas, each its own engine and KV pool (default 1)")
    c.add_argument("--router", default="round_robin", help=f"which replica serves a call: {', '.join(ROUTERS)}")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def parse_policy_args(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise PolicyError(f"--policy-arg {it!r} is not K=V; write e.g. --policy-arg K=100")
        out[k.strip()] = v.strip()
    return out


def _not_a_file(out: str | None) -> str | None:
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ValueError("names an existing file; give a directory for the results")
    return out


Count = Annotated[int | None, Field(ge=1)]


class RunFlags(Model):
    """`sim run`'s numeric and path flags (None = not given); sweeps check theirs here too."""

    seed: Annotated[int | None, Field(ge=0, lt=2**63, alias="--seed")] = None  # numpy seeds are >= 0
    programs: Annotated[Count, Field(alias="--programs")] = None
    num_blocks: Annotated[Count, Field(alias="--num-blocks")] = None
    block_size: Annotated[Count, Field(alias="--block-size")] = None
    max_num_batched_tokens: Annotated[Count, Field(alias="--max-num-batched-tokens")] = None
    max_num_seqs: Annotated[Count, Field(alias="--max-num-seqs")] = None
    max_model_len: Annotated[Count, Field(alias="--max-model-len")] = None
    replicas: Annotated[Count, Field(alias="--replicas")] = None
    out: Annotated[str | None, AfterValidator(_not_a_file), Field(alias="--out")] = None


def check_knobs(profile: Profile, args) -> None:
    """Refuse bad flags, and flags that contradict what the profile measured."""
    validated(RunFlags, {f.alias: getattr(args, k, None) for k, f in RunFlags.model_fields.items()}, "sim run",
              "see `sim run --help`")
    e = profile.engine
    if args.block_size is not None and args.block_size != int(e["block_size"]):
        raise InputError(f"--block-size {args.block_size} contradicts profile {profile.name!r} (measured with block_size {e['block_size']}); "
                         f"recalibrate with that block size or drop the flag")
    if args.num_blocks is not None and args.num_blocks > int(e["num_gpu_blocks"]):
        raise InputError(f"--num-blocks {args.num_blocks} exceeds the {e['num_gpu_blocks']} KV blocks profile {profile.name!r} "
                         f"allocated; give at most that many")
    if args.max_model_len is not None and args.max_model_len > int(e["max_model_len"]):
        raise InputError(f"--max-model-len {args.max_model_len} exceeds profile {profile.name!r}'s max_model_len {e['max_model_len']}")


# Policies that key decisions on the tool name, and what they do when no call has one.
# (oracle and infercept read the true duration; static-ttl never reads the tool.)
_NO_TOOL = {
    "continuum-static": "it pins only after a named tool, so it pins nothing and equals program-fcfs",
    "continuum": "it learns no per-tool CDF; every TTL comes from the global CDF of all tool times",
    "continuum-offload": "it learns no per-tool CDF; every TTL comes from the global CDF of all tool times",
}


def tool_name_warning(trace, policy) -> str | None:
    """One line when the trace names no tool and the policy would key on tool names."""
    calls = trace["tool_duration_s"].notna()  # rows followed by a tool call
    if not calls.any() or trace.loc[calls, "tool"].notna().any():
        return None
    what = _NO_TOOL.get(policy.name)
    if policy.name == "infercept" and not getattr(policy, "true_tool_time", True):
        what = "with true_tool_time off it estimates every tool time by the mean over all tools"
    return f"the trace has no tool names; {policy.name}: {what}" if what else None


def run(args) -> int:
    policy = make_policy(args.policy, **parse_policy_args(args.policy_arg))
    profile = load_profile(args.profile)
    check_knobs(profile, args)
    tiers = parse_offload(args.offload)
    make_router(args.router)  # an unknown router fails here, before the trace is read
    trace, meta = read_trace(args.trace)
    if args.programs is not None:
        keep = trace["program_id"].drop_duplicates().iloc[: args.programs]
        trace = trace[trace["program_id"].isin(keep)]
    warn = tool_name_warning(trace, policy)
    if warn:
        print(f"warning: {warn}", file=sys.stderr)
    cfg = engine_config(profile, num_gpu_blocks=args.num_blocks, max_num_batched_tokens=args.max_num_batched_tokens,
                        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                        enable_chunked_prefill=False if args.no_chunked_prefill else None)
    if tiers:
        build_tiers(tiers, profile, cfg.block_size)  # a profile without PCIe bandwidth fails here
    arrivals = arrivals_for(trace, args.jps, args.seed)
    n = len(arrivals)
    t0 = time.perf_counter()
    with tqdm(total=n, desc=f"{args.policy}", unit="prog", disable=args.no_progress or not sys.stderr.isatty(), leave=False) as bar:
        res = run_simulation(trace, policy, profile, cfg, arrivals, progress=bar,
                             replicas=args.replicas, router=args.router, offload=tiers)
    wall = time.perf_counter() - t0
    res.summary.update({"trace": str(args.trace), "jps": args.jps, "seed": args.seed, "profile": profile.name,
                        "wall_s": wall, "sim_s_per_wall_s": res.summary["makespan_s"] / wall})
    print(format_summary(res.summary))
    if args.out:
        write_results(Path(args.out), res.turns, res.programs, res.kv_usage, res.summary)
        print(f"wrote {args.out}/summary.json, turns.parquet, programs.parquet, kv_usage.parquet")
    return 0


def format_summary(s: dict) -> str:
    rows = [
        ("policy", s["policy"]), ("programs / calls", f"{s['programs']} / {s['calls']}"),
        ("JCT mean / p50", f"{s['mean_jct']:.2f} s / {s['p50_jct']:.2f} s"),
        ("JCT p90 / p95 / p99", f"{s['p90_jct']:.2f} / {s['p95_jct']:.2f} / {s['p99_jct']:.2f} s"),
        ("throughput", f"{s['jobs_per_s']:.3f} jobs/s, {s['output_tokens_per_s']:.0f} output tok/s"),
        ("mean queueing delay / call", f"{s['mean_queue_delay']:.3f} s"),
        ("prefix cache hit ratio", f"{s['cache_hit_ratio']:.3f}"),
        ("prefill tokens computed / cached", f"{s['prefill_tokens_computed']} / {s['prefill_tokens_cached']}"),
        ("preemptions", s["preemptions"]),
        ("KV usage mean / peak", f"{s['mean_kv_usage']:.1%} / {s['peak_kv_usage']:.1%} of {s['num_gpu_blocks']} blocks"),
        ("pins hit / expired / victim", f"{s['pins_hit']} / {s['pins_expired']} / {s['pins_victim']}"),
        ("pinned block-seconds", f"{s['pinned_block_seconds']:.0f}"),
    ]
    if s.get("replicas", 1) > 1:
        rows.append(("replicas / router", f"{s['replicas']} / {s['router']}"))
        for r in s["per_replica"]:
            rows.append((f"  replica {r['replica']}", f"{r['calls']} calls, KV {r['mean_kv_usage']:.1%} mean, hit {r['cache_hit_ratio']:.3f}"))
    if s.get("offload"):
        rows.append(("offload tiers", ", ".join(f"{n}: {t['bytes_written'] / 1e9:.1f} GB in, {t['bytes_read'] / 1e9:.1f} GB out"
                                                for n, t in s["tiers"].items())))
        rows.append(("CPU hit ratio / reloads", f"{s['cpu_hit_ratio']:.3f} / {s['offload_loads']} loads, {s['reload_s']:.1f} s"))
    if "decisions" in s:
        rows.append(("preserve / discard / swap", " / ".join(str(s["decisions"][k]) for k in ("preserve", "discard", "swap"))))
    if "proxy" in s:
        rows.append(("proxy paused / resumed", f"{s['proxy']['paused']} / {s['proxy']['resumed']} (queued {s['proxy']['queued']})"))
    for tool, t in list(s["ttl_by_tool"].items())[:12]:
        rows.append((f"  TTL {tool}", f"{t['mean_ttl_s']:.2f} s mean over {t['pins']} pins"))
    if "sim_s_per_wall_s" in s:
        rows.append(("simulated s per wall s", f"{s['sim_s_per_wall_s']:.0f} ({s['makespan_s']:.0f} s in {s['wall_s']:.1f} s)"))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)
