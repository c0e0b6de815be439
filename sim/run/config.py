"""One run specification: `SimConfig` (what to simulate) and `build_run` (the one place a
config becomes a simulation).

Why: a run used to be assembled five ways (`sim run`, sweep points through an argparse
shim, validation, benchmarks, tests), each re-checking a different subset of the
limits. Now every caller fills in a `SimConfig` — `sim run` from its flags and an
optional `--config FILE`, a sweep point from its axes (an axis is a leaf field name:
`num_gpu_blocks`, `router`; any other axis is a parameter of the point's policy) — and calls
`build_run`, then `execute`. Each field carries its help text; the `sim run` flags take
theirs from here.

`Run.config` is the *resolved* config: the profile named, the engine limits and every
policy parameter filled in from the profile and the policy's defaults. `sim run` writes
it as config.json beside summary.json; `sim run --config DIR/config.json` reproduces the
run exactly (on the same code and files).
"""
from __future__ import annotations

import functools
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from policies.base import Policy, PolicyError
from policies.registry import make_policy, params_model, policy_params
from sim.kv.tiers import TierSpec, build_tiers, parse_offload
from sim.cluster.disagg import DEFAULT_LINK, Disagg, MAX_LOCAL_PREFILL, MAX_PREFILL_QUEUE, check_replicas, make_disagg
from sim.hardware.profile import DEFAULT_PROFILE, SAMPLING_MODES, Profile, load_profile
from sim.cluster.router import Router, make_router, router_args, router_names
from sim.hardware.engine_config import RENAMED_FIELDS, EngineConfig, renamed_flag
from sim.run.simulate import arrivals_for, engine_config, execute  # noqa: F401 - execute: runs are built and run here
from sim.run.metrics import METRICS_AT
from sim.run.workload import closed_loop_arrivals
from agentsim.bounds import COUNT_MAX, SEED_MAX
from agentsim import requires
from agentsim.errors import InputError
from agentsim.resources import BLOCK_BYTES, CALL_BYTES, REPLICA_BYTES, check_memory
from traces.schema import Columns, columns, read_columns
from traces.transform import repeat_turns
from traces.validation import JSONBool, JSONFloat, JSONInt, describe, validated

if TYPE_CHECKING:
    import pandas as pd

Count = Annotated[JSONInt, Field(ge=1, le=COUNT_MAX)]


def OneOf(names: tuple[str, ...], what: str):  # noqa: N802 - a type, used as one
    """A string that must be one of `names` (a field's validator, one line naming the choices)."""
    def known(v: str) -> str:
        if v not in names:
            raise ValueError(f"no such {what}; give one of: {', '.join(names)}")
        return v
    return Annotated[str, AfterValidator(known)]


CACHES = ("vllm", "radix")  # KV cache models of a replica (sim/kv/block_pool.py, sim/kv/radix_cache.py)
WORKLOAD_MODES = ("open", "closed")  # arrivals, or N programs in flight (sim/run/workload.py)
FLAG_NAMES = {"mode": "workload"}  # leaf -> `sim run` flag where they differ (`--workload closed`)
SCHEDULERS = ("simpy", "vllm")  # a replica's scheduler: the SimPy model, or vLLM's own Scheduler (sim/vllm_replica/engine.py)
WorkloadMode = OneOf(WORKLOAD_MODES, "workload mode")
MetricsView = OneOf(METRICS_AT, "view")
SchedulerKind = OneOf(SCHEDULERS, "scheduler")
SamplingMode = OneOf(SAMPLING_MODES, "sampling mode")
CacheModel = OneOf(CACHES, "cache model")


class _Section(BaseModel):
    # a config file is external input: unknown fields are typos, numbers are numbers
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class WorkloadConfig(_Section):
    trace: str = Field("swebench", description="bundled trace name (swebench, bfcl) or parquet path")
    programs: Count | None = Field(None, description="use only the first N programs")
    turn_repeat: Annotated[JSONInt, Field(ge=1, le=COUNT_MAX)] = Field(
        1, description="turns xN, tokens /N (the paper's Fig. 14; traces/transform.py)")
    jps: JSONFloat | None = Field(None, description="program arrivals per second (Poisson); default: the trace's arrivals, else 0.2")
    seed: Annotated[JSONInt, Field(ge=0, le=SEED_MAX)] = Field(0, description="arrival seed")
    rep: Annotated[JSONInt, Field(ge=0, le=SEED_MAX)] = Field(
        0, description="repetition: rep r > 0 draws arrivals from SeedSequence([seed, r])")
    mode: WorkloadMode = Field(
        "open", description="open: programs arrive (the trace's arrivals, or Poisson at jps); closed: --concurrency programs "
                            "in flight, the next one (in trace order) starting when one finishes, as RL rollouts or a batch evaluation")
    concurrency: Count | None = Field(None, description="with --workload closed: programs in flight at once")



class PolicyConfig(_Section):
    name: str = Field("vllm", description="the retention/scheduling policy (see `sim run --help`)")
    args: dict[str, Any] = Field(default_factory=dict, description="the policy's parameters (name -> value)")


class EngineLimits(_Section):
    profile: str | None = Field(None, description=f"hardware profile JSON or bundled name (default {DEFAULT_PROFILE})")
    num_gpu_blocks: Count | None = Field(None, description="GPU KV blocks (at most the profile's)")
    block_size: Count | None = Field(None, description="tokens per KV block (must equal the profile's)")
    max_num_batched_tokens: Count | None = Field(None, description="token budget of one engine step")
    max_num_seqs: Count | None = Field(None, description="calls running at once")
    max_model_len: Count | None = Field(None, description="longest context (at most the profile's)")
    enable_chunked_prefill: JSONBool | None = Field(None, description="split long prompts over steps (off: admit only whole prompts)")
    scheduler_reserve_full_isl: JSONBool | None = Field(
        None, description="admit a waiting call only when blocks for its whole prompt are free, not just its first chunk (vLLM's scheduler_reserve_full_isl)")
    fast_forward: JSONBool = Field(True, description="run decode-only stretches in one event (same results; off: step by step)")
    async_scheduling: JSONBool = Field(
        False, description="schedule asynchronously, as vLLM 0.32 does by default on a GPU (the next step is scheduled "
                           "while one runs); not with --cache radix")
    metrics_at: MetricsView = Field(
        "engine", description="TTFT, TPOT, ITL and E2EL (vLLM bench's names) as the engine sees them, from a call's "
                              "arrival at the engine core, or as a benchmark client does: plus the API server's time per "
                              "request (HTTP, parsing, streaming; vLLM's hand-off to the engine core and back) from the "
                              "profile's `server` section, added after the run (the steps do not change); client or engine")
    sampling: SamplingMode | None = Field(
        None, description="how the calls sample (greedy, random: temperature > 0, top-p: with or without top-k), priced "
                          "from the profile's `sampler` section beyond the sampler its step times hold (a step samples "
                          "a row of logits per call it schedules; default: as the profile's steps were measured)")
    scheduler: SchedulerKind = Field(
        "simpy", description="the replica's scheduler: simpy (the simulator's model of vLLM, fast) or vllm (the installed "
                             "vLLM 0.32's own Scheduler and KV cache manager, no model, same step times; docs/validation.md)")




class ClusterConfig(_Section):
    replicas: Count = Field(1, description="replicas, each its own engine and KV pool")
    router: str | None = Field(None, description=f"which replica serves a call: {', '.join(router_names())} "
                                                  "(round_robin by default; installed plugins add theirs)")
    router_args: dict[str, Any] = Field(
        default_factory=dict, description="the router's parameters (name -> value), e.g. cache_aware's cache_threshold "
                                          "(`sim run --router-arg K=V`; sim/cluster/router.py)")
    offload: str | None = Field(
        None, description="offload tiers per replica, LMCache-like: cpu:200GiB, cpu:200GiB,ssd:1TiB (optional @GB/s: cpu:100GiB@25)")
    disagg: str | None = Field(
        None, description="prefill/decode disaggregation xPyD, e.g. 1P1D or 2P1D: x prefill + y decode replicas, the KV "
                          "handed over a link (default off; --replicas must be x+y or left at 1; docs/disaggregation.md)")
    disagg_link: str = Field(
        DEFAULT_LINK, description="with --disagg, the prefill->decode KV link: rdma-ndr (InfiniBand 400 Gb/s, the default), "
                                  "rdma-hdr, nvlink4, nvlink5 (figures and sources: sim/hardware/specs/gpus.json kv_transfer)")
    disagg_local_prefill: Annotated[JSONInt, Field(ge=0, le=COUNT_MAX)] = Field(
        MAX_LOCAL_PREFILL, description="with --disagg, a prefill of at most this many tokens the decode replica has not "
                                       "cached runs on it (Dynamo's max_local_prefill_length)")
    disagg_prefill_queue: Annotated[JSONInt, Field(ge=0, le=COUNT_MAX)] = Field(
        MAX_PREFILL_QUEUE, description="with --disagg, prefill on the decode replica while this many calls wait for a "
                                       "prefill replica (Dynamo's max_prefill_queue_size)")
    cache: CacheModel = Field(
        "vllm", description="each replica's KV cache model: vllm (vLLM's block pool, the default) or radix (SGLang's radix tree: "
                            "unlocked leaves evicted LRU first; matched in whole blocks; docs/model.md)")



class SimConfig(_Section):
    """Everything a run depends on besides the code and the files it names."""

    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    engine: EngineLimits = Field(default_factory=EngineLimits)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)

    def to_json(self) -> str:
        """Every field but those whose condition fails (agentsim/requires.py: a flag given
        without its condition is refused, so a rerun of this file must not give them)."""
        data = self.model_dump(mode="json")
        for sec, field in requires.inapplicable(self):
            data[sec].pop(field, None)
        return json.dumps(data, indent=2) + "\n"


SECTIONS = {"workload": WorkloadConfig, "policy": PolicyConfig, "engine": EngineLimits, "cluster": ClusterConfig}


def scalar_kind(annotation) -> type | None:
    """bool, int, float or str: the scalar type under Optional/Annotated."""
    for t in (bool, int, float, str):
        if annotation is t:
            return t
    for a in typing.get_args(annotation):
        k = scalar_kind(a)
        if k is not None:
            return k
    return None


def leaves() -> dict[str, tuple[str, str, type, object, str]]:
    """Flat name -> (section, field, scalar type, default, help) of every scalar field: the
    names sweep axes and `sim run` flags use (the policy's name is `policy`)."""
    out = {}
    for sec, model in SECTIONS.items():
        for name, f in model.model_fields.items():
            if sec == "policy":
                if name == "name":
                    out["policy"] = (sec, name, str, f.default, f.description)
                continue
            if typing.get_origin(f.annotation) is not dict:  # not router_args: a mapping, given as --router-arg K=V
                out[name] = (sec, name, scalar_kind(f.annotation), f.default, f.description)
    return out


def from_flat(values: dict[str, object], policy_args: dict | None = None, base: dict | None = None,
              router_args: dict | None = None) -> dict:
    """A nested config dict: `base` (a file's) with leaf values (flat names) laid over it,
    and policy or router parameters added to the file's."""
    data = {s: dict(v) for s, v in (base or {}).items()} if isinstance(base, dict) else {}
    known = leaves()
    for k, v in values.items():
        sec, field = known[k][:2]
        data.setdefault(sec, {})[field] = v
    for sec, field, extra in (("policy", "args", policy_args), ("cluster", "router_args", router_args)):
        if extra:
            part = data.setdefault(sec, {})
            part[field] = {**(part.get(field) or {}), **extra}
    return data


def parse_config(data: object, where: str, style: str = "field") -> SimConfig:
    """`data` checked against SimConfig; one InputError line naming `where` and the field:
    as a dotted field ('engine.num_gpu_blocks'), a flag ('--num-gpu-blocks', style "flag") or a
    sweep axis ('num_gpu_blocks', style "axis")."""
    engine = data.get("engine") if isinstance(data, dict) else None
    for old in RENAMED_FIELDS.keys() & (engine.keys() if isinstance(engine, dict) else set()):
        new = RENAMED_FIELDS[old]
        shown = (old, new) if style == "axis" else (f"engine.{old}", f"engine.{new}")
        raise InputError(f"{where}: {'axis' if style == 'axis' else 'field'} '{shown[0]}' is now '{shown[1]}'; rename it")
    try:
        return SimConfig.model_validate(data)
    except ValidationError as e:
        msg = describe(e)
        loc = e.errors()[0]["loc"]
        if style != "field" and loc:
            name = "policy" if tuple(loc[:2]) == ("policy", "name") else str(loc[-1])
            shown = "--" + FLAG_NAMES.get(name, name).replace("_", "-") if style == "flag" else name
            msg = msg.replace(f"field '{'.'.join(map(str, loc))}'", f"{'field' if style == 'flag' else 'axis'} '{shown}'", 1)
        raise InputError(f"{where}: {msg}") from None


def read_config(path: str | Path) -> dict:
    """A JSON or YAML config file as a dict (checked by parse_config)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"--config {str(p)!r}: cannot read it ({e.strerror}); give a JSON or YAML file") from None
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - yaml and json raise their own types; one line either way
        first = " ".join(str(e).split())[:200]
        raise InputError(f"--config {str(p)!r} is not valid {'YAML' if p.suffix.lower() in ('.yaml', '.yml') else 'JSON'} "
                         f"({first}); fix the file") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"--config {str(p)!r}: give an object with sections {', '.join(SECTIONS)}, not {type(data).__name__}")
    where = f"--config {str(p)!r}"
    c = parse_config(data, where)  # a bad file is named as such, before any flag is laid over it
    try:
        known = policy_params(c.policy.name)
    except PolicyError as e:
        raise InputError(f"{where}: field 'policy.name': {e}") from None
    for k in c.policy.args:
        if k not in known:
            raise InputError(f"{where}: field 'policy.args.{k}': policy {c.policy.name!r} has no parameter {k!r}; "
                             f"known: {', '.join(known) or 'none'}")
    validated(params_model(c.policy.name), c.policy.args, f"{where}: policy.args")
    return data


def check_workload(w: WorkloadConfig) -> None:
    """A closed loop needs its size (flags that apply only to one mode: agentsim/requires.py)."""
    if w.mode == "closed" and w.concurrency is None:
        raise InputError("--workload closed needs --concurrency N (the programs in flight at once)")


def check_limits(profile: Profile, e: EngineLimits) -> None:
    """Refuse engine limits that contradict what the profile measured."""
    pe = profile.engine
    if e.block_size is not None and e.block_size != pe.block_size:
        raise InputError(f"--block-size {e.block_size} contradicts profile {profile.name!r} (measured with block_size {pe.block_size}); "
                         f"recalibrate with that block size or drop the flag")
    if e.num_gpu_blocks is not None and e.num_gpu_blocks > pe.num_gpu_blocks:
        raise InputError(f"--num-gpu-blocks {e.num_gpu_blocks} exceeds the {pe.num_gpu_blocks} KV blocks profile {profile.name!r} "
                         f"allocated; give at most that many")
    if e.max_model_len is not None and e.max_model_len > pe.max_model_len:
        raise InputError(f"--max-model-len {e.max_model_len} exceeds the max_model_len {pe.max_model_len} of profile {profile.name!r}")


def check_run_memory(rows: int, turn_repeat: int, replicas: int, blocks: int) -> None:
    """A run keeps every call's record and each replica's KV pool: refused before it starts
    when they cannot fit (agentsim/resources.py)."""
    calls = rows * turn_repeat
    check_memory(calls * CALL_BYTES, f"{calls:,} calls ({rows:,} trace rows x --turn-repeat {turn_repeat})",
                 "give fewer --programs or a smaller --turn-repeat")
    check_memory(replicas * (blocks * BLOCK_BYTES + REPLICA_BYTES), f"--replicas {replicas} of {blocks:,} KV blocks each",
                 "give fewer --replicas or --num-gpu-blocks")


@functools.lru_cache(maxsize=8)
def _trace(name: str, programs: int | None, turn_repeat: int) -> Columns:
    trace, _ = read_columns(name)
    return _cut(trace, programs, turn_repeat)


def _cut(trace: Columns, programs: int | None, turn_repeat: int) -> Columns:
    """The first `programs` programs of a checked trace, turns repeated `turn_repeat` times."""
    if programs is not None:
        pid = trace["program_id"]
        starts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])  # rows are sorted by program
        trace = trace.take(slice(0, starts[programs] if programs < len(starts) else len(pid)))
    return trace if turn_repeat == 1 else columns(repeat_turns(trace.frame(), turn_repeat))


def _resolved_path(name: str) -> str:
    """A file path made absolute (the config may be rerun elsewhere); a bundled name as is."""
    p = Path(name)
    return str(p.resolve()) if p.exists() else name


@dataclass
class Run:
    """A built run (sim.run.config.build_run), ready for `execute` (once: the policy and the
    router keep state)."""

    config: SimConfig  # resolved: profile, engine limits and policy parameters filled in
    trace: Columns
    policy: Policy
    profile: Profile
    cfg: EngineConfig
    arrivals: np.ndarray
    tiers: tuple[TierSpec, ...]  # specs: each replica builds its own tiers (they hold state)
    router: Router
    disagg: Disagg | None = None

    @property
    def scheduler(self) -> str:
        return self.config.engine.scheduler

    @property
    def replicas(self) -> int:
        return self.config.cluster.replicas

    @property
    def fast_forward(self) -> bool:
        return self.config.engine.fast_forward

    @property
    def metrics_at(self) -> str:
        return self.config.engine.metrics_at


def build_run(config: SimConfig, *, trace: pd.DataFrame | Columns | None = None, profile: Profile | None = None,
              arrivals: np.ndarray | None = None, policy: Policy | None = None) -> Run:
    """Check `config` against the profile and build its run; every problem is an InputError
    or PolicyError here, before anything is simulated or written. The one way to make a
    run; `execute` simulates it.

    A caller holding the objects themselves passes them: `trace` (cut and repeated as the
    workload says), `profile` (its engine limits are not checked: validation gives the real
    engine's own), `arrivals` (instead of jps/seed), `policy` (a Policy of its own, instead
    of config.policy; the resolved config then names it, without parameters)."""
    w, e, c = config.workload, config.engine, config.cluster
    own_policy = policy is not None
    requires.check("run", config if not own_policy else config.model_copy(update={"policy": PolicyConfig()}))
    if not own_policy:
        policy = make_policy(config.policy.name, **config.policy.args)
    if profile is None:
        profile = load_profile(e.profile)
        check_limits(profile, e)
    profile = profile.scheduled(e.async_scheduling).with_sampling(e.sampling)
    if e.metrics_at == "client" and profile.server is None:
        raise InputError(f"--metrics-at client needs the API server's time per request, the profile's `server` section; "
                         f"profile {profile.name!r} has none: add it with benchmarks/server_time.py --into, or drop the flag")
    tiers = parse_offload(c.offload)
    router = make_router(c.router, c.router_args)  # an unknown router or parameter fails here, before the trace is read
    disagg = make_disagg(c.disagg, c.disagg_link, c.disagg_local_prefill, c.disagg_prefill_queue)  # bad spec or link: here too
    if disagg is not None:
        check_replicas(disagg.spec, (disagg.prefill, disagg.decode), c.replicas)
    check_workload(w)
    cfg = engine_config(profile, num_gpu_blocks=e.num_gpu_blocks, block_size=e.block_size, max_num_batched_tokens=e.max_num_batched_tokens,
                        max_num_seqs=e.max_num_seqs, max_model_len=e.max_model_len,
                        enable_chunked_prefill=e.enable_chunked_prefill, scheduler_reserve_full_isl=e.scheduler_reserve_full_isl, cache=c.cache,
                        async_scheduling=e.async_scheduling)
    base = _trace(w.trace, w.programs, 1) if trace is None else _cut(columns(trace), w.programs, 1)
    check_run_memory(len(base["program_id"]), w.turn_repeat, c.replicas if disagg is None else disagg.prefill + disagg.decode,
                     cfg.num_gpu_blocks)
    trace = _trace(w.trace, w.programs, w.turn_repeat) if trace is None else _cut(columns(trace), w.programs, w.turn_repeat)
    if tiers:
        build_tiers(tiers, profile, cfg.block_size)  # sizes against the profile's chunk; each replica builds its own
    if e.scheduler == "vllm":  # what vLLM's scheduler cannot run this way, or no vLLM: one line, before anything runs
        from sim.vllm_replica.engine import check_supported

        check_supported(cfg)
    if arrivals is None and w.mode == "closed":
        arrivals = closed_loop_arrivals(len(np.unique(np.asarray(trace["program_id"]))), w.concurrency)
    elif arrivals is None:
        seed = w.seed if w.rep == 0 else int(np.random.SeedSequence([w.seed, w.rep]).generate_state(1)[0])
        arrivals = arrivals_for(trace, w.jps, seed)
    args = {} if own_policy else params_model(config.policy.name).model_validate(config.policy.args).model_dump(mode="json")
    resolved = config.model_copy(update={
        "workload": w.model_copy(update={"trace": _resolved_path(w.trace)}),
        "policy": PolicyConfig(name=policy.name, args=args),
        "engine": e.model_copy(update={
            "profile": _resolved_path(e.profile) if e.profile else profile.name, "num_gpu_blocks": cfg.num_gpu_blocks,
            "block_size": cfg.block_size, "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_num_seqs": cfg.max_num_seqs, "max_model_len": cfg.max_model_len,
            "enable_chunked_prefill": cfg.enable_chunked_prefill, "scheduler_reserve_full_isl": cfg.scheduler_reserve_full_isl}),
        "cluster": c.model_copy(update={"router": router.name, "router_args": router_args(router.name, c.router_args),
                                        **({} if disagg is None else {
            "disagg": disagg.spec, "disagg_link": disagg.link.name, "replicas": disagg.prefill + disagg.decode})}),
    })
    return Run(resolved, trace, policy, profile, cfg, np.asarray(arrivals, dtype=float), tiers, router, disagg)
