"""The GPU step model of each committed cuDNN calibration run (benchmarks/gpu/*/) refitted
on its own probes with each row weighing the same and with each kind of row (prefill,
cached prefill, decode, mixed) weighing the same (calibrate/fit.py fit_gpu_step_model
balance_kinds, what `sim calibrate --backend torch` uses on a GPU), judged per kind against
the run's independent reference probes (each of its reference runs, `/`-separated), and
the fit's MAPE on its own held-out probes:

    python benchmarks/gpu/fit_weighting.py
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from calibrate.fit import fit_gpu_step_model, gpu_step_time  # noqa: E402
from sim.hardware import check as pc  # noqa: E402

RUNS = Path(__file__).resolve().parent
KINDS = ("fresh prefill", "cached prefill", "decode B=1", "decode B=2-16", "decode B=17-64", "decode B=65-256")


def mape_by_kind(coef: dict, probe_file: Path) -> dict:
    probes = pc.read_probes(json.loads(probe_file.read_text()))
    # the fit's feature order: steps, tokens, sum_qk, seqs, sum_k, sum_q_cached
    X = [[1.0, f[0], f[2], f[1], f[3], f[4]] for f in (p.features() for p in probes)]
    rows = pc.error_rows([float(t) for t in gpu_step_time(coef, X)], probes)
    return {s["kind"]: s["mape_pct"] for s in pc.summary(rows)}


def main() -> None:
    warnings.simplefilter("ignore")  # the optimiser's trial points overflow the smooth max now and then
    print("| run | model | weighting | " + " | ".join(KINDS) + " | own held-out |")
    print("|" + "---|" * (len(KINDS) + 4))
    for path in sorted(RUNS.glob("*/calibrate-torch-cuda-*.json")):
        raw = json.loads(path.read_text())
        if "cuDNN" not in raw["provenance"].get("attention", ""):
            continue  # the FlashAttention runs: another step, superseded
        model = path.stem.removeprefix("calibrate-torch-cuda-")
        refs = sorted(path.parent.glob(f"{model}-shape-torch-probes*.json"))
        for balance in (False, True):
            fit = fit_gpu_step_model(raw["probes"], balance_kinds=balance)
            got = [mape_by_kind(fit["coef"], r) for r in refs]
            cells = ["/".join(f"{g[k]:.1f}" for g in got if k in g) for k in KINDS]
            print(f"| {path.parent.name} | {model} | {'by kind' if balance else 'by row'} | " + " | ".join(cells)
                  + f" | {fit['heldout_mape']:.1f} |")


if __name__ == "__main__":
    main()
