"""Kept so that `from sim.cli import main` and `python -m sim.cli` still work: the
command line itself is agentsim/cli.py, above sim, because it registers calibrate's
commands and sim must not import calibrate."""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from agentsim.cli import main as _main  # at call time: importing sim.cli imports no calibrate

    return _main(argv)


if __name__ == "__main__":
    from agentsim.cli import cli

    cli()
