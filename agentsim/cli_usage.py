"""Keep the usage blocks of docs/reference/cli.md equal to what `sim CMD --help` prints.

    python -m agentsim.cli_usage            # rewrite them in place
    python -m agentsim.cli_usage --check    # exit 1 naming the stale ones (tests/test_docs.py)

A block is an indented line `usage: sim CMD ...` and its more-indented continuation
lines; CMD (one or two words) names the subcommand. The table between `<!-- requires -->`
and `<!-- end requires -->` is agentsim/requires.py's: the flags that apply only with another.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

CLI_MD = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"
WIDTH = 100
_BLOCK = re.compile(r"^(    )usage: sim ((?:[a-z-]+ ?){1,2}).*\n(?:^\1 +\S.*\n)*", re.MULTILINE)
_REQUIRES = re.compile(r"(?<=<!-- requires -->\n).*?(?=<!-- end requires -->)", re.DOTALL)


def usage(words: list[str]) -> str:
    """`sim WORDS --help`'s usage text, wrapped at WIDTH columns."""
    from agentsim.cli import build_parser

    os.environ["COLUMNS"] = str(WIDTH + 2)  # argparse wraps at COLUMNS - 2
    parser = build_parser()
    for w in words:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[w]
    return parser.format_usage().strip()


def requires_table() -> str:
    """agentsim/requires.py's rows as a table: the flags of one command with one condition on a row."""
    from agentsim.requires import RULES, rules

    groups: dict[tuple[str, str], list[str]] = {}
    for command in dict.fromkeys([*(r.command for r in RULES), "validate", "calibrate"]):
        for r in rules(command):
            flag, _, param = r.flag.partition(" ")
            if param:  # a policy's or router's parameter: one row for all
                flag, cond = f"{flag} K=V", f"a {r.condition.split()[0]} that has K"
            else:
                cond = r.condition
            flags = groups.setdefault((command, cond), [])
            if f"`{flag}`" not in flags:
                flags.append(f"`{flag}`")
    lines = ["| command | flags | apply only with |", "|---|---|---|"]
    lines += [f"| `sim {cmd}` | {', '.join(flags)} | {cond} |" for (cmd, cond), flags in groups.items()]
    return "\n".join(lines) + "\n"


def render(text: str) -> str:
    def one(m: re.Match) -> str:
        body = usage(m.group(2).split())
        return "".join(f"    {line}\n" for line in body.splitlines())
    return _REQUIRES.sub(lambda _: requires_table(), _BLOCK.sub(one, text))


def main(argv: list[str]) -> int:
    old = CLI_MD.read_text()
    new = render(old)
    if "--check" in argv:
        if new != old:
            stale = [m.group(0).splitlines()[0].strip() for m in _BLOCK.finditer(old) if m.group(0) not in new]
            print(f"{CLI_MD}: stale usage blocks: {'; '.join(stale)}; run python -m agentsim.cli_usage", file=sys.stderr)
            return 1
        return 0
    if new != old:
        CLI_MD.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
