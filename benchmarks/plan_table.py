"""What `sim plan` prints for the question of docs/planning.md: the plan that
docs/reference/planning.md shows, made by running the command, not copied.

    python benchmarks/plan_table.py [--page docs/planning.md] [--write-docs [PAGE]]

The question is the first `sim plan` command on --page (read from it, as
benchmarks/plan_speed.py reads it, so the two cannot drift), run whole into a fresh
--out (one to two minutes on 2 cores). Prints what it printed, less the echoed command and
the closing wall-time line; --write-docs puts that into PAGE (default
docs/reference/planning.md) between `<!-- plan_table: --page QUESTION_PAGE -->` and
`<!-- end plan_table -->`.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import write_block  # noqa: E402
from benchmarks.plan_speed import documented_question  # noqa: E402

QUESTION = "docs/planning.md"
PAGE = ROOT / "docs" / "reference" / "planning.md"
# the last line: wall time and the files written (a temporary folder)
CLOSING = re.compile(r"^\d+ candidates? in [\d.]+ s; wrote ")


def plan_output(args: list[str]) -> str:
    """sim plan's printed plan for args (a fresh --out), without the echoed command and the closing line."""
    with tempfile.TemporaryDirectory(prefix="plan_table_") as out:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run([sys.executable, "-m", "agentsim.cli", "plan", *args, "--out", out, "--no-progress"],
                           cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"error: sim plan {' '.join(args)} failed (exit {r.returncode}): "
              f"{''.join((r.stderr or r.stdout).strip().splitlines()[-1:])}", file=sys.stderr)
        raise SystemExit(r.returncode)
    lines = [ln for ln in r.stdout.rstrip("\n").split("\n") if not ln.startswith("    sim plan ") and not CLOSING.match(ln)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page", default=QUESTION, help=f"the page whose first `sim plan` command is asked (default {QUESTION})")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), default=None, metavar="PAGE",
                    help="put the plan into PAGE (default docs/reference/planning.md) between its markers")
    a = ap.parse_args(argv)
    page = Path(a.page) if Path(a.page).is_absolute() else ROOT / a.page
    try:
        args = documented_question(page)
    except (OSError, StopIteration):
        print(f"error: --page {a.page}: no such page, or no `sim plan` command on it", file=sys.stderr)
        raise SystemExit(2) from None
    text = f"Made by `python benchmarks/plan_table.py` (it runs that command):\n\n{plan_output(args)}"
    print(text)
    if a.write_docs:
        write_block(a.write_docs, "plan_table", f"--page {a.page}", text)
    return text


if __name__ == "__main__":
    main()
