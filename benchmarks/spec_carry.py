"""The measured specs' default context carry-over (traces/fit.py `carry`): the table of
docs/reference/traces.md.

    python benchmarks/spec_carry.py [--specs DIR] [--write-docs [PAGE]]

Reads the spec files in DIR (default traces/data/specs, written by
`benchmarks/agent_log_stats.py --write-specs`, which measures each carry in its logs) and
prints, per spec, its carry mode, reasoning share (of output tokens and of calls), what the
mode rests on, the evidence and its sources. --write-docs puts the table into
docs/reference/traces.md (or PAGE) between `<!-- spec_carry: --specs DIR -->` and `<!-- end spec_carry -->`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPECS = "traces/data/specs"
BASIS = {"logs": "its logs", "documented": "the client's documented behaviour", "trace": "the fitted trace's column"}


def table(folder: Path) -> str:
    from traces.fit import read_spec

    rows = []
    for p in sorted(folder.glob("*.json")):
        s = read_spec(str(p))
        c = s.carry
        share = "-" if s.reasoning_share is None else (
            f"{s.reasoning_share:.1%} / {'all' if s.reasoning_calls is None else f'{s.reasoning_calls:.1%}'}")
        if c is None:
            rows.append(f"| `{s.name}` | cached (none given) | {share} | - | - | - |")
            continue
        links = ", ".join(f"[{i + 1}]({u})" for i, u in enumerate(c.sources)) or "-"
        rows.append(f"| `{s.name}` | `{c.mode}` | {share} | {BASIS[c.basis]} | {c.evidence} | {links} |")
    return ("Table: each measured spec's default carry (`sim trace gen --spec` writes it into the trace's `carry` "
            "column). Reasoning: share of output tokens / share of calls that reason.\n\n"
            "| spec | carry | reasoning | rests on | evidence | sources |\n|---|---|---|---|---|---|\n" + "\n".join(rows))


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specs", default=DEFAULT_SPECS, metavar="DIR", help=f"the spec files (default {DEFAULT_SPECS})")
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "traces.md"), default=None, metavar="PAGE")
    a = ap.parse_args(argv)
    folder = Path(a.specs) if Path(a.specs).is_absolute() else ROOT / a.specs
    if not folder.is_dir():
        raise SystemExit(f"error: --specs {a.specs!r}: no such folder; give the folder of spec JSON files")
    text = table(folder)
    print(text)
    if a.write_docs:
        write_block(a.write_docs, "spec_carry", f"--specs {a.specs}", text)
    return text


if __name__ == "__main__":
    main()
