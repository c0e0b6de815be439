"""Held-out check of `sim trace fit`: fit on half of a real corpus, generate, and run the
policy table on the generated trace and on the other half's resampled sessions.

    python benchmarks/trace_fit_holdout.py [--logs DIR] [--programs 100] [--num-gpu-blocks 26124] [--jps 0.05]
        [--seeds 0] [--gen-seeds 0] [--resample-seeds 0] [--policies vllm,...] [--workers 1] [--write-docs [PAGE]]

Corpus: AgentCgroup's 111 Claude Code + GLM-4.7-Flash sessions (main chains, as
benchmarks/agent_log_stats.py reads them: a call's tool is its slowest, tool time the gap
to the next call, the shared prefix as in the claude-code spec). Sessions sorted by id;
even positions are the fit half, odd the held-out half. The fit half's spec generates
--programs programs per --gen-seeds seed; the held-out half is resampled to as many (`sim
trace resample --jitter`) per --resample-seeds seed (100 draws of 55 sessions repeat 45 of
them: which ones moves the reference itself). Each policy runs on every trace at --jps on
the default profile with its KV pool cut to --num-gpu-blocks, per arrival seed (--seeds). A
trace's mean JCT is its mean over the arrival seeds; a side's is the mean over its traces,
and the 95% interval of the difference is Welch's t over those per-trace means (both sides'
sampling noise; none with one trace a side). Passes when the policies rank the same by mean
JCT and every mean JCT is within 10% of the held-out one. The fit half's own sessions,
resampled alike, show how far the two halves differ without any fit; the generated traces
against them, how far the fit is from what it was fitted on. Prints a Markdown
table; --write-docs puts it into docs/reference/traces.md between `<!-- trace_fit_holdout: FLAGS -->`
and its end marker.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.docs_tables import DOCS, external_logs, write_block  # noqa: E402

DEFAULT_LOGS = "$AGENTSIM_EXTERNAL_TRACES"  # a folder with agentcgroup/ and tracelab/

ROOT = Path(__file__).resolve().parents[1]
POLICIES = "vllm,program-fcfs,static-ttl,continuum-static,continuum"
TOLERANCE = 0.10


def one(args):
    from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute

    trace, programs, num_gpu_blocks, jps, policy, seed = args
    res = execute(build_run(SimConfig(workload=WorkloadConfig(trace=trace, programs=programs, jps=jps, seed=seed),
                                      policy=PolicyConfig(name=policy), engine=EngineLimits(num_gpu_blocks=num_gpu_blocks))))
    return (trace, policy, seed), res.summary["mean_jct"]


def halves(logs: Path):
    from benchmarks import agent_log_stats as als

    t, prov = als.claude_code_spec(logs)
    ids = sorted(t["program_id"].unique())
    fit_ids, held_ids = set(ids[0::2]), set(ids[1::2])
    return t[t["program_id"].isin(fit_ids)].reset_index(drop=True), t[t["program_id"].isin(held_ids)].reset_index(drop=True), prov


def build(logs: Path, programs: int, tmp: Path, gen_seeds=(0,), resample_seeds=(0,), shuffled: bool = False):
    from benchmarks import agent_log_stats as als
    from traces import fit
    from traces.resample import resample
    from traces.schema import columns, write_trace

    a, b, prov = halves(logs)
    spec = fit.fit_columns(columns(a), "holdout-fit", {**prov, "counts": {}}, max_context=als.CONTEXT_WINDOW)
    gens = []
    for seed in gen_seeds:
        gen, gmeta = fit.generate_from_spec(spec, programs, seed)
        gens.append(str(tmp / f"generated-{seed}.parquet"))
        write_trace(gen, gens[-1], gmeta)
    paths = [gens]
    shuffled_paths = []
    for label, half in (("held-out", b), ("fit", a)):  # the fit half resampled: the split's own difference
        paths.append([])
        for seed in resample_seeds:
            rs, rmeta = resample([(label, half, {"importer": "agentsim", "synthetic": False})], programs, seed=seed,
                                 max_context=als.CONTEXT_WINDOW, jitter=0.05)
            paths[-1].append(str(tmp / f"{label}-{seed}.parquet"))
            write_trace(rs, paths[-1][-1], rmeta)
            if label == "held-out" and shuffled:
                shuffled_paths.append(str(tmp / f"shuffled-{seed}.parquet"))
                write_trace(shuffle_calls(rs, seed), shuffled_paths[-1], {**rmeta, "shuffled": True})
    info = {"fit_sessions": a["program_id"].nunique(), "held_sessions": b["program_id"].nunique()}
    return *paths, shuffled_paths, info


def shuffle_calls(df, seed: int):
    """The trace with each call's output tokens (calls before a tool among themselves, last
    calls among themselves) and its (tool, duration) permuted across all programs: the
    marginals a spec fits are kept, what makes one session unlike another (a verbose model,
    a task whose tests run for minutes) is gone, as in a trace sampled from a spec."""
    rng = np.random.default_rng(seed)
    df = df.copy()
    pid = df["program_id"].to_numpy()
    last = np.r_[pid[1:] != pid[:-1], True]
    for sel in (~last, last):
        idx = np.flatnonzero(sel)
        df.iloc[idx, df.columns.get_loc("output_tokens")] = df["output_tokens"].to_numpy()[rng.permutation(idx)]
    idx = np.flatnonzero(df["tool_duration_s"].notna().to_numpy())
    perm = rng.permutation(idx)
    for c in ("tool", "tool_duration_s"):
        df.iloc[idx, df.columns.get_loc(c)] = df[c].to_numpy()[perm]
    if "reasoning_tokens" in df:
        df["reasoning_tokens"] = np.minimum(df["reasoning_tokens"], df["output_tokens"])
    return df


STATS = (("calls", "calls per program"), ("out", "output tokens per program"), ("tool", "tool s per program"),
         ("cv_out", "spread of programs' output per call (CV)"), ("cv_tool", "spread of programs' mean tool time (CV)"),
         ("ac_tool", "lag-1 autocorrelation of log tool time"))


def workload_stats(path) -> dict[str, float]:
    """What sets a trace's load beyond the marginals a spec fits: per-program totals, how
    much programs differ from one another (CV over programs of their mean output per call and
    mean tool time) and how alike a program's successive tool times are (lag-1 autocorrelation
    of log duration within a program)."""
    import pandas as pd

    df = pd.read_parquet(path, columns=["program_id", "output_tokens", "tool_duration_s"])
    g = df.groupby("program_id", sort=False)
    n = g.ngroups
    mo, mt = g["output_tokens"].mean(), g["tool_duration_s"].mean()
    t = df[df["tool_duration_s"].notna()]
    lg = np.log(np.maximum(t["tool_duration_s"].to_numpy(), 1e-3))
    same = t["program_id"].to_numpy()[1:] == t["program_id"].to_numpy()[:-1]
    return {"calls": len(df) / n, "out": df["output_tokens"].sum() / n, "tool": t["tool_duration_s"].sum() / n,
            "cv_out": float(mo.std() / mo.mean()), "cv_tool": float(mt.std() / mt.mean()),
            "ac_tool": float(np.corrcoef(lg[:-1][same], lg[1:][same])[0, 1])}


def interval(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """95% interval of mean(x) / mean(y) - 1 from Welch's t on the difference of the means
    (delta method on the ratio); None when a side has one value."""
    from scipy.stats import t as student

    if len(x) < 2 or len(y) < 2:
        return None
    mx, my = float(np.mean(x)), float(np.mean(y))
    vx, vy = np.var(x, ddof=1) / len(x), np.var(y, ddof=1) / len(y)
    se = float(np.sqrt(vx + vy))
    if se == 0:
        return (mx / my - 1, mx / my - 1)
    df = se ** 4 / ((vx ** 2 / (len(x) - 1) if vx else 0) + (vy ** 2 / (len(y) - 1) if vy else 0))
    h = float(student.ppf(0.975, df)) * se / my
    return (mx / my - 1 - h, mx / my - 1 + h)


def _ci(c) -> str:
    return "-" if c is None else f"{c[0]:+.1%} to {c[1]:+.1%}"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--logs", default=DEFAULT_LOGS, help=f"the folder holding agentcgroup/ and tracelab/ (default {DEFAULT_LOGS})")
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--num-gpu-blocks", type=int, default=26124)
    ap.add_argument("--jps", type=float, default=0.05)
    ap.add_argument("--seeds", default="0", help="arrival seeds")
    ap.add_argument("--gen-seeds", default="0", help="seeds of the generated traces (their mean is compared)")
    ap.add_argument("--resample-seeds", default="0", help="seeds of the halves' resampled traces (their mean is compared)")
    ap.add_argument("--shuffled", action="store_true",
                    help="also run the held-out traces with calls shuffled across sessions (shuffle_calls)")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "traces.md"), default=None, metavar="PAGE")
    a = ap.parse_args(argv)
    logs = external_logs(a.logs)
    if not logs.is_dir():
        raise SystemExit(f"error: --logs {a.logs!r}: no such folder")
    from sim.study.sweep import map_points

    pols, seeds = a.policies.split(","), [int(s) for s in a.seeds.split(",")]
    gseeds, rseeds = [int(x) for x in a.gen_seeds.split(",")], [int(x) for x in a.resample_seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="holdout_") as tmp:
        gs, rs, fs, ss, info = build(logs, a.programs, Path(tmp), gseeds, rseeds, a.shuffled)
        side = {"gen": gs, "held": rs, "fit": fs, **({"shuf": ss} if a.shuffled else {})}
        jobs = [(tr, a.programs, a.num_gpu_blocks, a.jps, p, s) for trs in side.values() for tr in trs for p in pols for s in seeds]
        res = dict(map_points(one, jobs, a.workers))
        stats = {k: {m: float(np.mean([workload_stats(tr)[m] for tr in trs])) for m, _ in STATS} for k, trs in side.items()}
    per = {(k, p): [float(np.mean([res[(tr, p, s)] for s in seeds])) for tr in trs] for k, trs in side.items() for p in pols}
    jct = {kp: float(np.mean(v)) for kp, v in per.items()}
    spread = {p: (min(per[("gen", p)]) / jct[("held", p)] - 1, max(per[("gen", p)]) / jct[("held", p)] - 1) for p in pols}
    rank = {tr: sorted(pols, key=lambda p: jct[(tr, p)]) for tr in ("gen", "held")}
    err = {p: jct[("gen", p)] / jct[("held", p)] - 1 for p in pols}
    split = {p: jct[("fit", p)] / jct[("held", p)] - 1 for p in pols}
    ci = {p: interval(per[("gen", p)], per[("held", p)]) for p in pols}
    ci_split = {p: interval(per[("fit", p)], per[("held", p)]) for p in pols}
    own = {p: (jct[("gen", p)] / jct[("fit", p)] - 1, interval(per[("gen", p)], per[("fit", p)])) for p in pols}
    shuf = ({p: (jct[("shuf", p)], jct[("shuf", p)] / jct[("held", p)] - 1, interval(per[("shuf", p)], per[("held", p)]))
             for p in pols} if a.shuffled else None)
    ok = rank["gen"] == rank["held"] and all(abs(e) <= TOLERANCE for e in err.values())
    lines = [f"Table: fit on {info['fit_sessions']} AgentCgroup GLM-local sessions, held out {info['held_sessions']}; "
             f"{a.programs} programs each, JPS {a.jps:g}, {a.num_gpu_blocks} KV blocks, arrival seeds {a.seeds}, "
             f"generation seeds {a.gen_seeds}, resample seeds {a.resample_seeds}; mean JCT (s), 95% intervals",
             "", "| policy | generated from the fit half | held-out half resampled | difference | 95% interval | "
                 "per generation seed | fit half resampled | its difference | 95% interval |"
             + (" held-out, calls shuffled across sessions | its difference | 95% interval |" if shuf else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if shuf else "")]
    lines += [f"| {p} | {jct[('gen', p)]:.1f} | {jct[('held', p)]:.1f} | {err[p]:+.1%} | {_ci(ci[p])} | "
              f"{spread[p][0]:+.1%} to {spread[p][1]:+.1%} | {jct[('fit', p)]:.1f} | {split[p]:+.1%} | {_ci(ci_split[p])} |"
              + (f" {shuf[p][0]:.1f} | {shuf[p][1]:+.1%} | {_ci(shuf[p][2])} |" if shuf else "")
              for p in pols]
    lines += ["", f"Ranking (best first): generated {' < '.join(rank['gen'])}; held-out {' < '.join(rank['held'])}. "
                  f"{'PASS' if ok else 'FAIL'}: ranking {'equal' if rank['gen'] == rank['held'] else 'differs'}, "
                  f"largest mean-JCT difference {max(abs(e) for e in err.values()):.1%} (bound {TOLERANCE:.0%}); "
                  f"between the halves' own sessions {max(abs(e) for e in split.values()):.1%}. Generated against "
                  f"the fit half it was fitted on (resampled): "
                  + "; ".join(f"{p} {own[p][0]:+.1%} ({_ci(own[p][1])})" for p in pols) + "."]
    names = {"gen": "generated", "held": "held-out resampled", "fit": "fit half resampled", "shuf": "held-out, shuffled"}
    lines += ["", "Table: the traces compared (means over their seeds)", "",
              "| | " + " | ".join(label for _, label in STATS) + " |", "|---|" + "---|" * len(STATS)]
    lines += [f"| {names[k]} | " + " | ".join(f"{v[m]:.2f}" if m.startswith(("cv", "ac")) else f"{v[m]:,.0f}" if m == "out"
                                             else f"{v[m]:.1f}" for m, _ in STATS) + " |" for k, v in stats.items()]
    text = "\n".join(lines)
    print(text)
    if a.write_docs:
        key = (f"--logs {a.logs} --programs {a.programs} --num-gpu-blocks {a.num_gpu_blocks} --jps {a.jps:g} --seeds {a.seeds} "
               f"--gen-seeds {a.gen_seeds}" + ("" if a.resample_seeds == "0" else f" --resample-seeds {a.resample_seeds}")
               + (" --shuffled" if a.shuffled else "")
               + ("" if a.policies == POLICIES else f" --policies {a.policies}"))
        write_block(a.write_docs, "trace_fit_holdout", key, text)
    return text


if __name__ == "__main__":
    main()
