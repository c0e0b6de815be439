"""Calibration end to end: engine -> limits -> probes -> fits -> profile JSON.

Python API (used by `sim calibrate`, the engine tests and sim-vs-real validation):
    run_calibration(model=None, out=None, device="auto", quick=False, **limits) -> profile dict
    calibrate_engine(llm, device, quick=False) -> profile dict   (an engine already started)
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from calibrate.engine import resolve_device, start_engine
from calibrate.fit import fit_gpu_step_model, fit_quadratic, fit_step_model
from calibrate.limits import check_limits, read_limits
from calibrate.pcie import measure_pcie
from calibrate.probes import REPEATS, Runner, plan, repeat_noise, repeat_time
from calibrate import sampler
from agentsim.files import atomic_write

HOW = {
    "engine": "read from the started engine: vllm_config (scheduler/cache/model config) and the engine core's "
              "scheduler.kv_cache_config (num_blocks, page bytes per block)",
    "prefill": "fresh prompt of n random token ids, max_tokens=1; RequestOutput.metrics first_token_ts - scheduled_ts",
    "cached_prefill": "prefix of P tokens sent first; then prefix + n new tokens (engine reports P cached), same timing",
    "decode": "B distinct prefixes of L tokens sent first (cached); B prompts = own prefix + 16 tokens sent together; "
              "(last_token_ts - first_token_ts) / steps, median over the batch",
    "repeats": "each probe repeated (5 times unless given), interleaved with the others; the median is kept",
    "step_time": "non-negative least squares (relative error) of all training probes (prefill, cached_prefill, "
                 "decode) on features [steps, tokens, sum q*k, seqs, sum k, sum q*(k-q)] summed over a prefill's chunks "
                 "(max_num_batched_tokens each) or averaged over decode steps",
    "prefill_quadratic": "non-negative least squares (relative error) of fresh prefill latency on [1, n, n^2]",
    "fit_error": "MAPE in percent on held-out probes (sizes/batches not used by the fit); repeat_noise_pct: the "
                 "median over probes of their repeats' median absolute deviation over their median",
}


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()} x{os.cpu_count()}"


def calibrate_engine(llm, device: str, quick: bool = False, reps: int | None = None, seed: int = 0,
                     progress: bool = True, requested: dict | None = None, started_s: float = 0.0) -> dict:
    """Probe a started engine and return the profile (not written)."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    lim = read_limits(llm)
    check_limits(requested or {}, lim["engine"])
    eng = lim["engine"]
    budget = eng["max_num_batched_tokens"]
    probes = plan(eng, quick)
    reps = reps or REPEATS
    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    runner = Runner(llm, vocab, budget, seed)
    runner.warm_up(max((p for p in probes if p.kind == "decode"), key=lambda p: (p.batch, -p.prefix)))
    with tqdm(total=reps * len(probes), desc="calibrate", unit="probe", disable=not progress) as bar:
        for _ in range(reps):
            for p in probes:
                bar.set_postfix_str(f"{p.kind} n={p.new} P={p.prefix} B={p.batch}")
                runner.run(p)
                bar.update()
    rows = [p.to_json(budget) for p in probes]
    meta = {"quick": quick, "repeats": reps, "seed": seed, "engine_start_s": round(started_s, 1)}
    profile = build_profile(lim, rows, measure_pcie(device), device_name(device), meta)
    profile["sampler"] = measure_sampler(vocab, eng["max_num_seqs"], device, quick)
    profile["provenance"]["total_calibration_s"] = round(time.perf_counter() - t0 + started_s, 1)
    return profile


def measure_sampler(vocab: int, max_seqs: int, device: str, quick: bool, impl: str = "vllm") -> dict:
    """The profile's `sampler` section (calibrate/sampler.py): vLLM's own Sampler per sampling
    mode on this device, whose greedy one the probes above hold (in_steps), or, for the torch
    backend, vLLM's native path re-written in torch, which its steps do not hold."""
    rows, repeats = sampler.rows_for(max_seqs, device, quick), 5 if quick else 10
    modes = sampler.measure(vocab, rows, device, impl, repeats)
    return sampler.section(modes, vocab, device, device_name(device), impl, rows, repeats, how="sim calibrate")


VLLM_METHOD = "sim calibrate (calibrate/run.py) on a real vLLM engine, dummy weights"


def choose_step_model(rows: list[dict]) -> tuple[dict, str, dict]:
    """The linear step model, or the GPU form (calibrate/fit.py) where every row is one step
    and the GPU form predicts the held-out rows better: (fit, form, the other form's fit)."""
    lin = fit_step_model(rows)
    if any(r["features"]["steps"] != 1 for r in rows):
        return lin, "linear", {}
    # The torch plan is mostly decode and mixed probes (about 85 of 105 on a GPU): unweighted,
    # the fit gave the few prefill probes away (cached prefill 8.6-24.9% held out on the five
    # committed cuDNN runs, benchmarks/gpu/; 4.8-20.2% with each kind weighing the same).
    gpu = fit_gpu_step_model(rows, balance_kinds=True)
    if gpu["heldout_mape"] < lin["heldout_mape"]:
        return gpu, "gpu", lin
    return lin, "linear", gpu


def build_profile(lim: dict, rows: list[dict], pcie: dict, device: str, meta: dict, *,
                  method: str = VLLM_METHOD, engine_version: str | None = None, how: dict | None = None,
                  gpu_form: bool = False) -> dict:
    """The profile JSON from the engine limits (read_limits, or computed ones) and the probe
    rows; shared by the vLLM and the torch backend (calibrate/torch_backend.py), which
    differ only in method, engine_version and how the probes were timed. `gpu_form`: the
    linear and the GPU step model are both fitted and the one with the lower held-out
    error is kept (choose_step_model)."""
    step, form, other = choose_step_model(rows) if gpu_form else (fit_step_model(rows), "linear", {})
    quad = fit_quadratic(rows)
    eng = lim["engine"]
    per_kind = lambda fit: {k: v for k, v in fit.items() if k.startswith(("heldout_mape_", "train_mape_"))}
    fit_error = {"unit": "percent (MAPE)", "step_model_mape": step["heldout_mape"],
                 "prefill_quadratic_mape": quad["heldout_mape"], "step_model_train_mape": step["train_mape"],
                 "prefill_quadratic_train_mape": quad["train_mape"], **per_kind(step)}
    if all(r.get("samples") for r in rows):  # repeats measured here (not kernel timings from elsewhere)
        fit_error["repeat_noise_pct"] = round(float(np.median([repeat_noise(r["samples"]) for r in rows])), 2)
    if gpu_form:
        fit_error["step_model_form"] = form
        if other:
            fit_error[f"{'linear' if form == 'gpu' else 'gpu'}_step_model"] = {"heldout_mape": other["heldout_mape"],
                                                                                **per_kind(other)}
        how = {**(how or HOW), "step_time": "calibrate/run.py choose_step_model: the linear model (NNLS, relative "
               "error) and the GPU form smax(launch, c0 + smax(w, c1*tokens) + ...) (calibrate/fit.py "
               "fit_gpu_step_model) fitted on one-step probes; the one with the lower held-out MAPE is kept"}
    return {
        "schema": "agentsim-profile/1",
        "model": lim["model"],
        "device": device,
        "engine": eng,
        "kv_bytes_per_block": lim["kv_bytes_per_block"],
        "step_time": step["coef"],
        "prefill_quadratic": quad["coef"],
        "pcie": pcie,
        "fit_error": fit_error,
        "probes": rows,
        "provenance": {"method": method, "model": lim["model"]["name"],
                       "engine_version": engine_version or f"vllm {eng['version']}",
                       "device": device, "date": dt.date.today().isoformat(), "how": how or HOW, **meta},
    }


def refit_profile(raw: dict, rule=repeat_time) -> dict:
    """The profile re-derived from its probes' stored repeats, each probe's time being
    `rule` of its samples (the calibration's own rule by default): the same measurements,
    refitted without an engine (a profile written under an older rule, or a diagnostic)."""
    rows = copy.deepcopy(raw["probes"])
    for row in rows:
        row["seconds"] = round(float(rule(row["samples"])), 6)
    lim = {k: raw[k] for k in ("model", "engine", "kv_bytes_per_block")}
    prov = raw["provenance"]
    meta = {k: v for k, v in prov.items() if k not in ("method", "model", "engine_version", "device", "date", "how")}
    # a GPU calibration chose between two forms (choose_step_model): the refit chooses again
    new = build_profile(lim, rows, raw["pcie"], raw["device"], meta, method=prov["method"],
                        engine_version=prov["engine_version"], how={**prov["how"], "repeats": HOW["repeats"]},
                        gpu_form="step_model_form" in raw.get("fit_error", {}))
    new["provenance"]["date"] = prov["date"]
    return new


def write_profile(profile: dict, out: str | Path) -> Path:
    """Check that the simulator can load it, then write atomically (temp file + rename)."""
    from sim.hardware.profile import parse_profile

    out = Path(out)
    parse_profile(json.loads(json.dumps(profile)), out.stem)
    text = json.dumps(profile, indent=1) + "\n"
    atomic_write(out, lambda tmp: Path(tmp).write_text(text))
    return out


def run_calibration(model=None, out=None, device: str = "auto", quick: bool = False, reps: int | None = None,
                    seed: int = 0, progress: bool = True, **limits) -> dict:
    """Start the engine, calibrate it, write the profile to `out` (if given) and return it."""
    t0 = time.perf_counter()
    device = resolve_device(device)
    llm = start_engine(model, device, seed=seed, **limits)
    started = time.perf_counter() - t0
    profile = calibrate_engine(llm, device, quick, reps, seed, progress, requested=limits, started_s=started)
    if out:
        write_profile(profile, out)
    return profile
