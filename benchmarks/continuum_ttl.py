"""Continuum's TTL work, old against new (issue 20 item 4): interleaved in one process.

    python benchmarks/continuum_ttl.py [--programs 500] [--repeats 5] [--jps 0.2] [--old-rev REV]

"old" is policies/continuum.py as of --old-rev (default: the newest commit of that file
before the incrementally sorted samples), loaded from git; "new" is the working tree.
Two measurements, each repeated with old and new alternating, medians reported:
  policy   the policy's own per-call work on the bundled SWE-bench trace's tool calls in
           arrival order of a Poisson run: record the tool time, then the TTL of a call
           (what the vLLM adapter pays per call);
  sim run  a whole run (`execute`) with `continuum` (event loop only; no trace read).
Both check that old and new chose the same TTLs (the policy pass) and the same result.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

from policies.base import Request
from policies.continuum import ContinuumPolicy
from sim.hardware.profile import load_profile
from sim.run.config import SimConfig, build_run, execute
from sim.run.simulate import arrivals_for
from traces.schema import read_trace

ROOT = Path(__file__).resolve().parents[1]
MARKER = "class SortedSamples"  # the new code's; the old revision lacks it


def old_module(rev: str | None):
    """policies/continuum.py at `rev` (or the newest committed version without MARKER)."""
    git = ["git", "-C", str(ROOT)]
    revs = [rev] if rev else subprocess.run([*git, "log", "--format=%H", "--", "policies/continuum.py"],
                                            capture_output=True, text=True, check=True).stdout.split()
    for r in revs:
        src = subprocess.run([*git, "show", f"{r}:policies/continuum.py"], capture_output=True, text=True, check=True).stdout
        if rev or MARKER not in src:
            mod = types.ModuleType("continuum_old")
            exec(compile(src, f"{r[:10]}:policies/continuum.py", "exec"), mod.__dict__)
            return r[:10], mod
    sys.exit("no committed policies/continuum.py without the incremental samples; give --old-rev")


class View:
    """Prefill-reload priced by the default profile; T and eta come from the policy."""

    block_size = 16

    def __init__(self, prof):
        self.prefill_reload_time = prof.prefill_time


def policy_pass(cls, calls, prof) -> tuple[float, list[float]]:
    pol, view, ttls = cls(), View(prof), []
    t0 = time.perf_counter()
    for tool, dur, tokens in calls:
        pol.record_tool_time(tool, dur)
        ttls.append(pol.calc_ttl(Request("r", "p", 1, 0.0, 0.0, tokens, 0, False, tool), view))
    return time.perf_counter() - t0, ttls


def sim_pass(cls, trace, prof, jps) -> tuple[float, dict]:
    run = build_run(SimConfig(), trace=trace, profile=prof, arrivals=arrivals_for(trace, jps, 0), policy=cls())
    t0 = time.perf_counter()
    res = execute(run)
    wall = time.perf_counter() - t0
    return wall, {k: v for k, v in res.summary.items() if k not in ("wall_s", "sim_s_per_wall_s")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=500)
    ap.add_argument("--jps", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--old-rev", default=None)
    a = ap.parse_args()
    rev, old = old_module(a.old_rev)
    prof = load_profile()
    trace, _ = read_trace("swebench")
    trace = trace[trace["program_id"].isin(trace["program_id"].drop_duplicates().iloc[: a.programs])]
    # the tool calls in a Poisson run's arrival order: program start + turn, one TTL per call
    rng = np.random.default_rng(0)
    starts = dict(zip(trace["program_id"].drop_duplicates(), np.cumsum(rng.exponential(1 / a.jps, a.programs))))
    ctx = trace.groupby("program_id")["new_input_tokens"].cumsum() + trace.groupby("program_id")["output_tokens"].cumsum()
    rows = trace.assign(ctx=ctx, t=[starts[p] + 30.0 * k for p, k in zip(trace["program_id"], trace["turn"])])
    rows = rows[rows["tool_duration_s"].notna()].sort_values("t")
    calls = [(None if tool is None else str(tool), float(d), int(c))
             for tool, d, c in zip(rows["tool"], rows["tool_duration_s"], rows["ctx"])]
    print(f"continuum TTL, old = {rev} vs new = working tree; swebench {a.programs} programs, "
          f"{len(calls)} tool calls, {a.repeats} interleaved repeats, medians")
    pol_t = {"old": [], "new": []}
    sim_t = {"old": [], "new": []}
    for _ in range(a.repeats):
        for name, cls in (("old", old.ContinuumPolicy), ("new", ContinuumPolicy)):
            w, ttls = policy_pass(cls, calls, prof)
            pol_t[name].append(w)
            if name == "old":
                ref = ttls
            elif ttls != ref:
                sys.exit("old and new chose different TTLs")
    for _ in range(a.repeats):
        for name, cls in (("old", old.ContinuumPolicy), ("new", ContinuumPolicy)):
            w, summary = sim_pass(cls, trace, prof, a.jps)
            sim_t[name].append(w)
            if name == "old":
                ref_summary = summary
            elif summary != ref_summary:
                sys.exit("old and new gave different simulation results")
    for what, t in (("policy, per call", pol_t), ("sim run (event loop)", sim_t)):
        o, n = statistics.median(t["old"]), statistics.median(t["new"])
        per = f" ({o / len(calls) * 1e6:.1f} us vs {n / len(calls) * 1e6:.1f} us a call)" if "policy" in what else ""
        print(f"  {what:22s} old {o:7.3f} s  new {n:7.3f} s  ratio old/new {o / n:5.2f}x{per}")


if __name__ == "__main__":
    main()
