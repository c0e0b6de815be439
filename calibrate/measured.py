"""Probe rows from an external measurement file (kernel timings taken without vLLM).

The format is that of sim/hardware/measurements/h100/llama3.1-8b-shape-torch-probes.json
(its README.md says how the numbers were taken): top-level `device`, `mem_total_GB`,
`pcie` {h2d: [{MiB, median_s}], d2h: [...]}, and `probes`, each
{kind: prefill, n, k, median_s, min_s} (n new tokens after k cached ones, one unchunked
forward pass) or {kind: decode, B, ctx, median_s, min_s} (B sequences each attending over
ctx tokens), the median and the minimum over the probe's repeats.

They become the project's probe rows {kind, heldout, seconds, features} with the
features of calibrate/probes.py's step rows, so the same fits run on them:
- `prefill` (k == 0) and `cached_prefill` (k > 0): one step with one (n, k + n) chunk.
  The probes were taken as one forward pass each, so they are not chunked here.
- `decode`: one step of B sequences (1, ctx).
Seconds are each probe's min_s (the minimum over its repeats); `stat="median_s"` takes
the medians, the rule calibrate/probes.py now keeps. The bundled H100 profile stays on
min_s: on these GPU timings the median lies 0.2% (decode) and 3.2% (prefill, mean) above
the minimum, and moving it re-derives every results table (not done yet). Hold-out rule:
within each kind, in file order, every third probe (index % 3 == 2) is held out of the
fit and only scored.

build_measured_profile() fits them (calibrate/fit.py, the GPU step model) into a profile
(`sim calibrate --from-probes FILE`), with the engine limits vLLM 0.32 would compute for
the GPU's memory (sim/hardware/limits.py) and the PCIe figures of the same file.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from calibrate.fit import FEATURES, fit_gpu_step_model, fit_quadratic, fit_step_model, nnls_relative
from calibrate.probes import step_row
from sim.hardware.limits import gpu_engine_limits
from agentsim.errors import InputError
from sim.hardware.check import load_probe_file, read_probes

REPO = Path(os.path.normpath(Path(__file__).absolute().parent.parent))
# Model shapes by the file's `model` prefix (the file names the shape, its README gives it).
SHAPES = {"llama3.1-8b": {
    "name": "meta-llama/Llama-3.1-8B-Instruct", "architecture": "LlamaForCausalLM", "num_layers": 32,
    "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8, "head_dim": 128, "intermediate_size": 14336,
    "vocab_size": 128256, "dtype": "bfloat16", "dtype_bytes": 2, "num_params": 8.03e9, "max_position_embeddings": 131072}}


def load_measurements(path: str | Path) -> dict:
    """The file's JSON, checked for what the rows and the PCIe fit need (one-line InputError);
    the file and its probes are read by sim/hardware/check.py, the one reader of the format."""
    data = load_probe_file(path, kinds=("prefill", "decode"), doc="calibrate/measured.py")
    mem = data.get("mem_total_GB")
    if isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem <= 0:
        raise InputError(f"probe file {str(Path(path))!r} has mem_total_GB={mem!r}; need the GPU's memory in GB (a positive number)")
    return data


def probe_rows(data: dict, stat: str = "min_s") -> list[dict]:
    """Probe rows {kind, new, prefix, batch, heldout, seconds, features} in file order."""
    rows, seen = [], {}
    for pr in read_probes(data, kinds=("prefill", "decode")):
        kind = "prefill" if pr.group == "fresh_prefill" else pr.group
        new, prefix, batch = (1, pr.ctx, pr.B) if pr.kind == "decode" else (pr.n, pr.k, 1)
        x = step_row(pr.chunks())
        i = seen[kind] = seen.get(kind, -1) + 1
        rows.append({"kind": kind, "new": new, "prefix": prefix, "batch": batch, "heldout": i % 3 == 2,
                     "seconds": pr.seconds[stat], "features": dict(zip(FEATURES, map(float, x)))})
    return rows


def pcie_from(data: dict) -> dict:
    """t = latency + bytes / bandwidth per direction (least squares on relative error, as
    calibrate/pcie.py); `bandwidth_GBps` is the slower direction, `latency_s` the larger."""
    pc = data.get("pcie")
    if not isinstance(pc, dict) or not all(isinstance(pc.get(d), list) and len(pc[d]) >= 2 for d in ("h2d", "d2h")):
        raise InputError("probe file has no 'pcie' section with h2d and d2h lists of {MiB, median_s}")
    out = {"measured": True, "method": "from the probe file: pinned host <-> device copy_(non_blocking), CUDA events, "
                                       "median per size; fit t = latency + bytes/bw"}
    for d in ("h2d", "d2h"):
        try:
            nbytes = np.array([r["MiB"] for r in pc[d]], float) * (1 << 20)
            t = np.array([r["median_s"] for r in pc[d]], float)
            lat, inv_bw = nnls_relative(np.stack([np.ones_like(nbytes), nbytes], 1), t)
        except (KeyError, TypeError, ValueError):
            inv_bw = 0.0
        if not inv_bw > 0:
            raise InputError(f"probe file: pcie.{d} rows need positive 'MiB' and 'median_s' that grow together")
        out[f"{d}_GBps"] = round(float(1 / inv_bw / 1e9), 3)
        out[f"{d}_latency_s"] = float(lat)
    out["bandwidth_GBps"] = min(out["h2d_GBps"], out["d2h_GBps"])
    out["latency_s"] = max(out["h2d_latency_s"], out["d2h_latency_s"])
    return out


def _shape(data: dict) -> dict:
    name = str(data.get("model", ""))
    for prefix, shape in SHAPES.items():
        if name.lower().startswith(prefix):
            return dict(shape)
    raise InputError(f"probe file model {name!r}: no known shape; known: {', '.join(SHAPES)} (calibrate/measured.py SHAPES)")


def _display(path: Path) -> str:
    """The file's path relative to the repository (profiles are committed), else absolute."""
    # lexical, not resolved: a folder reached through a symlink reads as the folder
    path = Path(os.path.normpath(path.absolute()))
    return os.path.relpath(path, REPO) if path.anchor == REPO.anchor else str(path)


def build_measured_profile(path: str | Path, stat: str = "min_s", gpu_memory_utilization: float = 0.9) -> dict:
    """A profile from a measurement file: GPU step model, paper's quadratic, computed limits, its PCIe."""
    path = Path(path)
    data = load_measurements(path)
    model = _shape(data)
    rows = probe_rows(data, stat)
    step, quad, lin = fit_gpu_step_model(rows), fit_quadratic(rows), fit_step_model(rows)
    eng = gpu_engine_limits(model, float(data["mem_total_GB"]) * 1e9, gpu_memory_utilization=gpu_memory_utilization,
                            gpu_name=str(data["device"]))
    per_kind = lambda fit: {k: v for k, v in fit.items() if k.startswith(("heldout_mape_", "train_mape_"))}
    where = _display(path)
    source = f"torch kernels on {'an H100' if 'H100' in str(data['device']) else data['device']} ({_display(path.parent)}), not vLLM"
    return {
        "schema": "agentsim-profile/1",
        "model": model,
        "device": f"{data['device']} (torch kernels, not vLLM)",
        "engine": eng,
        "kv_bytes_per_block": 2 * model["num_layers"] * model["num_kv_heads"] * model["head_dim"] * model["dtype_bytes"]
        * eng["block_size"],
        "step_time": step["coef"],
        "prefill_quadratic": quad["coef"],
        "pcie": pcie_from(data),
        "fit_error": {"unit": "percent (MAPE)", "step_model_mape": step["heldout_mape"],
                      "step_model_train_mape": step["train_mape"], "prefill_quadratic_mape": quad["heldout_mape"],
                      "prefill_quadratic_train_mape": quad["train_mape"], **per_kind(step),
                      "linear_step_model": {"heldout_mape": lin["heldout_mape"], **per_kind(lin)}},
        "probes": rows,
        "provenance": {
            "source": source, "method": "sim calibrate --from-probes (calibrate/measured.py): the project's fits of "
                                        "kernel timings from a file", "file": where,
            "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "model": model["name"] + " shape, random bf16 weights",
            "torch": data.get("torch"), "cuda": data.get("cuda"),
            "how": {
                "rows": "prefill (k == 0) and cached_prefill (k > 0): one step with one unchunked (n, k + n) chunk, "
                        "eager, no CUDA graph; decode: one step of B sequences (1, ctx) in a CUDA graph",
                "seconds": f"each probe's {stat} over its repeats",
                "heldout": "within each kind, in file order, every third probe (index % 3 == 2) is held out",
                "step_time": "calibrate/fit.py fit_gpu_step_model: least squares on relative error of "
                             "smax(launch, c0 + smax(w, c1*tokens) + c2*sum q*k + c3*seqs + c4*sum k + c5*sum q*(k-q)) "
                             "(launch floor only for steps with a prefill chunk; smax = p-norm; sim/hardware/profile.py)",
                "linear_step_model": "fit_error of the linear model (c0..c5, NNLS) on the same rows, for comparison",
                "prefill_quadratic": "non-negative least squares (relative error) of fresh prefill latency on [1, n, n^2]",
                "engine": eng["computed"],
                "pcie": "t = latency + bytes/bw per direction from the file's pcie section; the slower direction"}},
    }
