"""Step times and collectives from measured kernels (sim/hardware/specs/measured_kernels.json).

The file is derived by benchmarks/measured_kernels.py from NVIDIA aiconfigurator's database
of vLLM kernels measured per GPU (aiconfigurator-core 0.12.0, Apache-2.0): per GPU, model
and tp, the GPU step model of sim/hardware/profile.py (c0..c5, w, launch, p) fitted on the step
times aiconfigurator composes from its measured GEMMs, attention, MoE and all-reduce
kernels; per GPU, vLLM's all-reduce and NCCL's all-to-all at 2, 4 and 8 GPUs as latency +
bytes / bandwidth. The data ships: a user needs no extra to use it.

`sim profile roofline` (sim/hardware/roofline.py) takes a GPU, model and tp's coefficients from here
where they exist (`source: measured-kernels ...`), else the roofline (`source: roofline`);
a roofline with tp or ep > 1 on a GPU listed here prices its collectives with the measured
fits instead of the link's datasheet bandwidth.

vLLM changed between releases, so a profile for a release (`--vllm-version`) takes what was
measured nearest it (that release, else the latest before it, else the earliest): vLLM's
all-reduce per release (aiconfigurator measured several), and a GPU's fits of another release
(`by_vllm`: the RTX PRO 6000's LLMServingSim layers of vLLM 0.19.0 beside aiconfigurator's 0.24.0
kernels). Steps that hold another release's all-reduce, or none (one rank's layers), get the
difference as step_time.collective_shift(_token).
"""
from __future__ import annotations

import json
import statistics
from functools import lru_cache
from pathlib import Path

from sim.hardware.model_shape import ACT_BYTES

DATA_FILE = Path(__file__).parent / "specs" / "measured_kernels.json"
ABOUT = ("Step-time coefficients (sim/hardware/profile.py's GPU step model: c0..c5, w, launch, p) per GPU, model and tp, and "
         "collectives per GPU and GPU count, derived by benchmarks/measured_kernels.py from the vLLM kernel database of "
         "aiconfigurator-core 0.12.0 (NVIDIA, Apache-2.0; step times as its engine composes them from measured GEMM, "
         "attention, MoE and all-reduce kernels; a decode attention of more KV heads per GPU than its table measured priced "
         "on the table's rows of the same launch: sim/hardware/check.py aic_decode_attention_remap). heldout/train: MAPE in percent per kind against that database's steps. "
         "Only kernel data set these numbers; no end-to-end server run.")
LICENCE = ("aiconfigurator-core is Apache-2.0 (SPDX header of its systems/data files: Copyright (c) NVIDIA CORPORATION & "
           "AFFILIATES); this file holds coefficients fitted to its data, not the data")
KV_FP8_TABLE = "kv_fp8_models"  # per GPU: fits on steps with vLLM's --kv-cache-dtype fp8 (attention reads FP8 KV)
COEF_KEYS = ("c0", "c1", "c2", "c3", "c4", "c5", "w", "launch", "p")


@lru_cache(maxsize=1)
def load() -> dict:
    """The shipped file ({} of GPUs when it is absent)."""
    if not DATA_FILE.is_file():
        return {"gpus": {}}
    return json.loads(DATA_FILE.read_text())


def nearest_release(releases, vllm_version: str) -> str:
    """Of releases measured, the one a run of vllm_version takes: that release, else the latest before it,
    else the earliest."""
    from sim.hardware.kv_pool import release

    rels = sorted(releases, key=release)
    at = [r for r in rels if release(r) <= release(vllm_version)]
    return at[-1] if at else rels[0]


def release_entry(gpu: str, vllm_version: str | None = None) -> dict:
    """The entry of `gpu` whose fits a run of vllm_version takes (nearest_release): the GPU's own, measured on
    the release it names, or one of its `by_vllm`, fitted on measurements of another release; no release: its own."""
    g = load()["gpus"][gpu]
    if vllm_version is None or not g.get("by_vllm"):
        return g
    entries = {**g["by_vllm"], g["vllm"]: g}
    return entries[nearest_release(entries, vllm_version)]


def source_text(gpu: str, entry: dict | None = None) -> str:
    """provenance.source of a GPU's measured steps (entry: release_entry's, default the GPU's own)."""
    d = load()
    g = entry or d["gpus"][gpu]
    if "source" in g:  # fitted from LLMServingSim's per-layer measurements
        return f"measured-kernels ({g['source'].split(' (')[0]})"
    # the derive adds the rotary and KV-cache write of every token, which aiconfigurator prices for one
    return (f"measured-kernels ({d['package'].replace('aiconfigurator-core', 'aiconfigurator')} database, "
            f"vLLM {g['vllm']}, rotary and KV write of every token)")


def kernels_text(gpu: str, kv_fp8: bool = False, entry: dict | None = None) -> str:
    """Where a GPU's fitted steps come from, for a profile's provenance."""
    d = load()
    g = entry or d["gpus"][gpu]
    if "source" in g:
        return f"the steps composed from the {g['source']}"
    return (f"the vLLM {g['vllm']} kernels of {d['package']}'s database for {g['system']} (GEMMs, "
            f"attention{' with an FP8 KV cache' if kv_fp8 else ''}, MoE, all-reduce, as its engine composes a step)")


def fitted(gpu: str, model: str, tp: int, kv_fp8: bool = False, vllm_version: str | None = None) -> tuple[dict, dict] | None:
    """(entry, fit) of a GPU, model and tp: release_entry's fit where it has one, else the GPU's own
    (kv_fp8: its fits on steps with an FP8 KV cache, the `kv_fp8_models` table); None if neither has one."""
    if gpu not in load()["gpus"]:
        return None
    own = load()["gpus"][gpu]
    for entry in ([] if kv_fp8 else [release_entry(gpu, vllm_version)]) + [own]:
        fit = entry.get(KV_FP8_TABLE if kv_fp8 else "models", {}).get(model, {}).get(str(tp))
        if fit is not None:
            return entry, fit
    return None


def step_fit(gpu: str, model: str, tp: int, kv_fp8: bool = False, vllm_version: str | None = None) -> dict | None:
    """The fitted entry {coef, points, heldout, train} of a GPU, model and tp (`fitted`'s), or None."""
    f = fitted(gpu, model, tp, kv_fp8, vllm_version)
    return f[1] if f else None


def collective(gpu: str, op: str, n: int, vllm_version: str | None = None) -> dict | None:
    """{latency_s, GBps, fit_mape_pct, source, ...} of all_reduce or all_to_all over n GPUs, or None.
    vllm_version: the all-reduce measured on that vLLM release, or else on the latest measured
    before it, or else the earliest (vLLM's all-reduce changed between releases); None: the
    latest release measured."""
    c = load()["gpus"].get(gpu, {}).get("collectives", {}).get(op, {})
    if vllm_version is not None and c.get("by_vllm"):
        c = c["by_vllm"][nearest_release(c["by_vllm"], vllm_version)]
    f = c.get(str(n))
    return {**f, "source": c["source"]} if f and f.get("GBps") else None


def collective_shift(gpu: str, model: dict, n: int, vllm_version: str | None,
                     entry: dict | None = None) -> tuple[float, float, str] | None:
    """(seconds a step, seconds a token, what) to add to the measured steps of `entry` (release_entry's,
    default the GPU's own) on n GPUs in tensor parallel so they hold vllm_version's all-reduce: the
    difference to the all-reduce of the release aiconfigurator composed them at, or the whole of it on
    steps of single-GPU layers, which hold none. None where nothing changes or it is not measured. Two
    all-reduces per layer of a token's hidden state."""
    entry = entry or load()["gpus"][gpu]
    layers = "source" in entry  # LLMServingSim's layers: each rank's layers, no collective
    if vllm_version is None and not layers:
        return None
    run = collective(gpu, "all_reduce", n, vllm_version or entry["vllm"])
    held = None if layers else collective(gpu, "all_reduce", n, entry["vllm"])
    if run is None or (not layers and (held is None or held["source"] == run["source"])):
        return None
    per, msg = 2 * model["num_layers"], model["hidden_size"] * ACT_BYTES
    lat, inv = (held["latency_s"], 1 / (held["GBps"] * 1e9)) if held else (0.0, 0.0)
    dc0 = per * (run["latency_s"] - lat)
    dc1 = per * msg * (1 / (run["GBps"] * 1e9) - inv)
    what = (f"all-reduce of vLLM {vllm_version or entry['vllm']}: {run['latency_s'] * 1e6:.1f} us + bytes / {run['GBps']:.3g} "
            f"GB/s over {n} GPUs ({run['source'].split(' (')[0]}, fit MAPE {run['fit_mape_pct']}%) ")
    what += (f"in place of the {held['latency_s'] * 1e6:.1f} us + bytes / {held['GBps']:.3g} GB/s the composed steps hold "
             f"({held['source'].split(' (')[0]})" if held else "added to the steps of one rank's layers, which hold none")
    return dc0, dc1, (what + f": step_time.collective_shift {dc0 * 1e3:+.3f} ms a step, "
                             f"collective_shift_token {dc1 * 1e6:+.3f} us a token")


# aiconfigurator's collector times vLLM's linear layers on weights it never loads (fresh device memory: zeros); a
# compute-bound GEMM on trained-like values draws more power, so runs at a lower clock under the limit. Measured on
# an H200 (benchmarks/gpu/gemm_power.py, table: benchmarks/gemm_power_table.py); the H100 is the same chip and limit.
GEMM_POWER_FILE = Path(__file__).parent / "measurements" / "h200" / "gemm-power.json"
GEMM_VALUES_GPUS = {"H200": "measured on this GPU", "H100": "measured on an H200, the same GH100 chip and 700 W limit"}
TRAINED_FILL = "randn_x0.02"  # random weights at a trained layer's scale
COMPUTE_BOUND_ROWS = 1024


def gemm_empty_base(rows: list[dict]) -> dict[tuple[str, str, int], float]:
    """(dtype, GEMM, m) -> the collector's time on empty weights, what a gemm_power.py row is measured against
    (records before its --dtype are bf16)."""
    return {(r.get("dtype", "bf16"), r["gemm"], r["m"]): r["collector"]["s"] for r in rows if r["fill"] == "empty"}


def gemm_value_ratios(rows: list[dict], mode: str = "collector") -> dict[tuple[str, str], list[float]]:
    """(dtype, fill) -> each compute-bound row's (m >= 1,024) time in regime `mode` over the collector's time on
    empty weights of the same dtype, GEMM and m."""
    base, out = gemm_empty_base(rows), {}
    for r in rows:
        key = (r.get("dtype", "bf16"), r["gemm"], r["m"])
        if r["m"] >= COMPUTE_BOUND_ROWS and key in base:
            out.setdefault((key[0], r["fill"]), []).append(r[mode]["s"] / base[key])
    return out


@lru_cache(maxsize=1)
def gemm_values_factor() -> float:
    """The median, over the record's compute-bound bf16 GEMMs, of their time on trained-scale random weights over
    their time on empty (zero) weights, both in the collector's short graph replays."""
    return statistics.median(gemm_value_ratios(json.loads(GEMM_POWER_FILE.read_text())["rows"])["bf16", TRAINED_FILL])


def gemm_values(c: dict, gpu: str, entry: dict, shape: dict, n: int) -> tuple[str, bool]:
    """Price the compute-bound slope c1 of aiconfigurator's composed steps (its bf16 GEMMs timed on zero weights) for
    trained weights, in place: its part beside the composed all-reduce (tp > 1: two a layer of a token's hidden
    state, at the measured rate the steps hold) times gemm_values_factor. Returns (text, priced): the provenance of
    the pricing, or, where nothing is measured, a caveat saying why c1 keeps the zero-weight price (a user comparing
    the profile with a GH100 bf16 one, whose GEMMs are priced, sees it)."""
    f = gemm_values_factor()
    why = ("not measured on this GPU" if gpu not in GEMM_VALUES_GPUS
           else "FP8 GEMMs' values are not measured (benchmarks/gpu/gemm_power.py --dtype fp8)" if shape.get("dtype_bytes") != 2
           else None)
    ar = 0.0
    if why is None and n > 1:
        held = collective(gpu, "all_reduce", n, entry["vllm"])
        if held is None:
            why = "the all-reduce inside the composed steps is not measured, so their GEMMs' part is not known"
        else:
            ar = 2 * shape["num_layers"] * shape["hidden_size"] * ACT_BYTES / (held["GBps"] * 1e9)
    if why is not None:
        return (f"GEMMs as aiconfigurator timed them, on unloaded (zero) weights: {why}. Compute-bound bf16 GEMMs on "
                f"trained-scale weights take {f:.3f}x as long on the GH100 chip, which the H100 and H200 bf16 profiles "
                "price; this profile's compute-bound steps may be cheap by as much"), False
    c["c1"] = float(f"{c['c1'] + (f - 1) * max(0.0, c['c1'] - ar):.5g}")
    part = "c1" if n == 1 else f"c1 less the composed all-reduce's {ar * 1e6:.3f} us a token"
    return (f"{part} x {f:.3f}: aiconfigurator "
            f"times its GEMMs on unloaded (zero) weights; compute-bound bf16 GEMMs on trained-scale random weights take "
            f"{f:.3f}x as long in its collector's short replays (median over m >= {COMPUTE_BOUND_ROWS:,}, "
            f"{GEMM_VALUES_GPUS[gpu]}: {GEMM_POWER_FILE.relative_to(GEMM_POWER_FILE.parents[4]).as_posix()}); sustained "
            "at the power limit they take longer again, in short bursts less (not modelled: a profile does not know the load)"), True


def gpu_name(gpu: dict) -> str | None:
    """The canonical name (sim/hardware/specs/gpus.json) of a GPU spec that has measured data."""
    for g, d in load()["gpus"].items():
        if d.get("system") == gpu.get("aiconfigurator_system"):
            return g
    return None


def collectives_text(parts: dict, layout: str, n: int) -> str:
    mc = parts["collective_measured"]
    what = "all-reduce, 2 per layer" if layout == "tp" else "all-to-all dispatch and combine per MoE layer"
    return (f"MEASURED: {what} over {n} GPUs at {mc['latency_s'] * 1e6:.1f} us + bytes / {mc['GBps']:.0f} GB/s, fitted on "
            f"aiconfigurator's {mc['source']} (fit MAPE {mc['fit_mape_pct']}%); in c0 (latency) and c1 (bytes per token)")


def use_measured(profile: dict, gpu: str, model: str, layout: str, n: int, notes: list[str],
                 kv_fp8: bool = False, shape: dict | None = None, vllm_version: str | None = None) -> list[str]:
    """Put the measured step coefficients of (gpu, model, tp) into a roofline profile where
    the file has them (a tp layout; kv_fp8: those fitted with an FP8 KV cache, never the bf16
    KV ones, whose attention reads twice the bytes); say which in provenance.source. shape and
    vllm_version: the model's shape and the run's release, whose measured all-reduce replaces the
    one the composed steps hold (collective_shift). Returns the notes."""
    found = fitted(gpu, model, n, kv_fp8, vllm_version) if layout == "tp" else None
    prov = profile["provenance"]
    if found is None:
        prov["source"] = "roofline"
        return notes
    d = load()
    entry, fit = found
    c = dict(fit["coef"])
    shift = collective_shift(gpu, shape, n, vllm_version, entry) if shape is not None and n > 1 else None
    if shift:  # outside the fitted overlaps: the all-reduce runs between the layers' kernels
        c["collective_shift"], c["collective_shift_token"] = (float(f"{dv:.5g}") for dv in shift[:2])
    values, priced = gemm_values(c, gpu, entry, shape or {}, n) if "source" not in entry else (None, False)
    src = source_text(gpu, entry)
    prov["source"] = src
    prov["method"] = (f"STEP TIMES FROM MEASURED KERNELS: sim/hardware/profile.py's GPU step model fitted per GPU, model and tp on "
                      f"{kernels_text(gpu, kv_fp8, entry)} (benchmarks/measured_kernels.py, sim/hardware/specs/measured_kernels.json); "
                      "engine limits and host link as the roofline's. Written by `sim profile roofline`.")
    for k in ("c0", "c1", "c2", "c3", "c4", "c5", "constants", "moe", "collectives"):
        prov.pop(k, None)
    held, g = fit["heldout"]["all"]["points"], entry
    grid = g.get("grid", "fresh and cached prefill, decode B 1-256 over 256-32K tokens, mixed")
    prov["step_time"] = (f"fitted on {fit['points'] - held} steps ({grid}), judged on {held} others "
                         f"({g.get('held_out', d['held_out'])})"
                         + ("; collectives inside: aiconfigurator's step includes vLLM's measured all-reduce"
                            if n > 1 and "source" not in g else ""))
    if shift:
        prov["collectives"] = shift[2]
    if priced:
        prov["gemm_values"] = values
    if "c6" in fit and "source" in fit["c6"]:  # the mixed decodes' price from another source than the rest
        notes = notes + [f"{fit['c6']['how']}, from the {fit['c6']['source']}; held-out MAPE of that excess "
                         f"{fit['c6']['heldout_mape_pct']}%"]
    # the roofline's caveats are about its own step prices
    caveats = prov.pop("caveats", [])
    notes = [x for x in notes if x not in caveats]
    if values and not priced:  # aiconfigurator's zero-weight GEMMs, not priced for trained weights: why
        prov["caveats"] = [values]
        notes = notes + prov["caveats"]
    if notes:
        prov["notes"] = notes
    else:
        prov.pop("notes", None)
    profile["device"] = profile["device"].replace("(roofline estimate, not measured)",
                                                  f"(measured kernels: {src.split('(', 1)[1]}")
    profile["step_time"] = c
    profile["prefill_quadratic"] = {"a": float(f"{c['c0'] + c['c3'] + c.get('routed', 0.0) + c.get('collective_shift', 0.0):.5g}"),
                                    "b": float(f"{c['c1'] + c['c4'] + c.get('collective_shift_token', 0.0):.5g}"), "c": c["c2"]}
    against = g["source"].split(" (")[0] if "source" in g else f"{d['package']}'s vLLM kernel"
    profile["fit_error"] = {"anchor": f"held-out MAPE % against {against} steps of this GPU, model and tp",
                            **{f"heldout_{k.replace(' ', '_').replace('=', '')}": v["mape_pct"] for k, v in fit["heldout"].items()}}
    return notes
