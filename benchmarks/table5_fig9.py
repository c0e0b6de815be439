"""The Continuum paper's Table 5 and Fig. 9 set-ups, simulated.

    python benchmarks/table5_fig9.py [--programs 200] [--concurrency 16,32,64,128]
        [--policies vllm,thunderagent,continuum] [--table5-trace openhands|spec:NAME] [--fig9-programs 150]
        [--loads swebench:2,3/bfcl:0.5,1/openhands:0.02,0.05] [--seeds 0,1,2] [--write-docs [PAGE]]

Table 5 (RL rollouts): OpenHands-shaped programs (`sim trace gen openhands`, seed 0) on the
roofline profile of GLM-4.5-FP8 on one node of 8 H100s (`sim profile roofline --gpu H100
--model glm-4.5-fp8 --tp 8`, written to a temporary folder; its whole KV pool), in a closed
loop of N programs in flight (`sim run --workload closed --concurrency N`). One row per N and
policy: agent steps (LLM calls) per minute, the ratio to the first policy's, and what explains
the difference (preemptions, the prefix-cache hit ratio, mean KV use, pins dropped as victims).
A closed loop draws nothing at random: each row is one run. --table5-trace spec:NAME runs
the same set-up on programs sampled from a measured workload spec (`sim trace gen --spec
NAME`, seed 0) in place of the OpenHands-shaped ones.

Fig. 9 (gain against turns per program): Continuum against vLLM, mean and p95 JCT, on the
bundled swebench and bfcl traces and the openhands generator (seed 0), on one H100
(`llama3.1-8b-h100`, its whole KV pool), Poisson arrivals at two loads per trace, each cell the
mean over the arrival seeds; a trace may be `spec:NAME` (sampled, seed 0), as in
`spec:mini-swe-agent:0.03,0.05`. Loads are per trace (programs per second): a trace with 30 turns
per program offers ~3x the calls of one with 10 at the same rate, and the table shows vLLM's
mean KV use at each so that loads can be compared by memory pressure.

--write-docs puts the two tables into docs/reference/results.md (or PAGE) between
`<!-- table5: FLAGS -->` / `<!-- end table5 -->` and `<!-- fig9: FLAGS -->` / `<!-- end fig9 -->`
(benchmarks/docs_tables.py).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, SPEC_PREFIX, workload_trace, write_block  # noqa: E402

from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute  # noqa: E402

H100_PROFILE = "llama3.1-8b-h100"


def roofline_profile(folder: Path) -> Path:
    """`sim profile roofline --gpu H100 --model glm-4.5-fp8 --tp 8 --out FOLDER/glm.json`."""
    from agentsim.cli import main as sim

    out = folder / "glm-4.5-fp8-h100x8.json"
    with contextlib.redirect_stdout(io.StringIO()):
        code = sim(["profile", "roofline", "--gpu", "H100", "--model", "glm-4.5-fp8", "--tp", "8", "--out", str(out)])
    if code != 0:
        raise SystemExit(f"error: sim profile roofline exited {code}")
    return out


def openhands_trace(folder: Path, programs: int, seed: int = 0) -> Path:
    return Path(workload_trace("openhands", programs, folder, seed))


def described(name: str) -> str:
    """How a table's header names a workload that is generated (seed 0)."""
    if name.startswith(SPEC_PREFIX):
        return f"programs sampled from the measured spec {name[len(SPEC_PREFIX):]} (`sim trace gen --spec`, seed 0)"
    return "OpenHands-shaped programs (`sim trace gen openhands`, seed 0)"


def _run(trace, programs, policy, profile, **workload) -> dict:
    cfg = SimConfig(workload=WorkloadConfig(trace=str(trace), programs=programs, **workload),
                    policy=PolicyConfig(name=policy), engine=EngineLimits(profile=str(profile)))
    return execute(build_run(cfg)).summary


def _cell(args) -> dict:
    trace, programs, policy, profile, workload = args
    return _run(trace, programs, policy, profile, **workload)


def _runs(cells: list, workers: int) -> list[dict]:
    from sim.study.sweep import map_points

    return map_points(_cell, cells, workers)


def table5_rows(trace, profile, programs: int, concurrency: list[int], policies: list[str], workers: int = 1) -> list[dict]:
    rows = []
    got = iter(_runs([(str(trace), programs, p, str(profile), {"mode": "closed", "concurrency": n})
                      for n in concurrency for p in policies], workers))
    for n in concurrency:
        base = None
        for p in policies:
            s = next(got)
            base = s["steps_per_minute"] if base is None else base
            rows.append({"n": n, "policy": p, "steps_per_minute": s["steps_per_minute"],
                         "ratio": s["steps_per_minute"] / base, "preemptions": s["preemptions"],
                         "hit": s["cache_hit_ratio"], "kv": s["mean_kv_usage"], "pins": s["pins"],
                         "victims": s["pins_victim"], "mean_jct": s["mean_jct"]})
    return rows


def table5(trace, profile, programs: int, concurrency: list[int], policies: list[str], workload: str = "openhands",
           workers: int = 1) -> str:
    rows = table5_rows(trace, profile, programs, concurrency, policies, workers)
    head = (f"Table: Table 5 set-up: {programs} {described(workload)}, "
            f"GLM-4.5-FP8 on 8 H100s (roofline profile, tp 8, whole KV pool), closed loop; agent steps per "
            f"minute and the ratio to {policies[0]}. Paper: vLLM 93.4, ThunderAgent 114.8 (1.23x), "
            f"Continuum 144.9 (1.55x)")
    lines = [head, "", "| programs in flight | policy | steps/min | x " + policies[0] +
             " | preemptions | prefix-cache hit | mean KV use | pins (dropped as victims) | mean JCT (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['policy']} | {r['steps_per_minute']:.1f} | {r['ratio']:.2f} | {r['preemptions']} | "
                     f"{r['hit']:.1%} | {r['kv']:.1%} | {r['pins']} ({r['victims']}) | {r['mean_jct']:.0f} |")
    return "\n".join(lines)


def parse_loads(text: str) -> dict[str, list[float]]:
    """`swebench:1,2/bfcl:0.5,1` -> {"swebench": [1.0, 2.0], "bfcl": [0.5, 1.0]}."""
    out = {}
    for part in text.split("/"):
        name, _, loads = part.rpartition(":")
        if not name or not loads:
            raise SystemExit(f"error: --loads part {part!r} is not TRACE:JPS[,JPS...]")
        out[name] = [float(x) for x in loads.split(",")]
    return out


def fig9_rows(traces: dict[str, object], programs: int, loads: dict[str, list[float]], seeds: list[int],
              profile: str = H100_PROFILE, workers: int = 1) -> list[dict]:
    rows = []
    cells = [(str(traces[name]), programs, p, profile, {"jps": jps, "seed": s})
             for name, jpss in loads.items() for jps in jpss for p in ("vllm", "continuum") for s in seeds]
    got = iter(_runs(cells, workers))
    for name, jpss in loads.items():
        for jps in jpss:
            runs = {p: [next(got) for _ in seeds] for p in ("vllm", "continuum")}
            m = {p: {k: float(np.mean([s[k] for s in runs[p]])) for k in
                     ("mean_jct", "p95_jct", "mean_kv_usage", "cache_hit_ratio", "preemptions", "calls", "programs")}
                 for p in runs}
            rows.append({"trace": name, "turns": m["vllm"]["calls"] / m["vllm"]["programs"], "jps": jps,
                         "vllm": m["vllm"], "continuum": m["continuum"],
                         "gain": m["vllm"]["mean_jct"] / m["continuum"]["mean_jct"],
                         "gain_p95": m["vllm"]["p95_jct"] / m["continuum"]["p95_jct"]})
    return rows


def fig9(traces, programs: int, loads: dict[str, list[float]], seeds: list[int], workers: int = 1) -> str:
    rows = fig9_rows(traces, programs, loads, seeds, workers=workers)
    made = "; ".join(f"{n}: `sim trace gen {'--spec ' + n[len(SPEC_PREFIX):] if n.startswith(SPEC_PREFIX) else n}`"
                     for n in loads if n == "openhands" or n.startswith(SPEC_PREFIX))
    head = (f"Table: Fig. 9 comparison: Continuum against vLLM on one H100 (`{H100_PROFILE}`, whole KV pool), "
            f"{programs} programs per trace{f' ({made}, seed 0)' if made else ''}, Poisson arrivals, "
            f"mean over arrival seeds {','.join(map(str, seeds))}; gain = vLLM's JCT / Continuum's")
    lines = [head, "", "| trace | turns per program | programs/s | vLLM mean JCT (s) | Continuum mean JCT (s) | gain, mean | "
             "gain, p95 | vLLM mean KV use | prefix-cache hit vLLM / Continuum | preemptions vLLM / Continuum |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v, c = r["vllm"], r["continuum"]
        lines.append(f"| {r['trace']} | {r['turns']:.1f} | {r['jps']:g} | {v['mean_jct']:.0f} | {c['mean_jct']:.0f} | "
                     f"{r['gain']:.2f}x | {r['gain_p95']:.2f}x | {v['mean_kv_usage']:.0%} | "
                     f"{v['cache_hit_ratio']:.0%} / {c['cache_hit_ratio']:.0%} | {v['preemptions']:.0f} / {c['preemptions']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> tuple[str, str]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=200, help="Table 5: OpenHands programs (default 200)")
    ap.add_argument("--concurrency", default="16,32,64,128", help="Table 5: programs in flight")
    ap.add_argument("--policies", default="vllm,thunderagent,continuum", help="Table 5: policies, the first the base")
    ap.add_argument("--table5-trace", default="openhands", metavar="openhands|spec:NAME",
                    help="Table 5: the programs (default openhands; spec:NAME: sampled from a measured spec)")
    ap.add_argument("--fig9-programs", type=int, default=150, help="Fig. 9: programs per trace (default 150)")
    ap.add_argument("--loads", default="swebench:2,3/bfcl:0.5,1/openhands:0.02,0.05",
                    help="Fig. 9: TRACE:JPS,JPS/... (programs per second per trace)")
    ap.add_argument("--seeds", default="0,1,2", help="Fig. 9: arrival seeds")
    ap.add_argument("--workers", type=int, default=2, help="processes (1: in this one)")
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "results.md"), default=None, metavar="PAGE")
    a = ap.parse_args(argv)
    if a.table5_trace != "openhands" and not a.table5_trace.startswith(SPEC_PREFIX):
        ap.error(f"--table5-trace {a.table5_trace!r}: give openhands or spec:NAME (a measured spec: claude-code, codex, "
                 f"mini-swe-agent, or a spec JSON)")
    conc = [int(c) for c in a.concurrency.split(",")]
    pols = a.policies.split(",")
    loads = parse_loads(a.loads)
    seeds = [int(s) for s in a.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        profile = roofline_profile(tmp)
        t5 = table5(workload_trace(a.table5_trace, a.programs, tmp), profile, a.programs, conc, pols, a.table5_trace,
                    a.workers)
        print(t5 + "\n", flush=True)
        traces = {name: workload_trace(name, a.fig9_programs, tmp) for name in loads}
        f9 = fig9(traces, a.fig9_programs, loads, seeds, a.workers)
        print(f9)
    if a.write_docs:
        which = "" if a.table5_trace == "openhands" else f" --table5-trace {a.table5_trace}"
        write_block(a.write_docs, "table5", f"--programs {a.programs} --concurrency {a.concurrency} --policies {a.policies}{which}", t5)
        write_block(a.write_docs, "fig9", f"--fig9-programs {a.fig9_programs} --loads {a.loads} --seeds {a.seeds}", f9)
    return t5, f9


if __name__ == "__main__":
    main()
