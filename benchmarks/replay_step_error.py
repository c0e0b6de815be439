"""How far the step model is from a validation run's real steps, per step kind, with the
profile's probes refitted on the minimum (the calibration's rule until 2026-11-24) or the
median (its rule since) of their repeats, and what each refit does to the validation's
verdict. Reads what `sim validate` / the validation test writes for one shape:
profile.json (probes with every repeat's time), real_steps_<policy>_<repeat>.parquet and
report.json.

    python benchmarks/replay_step_error.py val/swebench

Prints, per replay, (predicted - real) / real of the summed step time: all steps, steps
that carry prefill tokens, decode-only steps; then, per policy, the real mean JCT and the
simulator's on each refit profile, unscaled (the same simulation as the report's
`sim_unscaled_mean_jct` under the rule the run was calibrated with). Nothing here is
fitted on the replays.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.run import refit_profile
from calibrate.validate import SHAPES, sim_run
from calibrate.validate_report import step_check
from sim.run.simulate import arrivals_for
from sim.hardware.profile import parse_profile
from traces.schema import read_trace

RULES = {"min": np.min, "median": np.median}


def refit(raw: dict, rule: str):
    """The profile with its step model refitted on each probe's `rule` over its repeats."""
    return parse_profile(refit_profile(raw, RULES[rule]), f"{rule}-of-repeats")


def errors(prof, steps: pd.DataFrame) -> dict:
    """validate.step_check's error over all steps, prefill-bearing steps and decode-only steps."""
    decode = steps["tokens"] == steps["seqs"]
    return {name: step_check(part, prof)["step_model_error"]
            for name, part in (("all", steps), ("prefill_steps", steps[~decode]), ("decode_steps", steps[decode]))}


def verdicts(shape_dir: Path, profiles: dict) -> pd.DataFrame:
    """Per policy of the shape's report: real mean JCT and the simulator's (unscaled) on each
    profile, on the replays' own trace, arrivals and engine limits."""
    rep = json.loads((shape_dir / "report.json").read_text())
    shape = SHAPES[shape_dir.name]
    trace = shape.cut(read_trace(shape.trace)[0])
    arrivals = arrivals_for(trace, shape.jps, rep["setup"]["seed"])
    rows = []
    for pol, row in rep["policies"].items():
        real = row["real"]["mean_jct"]
        out = {"policy": pol, "real_mean_jct": round(real, 2)}
        for rule, prof in profiles.items():
            sim = sim_run(trace, arrivals, pol, prof, rep["setup"]["engine"], rep["setup"]["policy_args"].get(pol))
            out[f"sim_{rule}"] = round(sim.summary["mean_jct"], 2)
            out[f"error_{rule}_%"] = round(100 * (sim.summary["mean_jct"] / real - 1), 1)
        rows.append(out)
    return pd.DataFrame(rows)


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
    rows, profiles = [], {rule: refit(raw, rule) for rule in RULES}
    for rule, prof in profiles.items():
        for f in runs:
            rows.append({"rule": rule, "run": f.stem.removeprefix("real_steps_"),
                         **{k: round(100 * v, 1) for k, v in errors(prof, pd.read_parquet(f)).items()}})
    print(pd.DataFrame(rows).to_string(index=False))
    if (args.shape_dir / "report.json").is_file() and args.shape_dir.name in SHAPES:
        print("\nmean JCT, real and simulated on each refit (unscaled):")
        print(verdicts(args.shape_dir, profiles).to_string(index=False))
    else:
        print(f"\n(no report.json of a known shape ({', '.join(SHAPES)}) in {args.shape_dir}: mean JCTs not re-simulated)")


if __name__ == "__main__":
    main()
