"""The table of docs/reference/profiles.md "Checking a profile against independent references":
`sim profile check` (sim/hardware/check.py) of the bundled H100 profile, the H200 roofline
profile (`sim profile roofline --gpu H200 --model llama3.1-8b`) and the calibrated H200
profiles in MEASUREMENTS/h200/calibrate-torch-cuda-*.json and benchmarks/gpu/*/ (each run of
benchmarks/gpu/calibration_check.sh: its calibrated profiles and reference probes, same
GPU), each against the probe files of MEASUREMENTS/h100, MEASUREMENTS/h200 and benchmarks/gpu/*/ whose
GPU and model are the profile's, and against aiconfigurator (when the optional extra is
installed; --write-docs needs it). MEASUREMENTS: the shipped sim/hardware/measurements.

    python benchmarks/profile_check_table.py [--measurements DIR] [--write-docs [PAGE]]

Prints a Markdown table; --write-docs also puts it into docs/reference/profiles.md (or PAGE) in place
of the block between `<!-- profile_check_table: FLAGS -->` and `<!-- end profile_check_table -->`.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402

from agentsim.errors import InputError  # noqa: E402
from sim.hardware import check as pc  # noqa: E402
from sim.hardware import roofline  # noqa: E402
from sim.hardware.profile import load_profile, parse_profile  # noqa: E402

REPO = roofline.REPO_ROOT
GPU_RUNS = REPO / "benchmarks" / "gpu"
COLS = ("fresh prefill", "cached prefill", "decode B=1", "decode B=2-16", "decode B=17-64", "decode B=65-256", "mixed", "all")


def _rel(path: Path) -> str:
    path = Path(os.path.normpath(Path(path).absolute()))
    return os.path.relpath(path, REPO)


def profiles(shared: Path) -> list[tuple[str, object, Path | None]]:
    """(how the docs name it, Profile, its GPU run's folder or None) for each profile of the table."""
    out = [("`llama3.1-8b-h100`", load_profile("llama3.1-8b-h100"), None)]
    raw, _ = roofline.roofline_profile("H200", "llama3.1-8b")
    out.append(("roofline H200 Llama-3.1-8B", parse_profile(raw, "roofline-h200-llama3.1-8b"), None))
    for f in sorted((shared / "h200").glob("calibrate-torch-cuda-*.json")):
        out.append((f"`{f.stem}` (H200)", load_profile(str(f)), None))
    for f in sorted(GPU_RUNS.glob("*/calibrate-torch-cuda-*.json")):
        out.append((f"`{f.stem}` ({f.parent.name})", load_profile(str(f)), f.parent))
    return out


def probe_files(shared: Path, run: Path | None) -> list[Path]:
    """The shared probe files, and those a GPU run took beside its calibration (same GPU)."""
    return sorted(shared.glob("*/*-probes.json")) + (sorted(run.glob("*-probes*.json")) if run else [])


def probe_label(f: Path, shared: Path) -> str:
    """'H200 llama3.1-8b probes', "same run's qwen3-8b probes (repeat2)": whose probes, and which
    repeat of the reference when a run timed it more than once (its files *-probes-repeatN.json)."""
    where = f.parent.name.upper() if f.parent.parent == shared else "same run's"
    repeat = f.stem.split("-probes", 1)[1].lstrip("-")
    return f"{where} {f.name.split('-shape')[0]} probes" + (f" ({repeat})" if repeat else "")


def rows(shared: Path, with_aic: bool) -> list[tuple[str, str, dict]]:
    """(profile, reference, reference dict) for every pair whose GPU and model match."""
    out = []
    for name, prof, run in profiles(shared):
        for f in probe_files(shared, run):
            try:
                ref = pc.probe_reference(prof, f)
            except InputError:  # another GPU or model: not a reference for this profile
                continue
            out.append((name, probe_label(f, shared), ref))
        if with_aic:
            ref = pc.aiconfigurator_reference(prof)
            out.append((name, f"aiconfigurator ({ref['system']}, {ref['backend']})", ref))
    return out


def table(shared: Path, with_aic: bool) -> str:
    lines = ["| profile | reference | " + " | ".join(COLS) + " | worst point |", "|" + "---|" * (len(COLS) + 3)]
    for name, what, ref in rows(shared, with_aic):
        by = {s["kind"]: s for s in ref["summary"]}
        cells = [f"{by[c]['mape_pct']:.1f} ({by[c]['mean_error_pct']:+.1f})" if c in by else "" for c in COLS]
        w = by["all"]["worst"]
        lines.append(f"| {name} | {what} | " + " | ".join(cells) + f" | {w['point']}: {w['error_pct']:+.0f}% |")
    return "\n".join(lines)


def agreement(shared: Path) -> str:
    """aiconfigurator's estimates of the probe files' own points against the probes: how far
    the two references are from each other."""
    lines = ["| aiconfigurator | reference | " + " | ".join(COLS) + " | worst point |", "|" + "---|" * (len(COLS) + 3)]
    for f in sorted(shared.glob("*/*-probes.json")):  # the shared Llama files: one per GPU
        data = pc.load_probe_file(f)
        raw, _ = roofline.roofline_profile(pc.gpu_family(data["device"]), "llama3.1-8b")  # the GPU and model to ask for
        probes = pc.read_probes(data)
        est, used = pc.aiconfigurator_points(parse_profile(raw, "roofline"), probes)
        if len(est) != len(probes):
            raise SystemExit(f"error: {f}: {len(probes) - len(est)} points beyond the roofline profile's max_model_len")
        by = {s["kind"]: s for s in pc.summary(pc.error_rows([p.seconds[pc.STAT] for p in est], probes))}
        cells = [f"{by[c]['mape_pct']:.1f} ({by[c]['mean_error_pct']:+.1f})" if c in by else "" for c in COLS]
        w = by["all"]["worst"]
        lines.append(f"| {used['system']}, {used['backend']} | {f.parent.name.upper()} probes | " + " | ".join(cells)
                     + f" | {w['point']}: {w['error_pct']:+.0f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measurements", default=str(roofline.MEASUREMENTS_DIR),
                    help="a measurements folder with h100/ and h200/ (default: the shipped sim/hardware/measurements)")
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "profiles.md"), default=None, metavar="PAGE",
                    help="also replace the table in PAGE (default docs/reference/profiles.md) between "
                         "`<!-- profile_check_table: FLAGS -->` and `<!-- end profile_check_table -->`")
    a = ap.parse_args(argv)
    shared = Path(a.measurements)
    if not (shared / "h100").is_dir() or not (shared / "h200").is_dir():
        raise SystemExit(f"error: {shared} has no h100/ and h200/ measurement folders; give --measurements DIR")
    try:
        pc._aic()
        with_aic = True
    except InputError as e:
        if a.write_docs:
            raise SystemExit(f"error: the docs table has aiconfigurator rows: {e}")
        print(f"note: no aiconfigurator rows ({e})", file=sys.stderr)
        with_aic = False
    body = table(shared, with_aic)
    if with_aic:
        body += ("\n\nThe two references against each other (aiconfigurator's estimate of each probe's point "
                 "against the probe's median_s):\n\n" + agreement(shared))
    print(body)
    if a.write_docs:
        write_block(a.write_docs, "profile_check_table", f"--measurements {_rel(shared)}", body)
        print(f"wrote {a.write_docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
