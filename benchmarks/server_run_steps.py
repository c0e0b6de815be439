"""The steps the published server runs are made of, priced by the judge's profile and by
aiconfigurator's own composition of its measured kernels (needs the optional extra).

    python benchmarks/server_run_steps.py [--only ID[,ID]] [--gpus GPU[,GPU]]

Per run of benchmarks/data/server_runs.json: a decode of the b sequences the real server kept in
decode (Little's law on its closed loop of c requests: b = c x (E2E - TTFT) / E2E, E2E = TTFT +
TPOT x (mean output - 1)) at the mean decode context (benchmarks/server_runs_table.py
decode_ctx), a mixed step of one prompt beside b - 1 of those decodes (the prompt whole, or its
first chunk where it exceeds max_num_batched_tokens), and the prompt alone; each priced by the profile the judge uses
(`sim profile roofline`, measured kernels where shipped; device time only) and by
aiconfigurator (sim/hardware/check.py aiconfigurator_points, which adds the rotary and KV write of
every prompt token, as for the measured kernels' derive), with the profile's error.
Kernel-level: it says which steps the profile misprices against the kernels. Then, beside each
run's real TPOT, the TPOT those steps imply (each of the b running requests is replaced by a new
prompt once per mean output length, so a step is mixed with probability b / mean output:
decode + b / mean output x (mixed - decode)), and what the real TPOT leaves above the
kernels' per step and per all-reduce (2 per layer when tp > 1). Nothing here is fitted.
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


def in_decode(run: dict) -> float:
    """The sequences the real server kept in decode, by Little's law (see above)."""
    m, c = run["measured"], run["workload"]["concurrency"]
    e2e = m["ttft_ms"]["mean"] + m["tpot_ms"]["mean"] * (mean_output(run) - 1)
    return c * (e2e - m["ttft_ms"]["mean"]) / e2e


def shapes(run: dict, budget: int) -> list[pc.Probe]:
    """The run's decode, mixed and prompt steps (budget: max_num_batched_tokens)."""
    b, ctx, n = max(1, round(in_decode(run))), round(srt.decode_ctx(run)), mean_input(run)
    out = [pc.Probe("decode", B=b, ctx=ctx)]
    if b > 1:
        out.append(pc.Probe("mixed", n=min(n, budget - (b - 1)), B=b - 1, ctx=ctx))
    return out + [pc.Probe("prefill", n=min(n, budget))]


def mean_output(run: dict) -> float:
    w = run["workload"]
    return w["output_tokens"] * (1 + (w.get("length_spread") or {}).get("low_ratio", 1.0)) / 2


def implied_tpot_ms(run: dict, decode_ms: float, mixed_ms: float) -> float:
    """The TPOT of a loop whose steps are these decode and mixed steps (see above)."""
    return decode_ms + in_decode(run) / mean_output(run) * (mixed_ms - decode_ms)


def judged_profile(data: dict, run: dict):
    """(Profile, provenance source) the judge builds for the run (server_runs_table.build_profile's
    engine view), scheduled as the run ran: vLLM's host time per step hidden behind an asynchronous
    step or added to a synchronous one."""
    import tempfile

    from sim.hardware.profile import load_profile

    with tempfile.TemporaryDirectory() as tmp:
        path, _, _ = srt.build_profile(data, run, "engine", Path(tmp))
        prof = load_profile(path)
    return prof.scheduled(bool(run["engine"].get("async_scheduling"))), prof.raw["provenance"].get("source", "")


def rows(data: dict, runs: list[dict]) -> list[dict]:
    out, profiles = [], {}
    for r in runs:
        key = (r["gpu"], r["tp"], r["model"])
        if key not in profiles:
            profiles[key] = judged_profile(data, r)
        prof, src = profiles[key]
        ref, _ = pc.aiconfigurator_points(prof, shapes(r, prof.engine.max_num_batched_tokens))
        for p in ref:
            aic, model = p.seconds[pc.STAT], prof.step_time(*p.features())
            out.append({"run": r["id"], "gpu": r["gpu"], "tp": r["tp"], "workload": r["workload"].get("label", ""),
                        "concurrency": r["workload"]["concurrency"], "step": p.label(), "kind": p.kind,
                        "profile": "measured" if src.startswith("measured") else "roofline",
                        "profile_ms": model * 1e3, "aic_ms": aic * 1e3, "error_pct": (model - aic) / aic * 100})
    return out


def tpot_rows(data: dict, runs: list[dict], rs: list[dict]) -> list[dict]:
    out = []
    for r in runs:
        by = {x["kind"]: x for x in rs if x["run"] == r["id"]}
        if "mixed" not in by:
            continue
        real = r["measured"]["tpot_ms"]["mean"]
        prof, aic = (implied_tpot_ms(r, by["decode"][k], by["mixed"][k]) for k in ("profile_ms", "aic_ms"))
        layers = (srt.model_spec(data, r["model"]) or _zoo(r["model"]))["num_layers"]
        out.append({"run": r["id"], "gpu": r["gpu"], "tp": r["tp"], "workload": r["workload"].get("label", ""),
                    "concurrency": r["workload"]["concurrency"], "real_ms": real, "profile_ms": prof, "aic_ms": aic,
                    "above_kernels_ms": real - aic,
                    "per_all_reduce_us": (real - aic) / (2 * layers) * 1e3 if r["tp"] > 1 else None})
    return out


def _zoo(model: str) -> dict:
    from sim.hardware.roofline import find_model

    return find_model(model)[1]


def render_tpot(ts: list[dict]) -> str:
    lines = ["| GPU x tp | workload | concurrency | real TPOT (ms) | implied by the steps: profile / aiconfigurator "
             "(ms) | real above the kernels (ms per step) | per all-reduce (us) |", "|---|---|---:|---:|---|---:|---:|"]
    lines += [f"| {t['gpu']} x{t['tp']} | {t['workload']} | {t['concurrency']} | {t['real_ms']:.2f} | "
              f"{t['profile_ms']:.2f} / {t['aic_ms']:.2f} | {t['above_kernels_ms']:+.2f} | "
              + (f"{t['per_all_reduce_us']:+.1f} |" if t["per_all_reduce_us"] is not None else "- |") for t in ts]
    return "\n".join(lines)


def render(rs: list[dict]) -> str:
    lines = ["| GPU x tp | workload | concurrency | step (B: the real server's sequences in decode) | profile | "
             "profile (ms) | aiconfigurator (ms) | profile vs kernels |", "|---|---|---:|---|---|---:|---:|---:|"]
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
        runs = [r for r in data["runs"] if r["workload"]["kind"] == "closed"]  # Little's law: a closed loop's runs
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
    print()
    print(render_tpot(tpot_rows(data, runs, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
