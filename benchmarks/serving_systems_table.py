"""Serving systems side by side on 2 GPUs (issue 18, item 5): vLLM, Continuum, ContextServe,
SGLang (radix cache + cache-aware router), SGLang + Continuum, 1P1D disaggregation with and
without Continuum; each without and with a CPU offload tier; on the bundled SWE-bench and
BFCL traces and on real Claude Code sessions (AgentCgroup, resampled), at two loads each.

    python benchmarks/serving_systems_table.py [--cells swebench:6000:0.6,1.0:300 bfcl:12000:0.4,0.6:300
                                                        real:26124:0.3,0.4:150]
        [--seeds 0] [--offload cpu:200GB] [--tiers gpu,cpu] [--systems vllm,continuum,...] [--profile NAME]
        [--real-sessions DIR] [--workers 2] [--figure PNG] [--results-json JSON] [--write-docs [PAGE]] [--quick]

A cell is TRACE:BLOCKS:JPS[,JPS...]:PROGRAMS: TRACE a bundled name, a parquet path, or `real`
(the first PROGRAMS of 300 programs resampled with jitter, seed 0, from the AgentCgroup
Claude Code sessions under --real-sessions, imported and resampled by the repo's own
`sim trace import` / `sim trace resample` into a temporary directory that is removed at the
end: the logs are GPL-2.0 and never copied into the repository; the same trace as
docs/results.md's real-session section); BLOCKS the GPU KV blocks of each replica (the
profile's pool cut, to make memory short); JPS the Poisson program arrival rates, summed
over the cluster.

Every system runs on 2 GPUs: two replicas (each BLOCKS blocks) behind a router, or one
prefill and one decode replica (`--disagg 1P1D`, each BLOCKS blocks, RDMA NDR link). Every
run goes through sim.run.config.SimConfig / build_run / execute. A combination the run builder
refuses is shown as n/a with its one-line reason in a footnote (none is refused today).
--systems also takes two diagnostics that split SGLang into its parts: radix+session (its
cache behind the session router) and vllm+cache_aware (its router in front of vLLM's pool).
Prints one Markdown table per cell and load, cells the mean over --seeds; --figure writes a
PNG (mean JCT per system, bars, p95 as a tick) with a JSON sidecar of what it drew;
--write-docs writes the tables into docs/reference/serving_systems.md (or PAGE) between
`<!-- serving_systems_table: FLAGS -->` and `<!-- end serving_systems_table -->`
(benchmarks/docs_tables.py), and, for the default tables, the figure to
docs/figures/serving_systems.png.
--quick: a few programs of SWE-bench at one load (seconds; tests/test_serving_systems_table.py).
"""
from __future__ import annotations

import argparse
import os
import datetime
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402
from policies.base import PolicyError
from sim.run.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute
from sim.study.sweep import map_points
from sim.hardware.profile import DEFAULT_PROFILE
from agentsim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
PAGE = DOCS / "reference" / "serving_systems.md"
FIGURE = DOCS / "figures" / "serving_systems.png"
SCRIPT = "serving_systems_table"
# AgentCgroup's experiments/ folder (github.com/eunomia-bpf/agentcgroup at 5af9e7b, GPL-2.0: read in place, never copied)
REAL_SESSIONS_ENV = "AGENTCGROUP_EXPERIMENTS"
REAL_DRAWN = 300  # programs resampled (as docs/results.md); a cell runs the first PROGRAMS of them

# label -> (policy, cluster settings); every system on 2 GPUs
SYSTEMS: dict[str, tuple[str, dict]] = {
    "vllm": ("vllm", {"replicas": 2, "router": "session"}),
    "continuum": ("continuum", {"replicas": 2, "router": "session"}),
    "contextserve": ("contextserve", {"replicas": 2, "router": "session"}),
    "sglang": ("vllm", {"replicas": 2, "router": "cache_aware", "cache": "radix"}),
    "sglang+continuum": ("continuum", {"replicas": 2, "router": "cache_aware", "cache": "radix"}),
    "1p1d": ("vllm", {"disagg": "1P1D"}),  # one decode replica: nothing to route
    "1p1d+continuum": ("continuum", {"disagg": "1P1D"}),
    # diagnostics, not in the default rows: SGLang's two parts one at a time
    "radix+session": ("vllm", {"replicas": 2, "router": "session", "cache": "radix"}),
    "vllm+cache_aware": ("vllm", {"replicas": 2, "router": "cache_aware"}),
}
DEFAULT_SYSTEMS = "vllm,continuum,contextserve,sglang,sglang+continuum,1p1d,1p1d+continuum"
WHAT = {
    "vllm": "vLLM: FCFS, KV freed at each turn's end; session router",
    "continuum": "Continuum's TTL pins and program FCFS; session router",
    "contextserve": "ContextServe's three-way pins; session router",
    "sglang": "SGLang: radix cache, cache-aware router, FCFS, nothing pinned",
    "sglang+continuum": "SGLang's radix cache and router with Continuum's policy",
    "1p1d": "Dynamo-style 1 prefill + 1 decode replica, vLLM policy",
    "1p1d+continuum": "1P1D with Continuum's policy on the decode replica",
    "radix+session": "radix cache, session router, vLLM policy",
    "vllm+cache_aware": "vLLM's block pool, cache-aware router, vLLM policy",
}
DEFAULT_CELLS = ["swebench:6000:0.6,1.0:300", "bfcl:12000:0.4,0.6:300", "real:26124:0.3,0.4:150"]
QUICK_CELLS = ["swebench:3000:0.5:6"]
FULL = 0.95  # "KV full": at least this share of a GPU's KV blocks in use
METRICS = ("mean_jct", "p95_jct", "makespan_s", "cache_hit_ratio", "cpu_hit_ratio", "peak_kv_usage", "preemptions",
           "kv_full_share", "busiest_share", "remote_share", "busy_decode", "busy_prefill")


def parse_cell(cell: str) -> tuple[str, int, list[float], int]:
    try:
        trace, blocks, loads, programs = cell.rsplit(":", 3)
        return trace, int(blocks), [float(j) for j in loads.split(",")], int(programs)
    except ValueError:
        raise SystemExit(f"error: cell {cell!r} is not TRACE:BLOCKS:JPS[,JPS...]:PROGRAMS, e.g. swebench:6000:0.6,1.0:300") from None


def one(job):
    """One simulation: (its key, its figures) or (its key, {'refused': the builder's line})."""
    key, trace_path, programs, blocks, jps, system, offload, seed, profile = job
    policy, cluster = SYSTEMS[system]
    try:
        run = build_run(SimConfig(
            workload=WorkloadConfig(trace=trace_path, programs=programs, jps=jps, seed=seed),
            policy=PolicyConfig(name=policy), engine=EngineLimits(profile=profile, num_gpu_blocks=blocks),
            cluster=ClusterConfig(offload=offload, **cluster)))
    except (InputError, PolicyError) as e:
        return key, {"refused": str(e)}
    r = execute(run)
    s = r.summary
    out = {k: float(s[k]) for k in METRICS[:7]}
    span = s["makespan_s"]
    # the share of the run during which the fullest GPU had >= FULL of its KV blocks in use
    # (the engine samples its use about once a second of busy time; each sample holds until the next)
    full = 0.0
    for _, g in r.kv_usage.groupby("replica"):
        t, used = g["t"].to_numpy(), g["used_blocks"].to_numpy()
        dt = np.diff(t, append=t[-1])
        full = max(full, float(dt[used >= FULL * (run.cfg.num_gpu_blocks - 1)].sum()) / span)
    out["kv_full_share"] = full
    reps = s["per_replica"]
    dec = [q for q in reps if q.get("role", "decode") == "decode"]
    pre = [q for q in reps if q.get("role") == "prefill"]
    out["busiest_share"] = max(q["calls"] for q in dec) / max(1, sum(q["calls"] for q in dec))
    out["busy_decode"] = max(q["busy_s"] for q in dec) / span
    out["busy_prefill"] = max(q["busy_s"] for q in pre) / span if pre else math.nan
    d = s.get("disaggregation")
    out["remote_share"] = d["remote_prefills"] / max(1, d["remote_prefills"] + d["local_prefills"]) if d else math.nan
    return key, out


def build_real(src: str | None, out_dir: Path) -> Path:
    """The real-session trace, built with the repo's own import and resample commands into out_dir."""
    from agentsim.cli import main as sim

    if not src or not Path(src).is_dir():
        raise SystemExit(f"error: the `real` cell needs AgentCgroup's experiments/ folder (a checkout of "
                         f"github.com/eunomia-bpf/agentcgroup, GPL-2.0, read in place): give --real-sessions DIR or set "
                         f"{REAL_SESSIONS_ENV}" + (f" ({src} is not a directory)" if src else "") + ", or drop the `real` cell")
    src = Path(src)
    local, haiku, real = out_dir / "local.parquet", out_dir / "haiku.parquet", out_dir / f"real{REAL_DRAWN}.parquet"
    for argv in (["trace", "import", "claude-code", str(src / "all_images_local"), "-o", str(local)],
                 ["trace", "import", "claude-code", str(src / "all_images_haiku"), "--estimate-tokens", "-o", str(haiku)],
                 ["trace", "resample", str(local), str(haiku), "--programs", str(REAL_DRAWN), "--seed", "0", "--jitter",
                  "-o", str(real)]):
        if sim(argv) != 0:
            raise SystemExit(f"error: `sim {' '.join(argv)}` failed")
    return real


def table_key(a) -> str:
    """The flags that define the tables, as their docs marker names them (a command that redoes them)."""
    key = f"--cells {' '.join(a.cells)} --seeds {a.seeds} --offload {a.offload} --profile {a.profile}"
    key += "" if a.tiers == "gpu,cpu" else f" --tiers {a.tiers}"
    return key + ("" if a.systems == DEFAULT_SYSTEMS else f" --systems {a.systems}")


def _cell_name(trace: str) -> str:
    return "real Claude Code sessions (AgentCgroup, resampled)" if trace == "real" else Path(trace).name


def render(a, cells, systems, seeds, res, wall_s: float | None = None) -> str:
    """All tables as printed (and as written into the docs)."""
    notes: dict[str, int] = {}  # a refusal's line -> its footnote number
    offs = [None if t == "gpu" else a.offload for t in a.tiers.split(",")]

    def figures(key) -> dict | int:
        """The cell's figures, mean over seeds, or the footnote number of its refusal."""
        runs = [res[(*key, s)] for s in seeds]
        for r in runs:
            if "refused" in r:
                return notes.setdefault(r["refused"], len(notes) + 1)
        return {m: float(np.mean([r[m] for r in runs])) for m in METRICS}

    seed_txt = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean over seeds {','.join(map(str, seeds))}"
    head = (f"Profile `{a.profile}`, 2 GPUs per system (2 replicas, or 1 prefill + 1 decode), each GPU's KV pool cut "
            f"to the table's blocks; Poisson program arrivals (JPS over the whole cluster), {seed_txt}. "
            f"Times in simulated seconds; JCT = a program's arrival to its last token; makespan = first arrival to "
            f"last finish; prefix hit = share of prompt tokens served from the GPU prefix cache; peak KV = the "
            f"fullest GPU's peak share of KV blocks in use (held by running calls and pins); KV full = share of the "
            f"makespan during which a GPU had >= {FULL:.0%} of its KV blocks in use (the fullest; sampled about once "
            f"a second); preempt. = preemptions (recomputes), summed over GPUs.")
    if a.offload and len(offs) > 1:
        head += f" +CPU = `--offload {a.offload}` on every GPU; CPU hit = share of GPU-missed prompt tokens reloaded from CPU."
    if wall_s is not None:
        head += f" Run on {datetime.date.today()}: {len(res)} runs, {wall_s / 60:.1f} min wall with {a.workers} worker(s)."
    out = [head]
    cols = []
    for off in offs:
        p = "" if off is None else "+CPU "
        cols += [f"{p}mean JCT (s)", f"{p}p95 JCT (s)", f"{p}makespan (s)"]
        cols += ["prefix hit", "peak KV", "KV full", "preempt."] if off is None else ["+CPU prefix / CPU hit"]
    for trace, blocks, loads, programs in cells:
        for jps in loads:
            out += ["", f"Table: {_cell_name(trace)}, {programs} programs, {blocks} KV blocks ({blocks * 16:,} tokens) "
                        f"per GPU, JPS {jps:g}", "", "| system | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
            said = []
            for sysname in systems:
                row = []
                for off in offs:
                    v = figures((trace, blocks, jps, programs, sysname, off))
                    n = 7 if off is None else 4
                    if isinstance(v, int):
                        row += [f"n/a [{v}]"] * n
                        continue
                    row += [f"{v['mean_jct']:.1f}", f"{v['p95_jct']:.1f}", f"{v['makespan_s']:.0f}"]
                    if off is None:
                        row += [f"{v['cache_hit_ratio']:.3f}", f"{v['peak_kv_usage']:.0%}", f"{v['kv_full_share']:.0%}",
                                f"{v['preemptions']:.0f}"]
                        if "cache_aware" in SYSTEMS[sysname][1].get("router", "") and SYSTEMS[sysname][0] == "vllm":
                            said.append(f"{sysname} sent {v['busiest_share']:.0%} of calls to its busier GPU")
                        if SYSTEMS[sysname][1].get("disagg") and SYSTEMS[sysname][0] == "vllm":
                            said.append(f"{sysname} prefilled {v['remote_share']:.0%} of calls on the prefill GPU (the rest "
                                        f"on the decode GPU); a step ran on the prefill GPU {v['busy_prefill']:.0%} of the "
                                        f"makespan, on the decode GPU {v['busy_decode']:.0%}")
                    else:
                        row += [f"{v['cache_hit_ratio']:.3f} / {v['cpu_hit_ratio']:.3f}"]
                out.append(f"| {sysname} | " + " | ".join(row) + " |")
            if said:
                out += ["", "Without offload: " + "; ".join(said) + "."]
    if notes:
        out += [""] + [f"[{n}] refused by the run builder: {line}" for line, n in notes.items()]
    out += ["", "Systems: " + "; ".join(f"{s} = {WHAT[s]}" for s in systems) + "."]
    return "\n".join(out)


def figure(a, cells, systems, seeds, res):
    """Mean JCT per system (bars: no offload, +CPU), p95 as a tick; one panel per cell and load."""
    from matplotlib.figure import Figure

    cols = max(len(loads) for _, _, loads, _ in cells)
    fig = Figure(figsize=(5.2 * cols, 3.6 * len(cells)), layout="constrained")
    axes = fig.subplots(len(cells), cols, squeeze=False)
    x = np.arange(len(systems))
    for r, (trace, blocks, loads, programs) in enumerate(cells):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(loads):
                ax.set_visible(False)
                continue
            jps = loads[c]
            bars = [(None, "no offload", "#4c72b0"), (a.offload, f"+CPU {a.offload}", "#dd8452")]
            bars = [b for b, t in zip(bars, ("gpu", "cpu")) if t in a.tiers.split(",")]
            w = 0.76 / len(bars)
            for i, (off, label, color) in enumerate(bars):
                m, p95 = [], []
                for s in systems:
                    runs = [res[(trace, blocks, jps, programs, s, off, sd)] for sd in seeds]
                    ok = all("refused" not in q for q in runs)
                    m.append(float(np.mean([q["mean_jct"] for q in runs])) if ok else 0.0)
                    p95.append(float(np.mean([q["p95_jct"] for q in runs])) if ok else np.nan)
                xs = x + (i - (len(bars) - 1) / 2) * w
                ax.bar(xs, m, w, label=label, color=color)
                ax.plot(xs, p95, linestyle="none", marker="_", markersize=9, color="black",
                        label="p95 JCT" if i == len(bars) - 1 else "_p95")
            ax.set_xticks(x, systems, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel("JCT (s)")
            ax.set_title(f"{'real sessions' if trace == 'real' else Path(trace).stem}, JPS {jps:g}, {blocks} blocks/GPU",
                         fontsize=9)
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"2 GPUs per system, {a.profile}: mean JCT (bars), p95 (ticks)", fontsize=10)
    return fig


def figure_path(a) -> str | None:
    """Where to draw the figure: --figure, else the docs' figure only when the default tables
    are written into the docs' page (a diagnostic run, or a page elsewhere, keeps it)."""
    docs = a.write_docs and Path(a.write_docs).resolve() == PAGE.resolve() and table_key(a) == table_key(parse_args([]))
    return a.figure or (str(FIGURE) if docs else None)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", nargs="+", default=None, metavar="TRACE:BLOCKS:JPS[,JPS]:PROGRAMS",
                    help=f"default: {' '.join(DEFAULT_CELLS)}")
    ap.add_argument("--seeds", default="0", help="arrival seeds, comma-separated; cells are means over them")
    ap.add_argument("--offload", default="cpu:200GB", help="the CPU tier of the +CPU columns, per GPU (the paper's H100/B200 setting)")
    ap.add_argument("--tiers", default="gpu,cpu", help="gpu: no offload; cpu: with --offload (default both)")
    ap.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"rows, of: {', '.join(SYSTEMS)}")
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--real-sessions", default=os.environ.get(REAL_SESSIONS_ENV), metavar="DIR",
                    help=f"AgentCgroup's experiments/ folder, read in place (default ${REAL_SESSIONS_ENV})")
    ap.add_argument("--workers", type=int, default=2, help="processes (1: in this one; at most 2 on a shared machine)")
    ap.add_argument("--figure", default=None, metavar="PNG", help="write the figure there (with --write-docs: docs/figures/serving_systems.png)")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), default=None, metavar="PAGE",
                    help="replace the tables in PAGE (default docs/reference/serving_systems.md) between "
                         f"`<!-- {SCRIPT}: FLAGS -->` and `<!-- end {SCRIPT} -->`, and write the figure")
    ap.add_argument("--results-json", default=None, metavar="JSON", help="also write every run's figures there")
    ap.add_argument("--quick", action="store_true", help=f"tiny run for tests: --cells {' '.join(QUICK_CELLS)}")
    a = ap.parse_args(argv)
    if a.cells is None:
        a.cells = QUICK_CELLS if a.quick else DEFAULT_CELLS
    if not a.tiers or set(a.tiers.split(",")) - {"gpu", "cpu"}:
        ap.error(f"--tiers {a.tiers!r}: give gpu, cpu or gpu,cpu")
    unknown = [s for s in a.systems.split(",") if s not in SYSTEMS]
    if unknown:
        ap.error(f"--systems: unknown {unknown}; give some of {', '.join(SYSTEMS)}")
    return a


def main(argv: list[str] | None = None) -> str:
    a = parse_args(argv)
    cells = [parse_cell(c) for c in a.cells]
    systems = a.systems.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    offs = [None if t == "gpu" else a.offload for t in a.tiers.split(",")]
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="serving_systems_") as tmp:
        paths = {t: t for t, *_ in cells}
        if "real" in paths:
            paths["real"] = str(build_real(a.real_sessions, Path(tmp)))
        jobs = [((t, b, j, p, s, off, sd), paths[t], p, b, j, s, off, sd, a.profile)
                for t, b, loads, p in cells for j in loads for s in systems for off in offs for sd in seeds]
        # the slowest first (radix caches, disaggregation), so two workers finish together
        jobs.sort(key=lambda job: (job[0][0] != "real", SYSTEMS[job[0][4]][1].get("cache") != "radix", -job[0][2]))
        res = dict(map_points(one, jobs, min(a.workers, len(jobs))))
    wall = time.time() - t0
    if a.results_json:
        Path(a.results_json).write_text(json.dumps([{"trace": k[0], "blocks": k[1], "jps": k[2], "programs": k[3], "system": k[4],
                                                     "offload": k[5], "seed": k[6], **v} for k, v in res.items()], indent=1))
    text = render(a, cells, systems, seeds, res, wall)
    print(text)
    fig_path = figure_path(a)
    if fig_path:
        from sim.study.plot import save

        save(figure(a, cells, systems, seeds, res), fig_path)
        print(f"\nwrote {fig_path}")
    if a.write_docs:
        write_block(a.write_docs, SCRIPT, table_key(a), text)
        print(f"wrote the tables into {a.write_docs} (<!-- {SCRIPT}: {table_key(a)} -->)")
    print(f"{len(jobs)} runs in {wall:.0f} s ({datetime.date.today()})")
    return text


if __name__ == "__main__":
    main()
