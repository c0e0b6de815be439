"""The planner's documented question, timed: this tree against a baseline commit, interleaved.

    python benchmarks/plan_speed.py [--baseline 0da9377] [--reps 2] [--workers 2] [--programs N]

The question is the `sim plan` command at the top of docs/planning.md, read from the page
(so the two cannot drift), run whole — a fresh `python -m agentsim.cli plan ... --workers N`
process per run, into a fresh --out — alternately in this tree and in the baseline
(checked out with `git worktree add` under /tmp and its compiled parts built in place, as
benchmarks/sim_speed.py does), rep by rep, so machine noise hits both alike. `--programs N`
asks the same question of the trace's first N programs (a reduced version, for a machine
where the full one takes too long).
Prints each run's wall time and answer, the medians, the baseline/current ratio and
whether the answers are the same.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "planning.md"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.sim_speed import worktree  # noqa: E402


def documented_question(page: Path = PAGE) -> list[str]:
    """The arguments after `sim plan` of the first command on the page, without --out."""
    lines = page.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip().startswith("sim plan "))
    cmd = ""
    for l in lines[start:]:
        cmd += " " + l.strip().rstrip("\\")
        if not l.rstrip().endswith("\\"):
            break
    args = shlex.split(cmd)[2:]
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        if a.startswith("--out="):
            continue
        out.append(a)
    return out


def with_flag(args: list[str], flag: str, value: str) -> list[str]:
    """args with `flag value` set (replaced where given)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        out.append(a)
    return out + [flag, value]


def run_plan(tree: Path, args: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "agentsim.cli", "plan", *args, "--out", str(out), "--no-progress"],
                       cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{tree}: sim plan failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    answer = next((l for l in r.stdout.splitlines() if l.startswith("Answer:")), "?")
    points = next((l for l in r.stdout.splitlines() if l.startswith("Points:")), "?")
    n = re.match(r"Points: (\d+) simulated", points)
    return {"wall_s": wall, "answer": answer, "points": int(n.group(1)) if n else None}


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="0da9377", help="git revision to compare with (default 0da9377)")
    ap.add_argument("--reps", type=int, default=2, help="runs per tree, interleaved (default 2)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--programs", type=int, default=None, help="ask the question of the first N programs only (reduced)")
    a = ap.parse_args(argv)
    args = with_flag(documented_question(), "--workers", str(a.workers))
    if a.programs is not None:
        args = with_flag(args, "--programs", str(a.programs))
    trees = {"current": ROOT, "baseline": worktree(a.baseline)}
    res: dict[str, list[dict]] = {"current": [], "baseline": []}
    with tempfile.TemporaryDirectory() as d:
        for rep in range(a.reps):
            for name in (("current", "baseline") if rep % 2 == 0 else ("baseline", "current")):
                out = run_plan(trees[name], args, Path(d) / f"{name}-{rep}")
                res[name].append(out)
                print(f"  rep {rep} {name}: {out['wall_s']:.1f} s, {out['points']} points; {out['answer']}",
                      file=sys.stderr, flush=True)
    med = {k: statistics.median(x["wall_s"] for x in v) for k, v in res.items()}
    answers = {k: {x["answer"] for x in v} for k, v in res.items()}
    same = answers["current"] == answers["baseline"] and len(answers["current"]) == 1
    walls = {k: ", ".join(f"{x['wall_s']:.1f}" for x in v) for k, v in res.items()}
    text = "\n".join([
        f"sim plan {' '.join(shlex.quote(x) for x in args)}",
        f"baseline {a.baseline} against this tree, {a.reps} interleaved runs each:",
        f"  baseline: median {med['baseline']:.1f} s ({walls['baseline']}); "
        f"{res['baseline'][0]['points']} points; {res['baseline'][0]['answer']}",
        f"  current:  median {med['current']:.1f} s ({walls['current']}); "
        f"{res['current'][0]['points']} points; {res['current'][0]['answer']}",
        f"  ratio (baseline / current): {med['baseline'] / med['current']:.2f}x; same answer: {same}",
    ])
    print(text)
    return text


if __name__ == "__main__":
    main()
