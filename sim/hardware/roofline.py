"""Roofline profiles: a labelled estimate of the step-time model for a GPU and a model
from public specs (sim/hardware/specs/gpus.json, sim/hardware/specs/models.json), with efficiency
constants fitted on one real measurement (H100 probes, sim/hardware/specs/roofline_fit.json).

Per step, on each of the N GPUs of a replica (sim/hardware/profile.py's features):
  c0  weights streamed once (bytes / (BW * eff_mem)) + a fixed step overhead
      + the latency of the collectives per layer (N > 1)
  c1  GEMM FLOPs 2 * active layer params per token / (peak * eff_gemm)
      + collective bytes per token / link_bw (N > 1)
      + sliding-window layers' attention at the window bound (Gemma-3)
  c2  attention 4 * full-attention layers * q_heads * head_dim FLOPs per (query, key) pair
      / (peak * eff_attn), halved: sum(q*k) counts a fresh chunk's full square, causal
      attention computes half
  c5  = c2: cached keys are attended in full, so pairs to them get the other half
  c3  LM head per scheduled sequence (vLLM takes logits of each sequence's last token only)
      + sliding-window layers' KV read at the window bound
  c4  KV of the full-attention layers read once per step per context token / (BW * eff_kv)
A linear sum, not max(compute, memory): the fitted efficiencies absorb the overlap, which is
why they are constants of this model and not hardware efficiencies.

Layouts of a replica of N GPUs (one node):
  tp  (--tp N) heads, MLP columns and every expert's columns split N ways; 2 ring
      all-reduces of the hidden state per layer.
  ep  (--ep N, MoE only) experts whole, E/N per GPU; attention, dense layers, shared experts
      and embeddings replicated, each GPU serving its own sequences (vLLM's data-parallel
      attention with --enable-expert-parallel); per MoE layer one all-to-all dispatch and one
      combine of top-k copies of each token's hidden state.
MoE: compute counts the active parameters (top-k + shared experts); c0 streams all but the
routed experts, and `routed` every routed expert, of which a step of T tokens reads the
share 1 - (1 - k/E)^T (uniform routing: a decode of one sequence reads k of E, a batch of
40 sequences 87% of GLM-4.5's, a prefill of hundreds of tokens all; sim/hardware/profile.py).
FP8 (dtype_bytes 1): linear layers stored and streamed at 1 byte and multiplied at the GPU's
FP8 rate (bf16 where it has none); embeddings, norms, router and biases stay bf16;
kv_dtype_bytes 1 halves the KV. Attention math stays at the bf16 rate.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from agentsim.errors import InputError
from sim.hardware import measured_sampler
from sim.hardware.spec_tables import SPEC_DIR, find_gpu, find_model, spec_key, spec_table
from sim.hardware.model_shape import (ACT_BYTES, KV_REFERENCE_TOKENS, attention_layers, kv_bytes_per_token,
                                      kv_bytes_per_token_charged, kv_dtype_bytes, kv_heads_per_gpu, kv_layers_charged,
                                      layer_params, lm_head_params, param_counts, per_gpu, weight_bytes_streamed,
                                      weight_bytes_total)

FIT_FILE = SPEC_DIR / "roofline_fit.json"
REPO_ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS_DIR = Path(__file__).parent / "measurements"  # shipped probe files, provenance in its README.md
DEFAULT_MEASUREMENTS = MEASUREMENTS_DIR / "h100" / "llama3.1-8b-shape-torch-probes.json"
KV_CACHE_DTYPES = ("auto", "fp8")  # vLLM's --kv-cache-dtype values modelled (fp8 = e4m3, 1 B an element)
KINDS = ("fresh_prefill", "cached_prefill", "decode")
# The efficiencies fitted on the probes, with their bounds (efficiencies cannot exceed 1).
EFF_NAMES = ("eff_mem", "eff_kv", "eff_gemm", "eff_attn", "step_overhead_s")
EFF_LOW, EFF_HIGH = (0.05, 0.05, 0.05, 0.05, 0.0), (1.0, 1.0, 1.0, 1.0, 0.05)


def links() -> dict:
    return spec_table("gpus.json")["links"]


def load_fit() -> dict:
    return json.loads(FIT_FILE.read_text())


def _link(gpu: dict, eff: dict) -> tuple[float, float, str]:
    """(effective bytes/s, per-collective latency s, what) of the GPU-GPU link."""
    lk, ic = links(), gpu["interconnect"]
    if ic["kind"].lower().startswith("nvlink"):
        return ic["GBps_per_direction"] * 1e9 * lk["nvlink_efficiency"], lk["nvlink_allreduce_latency_s"], "NVLink"
    return ic["GBps_per_direction"] * 1e9 * eff["eff_pcie"], lk["pcie_allreduce_latency_s"], "PCIe"


# aiconfigurator-core 0.12.0's measured all-reduce of vLLM on 4 L40S (systems/data/l40s/comm/
# vllm/0.22.0/custom_allreduce_perf.parquet): 134,217,728 bf16 elements in 108.5 ms
PCIE_ALLREDUCE_MEASURED = "vLLM's all-reduce measured on 4 L40S (aiconfigurator-core 0.12.0's database) is about 7x slower"


def caveats(gpu: dict, model: dict, eff: dict, n: int) -> list[str]:
    """What a user must know of a profile where independent measurements disagree with this
    model (docs/profiles.md): collectives of n GPUs over PCIe, whose cost is assumed and the
    one measurement at hand far slower; FP8 weights, priced at the FP8 rate that vLLM's
    kernels do not reach."""
    out = []
    if n > 1 and gpu["interconnect"]["kind"].lower().startswith("pcie") and not _measured_collective(gpu, "tp", n):
        bw, lat, _ = _link(gpu, eff)
        out.append(f"no NVLink: the all-reduces of {n} GPUs over PCIe are priced at an assumed {bw / 1e9:.0f} GB/s and "
                   f"{lat * 1e6:.0f} us each; {PCIE_ALLREDUCE_MEASURED}, so this profile's steps are optimistic")
    if model["dtype_bytes"] == 1:
        out.append("FP8 weights are priced at 1 byte and the GPU's FP8 rate, which puts Qwen3-32B-FP8's and "
                   "Qwen3-30B-A3B-FP8's steps 7-64% below vLLM's measured kernels (aiconfigurator-core 0.12.0), small "
                   "decode batches most: this profile's steps are optimistic")
    return out


def gemm_peak(gpu: dict, model: dict) -> tuple[float, str]:
    """(FLOP/s, what) of the linear layers: the FP8 rate for FP8 weights where the GPU has one."""
    if model["dtype_bytes"] == 1 and gpu.get("fp8_dense_TFLOPS"):
        return gpu["fp8_dense_TFLOPS"] * 1e12, "FP8"
    return gpu["bf16_dense_TFLOPS"] * 1e12, "bf16"


def _measured_collective(gpu: dict, layout: str, n: int, vllm_version: str | None = None) -> dict | None:
    """aiconfigurator's measured all-reduce (tp; vllm_version's where measured) or all-to-all (ep)
    of n of these GPUs, fitted as latency + bytes / bandwidth (sim/hardware/measured_kernels.py), or None."""
    from sim.hardware import measured_kernels as mk

    name = mk.gpu_name(gpu) if n > 1 else None
    return mk.collective(name, "all_reduce" if layout == "tp" else "all_to_all", n, vllm_version) if name else None


def step_coefficients(gpu: dict, model: dict, tp: int, eff: dict, layout: str = "tp",
                      measured_collectives: bool = True, vllm_version: str | None = None) -> dict:
    """c0..c5 (seconds) of sim/hardware/profile.py's step model on a replica of `tp` GPUs in `layout`,
    and the parts they are made of. Collectives: measured where sim/hardware/measured_kernels.py has
    them for the GPU and GPU count (and measured_collectives; vllm_version's all-reduce where that
    release was measured), else the link's bandwidth."""
    n = tp
    bw = gpu["bandwidth_GBps"] * 1e9
    peak = gpu["bf16_dense_TFLOPS"] * 1e12
    gpeak, _ = gemm_peak(gpu, model)
    L, H = model["num_layers"], model["hidden_size"]
    q, hd = model["num_attention_heads"], model["head_dim"]
    glob, local = attention_layers(model)
    win = model.get("sliding_window", 0)
    # KV heads one GPU reads per context token: its share of them (tp), or all of them for
    # its 1/n of the sequences (ep)
    kv_heads = kv_heads_per_gpu(model, n) if layout == "tp" else model["num_kv_heads"] / n
    kv_tok = 2 * kv_heads * hd * kv_dtype_bytes(model)  # per layer
    routed = param_counts(model)["routed"] * model["dtype_bytes"] / n  # tp: 1/n of each expert; ep: E/n whole ones
    parts = {
        "weights_s": (per_gpu(model, weight_bytes_streamed(model), layout, n) - routed) / (bw * eff["eff_mem"]),
        "routed_s": routed / (bw * eff["eff_mem"]),
        "overhead_s": eff["step_overhead_s"],
        "gemm_s_per_token": 2 * layer_params(model) / n / (gpeak * eff["eff_gemm"]),
        "pair_s": 4 * glob * q / n * hd / (peak * eff["eff_attn"]),
        "window_attn_s_per_token": 4 * local * q / n * hd * win / (peak * eff["eff_attn"]),
        "lm_head_s_per_seq": 2 * lm_head_params(model) / n / (peak * eff["eff_gemm"]),
        "window_kv_s_per_seq": local * kv_tok * win / (bw * eff["eff_kv"]),
        "kv_s_per_token": glob * kv_tok / (bw * eff["eff_kv"]),
        "collective_latency_s": 0.0, "collective_s_per_token": 0.0,
    }
    if n > 1:
        link_bw, lat, _ = _link(gpu, eff)
        if layout == "tp":  # 2 ring all-reduces per layer
            parts["collective_latency_s"] = 2 * L * lat
            parts["collective_s_per_token"] = 2 * L * 2 * (n - 1) / n * H * ACT_BYTES / link_bw
        else:  # dispatch + combine per MoE layer: each GPU sends (and receives) k copies of its 1/n
            # of the tokens, (n-1)/n of them to other GPUs
            m, k = param_counts(model)["moe_layers"], model["moe"]["experts_per_token"]
            parts["collective_latency_s"] = 2 * m * lat
            parts["collective_s_per_token"] = 2 * m * k * (n - 1) / n / n * H * ACT_BYTES / link_bw
        mc = _measured_collective(gpu, layout, n, vllm_version) if measured_collectives else None
        if mc:  # measured: the whole message (all-reduce: a token's hidden state; all-to-all: its k copies over n GPUs)
            per = 2 * L if layout == "tp" else 2 * param_counts(model)["moe_layers"]
            msg = H * ACT_BYTES if layout == "tp" else model["moe"]["experts_per_token"] * H * ACT_BYTES / n
            parts["collective_latency_s"] = per * mc["latency_s"]
            parts["collective_s_per_token"] = per * msg / (mc["GBps"] * 1e9)
            parts["collective_measured"] = mc
    c = {
        "c0": parts["weights_s"] + parts["overhead_s"] + parts["collective_latency_s"],
        "c1": parts["gemm_s_per_token"] + parts["collective_s_per_token"] + parts["window_attn_s_per_token"],
        "c2": parts["pair_s"] / 2,
        "c3": parts["lm_head_s_per_seq"] + parts["window_kv_s_per_seq"],
        "c4": parts["kv_s_per_token"],
        "c5": parts["pair_s"] / 2,
    }
    if routed:
        moe = model["moe"]
        c["routed"] = parts["routed_s"]
        c["routed_share"] = moe["experts_per_token"] / moe["num_experts"]
    return {"coef": c, "parts": parts}


def handmade_coefficients(gpu: dict, model: dict) -> dict:
    """A naive roofline, the baseline the fitted constants are compared with: weights + 2 ms,
    60% MFU for 2*params per token and 4*layers*hidden per pair (full square), KV at full
    bandwidth."""
    bw, peak = gpu["bandwidth_GBps"] * 1e9, gpu["bf16_dense_TFLOPS"] * 1e12 * 0.6
    p = model["num_params"]
    return {"c0": 2 * p / bw + 2e-3, "c1": 2 * p / peak, "c2": 4 * model["num_layers"] * model["hidden_size"] / peak,
            "c3": 0.0, "c4": kv_bytes_per_token(model) / bw, "c5": 0.0}


# ---- the H100 measurement ----------------------------------------------------------------

def read_measurements(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"measurement file {str(path)!r} not found; give --measurements PATH") from None
    except json.JSONDecodeError as e:
        raise InputError(f"measurement file {str(path)!r} is not valid JSON (line {e.lineno}: {e.msg})") from None


def probe_rows(meas: dict) -> list[tuple[str, np.ndarray, float]]:
    """(kind, features [steps, tokens, sum_qk, seqs, sum_k, sum_q_cached], seconds) per prefill
    or decode probe (sim/hardware/check.py reads the file; mixed probes are left out):
    prefill, one sequence of n new tokens after k cached; decode, B sequences of 1 token
    attending over ctx tokens. Seconds: median_s."""
    from sim.hardware.check import read_probes

    rows = []
    for p in read_probes(meas, "measurement file"):
        if p.kind != "mixed":
            tokens, seqs, sum_qk, sum_k, sum_q_cached, _ = p.features()  # no mixed probes: no mixed decodes
            rows.append((p.group, np.array([1, tokens, sum_qk, seqs, sum_k, sum_q_cached], float), p.seconds["median_s"]))
    if not rows:
        raise InputError("the measurement file has no prefill/decode probes")
    return rows


def _vec(coef: dict) -> np.ndarray:
    return np.array([coef[f"c{i}"] for i in range(6)])


def mape_by_kind(coef: dict, rows) -> dict:
    """MAPE in percent per probe kind and over all probes."""
    err = {k: [] for k in KINDS}
    for kind, f, y in rows:
        err[kind].append(abs(float(f @ _vec(coef)) - y) / y * 100)
    out = {k: round(float(np.mean(v)), 1) for k, v in err.items() if v}
    out["all"] = round(float(np.mean([e for v in err.values() for e in v])), 1)
    return out


def _anchor() -> tuple[dict, dict]:
    """The GPU and model the measurement was taken on."""
    return find_gpu("H100")[1], find_model("llama3.1-8b")[1]


def fit_efficiency(meas: dict, train=None) -> tuple[dict, list[str]]:
    """Least squares on relative error of the H100 probes -> the EFF_NAMES constants (and
    which of them sit on a bound). `train`: indices of the rows to fit on (default all)."""
    from scipy.optimize import least_squares

    gpu, model = _anchor()
    rows = probe_rows(meas)
    rows = [rows[i] for i in train] if train is not None else rows
    X = np.array([f for _, f, _ in rows])
    y = np.array([s for _, _, s in rows])

    def resid(theta):
        eff = dict(zip(EFF_NAMES, theta), eff_pcie=1.0)
        return (X @ _vec(step_coefficients(gpu, model, 1, eff)["coef"]) - y) / y

    res = least_squares(resid, [0.7, 0.9, 0.6, 0.5, 2e-3], bounds=(EFF_LOW, EFF_HIGH), x_scale=[1, 1, 1, 1, 1e-3])
    eff = {n: float(v) for n, v in zip(EFF_NAMES, res.x)}
    at_bound = [n for n, v, lo, hi in zip(EFF_NAMES, res.x, EFF_LOW, EFF_HIGH) if min(v - lo, hi - v) < 1e-3 * (hi - lo)]
    return eff, at_bound


def fit_pcie(meas: dict, nominal_GBps: float) -> dict:
    """Host<->device copies: t = latency + bytes / (nominal * eff_pcie), on relative error."""
    from scipy.optimize import nnls

    pts = [(r["MiB"] * 2**20, r["median_s"]) for d in ("h2d", "d2h") for r in (meas.get("pcie") or {}).get(d, [])]
    if not pts:
        raise InputError("the measurement file has no pcie h2d/d2h copies to fit the host link on")
    A = np.array([[1.0, b] for b, _ in pts]) / np.array([[t] for _, t in pts])
    scale = A.max(axis=0)
    lat, inv_bw = nnls(A / scale, np.ones(len(pts)))[0] / scale
    return {"eff_pcie": float(1 / inv_bw / (nominal_GBps * 1e9)), "pcie_latency_s": float(lat)}


def fit_report(meas: dict, source: str, date: str) -> dict:
    """Everything committed in sim/hardware/specs/roofline_fit.json: constants, bounds hit, errors."""
    gpu, model = _anchor()
    eff, at_bound = fit_efficiency(meas)
    eff.update(fit_pcie(meas, gpu["host_link"]["GBps_per_direction"]))
    rows = probe_rows(meas)
    train = [i for i in range(len(rows)) if i % 3 != 2]
    held_eff, _ = fit_efficiency(meas, train)
    held_coef = step_coefficients(gpu, model, 1, {**held_eff, "eff_pcie": 1.0})["coef"]
    held = mape_by_kind(held_coef, [rows[i] for i in range(len(rows)) if i % 3 == 2])
    return {
        "about": "Efficiency constants of sim/hardware/roofline.py, fitted by `sim profile fit-roofline` "
                 "(scipy least_squares on relative error, efficiencies bounded to (0.05, 1]).",
        "fitted_on": f"{source} ({meas.get('device', '?')}, {meas.get('model', '?')}, torch {meas.get('torch', '?')})",
        "date": date,
        "constants": {k: float(f"{v:.5g}") for k, v in eff.items()},
        "at_bound": at_bound,
        "fit_mape": mape_by_kind(step_coefficients(gpu, model, 1, eff)["coef"], rows),
        "heldout_mape": held,
        "heldout_rule": "fit on the probes whose index % 3 != 2, error on the others",
        "handmade_a100_method_on_h100_mape": mape_by_kind(handmade_coefficients(gpu, model), rows),
    }


# ---- the profile ---------------------------------------------------------------------------

def check_layout(mname: str, model: dict, tp: int, ep: int) -> tuple[str, int]:
    """(layout, GPUs) of --tp / --ep, or a one-line InputError naming what does not divide."""
    for flag, v in (("--tp", tp), ("--ep", ep)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 8:
            raise InputError(f"{flag} {v}: use 1 to 8 GPUs of one node")
    if tp > 1 and ep > 1:
        raise InputError(f"--tp {tp} --ep {ep}: give one layout, --tp N (everything split N ways) or --ep N "
                         "(experts spread over N GPUs, attention data-parallel)")
    moe = model.get("moe")
    if ep > 1:
        if not moe:
            raise InputError(f"--ep {ep}: {mname} is not a mixture-of-experts model; use --tp")
        if moe["num_experts"] % ep:
            raise InputError(f"--ep {ep} does not divide the {moe['num_experts']} experts of {mname}; use a divisor of it")
        return "ep", ep
    if model["num_attention_heads"] % tp:
        raise InputError(f"--tp {tp} does not divide the {model['num_attention_heads']} attention heads of {mname}; "
                         "use 1 to 8 GPUs of one node, dividing them")
    if moe and moe["moe_intermediate_size"] % tp:
        raise InputError(f"--tp {tp} does not divide the experts' {moe['moe_intermediate_size']} columns of {mname}; use a divisor of it")
    return "tp", tp


# vLLM admits a waiting request only when its whole prompt's blocks are free from 0.19.0
# (SchedulerConfig.scheduler_reserve_full_isl, default on: vllm-project/vllm#37307; not in the
# 0.18.1 sdist, in 0.19.0's); before, when its first chunk's are, and a request admitted on
# its first chunk may be preempted before the rest is prefilled.
FULL_ISL_ADMISSION_FROM = (0, 19, 0)


def full_isl_admission(vllm_version: str | None) -> bool:
    """Whether `vllm_version` (MAJOR.MINOR[.PATCH]; None: 0.32) gates admission on the whole prompt."""
    from sim.hardware.kv_pool import release

    return vllm_version is None or release(vllm_version) >= FULL_ISL_ADMISSION_FROM


def engine_limits(gname: str, gpu: dict, model: dict, layout: str, n: int, gpu_memory_utilization: float,
                  max_model_len: int | None, block_size: int = 16, max_num_batched_tokens: int | None = None,
                  max_num_seqs: int | None = None, enforce_eager: bool = False,
                  vllm_version: str | None = None) -> tuple[dict, list[str]]:
    """The engine section as vLLM 0.32 (or `vllm_version`'s accounting, sim/hardware/kv_pool.py) would set it up (sim/hardware/limits.py's arithmetic
    with this module's weight and KV bytes: FP8, MoE layouts, sliding windows), and notes.
    ep: each of the n GPUs is its own data-parallel rank (own KV, batch and token budget);
    the replica's pool is their sum, a sequence fits one GPU's share."""
    from sim.hardware.kv_pool import kv_pool
    from sim.hardware.limits import GiB, batch_defaults

    mem = gpu["memory_bytes"]
    usable = mem * gpu_memory_utilization
    where = f"{gname} at {layout}={n}"
    weights = per_gpu(model, weight_bytes_total(model), layout, n)
    if weights >= usable:
        raise InputError(f"{model['hf_repo'].split('/')[-1]} does not fit {where}: {weights / 1e9:.1f} GB of weights per GPU, "
                         f"{usable / 1e9:.1f} GB usable (--gpu-memory-utilization {gpu_memory_utilization} x {mem / 1e9:.1f} GB); "
                         "use more GPUs or a higher --gpu-memory-utilization")
    d_tokens, d_seqs = batch_defaults(mem, gpu["full_name"], "llm")
    d_tokens = d_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    d_seqs = d_seqs if max_num_seqs is None else max_num_seqs
    pool = kv_pool(mem, model, tp=n if layout == "tp" else 1, ep=n if layout == "ep" else 1,
                   gpu_memory_utilization=gpu_memory_utilization, max_num_batched_tokens=d_tokens, max_num_seqs=d_seqs,
                   enforce_eager=enforce_eager, block_size=block_size, gpu=gname,
                   **({"vllm_version": vllm_version} if vllm_version else {}))
    act, kv_mem, blocks = pool.activation_bytes, pool.available_bytes, pool.blocks
    fits = blocks * block_size  # one sequence's room: one rank's pool
    if fits < block_size:
        raise InputError(f"{model['hf_repo'].split('/')[-1]} does not fit {where}: {weights / 1e9:.1f} GB of weights per GPU plus "
                         f"vLLM's activation and runtime reserve leave no KV cache in {usable / 1e9:.1f} GB usable; use more GPUs")
    notes = []
    max_len = max_model_len
    if max_len is None:
        # vLLM refuses to start when one full-length request does not fit the KV cache; cap the
        # length to what fits instead (what `--max-model-len` would be set to) and say so.
        max_len = model["max_position_embeddings"]
        if fits < max_len:
            max_len = fits
            notes.append(f"max_model_len capped to {fits} tokens (the KV cache of {where}); "
                         f"{model['hf_repo']} allows {model['max_position_embeddings']}")
    elif max_len > model["max_position_embeddings"]:  # vLLM refuses it too (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN)
        raise InputError(f"--max-model-len {max_len} exceeds the {model['max_position_embeddings']} tokens {model['hf_repo']} "
                         f"allows (max_position_embeddings), as vLLM refuses it; give at most {model['max_position_embeddings']}")
    elif fits < max_len:
        raise InputError(f"the model does not fit: {where} leaves {max(kv_mem, 0) / GiB:.2f} GiB per GPU for KV = {fits} tokens, "
                         f"less than --max-model-len {max_len}; use more GPUs, a higher utilization or a shorter max_model_len")
    ranks = n if layout == "ep" else 1
    return {
        "name": "vllm", "version": f"{vllm_version or '0.32'} (computed)", "block_size": block_size, "num_gpu_blocks": blocks * ranks,
        "max_num_batched_tokens": d_tokens * ranks, "max_num_seqs": d_seqs * ranks, "max_model_len": int(max_len),
        "enable_chunked_prefill": True, "enable_prefix_caching": True,
        **({} if full_isl_admission(vllm_version) else {"scheduler_reserve_full_isl": False}),
        "computed": (f"computed, not read from an engine: vLLM {vllm_version or '0.32'}'s start-up arithmetic (sim/hardware/limits.py) for "
                     f"{mem / GiB:.1f} GiB x {gpu_memory_utilization} per GPU, {layout}={n}: minus weights "
                     f"{weights / GiB:.2f} GiB, activation peak {act / GiB:.2f} GiB, non-torch {pool.non_torch_bytes / GiB:.2f} GiB, "
                     f"CUDA graphs {pool.cudagraph_bytes / GiB:.2f} GiB (sim/hardware/kv_pool.py; every term in the profile's kv_pool); "
                     f"max_num_batched_tokens {d_tokens}, max_num_seqs {d_seqs}"
                     + (f"; {n} data-parallel ranks: blocks, sequences and token budget summed" if ranks > 1 else "")),
        "kv_pool": {**pool.to_dict(), "per": "GPU" + (f" (x{n} data-parallel ranks)" if ranks > 1 else "")},
    }, notes


def roofline_profile(gpu_name: str, model_name: str, tp: int = 1, gpu_memory_utilization: float = 0.9,
                     max_model_len: int | None = None, ep: int = 1, max_num_batched_tokens: int | None = None,
                     max_num_seqs: int | None = None, enforce_eager: bool = False, measured: bool = False,
                     model_spec: dict | None = None, kv_cache_dtype: str = "auto",
                     vllm_version: str | None = None) -> tuple[dict, list[str]]:
    """(profile dict in sim/hardware/profile.py's schema, notes to show the user). measured: step times
    from measured kernels where sim/hardware/measured_kernels.py has the GPU, model and tp (`sim
    profile roofline` asks for them); provenance.source says which. model_spec: a model shape
    (models.json's fields) that is not in models.json, named model_name; always the roofline
    (measured kernels are keyed by the zoo's names). kv_cache_dtype: vLLM's --kv-cache-dtype, auto
    (the model's own KV dtype) or fp8 (1 B a KV element: the pool, the KV bytes a step reads, and
    measured kernels of an FP8 KV cache). vllm_version: whose start-up accounting sizes the pool."""
    gname, gpu = find_gpu(gpu_name)
    mname, model = (model_name, model_spec) if model_spec is not None else find_model(model_name)
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InputError(f"--kv-cache-dtype {kv_cache_dtype!r}: expected one of {', '.join(KV_CACHE_DTYPES)}")
    if kv_cache_dtype == "fp8":
        model = {**model, "kv_dtype_bytes": 1}
    layout, n = check_layout(mname, model, tp, ep)
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization {gpu_memory_utilization} must be in (0, 1]")
    engine, notes = engine_limits(gname, gpu, model, layout, n, gpu_memory_utilization, max_model_len,
                                  max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                  enforce_eager=enforce_eager, vllm_version=vllm_version)
    kv_pool_section = engine.pop("kv_pool")
    mem = gpu["memory_bytes"]

    fit = load_fit()
    eff = fit["constants"]
    warned = caveats(gpu, model, eff, n)
    notes += warned
    sc = step_coefficients(gpu, model, n, eff, layout, vllm_version=vllm_version)
    parts = sc["parts"]
    c = {k: float(f"{v:.5g}") for k, v in sc["coef"].items()}
    host = gpu["host_link"]
    link_bw, ar_lat, link_kind = _link(gpu, eff)
    pc = param_counts(model)
    routed_gb = pc["routed"] * model["dtype_bytes"] / n / 1e9
    gpeak, gkind = gemm_peak(gpu, model)
    glob, local = attention_layers(model)
    moe = model.get("moe")
    kvb = kv_dtype_bytes(model)
    heads = kv_heads_per_gpu(model, n) if layout == "tp" else model["num_kv_heads"]
    kv_block = kv_bytes_per_token_charged(model, heads) * engine["block_size"]
    split = f"/ {n} GPUs" if n > 1 else ""
    lay = {"tp": f"tensor-parallel over {n} GPU(s)",
           "ep": f"expert-parallel over {n} GPUs: {moe['num_experts'] // n if moe else 0} experts per GPU, attention, dense layers "
                 "and shared experts replicated, each GPU serving its own sequences (data-parallel attention)"}[layout]
    if n == 1:
        coll = ""
    elif layout == "tp":
        coll = (f" + ring all-reduce 2 per layer x 2(N-1)/N x {model['hidden_size']} x {ACT_BYTES} B per token "
                f"/ {link_bw / 1e9:.0f} GB/s effective {link_kind}")
    else:
        coll = (f" + all-to-all dispatch and combine per MoE layer ({pc['moe_layers']}): top-{moe['experts_per_token']} copies "
                f"x (N-1)/N remote x {model['hidden_size']} x {ACT_BYTES} B per token / N GPUs / {link_bw / 1e9:.0f} GB/s effective {link_kind}")
    if "collective_measured" in parts:
        coll = " + measured collectives per token (provenance.collectives)"
    prov = {
        "method": "ROOFLINE ESTIMATE from public specs (sim/hardware/specs/*.json), not a measurement of this GPU; "
                  "efficiency constants fitted on H100 torch-kernel probes of a Llama-3.1-8B shape "
                  f"({fit['fitted_on']}, {fit['date']}). Written by `sim profile roofline`.",
        "inputs": f"{gpu['full_name']}: {gpu['bandwidth_GBps']} GB/s, {gpu['bf16_dense_TFLOPS']} TFLOP/s bf16 dense"
                  + (f", {gpu['fp8_dense_TFLOPS']} FP8" if gpu.get("fp8_dense_TFLOPS") else ", no FP8 tensor cores")
                  + f", {mem / 1e9:.1f} GB; {model['hf_repo']}: {model['num_params'] / 1e9:.2f}e9 params"
                  + (f" ({pc['layer_active'] / 1e9:.2f}e9 active in the layers: top-{moe['experts_per_token']} of "
                     f"{moe['num_experts']} experts + {moe['num_shared_experts']} shared)" if moe else "")
                  + (f" + {model['memory_only_params'] / 1e9:.2f}e9 loaded, idle for text" if model.get("memory_only_params") else "")
                  + f", {model['num_layers']} layers, {model['num_attention_heads']} q / {model['num_kv_heads']} KV heads x "
                    f"{model['head_dim']}; weights {'FP8' if model['dtype_bytes'] == 1 else 'bf16'}, KV {'FP8' if kvb == 1 else 'bf16'}; {lay}",
        "layout": {"kind": layout, "gpus": n},
        "constants": {**eff, "fit_date": fit["date"], "fit_mape_on_h100": fit["fit_mape"]},
        "c0": f"weights {per_gpu(model, weight_bytes_streamed(model), layout, n) / 1e9 - routed_gb:.2f} GB per GPU"
              f"{' but the routed experts' if moe else ''} / (BW x eff_mem) = "
              f"{parts['weights_s'] * 1e3:.3f} ms + step overhead {eff['step_overhead_s'] * 1e3:.3f} ms"
              + (f" + {parts['collective_latency_s'] / ar_lat:.0f} collectives x {ar_lat * 1e6:.0f} us ({link_kind})"
                 if n > 1 and "collective_measured" not in parts
                 else f" + {parts['collective_latency_s'] * 1e3:.3f} ms measured collectives' latency" if n > 1 else ""),
        "c1": f"2 x {layer_params(model) / 1e9:.2f}e9 {'active ' if moe else ''}layer params {split} per token / "
              f"({gkind} peak {gpeak / 1e12:.0f} TFLOP/s x eff_gemm)" + coll
              + (f" + {local} sliding-window layers' attention at the window bound, 4 x q_heads x head_dim x {model['sliding_window']} "
                 "FLOPs per token" if local else ""),
        "c2": f"half of 4 x {glob} full-attention layers x q_heads {split} x head_dim FLOPs per (query, key) pair / "
              "(bf16 peak x eff_attn): causal chunk",
        "c3": f"LM head 2 x vocab x hidden {split} FLOPs per scheduled sequence (logits of its last token) / (peak x eff_gemm)"
              + (f" + {local} sliding-window layers' KV read at the window bound ({model['sliding_window']} tokens) per sequence" if local else ""),
        "c4": f"KV read per context token: {glob * 2 * (heads if layout == 'tp' else heads / n) * model['head_dim'] * kvb:.0f} B per GPU"
              f"{' (full-attention layers)' if local else ''} / (BW x eff_kv)",
        "c5": "= c2: new tokens attend all cached keys (no causal half)",
        "engine": f"vLLM {vllm_version or '0.32'} start-up arithmetic (sim/hardware/kv_pool.py; every term and its source in kv_pool)",
        "kv_bytes_per_block": ("per GPU (each tensor-parallel rank holds and moves its own KV heads)" if layout == "tp"
                               else "all KV heads of a block (a sequence's blocks live on the GPU that serves it; offload "
                                    "and disaggregation transfers are priced on one GPU's link, though the N GPUs' links "
                                    "would move different sequences' blocks in parallel)")
                              + (f"; KV {'FP8, 1 B' if kvb == 1 else 'bf16, 2 B'} per element"),
        "pcie": f"{host['kind']} {host['GBps_per_direction']} GB/s per direction x eff_pcie {eff['eff_pcie']:.3f} "
                f"(fitted on the H100's pinned copies), latency {eff['pcie_latency_s'] * 1e6:.1f} us; not measured on this GPU",
        "sources": {"gpu": gpu["sources"], "model": model["source"]},
    }
    if moe:
        prov["moe"] = (f"compute: active parameters per token; routed: every routed expert, {routed_gb:.2f} GB per GPU / "
                       f"(BW x eff_mem) = {parts['routed_s'] * 1e3:.3f} ms, of which a step of T tokens reads the share "
                       f"1 - (1 - {moe['experts_per_token']}/{moe['num_experts']})^T (routing taken as uniform; a skewed "
                       "router reads fewer); routed_share = top-k / experts")
    if local:
        charged = kv_layers_charged(model)
        prov["sliding_window"] = (
            f"APPROXIMATION: {local} of {model['num_layers']} layers attend a {model['sliding_window']}-token window and hold at most "
            f"that many tokens' KV per sequence; the block pool counts blocks of one size, so kv_bytes_per_block charges "
            f"{charged:.2f} layers' KV per token ({glob} global + {local} x {model['sliding_window']}/{KV_REFERENCE_TOKENS}), "
            f"exact for a {KV_REFERENCE_TOKENS}-token sequence: an 8K sequence really holds {kv_layers_charged(model, 8192):.2f} "
            f"per token ({kv_layers_charged(model, 8192) / charged - 1:+.0%}), a 128K one {kv_layers_charged(model, 131072):.2f} "
            f"({kv_layers_charged(model, 131072) / charged - 1:+.0%}); all {model['num_layers']} layers would be "
            f"{model['num_layers'] / charged:.1f}x this. Step time: local layers' attention and KV read at the window bound "
            "(c1, c3), exact for contexts of at least the window")
    if warned:
        prov["caveats"] = warned  # also in notes; `sim plan` repeats them per candidate
    if notes:
        prov["notes"] = notes
    mfields = {k: model[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                                     "intermediate_size", "vocab_size", "dtype_bytes", "num_params")}
    extra = {k: model[k] for k in ("kv_dtype_bytes", "moe", "sliding_window", "sliding_window_pattern", "memory_only_params")
             if k in model}
    profile = {
        "schema": "agentsim-profile/1",
        "model": {"name": model["hf_repo"], "architecture": model["architecture"], **mfields, **extra,
                  "tensor_parallel_size": n if layout == "tp" else 1,
                  **({"expert_parallel_size": n, "data_parallel_size": n, "gpus": n} if layout == "ep" else {})},
        "device": f"{gpu['full_name']}" + (f" x{n}" if n > 1 else "") + (f" (EP{n}, data-parallel attention)" if layout == "ep" else "")
                  + " (roofline estimate, not measured)",
        "engine": engine,
        "kv_pool": kv_pool_section,
        "kv_bytes_per_block": int(round(kv_block)),
        "step_time": c,
        "prefill_quadratic": {"a": float(f"{c['c0'] + c['c3'] + c.get('routed', 0.0):.5g}"), "b": float(f"{c['c1'] + c['c4']:.5g}"), "c": c["c2"]},
        "pcie": {"measured": False, "bandwidth_GBps": round(host["GBps_per_direction"] * eff["eff_pcie"], 2),
                 "latency_s": float(f"{eff['pcie_latency_s']:.3g}")},
        "provenance": prov,
        "fit_error": {"anchor": "MAPE % of these constants on the H100 Llama-3.1-8B-shape probes (the only measurement)",
                      **{f"h100_{k}": v for k, v in fit["fit_mape"].items()}},
    }
    prov["source"] = "roofline"
    sampler = measured_sampler.section(gname, model["vocab_size"], vllm_version)
    if sampler is not None:  # kernels hold no sampler; `--sampling MODE` prices it from this
        profile["sampler"] = sampler
    if "collective_measured" in parts:
        from sim.hardware.measured_kernels import collectives_text

        prov["collectives"] = collectives_text(parts, layout, n)
    if measured and model_spec is None:
        from sim.hardware.measured_kernels import use_measured

        notes = use_measured(profile, gname, mname, layout, n, notes, kv_fp8=kv_dtype_bytes(model) == 1,
                             shape=model, vllm_version=vllm_version)
    return profile, notes


def h100_errors(meas: dict, profile_coef: dict | None) -> dict:
    """MAPE on the H100 probes: of this profile's own c-terms (when it is the H100 / Llama-8B /
    tp=1 profile), of the committed constants on the H100, and of the naive roofline."""
    rows = probe_rows(meas)
    gpu, model = _anchor()
    eff = load_fit()["constants"]
    out = {"constants": mape_by_kind(step_coefficients(gpu, model, 1, eff)["coef"], rows),
           "handmade": mape_by_kind(handmade_coefficients(gpu, model), rows)}
    if profile_coef is not None:
        out["profile"] = mape_by_kind(profile_coef, rows)
    return out
