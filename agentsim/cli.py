"""`sim` command line: one entry point, subcommands registered by each package.

It lives above the packages it gathers (traces, sim, calibrate), so that `sim` never
imports `calibrate`: calibrate depends on sim, not the reverse.

Every subcommand is a function taking the parsed args and returning an exit code.
Bad input raises InputError/PolicyError, a simulation that cannot go on (a deadlock,
the progress watchdog) SimulationError; each is printed as one line (exit 2), never a
traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from policies.base import PolicyError
from agentsim import requires
from agentsim.errors import InputError, SimulationError
from sim.hardware.engine_config import renamed_flag

# The module that registers each subcommand, in `sim --help`'s order. A command line
# imports only its own command's module: `sim run` needs neither pandas (sim.study.plan and
# sim.study.sweep import it, ~0.6 s) nor the trace tools.
COMMANDS = {"run": "sim.commands.run", "sweep": "sim.commands.sweep", "plot": "sim.commands.sweep", "plan": "sim.study.plan", "tune": "sim.commands.tune",
            "trace": "traces.cli", "calibrate": "calibrate.cli", "validate": "calibrate.cli", "profile": "sim.commands.profile"}


# What each writer makes at its output flags: (attribute, flag, "file" | "dir"), checked by
# agentsim.files.check_output before the command does any work (nothing read, simulated or
# written first). A command with subcommands is keyed "command subcommand".
OUTPUTS = {
    "run": [("out", "--out", "dir")], "sweep": [("out", "--out", "dir")], "plot": [("out", "--out", "file")],
    "plan": [("out", "--out", "dir"), ("md", "--md", "file")], "tune": [("out", "--out", "dir")],
    "trace gen": [("output", "--output", "file")], "trace import": [("out", "--out", "file")],
    "trace resample": [("output", "--output", "file")],
    "calibrate": [("out", "--out", "file")], "validate": [("out", "--out", "dir"), ("json", "--json", "file")],
    "profile roofline": [("out", "--out", "file")], "profile fit-roofline": [("out", "--out", "file")],
    "profile check": [("json", "--json", "file")],
}


def command_key(args) -> str:
    """"run", "trace gen": the parsed command as OUTPUTS and agentsim.requires key it."""
    sub = getattr(args, "trace_cmd", None) or getattr(args, "profile_command", None)
    return f"{args.command} {sub}" if sub else args.command


def check_outputs(args) -> None:
    """Every output path of the parsed command line, before any work (OUTPUTS)."""
    from agentsim.files import check_output

    for attr, flag, kind in OUTPUTS.get(command_key(args), ()):
        check_output(getattr(args, attr, None), kind, flag)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of `command`'s alone (with its module's siblings)."""
    parser = _Parser(prog="sim", description="Simulate and calibrate LLM serving of multi-turn agent programs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    modules = [COMMANDS[command]] if command in COMMANDS else dict.fromkeys(COMMANDS.values())
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def subparser(key: str) -> argparse.ArgumentParser:
    """The parser of one command by its key ("validate", "trace gen")."""
    parser = build_parser(key.split()[0])
    for word in key.split():
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return parser


def given_dests(argv: list[str]) -> frozenset[str]:
    """The dests the command line gives, whatever their values: the same parse with every
    default suppressed, so that a flag at its default value still counts (agentsim.requires)."""
    parser = build_parser(argv[0] if argv else None)
    stack, subcommands = [parser], set()
    while stack:
        p = stack.pop()
        p._defaults.clear()  # set_defaults (func=...) are not flags
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                stack.extend(a.choices.values())
                subcommands.add(a.dest)
            elif a.dest != "help":
                a.default = argparse.SUPPRESS
    return frozenset(vars(parser.parse_args(argv))) - subcommands


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line, with `given_dests` (argparse's SystemExit on bad input)."""
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    args.given_dests = given_dests(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        for a in argv:
            if (msg := renamed_flag(a)) is not None:
                raise InputError(msg)
        try:
            args = parse(argv)
        except SystemExit as e:  # argparse's own refusal (one line: _Parser.error), or --help
            return int(e.code or 0)
        if command_key(args) != "run":  # a run's rows read its config, --config file included (build_run)
            requires.check(command_key(args), args)
        check_outputs(args)
        return int(args.func(args) or 0)
    except (InputError, PolicyError, SimulationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`sim run ... | head`): say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
        return 141
    except OSError as e:  # the system refused what the checks could not foresee (a full disk)
        print(f"error: {e.strerror or e}" + (f": {e.filename!r}" if e.filename else ""), file=sys.stderr)
        return 1


def cli() -> None:
    """The `sim` console script. After an interrupt it exits at once: everything kept
    is already written (atomically), and tearing down pandas/pyarrow/scipy takes 1-2 s
    (a second Ctrl-C must stop a sweep within 2 s)."""
    code = main()
    if code == 130:
        if "multiprocessing.util" in sys.modules:  # unlink a killed pool's semaphores, as a normal exit would
            sys.modules["multiprocessing.util"]._run_finalizers(0)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    cli()
