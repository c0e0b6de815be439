"""The pin table both engines keep their pins in (policies/pins.py)."""
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.pins import PinTable


def test_distinct_blocks_and_their_integral():
    t = PinTable(now=0.0)
    t.add("a", [0, 1, 2], now=1.0)        # 3 distinct from t=1
    t.add("b", [0, 1, 7], now=3.0)        # blocks 0, 1 shared: 4 distinct from t=3
    assert t.distinct == 4 and len(t) == 2 and "a" in t and sorted(t) == ["a", "b"]
    assert t.pop("a", now=4.0) == [0, 1, 2]  # 3 distinct from t=4 (b still holds 0, 1)
    assert t.distinct == 3 and t.pop("a", now=5.0) is None
    t.pop("b", now=6.0)
    assert t.distinct == 0 and not t
    assert t.block_seconds == pytest.approx(3 * 2 + 4 * 1 + 3 * 2)


def test_engine_blocks_are_counted_by_id():
    blk = [SimpleNamespace(block_id=i) for i in range(3)]
    t = PinTable(now=0.0, block_id=lambda b: b.block_id)
    t.add("a", blk[:2], now=0.0)
    t.add("b", [SimpleNamespace(block_id=1), blk[2]], now=0.0)  # another object, same block
    assert t.distinct == 3
    t.restart(now=10.0)
    t.pop("a", now=12.0)
    assert t.block_seconds == pytest.approx(3 * 2)


def test_one_pin_per_program():
    t = PinTable()
    t.add("a", [1], now=0.0)
    with pytest.raises(ValueError, match="already holds a pin"):
        t.add("a", [2], now=1.0)


def test_retention_actions_and_release_reasons_are_typed():
    from policies.base import Action, Release, Retention

    assert Retention("pin", 2.0).action is Action.PIN  # the string form still reads
    with pytest.raises(ValueError):
        Retention("pni")
    outcomes = {Release.HIT: 2, "expired": 1}  # StrEnum members are their strings
    from policies.pins import pin_counts

    assert pin_counts(outcomes) == {"pins": 3, "pins_hit": 2, "pins_expired": 1, "pins_victim": 0,
                                    "pins_discarded": 0, "pins_moved": 0}


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("abcd"), st.sets(st.integers(0, 3000), max_size=40)), max_size=60))
def test_distinct_and_integral_match_counting_pins_per_block(ops):
    """Random pins and releases (blocks shared between programs, ids past any seen before,
    empty pins) against a plain count of pins per block."""
    t, held, now = PinTable(now=0.0), {}, 0.0
    area = 0.0
    for pid, blocks in ops:
        now += 0.5
        area += len(set().union(*held.values())) * 0.5
        if pid in held:
            assert t.pop(pid, now) == held.pop(pid)
        else:
            held[pid] = sorted(blocks)
            t.add(pid, held[pid], now)
        assert t.distinct == len(set().union(*held.values()))
    assert t.block_seconds == pytest.approx(area)
