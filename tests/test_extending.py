"""docs/extending.md runs as written: every ```python block of the page, in order, in one
namespace (its own asserts are the checks), and what it registers is then usable by name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from policies.registry import POLICIES, RANGES, make_policy, register_policy
from sim.cluster.router import make_router, register_router

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def test_the_extension_page_runs_as_written():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 3
    ns: dict = {"__name__": "extending_page"}
    try:
        for code in blocks:
            exec(compile(code, str(PAGE), "exec"), ns)
        assert make_policy("fixed-pin", seconds=1.5).seconds == 1.5
        assert make_router("shortest_queue").name == "shortest_queue"
        assert ns["pinned"] != ns["vllm"]
    finally:
        POLICIES.pop("fixed-pin", None)
        RANGES.pop("seconds", None)
        from sim.cluster import router
        router._CLASSES.pop("shortest_queue", None)


def test_registration_takes_only_named_subclasses():
    for bad in (object, int):
        with pytest.raises(TypeError):
            register_policy(bad)
        with pytest.raises(TypeError):
            register_router(bad)
