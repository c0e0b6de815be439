"""A/B of `sim run` between two source trees: user CPU seconds, whole process and event loop.

    python benchmarks/pool_speed.py [--base /tmp/base_F] [--new .] [--rounds 3] [--policies vllm continuum]

`--base` defaults to a git worktree of the previous commit (HEAD), made with
`git worktree add --detach` if the folder does not exist yet. Each round runs every
policy once on each tree, alternating which tree goes first, so machine load hits both
alike. CPU time, not wall time: on a shared machine wall time mostly measures the
neighbours. Whole process: the child's user CPU (what `/usr/bin/time -f %U` prints),
imports and output writing included. Event loop: the CPU time inside simpy's
`Environment.run`, the simulation alone. Prints medians and new/base ratios (below 1:
the new tree is cheaper).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run `sim run` from the tree on PYTHONPATH, timing simpy's event loop from outside the code under test.
CHILD = """
import json, sys, time
import simpy
run = simpy.Environment.run
spent = [0.0]
def timed(self, *a, **k):
    t0 = time.process_time()
    try:
        return run(self, *a, **k)
    finally:
        spent[0] += time.process_time() - t0
simpy.Environment.run = timed
from sim.cli import main
rc = main(sys.argv[2:])
open(sys.argv[1], "w").write(json.dumps({"rc": rc, "loop_cpu": spent[0]}))
"""


def base_tree(path: Path) -> Path:
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), "HEAD"], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def one_run(tree: Path, args: list[str]) -> tuple[float, float]:
    """(whole-process user CPU s, event-loop CPU s) of one `sim run` in `tree`."""
    with tempfile.TemporaryDirectory() as d:
        res = Path(d) / "res.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, "-c", CHILD, str(res), "run", *args, "--no-progress", "--out", str(Path(d) / "out")],
                       cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        user = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before
        out = json.loads(res.read_text())
        assert out["rc"] == 0, f"sim run failed in {tree}"
        return user, out["loop_cpu"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, default=Path("/tmp/base_F"))
    ap.add_argument("--new", type=Path, default=ROOT)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policies", nargs="+", default=["vllm", "continuum"])
    ap.add_argument("--programs", type=int, default=500)
    ap.add_argument("--jps", type=float, default=0.2)
    a = ap.parse_args()
    trees = {"base": base_tree(a.base), "new": a.new.resolve()}
    times = {(t, p): [] for t in trees for p in a.policies}
    for r in range(a.rounds):
        order = ["base", "new"] if r % 2 == 0 else ["new", "base"]
        for p in a.policies:
            for t in order:
                args = ["--trace", "swebench", "--programs", str(a.programs), "--jps", str(a.jps), "--policy", p]
                times[t, p].append(one_run(trees[t], args))
                print(f"round {r + 1} {p:10s} {t:4s}: user {times[t, p][-1][0]:.2f} s, event loop {times[t, p][-1][1]:.2f} s",
                      file=sys.stderr)
    print(f"swebench, {a.programs} programs, jps {a.jps}, 1 replica; medians of {a.rounds} interleaved rounds, "
          f"user CPU s (base {trees['base']}, new {trees['new']})")
    print(f"{'policy':10s} {'whole base':>10s} {'whole new':>10s} {'ratio':>6s}   {'loop base':>9s} {'loop new':>9s} {'ratio':>6s}")
    for p in a.policies:
        wb, wn = (statistics.median(x[0] for x in times[t, p]) for t in ("base", "new"))
        lb, ln = (statistics.median(x[1] for x in times[t, p]) for t in ("base", "new"))
        print(f"{p:10s} {wb:10.2f} {wn:10.2f} {wn / wb:6.2f}   {lb:9.2f} {ln:9.2f} {ln / lb:6.2f}")


if __name__ == "__main__":
    main()
