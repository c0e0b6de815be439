"""sim.study.sweep.map_points: the pool the benchmark table scripts share with sweeps and the
planner; results in the items' order, in-process or on spawned workers."""
import math

import pytest

from sim.study.sweep import map_points


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_back_in_the_items_order(workers):
    items = [9.0, 1.0, 16.0, 4.0, 25.0]
    assert map_points(math.sqrt, items, workers) == [3.0, 1.0, 4.0, 2.0, 5.0]


def test_an_items_error_is_raised_where_it_is_mapped():
    assert map_points(_divide_by_zero, [], 2) == []
    with pytest.raises(ZeroDivisionError):
        map_points(_divide_by_zero, [1], 2)


def _divide_by_zero(x):
    return x / 0
