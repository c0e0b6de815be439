"""How the simulated mean JCT of a validation shape moves with the clock it runs on: why
`sim validate` simulates each repeat on a band of clocks (calibrate/validate.py
`clock_band`) rather than on its probes' one scale.

    python benchmarks/clock_sensitivity.py [--shape swebench] [--policies continuum-static,continuum]
                                           [--profile cpu-tiny-llama | --report DIR] [--lo 0.94 --hi 1.06 --step 0.01]
                                           [--write-docs]

Per policy, the simulated mean JCT on the shape's trace, arrivals and engine limits with
every step time x clock, for clocks lo..hi; then, over the same range, the mean over
the band (clock_band(c, c)) around each clock. With --report DIR (what `sim validate
--shape ... --out DIR` wrote), the profile is DIR/<shape>/profile.json and the engine
limits the report's; each repeat's probe scales are listed with the simulated mean JCT
on the middle clock alone and over its band, beside the real one. Nothing is fitted.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from calibrate.validate import SHAPES, scaled, sim_run
from calibrate.validate_report import CLOCKS, clock_band
from sim.hardware.profile import load_profile
from sim.run.simulate import arrivals_for
from traces.schema import read_trace

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="swebench", choices=sorted(SHAPES))
    ap.add_argument("--policies", default="continuum-static,continuum")
    ap.add_argument("--profile", default="cpu-tiny-llama", help="profile name or path (ignored with --report)")
    ap.add_argument("--report", default=None, help="a `sim validate --out` folder: its profile, limits and repeats")
    ap.add_argument("--lo", type=float, default=0.94)
    ap.add_argument("--hi", type=float, default=1.06)
    ap.add_argument("--step", type=float, default=0.01)
    ap.add_argument("--write-docs", nargs="?", const=str(ROOT / "docs" / "reference" / "validation.md"), default=None, metavar="PAGE")
    a = ap.parse_args(argv)
    shape = SHAPES[a.shape]
    trace = shape.cut(read_trace(shape.trace)[0])
    arrivals = arrivals_for(trace, shape.jps, 0)
    policies = [p for p in a.policies.split(",") if p]
    rep = None
    if a.report:
        rep = json.loads((Path(a.report) / "report.json").read_text())["shapes"][a.shape]
        prof, engine = load_profile(str(Path(a.report) / a.shape / "profile.json")), rep["setup"]["engine"]
    else:
        prof = load_profile(a.profile)
        e = prof.engine
        engine = {"num_gpu_blocks": shape.num_gpu_blocks, "block_size": e.block_size,
                  "max_num_batched_tokens": e.max_num_batched_tokens, "max_num_seqs": e.max_num_seqs,
                  "max_model_len": min(shape.max_model_len, e.max_model_len),
                  "enable_chunked_prefill": e.enable_chunked_prefill,
                  "scheduler_reserve_full_isl": e.scheduler_reserve_full_isl}
    cache: dict[tuple[str, float], float] = {}

    def jct(pol: str, clock: float) -> float:
        key = (pol, round(float(clock), 9))
        if key not in cache:
            args = shape.policy_args.get(pol, {})
            cache[key] = sim_run(trace, arrivals, pol, scaled(prof, float(clock)), engine, args).summary["mean_jct"]
        return cache[key]

    def band(pol: str, before: float, after: float) -> float:
        return float(np.mean([jct(pol, c) for c in clock_band(before, after)]))

    clocks = np.round(np.arange(a.lo, a.hi + a.step / 2, a.step), 6)
    lines = [f"shape {a.shape}, profile {prof.name}, {CLOCKS} clocks a band; simulated mean JCT (s) on one clock "
             "and over the band around it", "",
             "| clock | " + " | ".join(f"{p} | {p} band" for p in policies) + " |",
             "|---|" + "---|---|" * len(policies)]
    for c in clocks:
        lines.append(f"| {c:.2f} | " + " | ".join(f"{jct(p, c):.2f} | {band(p, c, c):.2f}" for p in policies) + " |")
    if rep is not None:
        lines += ["", "| policy | repeat | probe scales before / after | real mean JCT (s) | sim, middle clock | sim, band |",
                  "|---|---|---|---|---|---|"]
        for p in policies:
            row = rep["policies"][p]
            for i, ((b, f), real) in enumerate(zip(row["time_scale_runs"], row["real"]["mean_jct_runs"])):
                lines.append(f"| {p} | {i + 1} | {b:.4f} / {f:.4f} | {real:.2f} | {jct(p, (b + f) / 2):.2f} | {band(p, b, f):.2f} |")
    text = "\n".join(lines)
    print(text)
    if a.write_docs:
        sys.path.insert(0, str(ROOT))  # as a script: the repository root, for `benchmarks.`
        from benchmarks.docs_tables import write_block

        flags = " ".join(f"--{k} {v}" for k, v in vars(a).items() if k not in ("write_docs", "report") and v is not None)
        write_block(a.write_docs, "clock_sensitivity", flags, text)
    return text


if __name__ == "__main__":
    main()
