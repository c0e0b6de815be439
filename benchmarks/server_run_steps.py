"""The steps the published server runs are made of, priced by the judge's profile and by
aiconfigurator's own composition of its measured kernels (needs the optional extra).

    python benchmarks/server_run_steps.py [--only ID[,ID]] [--gpus GPU[,GPU]]

Per run of benchmarks/data/server_runs.json at concurrency c: a decode of c sequences at the
mean decode context (benchmarks/server_runs_table.py decode_ctx), a mixed step of one prompt
beside c - 1 of those decodes (the prompt whole, or its first chunk where it exceeds
max_num_batched_tokens), and the prompt alone; each priced by the profile the judge uses
(`sim profile roofline`, measured kernels where shipped; device time only) and by
aiconfigurator (sim/hardware/check.py aiconfigurator_points), with the profile's error.
Kernel-level only: it says which steps the profile misprices against the kernels, not
against the servers, and nothing here is fitted.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root

from agentsim.errors import InputError  # noqa: E402
from benchmarks import server_runs_table as srt  # noqa: E402
from sim.hardware import check as pc  # noqa: E402


def mean_input(run: dict) -> int:
    w = run["workload"]
    return round(w["input_tokens"] * (1 + (w.get("length_spread") or {}).get("low_ratio", 1.0)) / 2)


def shapes(run: dict, budget: int) -> list[pc.Probe]:
    """The run's decode, mixed and prompt steps (budget: max_num_batched_tokens)."""
    c, ctx, n = int(run["workload"]["concurrency"]), round(srt.decode_ctx(run)), mean_input(run)
    out = [pc.Probe("decode", B=c, ctx=ctx)]
    if c > 1:
        out.append(pc.Probe("mixed", n=min(n, budget - (c - 1)), B=c - 1, ctx=ctx))
    return out + [pc.Probe("prefill", n=min(n, budget))]


def rows(data: dict, runs: list[dict]) -> list[dict]:
    out, profiles = [], {}
    for r in runs:
        key = (r["gpu"], r["tp"], r["model"])
        if key not in profiles:
            e = r["engine"]
            profiles[key] = srt._profile(r["gpu"], r["model"], r["tp"], True, srt.model_spec(data, r["model"]),
                                         gpu_memory_utilization=e.get("gpu_memory_utilization") or 0.9,
                                         max_num_batched_tokens=e.get("max_num_batched_tokens"),
                                         max_num_seqs=e.get("max_num_seqs"))
        prof, src = profiles[key]
        ref, _ = pc.aiconfigurator_points(prof, shapes(r, prof.engine.max_num_batched_tokens))
        for p in ref:
            aic, model = p.seconds[pc.STAT], prof.step_time(*p.features())
            out.append({"run": r["id"], "gpu": r["gpu"], "tp": r["tp"], "workload": r["workload"].get("label", ""),
                        "concurrency": r["workload"]["concurrency"], "step": p.label(), "kind": p.kind,
                        "profile": "measured" if src.startswith("measured") else "roofline",
                        "profile_ms": model * 1e3, "aic_ms": aic * 1e3, "error_pct": (model - aic) / aic * 100})
    return out


def render(rs: list[dict]) -> str:
    lines = ["| GPU x tp | workload | concurrency | step | profile | profile (ms) | aiconfigurator (ms) | "
             "profile vs kernels |", "|---|---|---:|---|---|---:|---:|---:|"]
    lines += [f"| {r['gpu']} x{r['tp']} | {r['workload']} | {r['concurrency']} | {r['step']} | {r['profile']} | "
              f"{r['profile_ms']:.2f} | {r['aic_ms']:.2f} | {r['error_pct']:+.1f}% |" for r in rs]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(srt.DATA), help="the runs file (default benchmarks/data/server_runs.json)")
    ap.add_argument("--only", help="comma-separated run ids")
    ap.add_argument("--gpus", help="comma-separated GPU names of the runs file (e.g. H100)")
    args = ap.parse_args(argv)
    try:
        data = srt.load_data(Path(args.data))
        runs = data["runs"]
        for flag, field in (("only", "id"), ("gpus", "gpu")):
            if getattr(args, flag):
                want = getattr(args, flag).split(",")
                missing = [x for x in want if x not in {r[field] for r in runs}]
                if missing:
                    raise InputError(f"--{flag}: no run with {field} {missing[0]!r} in {args.data}")
                runs = [r for r in runs if r[field] in want]
        out = rows(data, runs)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
