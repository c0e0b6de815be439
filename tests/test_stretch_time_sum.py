"""A call's execution time after a stretch (sim/hardware/stretch.py add_in_order): the compiled
loop and the Python reference give the float that adding each step's time gives."""
from functools import reduce
from operator import add

from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=500, deadline=None)
@given(x=st.floats(0, 1e5), dts=st.lists(st.floats(1e-9, 5.0), max_size=200))
def test_added_one_by_one_compiled_and_python(x, dts):
    from sim.hardware import _steps, stretch

    want = reduce(add, dts, x)
    assert _steps.add_in_order(x, dts) == want
    assert stretch.py_add_in_order(x, dts) == want
    assert stretch.add_in_order is _steps.add_in_order  # the install step built it
