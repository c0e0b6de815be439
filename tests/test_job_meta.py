import pytest

from hypothesis import given
from hypothesis import strategies as st

from sim.replica.job_meta import _parse, parse_job_meta


@pytest.mark.parametrize("xargs", [None, {}, "job=1", ["a"], {"job_id": None}, {"job_id": ""}, {"job_id": "  "},
                                   {"job_id": True}, {"job_id": 1.5}, {"job_id": ["a"]}, {"job_id": {"x": 1}}])
def test_no_usable_job_id_is_a_one_turn_program(xargs):
    m = parse_job_meta(xargs, "r7")
    assert m.anonymous and m.program_id == "<anon>r7" and m.is_last_step and m.tool is None


def test_malformed_values_are_reported_not_raised():
    assert parse_job_meta({"job_id": ["a"]}, "r").problems
    assert parse_job_meta("x", "r").problems
    assert not parse_job_meta(None, "r").problems and not parse_job_meta({}, "r").problems


@pytest.mark.parametrize("flag,want", [(True, True), (False, False), (1, True), (0, False), ("1", True), ("0", False),
                                       ("true", True), ("False", False), (" yes ", True), ("", False)])
def test_is_last_step_forms(flag, want):
    m = parse_job_meta({"job_id": "j", "is_last_step": flag}, "r")
    assert m.is_last_step is want and not m.problems


@pytest.mark.parametrize("flag", [2, -1, "maybe", 0.5, [1], None])
def test_odd_is_last_step_is_false_with_a_problem(flag):
    m = parse_job_meta({"job_id": "j", "is_last_step": flag}, "r")
    assert m.is_last_step is False and m.problems and not m.anonymous


def test_job_id_tool_and_hint():
    m = parse_job_meta({"job_id": 42, "tool": "pytest"}, "r")
    assert (m.program_id, m.tool, m.is_last_step, m.anonymous) == ("42", "pytest", False, False)
    assert parse_job_meta({"job_id": "a", "tool_hint": "ls"}, "r").tool == "ls"
    bad = parse_job_meta({"job_id": "a", "tool": 3}, "r")
    assert bad.tool is None and bad.problems


@pytest.mark.parametrize("value,want", [(1.5, 1.5), ("2", 2.0), (0, 0.0)])
def test_tool_duration_hint(value, want):
    m = parse_job_meta({"job_id": "a", "tool_duration_s": value}, "r")
    assert m.tool_duration_s == want and not m.problems


@pytest.mark.parametrize("value", [-1, "soon", float("nan"), float("inf"), [3]])
def test_odd_tool_duration_is_ignored_with_a_problem(value):
    m = parse_job_meta({"job_id": "a", "tool_duration_s": value}, "r")
    assert m.tool_duration_s is None and m.problems and m.program_id == "a"


_values = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=True),
                    st.sampled_from(["", " ", "a", " a", "a ", "true", "0", "1.5", "inf"]), st.lists(st.integers(), max_size=1))


@given(st.dictionaries(st.sampled_from(["job_id", "is_last_step", "tool", "tool_hint", "tool_duration_s", "other"]),
                       _values, max_size=6))
def test_fast_path_reads_what_the_full_parser_reads(xargs):
    """parse_job_meta's per-request fast path for well-formed metadata gives exactly the
    full parser's result, on any mapping."""
    assert parse_job_meta(xargs, "r") == _parse(xargs, "r")


def test_fast_path_takes_the_replays_form():
    xargs = {"job_id": "p1", "is_last_step": False, "tool": "pytest", "tool_duration_s": 2.5}
    m = parse_job_meta(xargs, "r")
    assert (m.program_id, m.is_last_step, m.tool, m.tool_duration_s, m.problems) == ("p1", False, "pytest", 2.5, [])
