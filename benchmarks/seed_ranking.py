"""Does the real engine order policies as the simulator predicted, arrival seed by seed?

    python benchmarks/seed_ranking.py --seeds 0,1,2,3 --target rebuild-priced-ttl \\
        --others continuum,continuum-static --out DIR [--reuse] \\
        [--trace swebench --programs 24 --jps 2 --num-gpu-blocks 96 --max-tool-s 4 --profile P --policy-arg K=10]

At the CPU engine's size one arrival seed can reverse the order the next seed shows (in
the simulator as in the engine), so one replay, or repeats of one seed, cannot judge a
ranking. This runs `sim validate` once per seed (DIR/s<seed>/, one real replay per policy;
--reuse reads the reports already there) and compares, per seed and over seeds, the
target's real gain over each other policy (1 - target / other, mean JCT) with the gain the
simulator predicted on the same arrivals. Each replay runs on its own engine at its own
moment, and the machine's speed drifts between them by as much as the gaps looked for, so
the real side is shown twice: as measured, against the simulator on that replay's clock
(scaled by its clock probes), and with the time spent in the engine divided by that clock
factor (tool time, a wall-clock sleep, kept as it is), against the simulator on the
profile's clock (unscaled). The probes are fixed workloads timed before and after
each replay: nothing is fitted on the replays.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsim.errors import InputError  # noqa: E402

COLUMNS = ("real", "real / clock", "sim unscaled", "sim scaled")


def mean_jcts(report: dict, tool_s: float = 0.0) -> dict[str, dict[str, float]]:
    """Per policy, from one validation report: real mean JCT; the same on the profile's
    clock ("real / clock": the time the program spent in the engine divided by the run's
    clock factor, its probes against the profile before and after the replay, and its
    `tool_s` of tool time, wall-clock sleeps that no machine speed changes, added back),
    i.e. with the machine's speed drift between runs taken out; the simulator's unscaled
    (on the profile's clock) and scaled (on the run's clock)."""
    out = {}
    for pol, row in report["policies"].items():
        real = row["real"]["mean_jct"]
        out[pol] = {"real": real, "real / clock": tool_s + (real - tool_s) / row["time_scale"],
                    "sim unscaled": row["sim_unscaled_mean_jct"], "sim scaled": row["sim"]["mean_jct"]}
    return out


def mean_tool_s(trace) -> float:
    """Mean tool time per program: its turns' tool durations but the last turn's."""
    t = trace.sort_values(["program_id", "turn"])
    last = t.groupby("program_id")["turn"].transform("max") == t["turn"]
    return float(t["tool_duration_s"].where(~last, 0.0).groupby(t["program_id"]).sum().mean())


def gains(reports: dict[int, dict], target: str, others: list[str],
          tool_s: float = 0.0) -> dict[str, dict[str, dict[int, float]]]:
    """{other: {column: {seed: 1 - target / other}}} over COLUMNS."""
    res: dict = {o: {c: {} for c in COLUMNS} for o in others}
    for seed, rep in reports.items():
        m = mean_jcts(rep, tool_s)
        missing = [p for p in (target, *others) if p not in m]
        if missing:
            raise InputError(f"seed {seed}: the report has no row for {', '.join(missing)}")
        for o in others:
            for c in COLUMNS:
                res[o][c][seed] = 1 - m[target][c] / m[o][c]
    return res


def render(reports: dict[int, dict], target: str, others: list[str], tool_s: float = 0.0) -> str:
    pols = [target, *others]
    g = gains(reports, target, others, tool_s)  # first: it names a missing policy
    lines = ["Mean JCT per seed, s (" + " | ".join(COLUMNS) + "):", "",
             "| seed | " + " | ".join(pols) + " |", "|---|" + "---|" * len(pols)]
    for seed, rep in reports.items():
        m = mean_jcts(rep, tool_s)
        lines.append(f"| {seed} | " + " | ".join(
            " \\| ".join(f"{m[p][c]:.1f}" for c in COLUMNS) for p in pols) + " |")
    lines += ["", f"{target}'s gain over each policy, 1 - {target} / other (mean JCT), per seed:", "",
              "| over | column | " + " | ".join(f"seed {s}" for s in reports) + " | mean | seeds > 0 |",
              "|---|---|" + "---|" * (len(reports) + 2)]
    for o in others:
        for c in COLUMNS:
            v = list(g[o][c].values())
            lines.append(f"| {o} | {c} | " + " | ".join(f"{100 * x:+.1f}%" for x in v)
                         + f" | {100 * sum(v) / len(v):+.1f}% | {sum(x > 0 for x in v)} of {len(v)} |")
    for real, sim in (("real", "sim scaled"), ("real / clock", "sim unscaled")):
        agree = {o: sum((g[o][real][s] > 0) == (g[o][sim][s] > 0) for s in reports) for o in others}
        lines += ["", f"Seeds where the pair's order by {real} is the order by {sim}: "
                  + ", ".join(f"{target} vs {o} {agree[o]} of {len(reports)}" for o in others)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--target", default="rebuild-priced-ttl")
    ap.add_argument("--others", default="continuum,continuum-static")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reuse", action="store_true", help="read DIR/s<seed>/report.json where it exists")
    ap.add_argument("--trace", default="swebench")
    ap.add_argument("--programs", type=int, default=24)
    ap.add_argument("--jps", type=float, default=2.0)
    ap.add_argument("--num-gpu-blocks", type=int, default=96)
    ap.add_argument("--max-tool-s", type=float, default=4.0)  # the cut's other options: sim validate's defaults
    ap.add_argument("--profile", default=None, help="profile to judge on (default: calibrate per seed)")
    ap.add_argument("--policy-arg", action="append", default=["K=10"], metavar="K=V",
                    help="added to K=10, which is always given (Continuum's cold-start threshold, as the "
                         "validation shapes set it)")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",") if s]
    others = [p for p in a.others.split(",") if p]
    reports = {}
    for seed in seeds:
        path = Path(a.out) / f"s{seed}" / "report.json"
        if not (a.reuse and path.exists()):
            from sim.cli import main as sim_main

            args = ["validate", "--trace", a.trace, "--programs", str(a.programs), "--jps", str(a.jps),
                    "--num-gpu-blocks", str(a.num_gpu_blocks), "--max-tool-s", str(a.max_tool_s),
                    "--policy", ",".join([a.target, *others]), "--seed", str(seed), "--out", str(path.parent),
                    *(["--profile", a.profile] if a.profile else []),
                    *[x for kv in a.policy_arg for x in ("--policy-arg", kv)]]
            rc = sim_main(args)
            if rc:
                raise SystemExit(rc)
        reports[seed] = json.loads(path.read_text())
    from calibrate.validate import fit_trace
    from traces.schema import read_trace

    tool_s = mean_tool_s(fit_trace(read_trace(a.trace)[0], a.programs, 5, 3000, 24, a.max_tool_s))
    text = f"Mean tool time per program: {tool_s:.1f} s\n\n" + render(reports, a.target, others, tool_s)
    print(text)
    return text


if __name__ == "__main__":
    try:
        main()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
