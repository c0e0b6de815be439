"""Bounds of the whole-number flags, printed exactly in their refusals.

Below every package (it imports nothing at module level), so that each command parser
can use it without importing pydantic or numpy.
"""
from __future__ import annotations

SEED_MAX = 2**63 - 1  # numpy's SeedSequence takes more, but seeds are stored as int64 (parquet, sweep tables)
COUNT_MAX = 2**62  # far above what a machine holds: the memory checks (agentsim/resources.py) refuse sooner


def int_flag(low: int, high: int):
    """An argparse type: a whole number within [low, high], its bounds printed exactly
    (argparse names the flag: "argument --seed: 9223372036854775808 is above ...")."""
    import argparse

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v} is below {low}; give a whole number in {low}..{high}")
        if v > high:
            raise argparse.ArgumentTypeError(f"{v} is above {high}; give a whole number in {low}..{high}")
        return v

    parse.__name__ = "whole number"
    parse.bounds = (low, high)  # read by the test that walks every whole-number flag
    return parse
