"""`--scheduler vllm`: each replica's scheduling is the installed vLLM's own v1 Scheduler and
KV cache manager, driven without a model, on the simulated clock.

Why: the SimPy replica (sim/simpy_replica/engine.py, sim/simpy_replica/scheduler.py) re-implements vLLM's scheduling
(admission, chunking, preemption, prefix hits, eviction) and the policy protocol; this
engine runs vLLM's own code for them instead, so where the two engines disagree on one
run spec the SimPy replica is wrong, or makes a documented simplification
(`benchmarks/twin_check.py`, docs/validation.md). Timing is the same on both: each
SchedulerOutput is one simulated step whose duration is the profile's step model on
that step's (q, k) rows (`PolicyScheduler.features`, the features the SimPy engine
prices).

How:
- The scheduler is `sim.vllm_scheduler.PolicyScheduler` (vLLM's Scheduler with
  the run's policy: the one implementation of the policy protocol inside vLLM), built
  from a VllmConfig made by vLLM's own EngineArgs from the run's limits (block size, KV
  blocks, token budget, sequences, chunked prefill, prefix caching on, max_model_len,
  vLLM 0.32's scheduler_reserve_full_isl) and a one-group KVCacheConfig; the model
  config is the shipped tiny Llama's, only read (no weights, no engine, no worker). It
  gets the simulated clock, the run's policy object and profile, and the policy's
  record of each call (so the policy sees the same records as in the SimPy engine).
- Token ids come from content (sim/kv/content.py): token j of a content run is a 31-bit
  hash of (the run's id, j), so identical content gives identical ids and vLLM's
  hash-chained prefix cache sees exactly the sharing the trace describes. A call's
  output is its content's output run, fed back one stand-in token a step through
  ModelRunnerOutput / update_from_output; vLLM ends the call at max_tokens = its
  output_tokens. Block hashes are vLLM's own (`hash_block_tokens` with the configured
  hash function), memoised per program: a program's tokens are append-only, so a
  turn's hashes are the earlier turns' plus the new blocks' (tests compare them with
  vLLM's request hasher).
- Calls that reach a replica mid-step are added when the step ends (vLLM's engine core
  takes requests between steps), as in the SimPy engine.

- KV the replica did not compute comes in through a KV connector (sim/vllm_replica/connector.py),
  as vLLM admits external KV: offload tiers (`--offload`, LMCache's connector over the
  same tiers as the SimPy replica's, sim/kv/tiers.py: loads at admission charged to the
  step, write-through after prefill steps, the policy's offloads of finished calls and
  dropped pins) and a disaggregated decode replica's handed-over prompts.

Not supported here (refused by `check_supported`, one line): the radix cache (SGLang's).
ThunderAgent's proxy runs in front of these replicas as in
front of SimPy ones (sim/cluster/cluster.py): it routes and holds programs, the engines run vLLM's
defaults.
"""
from __future__ import annotations

import functools
from collections import deque
import math

import numpy as np

from agentsim.errors import InputError
from policies.base import Policy
from sim.hardware import stretch
from sim.replica.call import Call
from sim.kv.tiers import NO_TIER, KVOffload
from sim.replica.clock import step_end
from sim.replica.base import Replica
from sim.hardware.profile import Profile

_MASK31 = (1 << 31) - 1


def vllm_available() -> str | None:
    """None when vLLM's scheduler can be imported, else why not (one line)."""
    import os

    # vLLM's start-up lines (INFO) would bury the run's own output and one-line errors;
    # its logging stays the user's to configure (VLLM_CONFIGURE_LOGGING=1)
    if "VLLM_CONFIGURE_LOGGING" not in os.environ:
        import logging

        os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
        logging.getLogger("vllm").setLevel(logging.ERROR)
    try:
        import vllm  # noqa: F401
        from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
    except Exception as err:  # noqa: BLE001 - missing, or broken against this torch: one line either way
        return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
    return None


def check_supported(cfg) -> None:
    """One InputError line for what `--scheduler vllm` cannot run here (checked before vLLM
    is imported, which takes seconds)."""
    if getattr(cfg, "cache", "vllm") != "vllm":
        raise InputError("--scheduler vllm cannot run --cache radix (SGLang's radix cache is not vLLM's); use --scheduler simpy")
    why = vllm_available()
    if why is not None:
        raise InputError(f"--scheduler vllm needs vLLM 0.32 installed (`make engine`; on a GPU machine pip install "
                         f"'vllm==0.32.*'), and it cannot be imported here ({why}); or use --scheduler simpy")


def run_tokens(cid, n: int) -> list[int]:
    """Token ids of a content run: 31-bit splitmix64 of (hash of the run's id, offset)."""
    base = np.uint64(hash(cid) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = base + (np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z & np.uint64(_MASK31)).astype(np.int64).tolist()


class ProgramTokens:
    """A program's token ids and vLLM block hashes, both append-only over its turns; it is
    the block hasher of the program's requests (each request's tokens are a prefix of them).
    `key_of` maps each hash it made to the content key of its block, across the program's
    contexts: a turn whose prompt does not carry the last output as generated starts a new
    context (sim/kv/content.py `carried`), while blocks of the old one may still be offloaded
    later (a pin dropped, a step in flight), under the keys of the content they hold."""

    __slots__ = ("content", "tokens", "hashes", "key_of", "_bs", "_hash_fn", "_hash_tokens")

    def __init__(self, content, block_size: int, hash_fn, key_of: dict | None = None) -> None:
        from vllm.v1.core.kv_cache_utils import hash_block_tokens

        self.content = content
        self.tokens: list[int] = []
        self.hashes: list = []
        self.key_of: dict = {} if key_of is None else key_of
        self._bs, self._hash_fn, self._hash_tokens = block_size, hash_fn, hash_block_tokens

    def extend(self) -> None:
        """Tokens of every content run appended since (the runs are whole: calls append
        their prompt's segments and their output run before they are submitted)."""
        tokens = self.tokens
        for cid, start, n, _ in self.content.runs:
            if start >= len(tokens):
                tokens.extend(run_tokens(cid, n))

    def __call__(self, request) -> list:
        """vLLM's request block hasher (kv_cache_utils.get_request_block_hasher), memoised."""
        hashes, bs = self.hashes, self._bs
        start, end = len(request.block_hashes), request.num_tokens // bs
        while len(hashes) < end:
            i = len(hashes)
            h = self._hash_tokens(self._hash_fn, hashes[-1] if hashes else None, self.tokens[i * bs:(i + 1) * bs], None)
            hashes.append(h)
            self.key_of[h] = self.content.key(i)
        return hashes[start:end]


@functools.lru_cache(maxsize=4)
def _vllm_config(block_size: int, num_blocks: int, budget: int, seqs: int, chunked: bool, max_model_len: int,
                 reserve_full: bool, connector: bool = False, async_scheduling: bool = False):
    """vLLM's own config for the run's limits, made by vLLM's EngineArgs (its checks
    included) without loading a model or starting an engine; with `connector`, the
    simulator's KV connector (sim/vllm_replica/connector.py: handoffs, offload tiers)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm.engine.arg_utils import EngineArgs

    from sim.hardware.shipped_models import TINY_MODEL

    args = EngineArgs(model=str(TINY_MODEL), skip_tokenizer_init=True, load_format="dummy", dtype="float32",
                      enable_prefix_caching=True, block_size=block_size, num_gpu_blocks_override=num_blocks,
                      max_num_batched_tokens=budget, max_num_seqs=seqs, enable_chunked_prefill=chunked,
                      max_model_len=max_model_len, hf_overrides={"max_position_embeddings": max_model_len})
    if connector:
        from vllm.config import KVTransferConfig

        args.kv_transfer_config = KVTransferConfig(kv_connector="SimConnector", kv_role="kv_both",
                                                   kv_connector_module_path="sim.vllm_replica.connector")
    try:
        config = args.create_engine_config()
    except (ValueError, TypeError) as err:
        raise InputError(f"--scheduler vllm: vLLM refused the engine limits: {' '.join(str(err).split())[:300]}") from None
    config.cache_config.num_gpu_blocks = num_blocks
    config.scheduler_config.scheduler_reserve_full_isl = reserve_full
    config.scheduler_config.async_scheduling = async_scheduling  # off: one step in flight (either engine follows the flag)
    return config


def build_scheduler(cfg, policy: Policy, profile: Profile, clock, connector: bool = False):
    """A PolicyScheduler for the run's limits (`cfg`: sim.hardware.engine_config.EngineConfig) and its
    block hasher's hash function; `connector`: with the KV connector that admits KV the
    replica did not compute (sim/vllm_replica/connector.py)."""
    import torch
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from sim.vllm_replica.scheduler import AsyncPolicyScheduler, PolicyScheduler

    config = _vllm_config(cfg.block_size, cfg.num_gpu_blocks, cfg.max_num_batched_tokens, cfg.max_num_seqs,
                          bool(cfg.enable_chunked_prefill), cfg.max_model_len, bool(cfg.scheduler_reserve_full_isl), connector,
                          cfg.async_scheduling)
    spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=cfg.num_gpu_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(layer_names=["layer.0"], kv_cache_spec=spec)])
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    cls = AsyncPolicyScheduler if cfg.async_scheduling else PolicyScheduler
    sched = cls(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
                block_size=cfg.block_size, hash_block_size=cfg.block_size, log_stats=False,
                policy=policy, profile=profile, clock=clock)
    return sched, hash_fn


class _Pool:
    """What the run's end check and the used-block figures read of a replica's pool."""

    def __init__(self, replica) -> None:
        self.r = replica

    @property
    def num_used(self) -> int:
        return self.r.num_blocks - self.r.core.free_blocks()

    @property
    def num_free(self) -> int:
        return self.r.core.free_blocks()

    def check(self) -> None:
        """No block leaked: every usable block is free (or cached) once the run is over."""
        if self.num_free != self.r.num_blocks:
            raise RuntimeError(f"replica {self.r.index}: {self.num_used} KV blocks still in use at the end of the run")


class _SchedView:
    """The face of a replica's scheduler that clusters, routers and the run's summary read
    (sim/cluster/cluster.py, sim/cluster/router.py, sim/run/simulate.py): queues, pins, preemptions, pool."""

    def __init__(self, replica) -> None:
        self.r = replica
        self.pool = _Pool(replica)

    @property
    def waiting(self) -> list:
        core = self.r.core
        return list(core.waiting) + list(core.kv_holding_waiting)  # not calls still to be added (as SimpyReplica)

    @property
    def running(self) -> list:
        return self.r.core.running

    @property
    def pins(self):
        return self.r.core.pins

    @property
    def pinned_blocks(self) -> int:
        return self.r.core.pinned_blocks

    @property
    def pinned_block_seconds(self) -> float:
        return self.r.core.pinned_block_seconds

    @property
    def preemptions(self) -> int:
        return self.r.core.preemptions

    def prefix_hit(self, call: Call) -> list:
        """Blocks of the call's prompt vLLM's prefix cache holds now (for the prefix router),
        at most num_tokens - 1 tokens' worth, as a lookup at admission."""
        prog = self.r._program(call)
        n = (call.prompt_len - 1) // self.r.cfg.block_size
        prog.extend()
        hashes = prog(_Len(n * self.r.cfg.block_size))
        pool = self.r.core.kv_cache_manager.block_pool
        hit = []
        for h in hashes:
            block = pool.get_cached_block(h, [0])
            if block is None:
                break
            hit.append(block[0])
        return hit


class _Len:
    """A stand-in request for ProgramTokens' hasher: no hashes yet, `num_tokens` tokens."""

    block_hashes = ()

    def __init__(self, n: int) -> None:
        self.num_tokens = n


class VllmReplica(Replica):
    """One replica whose scheduling is vLLM's own (see the module's docstring); the
    interface sim/cluster/cluster.py and sim/run/simulate.py use of sim.simpy_replica.engine.SimpyReplica."""

    def __init__(self, env, cfg, profile: Profile, policy: Policy, on_finish=None, fast_forward: bool = True,
                 tiers=None, index: int = 0) -> None:
        from vllm import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        self._Request, self._MRO, self._Sampling = Request, ModelRunnerOutput, SamplingParams
        self.env, self.cfg, self.profile, self.policy, self.index = env, cfg, profile, policy, index
        self.on_finish = on_finish
        self._calls: dict[str, Call] = {}  # request id -> the simulator's record of the call
        self._requests: dict[str, object] = {}  # request id -> vLLM's Request
        self._programs: dict[str, ProgramTokens] = {}
        self.tier = KVOffload(tiers, cfg.block_size) if tiers else NO_TIER
        self._build(connector=bool(tiers))
        self.sched = _SchedView(self)
        self.arrived_mid_step: list[Call] = []  # calls that arrived mid-step, added at its end
        self._deferred: list[tuple[str, str]] = []  # pin releases asked for mid-step
        self._in_step = False
        self.horizon = self.read_horizon = env.peek  # set by the cluster; unused (no stretches)
        self._wakeup = env.event()
        self._start_accounting()
        self.process = env.process(self._loop())

    def _build(self, connector: bool) -> None:
        self.core, self._hash_fn = build_scheduler(self.cfg, self.policy, self.profile, clock=lambda: self.env.now,
                                                   connector=connector)
        self.core.tier, self.core.block_keys = self.tier, self._block_keys
        if connector:
            self.core.connector.bind(self.tier, self._calls)

    def accept_handoffs(self) -> None:
        """Be a disaggregated decode replica: admit calls with the KV a prefill replica
        handed over (sim/vllm_replica/connector.py); called before anything runs."""
        self._build(connector=True)

    def _block_keys(self, pid: str, blocks: list) -> list:
        """The content key of each of a program's context blocks (None where vLLM's prefix
        cache does not hold the block: a partial last one), as an offload tier names chunks."""
        key_of = self._programs[pid].key_of
        return [None if b.block_hash is None else key_of[b.block_hash[:-4]] for b in blocks]  # less vLLM's group id

    @property
    def received_tokens(self) -> int:
        """Tokens admitted from handoffs (0 unless accept_handoffs)."""
        connector = self.core.connector
        return connector.received_tokens if connector is not None else 0

    # --- what the cluster reads ---------------------------------------------------------
    def used_blocks(self) -> int:
        return self.sched.pool.num_used

    def state(self) -> str:
        core = self.core
        return (f"replica {self.index} (vLLM scheduler): {len(core.waiting) + len(core.kv_holding_waiting)} waiting, "
                f"{len(core.running)} running, pinned {core.pinned_blocks} blocks for {len(core.pins)} programs, "
                f"free {core.free_blocks()} of {self.num_blocks} blocks")

    # --- requests -----------------------------------------------------------------------
    def _program(self, call: Call) -> ProgramTokens:
        pid = call.req.program_id
        prog = self._programs.get(pid)
        if prog is None or prog.content is not call.content:
            prog = self._programs[pid] = ProgramTokens(call.content, self.cfg.block_size, self._hash_fn,
                                                       None if prog is None else prog.key_of)
        return prog

    def submit(self, call: Call) -> None:
        """vLLM's engine core takes requests between steps (as SimpyReplica.submit)."""
        call.replica = self.index
        if self._in_step:
            self.arrived_mid_step.append(call)
            return
        self._deliver(call)

    def _deliver(self, call: Call) -> None:
        prog = self._program(call)
        prog.extend()
        rid = call.req.req_id
        h = call.req.hint  # a client's retention hint reaches vLLM as extra_args do (sim/replica/job_meta.py)
        params = self._Sampling(max_tokens=call.max_output, ignore_eos=True, detokenize=False, temperature=0.0,
                                extra_args=None if h is None else {"kv_hints": {"priority": h.priority, "ttl": h.ttl,
                                                                                "session": h.session}})
        request = self._Request(rid, prog.tokens[:call.prompt_len], params, None, arrival_time=self.env.now,
                                block_hasher=prog)
        self._calls[rid], self._requests[rid] = call, request
        self.core.records[rid] = call.req
        if call.received_blocks:  # a prefill replica handed its prompt over (sim/cluster/disagg.py)
            self.core.connector.expect(rid, call.received_blocks * self.cfg.block_size)
            self.core.arrived[rid] = call.req.arrival
            call.received_blocks = 0
        self.core.add_request(request)
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def release_pin_later(self, program_id: str, reason: str) -> None:
        """As SimpyReplica.release_pin_later: mid-step it waits for the step's end."""
        if program_id not in self.core.pins:
            return
        if self._in_step:
            self._deferred.append((program_id, reason))
            return
        self.core.release_pin(program_id, self.env.now, reason)
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    # --- the step loop ------------------------------------------------------------------
    def _loop(self):
        """vLLM's engine core: schedule a step, run it, apply its output; with async
        scheduling (EngineCore.step_with_batch_queue, two batches) the next step is scheduled
        while one runs, from the state before that one's output, and runs right after it."""
        env, core = self.env, self.core
        depth = 2 if self.cfg.async_scheduling else 1
        in_flight: deque = deque()  # batches scheduled and not yet applied, oldest first
        empty_behind = None  # async: an empty output queued behind the step in flight (applied after it)
        spin_t, spins = -1.0, 0  # a watchdog, as SimpyReplica's: passes at one simulated instant
        while True:
            if env.now != spin_t:
                spin_t, spins = env.now, 0
            else:
                spins += 1
                if spins >= 100_000:
                    from agentsim.errors import SimulationError

                    raise SimulationError(f"no progress at t={env.now:.3f} ({spins} scheduler passes without the "
                                          f"simulated clock advancing): {self.state()}")
            for pid, reason in self._deferred:
                core.release_pin(pid, env.now, reason)
            self._deferred.clear()
            if len(in_flight) + (empty_behind is not None) < depth and core.has_requests():
                now = env.now
                before = (core.preemptions, len(core.pins), core.free_blocks())
                batch = self._schedule(now, in_flight[-1][2] if in_flight else now)
                if batch[3] is not None:
                    in_flight.append(batch)
                    if len(in_flight) < depth:
                        continue  # schedule the next one at once
                elif in_flight:
                    # async: vLLM queues the empty output behind the step in flight, where it
                    # takes the queue's last place: nothing is scheduled before that step ends
                    empty_behind = batch[0]
                else:
                    self._apply_empty(batch[0])
                    if (core.preemptions, len(core.pins), core.free_blocks()) != before:
                        # it preempted every running call, or dropped pins: vLLM's engine core
                        # schedules again at once (an empty step costs no model time)
                        continue
            if not in_flight:
                # nothing runs: only an arrival, a release or a pin expiry changes that
                now = env.now
                expiry = min((p.expiry for p in self.policy.pins.values() if p.expiry > now), default=math.inf)
                self._wakeup = env.event()
                yield self._wakeup if math.isinf(expiry) or not core.has_requests() else (
                    self._wakeup | env.timeout(expiry - now))
                continue
            self._in_step = True
            yield step_end(env, in_flight[0][2], self.index)  # its end exactly (a step scheduled ahead starts at the one before's end)
            self._in_step = False
            out, dt, _, rows = in_flight.popleft()
            self._apply(out, dt, rows)
            if empty_behind is not None:
                self._apply_empty(empty_behind)
                empty_behind = None
            if self.arrived_mid_step:
                for call in self.arrived_mid_step:
                    self._deliver(call)
                self.arrived_mid_step.clear()

    def _schedule(self, now: float, start: float):
        """One schedule() at `now` of a step that runs from `start` (a step scheduled ahead
        waits for the one before it): (output, its time, its end, per request (computed
        tokens after the step, samples a token)); (output, 0, start, None) when it scheduled
        nothing (for _apply_empty)."""
        core, requests, calls = self.core, self._requests, self._calls
        out = core.schedule()
        if not out.total_num_scheduled_tokens:
            return out, 0.0, start, None
        scheduled = out.num_scheduled_tokens
        for rid in [new.req_id for new in out.scheduled_new_reqs] + sorted(out.scheduled_cached_reqs.resumed_req_ids):
            call = calls[rid]  # admitted: the GPU prefix hit is what it did not compute or load
            call.admit(requests[rid].num_computed_tokens - scheduled[rid] - call.admission_loaded_tokens, call.admission_loaded_tokens)
            if call.scheduled_at is None:
                call.scheduled_at = now
                call.cached_tokens = call.admissions[0][0]
        rows = {}
        for rid, q in scheduled.items():
            r = requests[rid]
            after = r.num_computed_tokens
            if after - q < r.num_prompt_tokens:  # prompt tokens computed (a recompute counts again)
                calls[rid].computed_prompt_tokens += min(after, r.num_prompt_tokens) - (after - q)
            rows[rid] = (after, not r.is_prefill_chunk)
        dt, _ = self.tier.price_step(self.profile.step_time(*core.features(out)), start)
        used = self.sched.pool.num_used
        _, self._used_area, self.busy_time, end = stretch.account_steps(
            [dt], [0], used, self._used_area, self.busy_time, start,
            self.kv_samples[-1][0] if self.kv_samples else -math.inf, self.kv_samples, core.pinned_blocks)
        self.peak_used = max(self.peak_used, used)
        return out, dt, start + dt, rows

    def _apply_empty(self, out) -> None:
        """An output that scheduled nothing: no model time, applied when it leaves vLLM's
        batch queue (the adapter times its steps in that order)."""
        self.core.update_from_output(out, self._MRO(req_ids=[], req_id_to_index={}))

    def _apply(self, out, dt: float, rows: dict) -> None:
        """The step's output at its end: prefill chunks written through, one token sampled
        per request that finished its known tokens, finished calls handed on."""
        core, requests, calls, env = self.core, self._requests, self._calls, self.env
        self.steps += 1
        ids = list(rows)
        if self.tier.enabled:  # LMCache stores the new full chunks of prefill steps (as sim/simpy_replica/scheduler.py complete)
            for rid in ids:
                after = rows[rid][0]
                if after - out.num_scheduled_tokens[rid] < requests[rid].num_prompt_tokens:
                    self.tier.write_through(calls[rid], after)
        sampled = [[self._programs[calls[rid].req.program_id].tokens[rows[rid][0]]] if rows[rid][1] else [] for rid in ids]
        core.update_from_output(out, self._MRO(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                               sampled_token_ids=sampled))
        t = env.now
        timed = core.timed_steps  # the adapter adds each step's time itself (a policy that reads it)
        for rid in ids:
            r, call = requests[rid], calls[rid]
            if not timed:
                call.req.exec_time += dt
            call.num_output = r.num_output_tokens
            if call.first_token_at is None and call.num_output:
                call.first_token_at = t
            if r.is_finished():
                call.finished_at = t
                call.preemptions = r.num_preemptions
                del requests[rid], calls[rid]
                if call.req.is_last_step:
                    self._programs.pop(call.req.program_id, None)
                if self.on_finish is not None:
                    self.on_finish(call, t)
