import pytest

from calibrate.job_meta import parse_job_meta


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
