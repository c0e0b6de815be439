"""benchmarks/plan_speed.py times the command docs/planning.md documents."""
from __future__ import annotations

from benchmarks import plan_speed


def test_it_reads_the_documented_question():
    args = plan_speed.documented_question()
    assert args[:2] == ["--trace", "swebench"] and "--out" not in args
    assert args[args.index("--slo") + 1] == "p95_jct<=60" and args[args.index("--workers") + 1] == "2"
    assert plan_speed.with_flag(args, "--programs", "50")[-2:] == ["--programs", "50"]
    assert plan_speed.with_flag(args, "--workers", "4").count("--workers") == 1
