"""How far the step model is from a validation run's real steps, per step kind, with the
profile's probes refitted on the minimum (the calibration's rule) or the median of their
repeats. Reads what `sim validate` / the validation test writes for one shape: profile.json
(probes with every repeat's time) and real_steps_<policy>_<repeat>.parquet.

    python benchmarks/replay_step_error.py val/swebench

Prints, per replay, (predicted - real) / real of the summed step time: all steps, steps
that carry prefill tokens, decode-only steps. Nothing here is fitted on the replays.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.fit import fit_step_model
from calibrate.validate import step_check
from sim.profile import parse_profile

RULES = {"min": np.min, "median": np.median}


def refit(raw: dict, rule: str):
    """The profile with its step model refitted on each probe's `rule` over its repeats."""
    rows = copy.deepcopy(raw["probes"])
    for row in rows:
        row["seconds"] = float(RULES[rule](np.asarray(row["samples"], float)))
    return parse_profile({**raw, "step_time": fit_step_model(rows)["coef"]}, f"{rule}-of-repeats")


def errors(prof, steps: pd.DataFrame) -> dict:
    """validate.step_check's error over all steps, prefill-bearing steps and decode-only steps."""
    decode = steps["tokens"] == steps["seqs"]
    return {name: step_check(part, prof)["step_model_error"]
            for name, part in (("all", steps), ("prefill_steps", steps[~decode]), ("decode_steps", steps[decode]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape_dir", type=Path, help="a validation output directory of one shape (has profile.json)")
    args = ap.parse_args()
    runs = sorted(args.shape_dir.glob("real_steps_*.parquet"))
    if not (args.shape_dir / "profile.json").is_file() or not runs:
        print(f"error: {args.shape_dir} has no profile.json or no real_steps_*.parquet (a validation shape directory)",
              file=sys.stderr)
        sys.exit(2)
    raw = json.loads((args.shape_dir / "profile.json").read_text())
    spread = {}
    for p in raw["probes"]:
        s = np.asarray(p["samples"], float)
        spread.setdefault(p["kind"], []).append(np.median(s) / s.min() - 1)
    print("probe repeats, median over min - 1: " + ", ".join(f"{k} {100 * np.mean(v):.1f}%" for k, v in spread.items()))
    rows = []
    for rule in RULES:
        prof = refit(raw, rule)
        for f in runs:
            rows.append({"rule": rule, "run": f.stem.removeprefix("real_steps_"),
                         **{k: round(100 * v, 1) for k, v in errors(prof, pd.read_parquet(f)).items()}})
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
