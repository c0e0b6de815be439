"""Results tables written into the docs by the scripts that compute them, not by hand.

A page marks each table with the script's name and the flags that define it (a command
that redoes it), each marker on its own line:

    <!-- policy_table: --trace swebench --programs 300 ... -->
    ...the script's printed table...
    <!-- end policy_table -->

`write_block(page, script, key, body)` replaces what lies between the two lines; every
other byte of the page is kept, and the page is replaced atomically.
"""
from __future__ import annotations

import re
from pathlib import Path

from agentsim.files import atomic_write

DOCS = Path(__file__).resolve().parents[1] / "docs"


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
    path = Path(path)
    new = replace_block(path.read_bytes().decode("utf-8"), script, key, body).encode("utf-8")
    atomic_write(path, lambda t: Path(t).write_bytes(new))
