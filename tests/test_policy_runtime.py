"""policies/runtime.py: the no-deadlock rule both engines apply, on scripted cases."""
from __future__ import annotations

from policies.base import Policy
from policies.runtime import no_deadlock_victims


class View:
    def __init__(self, blocks: dict[str, int]) -> None:
        self.blocks = blocks

    def blocks_of(self, pid: str) -> int:
        return self.blocks.get(pid, 0)


class Pins(Policy):
    name = "pins"

    def __init__(self, pins: dict[str, float], while_running: bool = True) -> None:
        super().__init__()
        from policies.base import Pin

        for pid, arrival in pins.items():
            self.pins[pid] = Pin(10.0, arrival, 0.0, None)
        self.unpin_while_running = while_running


def test_nothing_running_drops_the_policys_victims_latest_program_first():
    p = Pins({"a": 1.0, "b": 2.0, "c": 3.0})
    view = View({"a": 4, "b": 4, "c": 4})
    assert no_deadlock_victims(p, view, p.pins, "x", 6, False, lambda: 0) == ["c", "b"]
    assert no_deadlock_victims(p, view, p.pins, "c", 6, False, lambda: 0) == ["b", "a"]  # never the head's first


def test_while_running_only_if_allowed_and_only_if_it_lets_the_head_in():
    p = Pins({"a": 1.0, "b": 2.0})
    view = View({"a": 4, "b": 4})
    asked = []
    assert no_deadlock_victims(p, view, p.pins, "x", 6, True, lambda: asked.append(1) or 8) == ["b", "a"]
    assert no_deadlock_victims(p, view, p.pins, "x", 9, True, lambda: 8) == []  # would be lost for nothing
    q = Pins({"a": 1.0}, while_running=False)  # Continuum's family: only against a true deadlock
    assert no_deadlock_victims(q, View({"a": 4}), q.pins, "x", 1, True, lambda: 100) == []
    assert no_deadlock_victims(q, View({"a": 4}), q.pins, "x", 1, False, lambda: 100) == ["a"]


def test_the_heads_own_pin_goes_last_when_nothing_else_can_free_memory():
    p = Pins({"h": 1.0})
    view = View({"h": 3})
    assert no_deadlock_victims(p, view, p.pins, "h", 2, False, lambda: 0) == ["h"]
    assert no_deadlock_victims(p, view, p.pins, "h", 2, True, lambda: 0) == []  # running calls will free memory
