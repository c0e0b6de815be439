"""A GPU calibration run's profiles refitted without each probe's first repeat, each judged
against the same run's independent reference probes beside the profile as written:

  python benchmarks/gpu/refit_without_first_repeat.py benchmarks/gpu/h100-2026-11-26-lerp-merge

A shape's first run on a GPU builds cuDNN's execution plans and recompiles the compiled layer
parts for its token count (50-120 ms once; vLLM pays that at start-up, not per step). Runs
taken before `sim calibrate --backend torch` made one untimed pass first kept that in their
first repeat; this refit is what the untimed pass would have kept. Writes
refit-calibrate-torch-cuda-MODEL.json beside each profile; prints the two check tables.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from calibrate.probes import repeat_time  # noqa: E402
from calibrate.run import refit_profile, write_profile  # noqa: E402
from sim.profile import load_profile  # noqa: E402
from sim.profile_check import format_table, probe_reference  # noqa: E402

RULE = ("the median of each probe's repeats after the first (the first ran each shape's one-time cuDNN plan "
        "build and recompilation): benchmarks/gpu/refit_without_first_repeat.py")


def refit(path: Path) -> Path:
    raw = json.loads(path.read_text())
    new = refit_profile(raw, rule=lambda s: repeat_time(s[1:]))
    new["provenance"]["how"]["repeats"] = RULE
    return write_profile(new, path.with_name("refit-" + path.name))


def main(run_dir: str) -> None:
    run = Path(run_dir)
    for path in sorted(run.glob("calibrate-torch-cuda-*.json")):
        model = path.stem.removeprefix("calibrate-torch-cuda-")
        probes = run / f"{model}-shape-torch-probes.json"
        for p in (path, refit(path)):
            prof = load_profile(str(p))
            print(format_table(prof, probe_reference(prof, probes)), end="\n\n")


if __name__ == "__main__":
    main(sys.argv[1])
