"""`sim` command line: one entry point, subcommands registered by each package.

Every subcommand is a function taking the parsed args and returning an exit code.
Bad input raises InputError/PolicyError and is printed as one line (exit 2), never a
traceback.
"""
from __future__ import annotations

import argparse
import sys

from policies.base import PolicyError
from traces.errors import InputError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sim", description="Simulate and calibrate LLM serving of multi-turn agent programs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    from sim import profile_cmd, run_cmd, sweep_cmd
    import traces.cli
    import calibrate.cli

    run_cmd.register(sub)
    sweep_cmd.register(sub)
    traces.cli.register(sub)
    calibrate.cli.register(sub)
    profile_cmd.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (InputError, PolicyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
