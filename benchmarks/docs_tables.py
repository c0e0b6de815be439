"""Results tables written into the docs by the scripts that compute them, not by hand.

A page marks each table with the script's name and the flags that define it (a command
that redoes it), each marker on its own line:

    <!-- policy_table: --trace swebench --programs 300 ... -->
    ...the script's printed table...
    <!-- end policy_table -->

`write_block(page, script, key, body)` replaces what lies between the two lines; every
other byte of the page is kept, and the page is replaced atomically.

Run as a script, it redoes every marked table of docs/ (the tables live on the reference
pages, docs/reference/) by its marker's command, or with
--check says which tables that command no longer gives (exit 1), the pages untouched:

    python benchmarks/docs_tables.py [--check] [--only SCRIPT[,SCRIPT]] [--match TEXT]

Not redone: sim_speed and tune_speed (wall-clock timings) and clock_sensitivity (a real vLLM engine);
a table whose input file is missing (e.g. /tmp/real300.parquet, built as
docs/reference/results.md says) is skipped with its name. The twin-check tables of
docs/reference/validation.md are benchmarks/twin_check.py's (`Run:` line in each).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agentsim.files import atomic_write

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# a marked table's script is benchmarks/<its name>.py, except these (one run writes both: a
# page's n-th table5 block and its n-th fig9 block are one run's)
SCRIPT_OF = {"table5": "table5_fig9", "fig9": "table5_fig9"}
NOT_REDONE = {"sim_speed": "wall-clock timings against a baseline commit", "clock_sensitivity": "runs a real vLLM engine",
              "sampler_time": "times vLLM's sampler and a real vLLM engine",
              "tune_speed": "a wall-clock timing on a shared machine"}
# what differs from run to run in a table's text and is not a result
VOLATILE = re.compile(r" Run on \d{4}-\d{2}-\d{2}: \d+ runs, [\d.]+ min wall with \d+ worker\(s\)\.")


def replace_block(text: str, script: str, key: str, body: str) -> str:
    """text with the block between `<!-- SCRIPT: KEY -->` and the next `<!-- end SCRIPT -->`
    replaced by body (a blank line either side)."""
    mark, end_mark = f"<!-- {script}: {key} -->", f"<!-- end {script} -->"
    found = [m.end() for m in re.finditer(rf"^{re.escape(mark)}$", text, re.M)]
    if len(found) != 1:
        have = re.findall(rf"^<!-- {re.escape(script)}: (.*?) -->$", text, re.M)
        raise SystemExit(f"error: {len(found)} lines {mark!r} (need exactly one); marked tables: {have or 'none'}. "
                         f"Put `{mark}` and `{end_mark}`, each on its own line, around the table to replace")
    end = re.compile(rf"^{re.escape(end_mark)}$", re.M).search(text, found[0])
    if end is None:
        raise SystemExit(f"error: {mark!r} has no line {end_mark!r} after it")
    return text[:found[0]] + "\n\n" + body.strip("\n") + "\n\n" + text[end.start():]


def write_block(path: str | Path, script: str, key: str, body: str) -> None:
    """Replace the block of `script` marked with `key` in the page at path, atomically."""
    write_blocks(path, script, {key: body})


def write_blocks(path: str | Path, script: str, bodies: dict[str, str]) -> None:
    """Replace each block of `script` keyed in bodies in the page at path: all in one atomic write,
    or none (a missing marker stops before anything is written)."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8")
    for key, body in bodies.items():
        text = replace_block(text, script, key, body)
    new = text.encode("utf-8")
    atomic_write(path, lambda t: Path(t).write_bytes(new))


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    name: str  # the marker's name: `<!-- NAME: KEY -->`
    key: str  # the flags that define the table
    body: str

    @property
    def script(self) -> str:
        return SCRIPT_OF.get(self.name, self.name)


def marked_blocks(docs: Path = DOCS) -> list[Block]:
    """Every `<!-- NAME: KEY -->` ... `<!-- end NAME -->` block of the pages in docs and its
    sub-folders."""
    out = []
    for page in sorted(docs.rglob("*.md")):
        text = page.read_text()
        for m in re.finditer(r"^<!-- ([a-z0-9_]+): (.*) -->$", text, re.M):
            end = re.compile(rf"^<!-- end {m[1]} -->$", re.M).search(text, m.end())
            if end is not None:
                out.append(Block(page, text.count("\n", 0, m.start()) + 1, m[1], m[2], text[m.end():end.start()].strip("\n")))
    return out


def missing_input(key: str) -> str | None:
    """The first path among the flags that does not exist (relative to the repository), or
    names an environment variable that is not set."""
    for tok in shlex.split(key):
        if "$" in os.path.expandvars(tok):
            return tok
        tok = os.path.expandvars(tok)
        path = tok.split(":", 1)[0]  # a cell is PATH:BLOCKS:LOADS
        if path.startswith(("/", "./", "../")) and not (ROOT / path).exists():
            return path
    return None


def command(blocks: list[Block], page: Path) -> list[str]:
    """The command that writes these blocks (one script's) into page."""
    script = ROOT / "benchmarks" / f"{blocks[0].script}.py"
    return [sys.executable, str(script), *[os.path.expandvars(t) for b in blocks for t in shlex.split(b.key)], "--write-docs", str(page)]


def redo(check: bool, only: set[str] | None = None, docs: Path = DOCS, out=print, select=None) -> int:
    """Redo (or with check, compare) every marked table (of the scripts in only; a group of
    blocks one run writes only when select(block) holds for each); 1 when a command fails or
    check finds a table its command no longer gives."""
    groups: dict[tuple, list[Block]] = {}
    nth: dict[tuple, int] = {}
    for b in marked_blocks(docs):
        if only and b.script not in only:
            continue
        if b.name in SCRIPT_OF:
            i = nth[(b.page, b.name)] = nth.get((b.page, b.name), -1) + 1
            groups.setdefault((b.page, b.script, i), []).append(b)
        else:
            groups.setdefault((b.page, b.script, b.key), []).append(b)
    if select is not None:
        groups = {k: g for k, g in groups.items() if all(select(b) for b in g)}
    stale = failed = 0
    with tempfile.TemporaryDirectory(prefix="docs_tables_") as tmp:
        for blocks in groups.values():
            where = ", ".join(f"{b.page.relative_to(docs.parent)}:{b.line}" for b in blocks)
            why = NOT_REDONE.get(blocks[0].script) or (f"{p} is missing" if (p := missing_input(blocks[0].key)) else None)
            if why:
                out(f"skipped  {where} {blocks[0].name}: {why}")
                continue
            page = Path(tmp) / blocks[0].page.name if check else blocks[0].page
            if check:
                page.write_bytes(blocks[0].page.read_bytes())
            run = subprocess.run(command(blocks, page), cwd=ROOT, capture_output=True, text=True)
            if run.returncode:
                out(f"failed   {where} {blocks[0].name}: {''.join((run.stderr or run.stdout).strip().splitlines()[-1:])}")
                failed += 1
                continue
            now = {(b.name, b.key): b.body for b in marked_blocks(page.parent) if b.page.name == page.name}
            for b in blocks:
                same = VOLATILE.sub("", now[(b.name, b.key)]) == VOLATILE.sub("", b.body)
                stale += not same
                out(f"{'current' if same else 'STALE' if check else 'rewrote'}  {b.page.relative_to(docs.parent)}:{b.line} "
                    f"{b.name}: {b.key}")
    return 1 if failed or (check and stale) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Redo the docs' marked tables by their commands (--check: compare only).")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table is not what its command gives")
    ap.add_argument("--only", default=None, metavar="SCRIPT[,SCRIPT]", help="only these scripts' tables")
    ap.add_argument("--match", default=None, metavar="TEXT",
                    help="only tables whose marker's flags contain TEXT (e.g. spec: for the measured-workload tables)")
    a = ap.parse_args(argv)
    select = (lambda b: a.match in b.key) if a.match else None
    return redo(a.check, set(a.only.split(",")) if a.only else None, docs=DOCS, select=select)


if __name__ == "__main__":
    sys.exit(main())


EXTERNAL_TRACES_ENV = "AGENTSIM_EXTERNAL_TRACES"


def external_logs(arg: str) -> Path:
    """The agent-log folder a benchmark reads in place (`--logs`, default $AGENTSIM_EXTERNAL_TRACES):
    agentcgroup/ (AgentCgroup's experiments and per-call tables derived from them, GPL-2.0) and
    tracelab/ (TraceLab's example sessions, CC BY 4.0). Nothing of it is copied."""
    path = os.path.expandvars(arg)
    if "$" in path:
        raise SystemExit(f"error: --logs {arg}: set {EXTERNAL_TRACES_ENV} to the folder holding agentcgroup/ and "
                         f"tracelab/ (the agent logs, read in place), or give --logs DIR")
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


SPEC_PREFIX = "spec:"


def workload_trace(name: str, programs: int, folder: Path, seed: int = 0) -> str:
    """What a table's `--trace` names, as a path or bundled name the simulator reads:
    `spec:NAME` (a shipped measured spec or a spec JSON) is sampled by `sim trace gen --spec`
    (programs, seed) into folder; `openhands` is generated (seed); anything else is itself."""
    if name.startswith(SPEC_PREFIX) or name == "openhands":
        from agentsim.errors import InputError
        from traces.schema import write_trace

        if name == "openhands":
            from traces.generate import generate

            df, meta = generate("openhands", programs=programs, seed=seed)
        else:
            from traces.fit import generate_from_spec, read_spec

            try:
                spec = read_spec(name[len(SPEC_PREFIX):])
            except InputError as e:
                print(f"error: --trace {name}: {e}", file=sys.stderr)
                raise SystemExit(2) from None
            df, meta = generate_from_spec(spec, programs, seed)
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        return str(write_trace(df, Path(folder) / f"{stem}-{programs}-{seed}.parquet", meta))
    return name
