"""Roofline profiles: a labelled estimate of the step-time model for a GPU and a model
from public specs (sim/specs/gpus.json, sim/specs/models.json), with efficiency
constants fitted on one real measurement (H100 probes, sim/specs/roofline_fit.json).

Per step, on each of the tp GPUs (sim/profile.py's features):
  c0  weights streamed once (bytes / (BW * eff_mem)) + a fixed step overhead
      + 2 all-reduces per layer times their latency (tp > 1)
  c1  GEMM FLOPs 2 * layer params per token / (peak * eff_gemm)
      + ring all-reduce bytes per token: 2 per layer * 2(N-1)/N * hidden * dtype / link_bw
  c2  attention 4 * layers * q_heads * head_dim FLOPs per (query, key) pair / (peak * eff_attn),
      halved: sum(q*k) counts a fresh chunk's full square, causal attention computes half
  c5  = c2: cached keys are attended in full, so pairs to them get the other half
  c3  LM head per scheduled sequence (vLLM takes logits of each sequence's last token only)
  c4  KV read once per step per context token / (BW * eff_kv)
Weights, FLOPs and KV are divided by tp (heads and MLP columns are split). A linear
sum, not max(compute, memory): the fitted efficiencies absorb the overlap, which is why
they are constants of this model and not hardware efficiencies.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from agentsim.errors import InputError

SPEC_DIR = Path(__file__).parent / "specs"
FIT_FILE = SPEC_DIR / "roofline_fit.json"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MEASUREMENTS = REPO_ROOT.parent / "shared/measurements/h100/llama3.1-8b-shape-torch-probes.json"
KINDS = ("fresh_prefill", "cached_prefill", "decode")
# The efficiencies fitted on the probes, with their bounds (efficiencies cannot exceed 1).
EFF_NAMES = ("eff_mem", "eff_kv", "eff_gemm", "eff_attn", "step_overhead_s")
EFF_LOW, EFF_HIGH = (0.05, 0.05, 0.05, 0.05, 0.0), (1.0, 1.0, 1.0, 1.0, 0.05)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", str(name).lower())


@lru_cache(maxsize=None)
def _table(name: str) -> dict:
    return json.loads((SPEC_DIR / name).read_text())


def _lookup(kind: str, name: str) -> tuple[str, dict]:
    table = _table(f"{kind}s.json")[f"{kind}s"]
    want = _key(name)
    for canon, spec in table.items():
        if want in {_key(canon), *(_key(a) for a in spec.get("aliases", ()))}:
            return canon, spec
    raise InputError(f"unknown {kind} {name!r}; known: {', '.join(table)}")


def find_gpu(name: str) -> tuple[str, dict]:
    return _lookup("gpu", name)


def find_model(name: str) -> tuple[str, dict]:
    return _lookup("model", name)


def links() -> dict:
    return _table("gpus.json")["links"]


def load_fit() -> dict:
    return json.loads(FIT_FILE.read_text())


def _lm_head_params(model: dict) -> int:
    return model["vocab_size"] * model["hidden_size"]


def layer_params(model: dict) -> int:
    """Params in the per-token GEMMs: all but the embedding table, the LM head and the final norm."""
    embed = _lm_head_params(model) * (1 if model["tie_word_embeddings"] else 2)
    return model["num_params"] - embed - model["hidden_size"]


def weight_bytes_streamed(model: dict) -> int:
    """Bytes read per step: everything but the embedding table (only looked up), unless tied."""
    skip = 0 if model["tie_word_embeddings"] else _lm_head_params(model)
    return (model["num_params"] - skip) * model["dtype_bytes"]


def kv_heads_per_gpu(model: dict, tp: int) -> int:
    return max(1, model["num_kv_heads"] // tp)  # fewer KV heads than ranks: vLLM replicates them


def kv_bytes_per_token(model: dict, tp: int = 1) -> int:
    return 2 * model["num_layers"] * kv_heads_per_gpu(model, tp) * model["head_dim"] * model["dtype_bytes"]


def _link(gpu: dict, eff: dict) -> tuple[float, float, str]:
    """(effective bytes/s, per-all-reduce latency s, what) of the GPU-GPU link."""
    lk, ic = links(), gpu["interconnect"]
    if ic["kind"].lower().startswith("nvlink"):
        return ic["GBps_per_direction"] * 1e9 * lk["nvlink_efficiency"], lk["nvlink_allreduce_latency_s"], "NVLink"
    return ic["GBps_per_direction"] * 1e9 * eff["eff_pcie"], lk["pcie_allreduce_latency_s"], "PCIe"


def step_coefficients(gpu: dict, model: dict, tp: int, eff: dict) -> dict:
    """c0..c5 (seconds) of sim/profile.py's step model, and the parts they are made of."""
    bw = gpu["bandwidth_GBps"] * 1e9
    peak = gpu["bf16_dense_TFLOPS"] * 1e12
    L, H, dt = model["num_layers"], model["hidden_size"], model["dtype_bytes"]
    parts = {
        "weights_s": weight_bytes_streamed(model) / tp / (bw * eff["eff_mem"]),
        "overhead_s": eff["step_overhead_s"],
        "gemm_s_per_token": 2 * layer_params(model) / tp / (peak * eff["eff_gemm"]),
        "pair_s": 4 * L * (model["num_attention_heads"] // tp) * model["head_dim"] / (peak * eff["eff_attn"]),
        "lm_head_s_per_seq": 2 * _lm_head_params(model) / tp / (peak * eff["eff_gemm"]),
        "kv_s_per_token": kv_bytes_per_token(model, tp) / (bw * eff["eff_kv"]),
        "allreduce_latency_s": 0.0, "allreduce_s_per_token": 0.0,
    }
    if tp > 1:
        link_bw, lat, _ = _link(gpu, eff)
        parts["allreduce_latency_s"] = 2 * L * lat
        parts["allreduce_s_per_token"] = 2 * L * 2 * (tp - 1) / tp * H * dt / link_bw
    c = {
        "c0": parts["weights_s"] + parts["overhead_s"] + parts["allreduce_latency_s"],
        "c1": parts["gemm_s_per_token"] + parts["allreduce_s_per_token"],
        "c2": parts["pair_s"] / 2,
        "c3": parts["lm_head_s_per_seq"],
        "c4": parts["kv_s_per_token"],
        "c5": parts["pair_s"] / 2,
    }
    return {"coef": c, "parts": parts}


def handmade_coefficients(gpu: dict, model: dict) -> dict:
    """The method of the hand-made A100 profile (its provenance): weights + 2 ms, 60% MFU for
    2*params per token and 4*layers*hidden per pair (full square), KV at full bandwidth."""
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
    or decode probe (sim/profile_check.py reads the file; mixed probes are left out):
    prefill, one sequence of n new tokens after k cached; decode, B sequences of 1 token
    attending over ctx tokens. Seconds: median_s."""
    from sim.profile_check import read_probes

    rows = []
    for p in read_probes(meas, "measurement file"):
        if p.kind != "mixed":
            tokens, seqs, sum_qk, sum_k, sum_q_cached = p.features()
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
    """Everything committed in sim/specs/roofline_fit.json: constants, bounds hit, errors."""
    gpu, model = _anchor()
    eff, at_bound = fit_efficiency(meas)
    eff.update(fit_pcie(meas, gpu["host_link"]["GBps_per_direction"]))
    rows = probe_rows(meas)
    train = [i for i in range(len(rows)) if i % 3 != 2]
    held_eff, _ = fit_efficiency(meas, train)
    held_coef = step_coefficients(gpu, model, 1, {**held_eff, "eff_pcie": 1.0})["coef"]
    held = mape_by_kind(held_coef, [rows[i] for i in range(len(rows)) if i % 3 == 2])
    return {
        "about": "Efficiency constants of sim/roofline.py, fitted by `sim profile fit-roofline` "
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

def roofline_profile(gpu_name: str, model_name: str, tp: int = 1, gpu_memory_utilization: float = 0.9,
                     max_model_len: int | None = None) -> tuple[dict, list[str]]:
    """(profile dict in sim/profile.py's schema, notes to show the user)."""
    from calibrate.vllm_limits import gpu_engine_limits

    gname, gpu = find_gpu(gpu_name)
    mname, model = find_model(model_name)
    if not 1 <= tp <= 8 or model["num_attention_heads"] % tp:
        raise InputError(f"--tp {tp}: use 1 to 8 GPUs of one node, dividing the {model['num_attention_heads']} attention heads of {mname}")
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization {gpu_memory_utilization} must be in (0, 1]")
    mem = gpu["memory_bytes"]
    weights = model["num_params"] * model["dtype_bytes"] / tp
    if weights >= mem * gpu_memory_utilization:
        raise InputError(f"{mname} does not fit {gname} at tp={tp}: {weights / 1e9:.1f} GB of bf16 weights per GPU, "
                         f"{mem * gpu_memory_utilization / 1e9:.1f} GB usable ({gpu_memory_utilization} x {mem / 1e9:.1f} GB); use a larger --tp")
    notes = []
    shape = {k: model[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                                   "intermediate_size", "vocab_size", "dtype_bytes", "num_params", "max_position_embeddings")}
    kw = dict(tp=tp, gpu_memory_utilization=gpu_memory_utilization, gpu_name=gpu["full_name"])
    if max_model_len is None:
        # vLLM refuses to start when one full-length request does not fit the KV cache; cap the
        # length to what fits instead (what `--max-model-len` would be set to) and say so.
        try:
            probe = gpu_engine_limits(shape, mem, max_model_len=16, **kw)
        except InputError:
            raise InputError(f"{mname} does not fit {gname} at tp={tp}: {weights / 1e9:.1f} GB of weights per GPU plus "
                             f"vLLM's activation and runtime reserve leave no KV cache in {mem * gpu_memory_utilization / 1e9:.1f} GB "
                             f"usable; use a larger --tp") from None
        fits = probe["num_gpu_blocks"] * probe["block_size"]
        if fits < model["max_position_embeddings"]:
            max_model_len = fits
            notes.append(f"max_model_len capped to {fits} tokens (the KV cache of {gname} at tp={tp}); "
                         f"{mname} allows {model['max_position_embeddings']}")
    engine = gpu_engine_limits(shape, mem, max_model_len=max_model_len, **kw)

    fit = load_fit()
    eff = fit["constants"]
    sc = step_coefficients(gpu, model, tp, eff)
    c = {k: float(f"{v:.5g}") for k, v in sc["coef"].items()}
    host = gpu["host_link"]
    link_bw, ar_lat, link_kind = _link(gpu, eff)
    prov = {
        "method": "ROOFLINE ESTIMATE from public specs (sim/specs/*.json), not a measurement of this GPU; "
                  "efficiency constants fitted on H100 torch-kernel probes of a Llama-3.1-8B shape "
                  f"({fit['fitted_on']}, {fit['date']}). Written by `sim profile roofline`.",
        "inputs": f"{gpu['full_name']}: {gpu['bandwidth_GBps']} GB/s, {gpu['bf16_dense_TFLOPS']} TFLOP/s bf16 dense, "
                  f"{mem / 1e9:.1f} GB; {model['hf_repo']}: {model['num_params'] / 1e9:.2f}e9 params, "
                  f"{model['num_layers']} layers, {model['num_attention_heads']} q / {model['num_kv_heads']} KV heads x {model['head_dim']}; tp={tp}",
        "constants": {**eff, "fit_date": fit["date"], "fit_mape_on_h100": fit["fit_mape"]},
        "c0": f"weights {weight_bytes_streamed(model) / tp / 1e9:.2f} GB per GPU / (BW x eff_mem) = {sc['parts']['weights_s'] * 1e3:.3f} ms"
              f" + step overhead {eff['step_overhead_s'] * 1e3:.3f} ms"
              + (f" + {2 * model['num_layers']} all-reduces x {ar_lat * 1e6:.0f} us ({link_kind})" if tp > 1 else ""),
        "c1": f"2 x {layer_params(model) / 1e9:.2f}e9 layer params / tp per token / (peak x eff_gemm)"
              + (f" + ring all-reduce 2 per layer x 2(N-1)/N x {model['hidden_size']} x {model['dtype_bytes']} B per token "
                 f"/ {link_bw / 1e9:.0f} GB/s effective {link_kind}" if tp > 1 else ""),
        "c2": "half of 4 x layers x q_heads/tp x head_dim FLOPs per (query, key) pair / (peak x eff_attn): causal chunk",
        "c3": "LM head 2 x vocab x hidden / tp FLOPs per scheduled sequence (logits of its last token) / (peak x eff_gemm)",
        "c4": f"KV read per context token: {kv_bytes_per_token(model, tp)} B per GPU / (BW x eff_kv)",
        "c5": "= c2: new tokens attend all cached keys (no causal half)",
        "engine": "vLLM 0.32 start-up arithmetic, calibrate/vllm_limits.py (see engine.computed)",
        "kv_bytes_per_block": "per GPU (each tensor-parallel rank holds and moves its own KV heads)",
        "pcie": f"{host['kind']} {host['GBps_per_direction']} GB/s per direction x eff_pcie {eff['eff_pcie']:.3f} "
                f"(fitted on the H100's pinned copies), latency {eff['pcie_latency_s'] * 1e6:.1f} us; not measured on this GPU",
        "sources": {"gpu": gpu["sources"], "model": model["source"]},
    }
    if notes:
        prov["notes"] = notes
    profile = {
        "schema": "agentsim-profile/1",
        "model": {"name": model["hf_repo"], "architecture": model["architecture"],
                  **{k: model[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                                           "head_dim", "intermediate_size", "vocab_size", "dtype_bytes", "num_params")},
                  "tensor_parallel_size": tp},
        "device": f"{gpu['full_name']}" + (f" x{tp}" if tp > 1 else "") + " (roofline estimate, not measured)",
        "engine": engine,
        "kv_bytes_per_block": kv_bytes_per_token(model, tp) * engine["block_size"],
        "step_time": c,
        "prefill_quadratic": {"a": float(f"{c['c0'] + c['c3']:.5g}"), "b": float(f"{c['c1'] + c['c4']:.5g}"), "c": c["c2"]},
        "pcie": {"measured": False, "bandwidth_GBps": round(host["GBps_per_direction"] * eff["eff_pcie"], 2),
                 "latency_s": float(f"{eff['pcie_latency_s']:.3g}")},
        "provenance": prov,
        "fit_error": {"anchor": "MAPE % of these constants on the H100 Llama-3.1-8B-shape probes (the only measurement)",
                      **{f"h100_{k}": v for k, v in fit["fit_mape"].items()}},
    }
    return profile, notes


def h100_errors(meas: dict, profile_coef: dict | None) -> dict:
    """MAPE on the H100 probes: of this profile's own c-terms (when it is the H100 / Llama-8B /
    tp=1 profile), of the committed constants on the H100, and of the hand-made method."""
    rows = probe_rows(meas)
    gpu, model = _anchor()
    eff = load_fit()["constants"]
    out = {"constants": mape_by_kind(step_coefficients(gpu, model, 1, eff)["coef"], rows),
           "handmade": mape_by_kind(handmade_coefficients(gpu, model), rows)}
    if profile_coef is not None:
        out["profile"] = mape_by_kind(profile_coef, rows)
    return out
