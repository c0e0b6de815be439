"""A GPU calibration run's profiles refitted from their stored measurements under another
rule, each judged, beside the profile as written, against every reference probe file the
run took (same GPU):

  python benchmarks/gpu/refit_run.py RUN_DIR --rule without-first   # e.g. h100-2026-11-26-lerp-merge
  python benchmarks/gpu/refit_run.py RUN_DIR --rule graph           # e.g. h200-2026-11-27-graph-twins

without-first: the median of each probe's repeats after the first. A shape's first run on
a GPU builds cuDNN's execution plans and recompiles the compiled layer parts for its token
count (50-120 ms once; vLLM pays that at start-up); runs taken before the calibration made
one untimed pass first kept that in their first repeat.
graph: each eager step that was also replayed from a CUDA graph (`graph_seconds`, runs
taken while eager steps of at most 4,096 tokens kept such a twin) priced at its graph time,
as the calibration now times those steps.

Writes refit-RULE-calibrate-torch-cuda-MODEL.json beside each profile (for diagnosis, not
for the docs tables) and prints the check tables.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from calibrate.probes import repeat_time  # noqa: E402
from calibrate.run import refit_profile, write_profile  # noqa: E402
from sim.hardware.profile import load_profile  # noqa: E402
from sim.hardware.check import format_table, probe_reference  # noqa: E402

HOW = {"without-first": "the median of each probe's repeats after the first",
       "graph": "an eager step's graph replay (graph_seconds) where it has one, else the median of its repeats"}


def refit(raw: dict, rule: str) -> dict:
    if rule == "without-first":
        return refit_profile(raw, rule=lambda s: repeat_time(s[1:]))
    raw = copy.deepcopy(raw)
    for row in raw["probes"]:
        if row.get("graph_seconds"):
            row["samples"] = [row["graph_seconds"]]
    return refit_profile(raw)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--rule", choices=sorted(HOW), required=True)
    args = ap.parse_args(argv)
    for path in sorted(args.run.glob("calibrate-torch-cuda-*.json")):
        model = path.stem.removeprefix("calibrate-torch-cuda-")
        new = refit(json.loads(path.read_text()), args.rule)
        new["provenance"]["how"]["repeats"] = f"{HOW[args.rule]}: benchmarks/gpu/refit_run.py --rule {args.rule}"
        out = write_profile(new, path.with_name(f"refit-{args.rule}-{path.name}"))
        for p in (path, out):
            prof = load_profile(str(p))
            for probes in sorted(args.run.glob(f"{model}-shape-torch-probes*.json")):
                print(format_table(prof, probe_reference(prof, probes)), end="\n\n")


if __name__ == "__main__":
    main()
