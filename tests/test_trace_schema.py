"""traces.schema validation: every bad trace gets one line naming program, turn and field."""
import numpy as np
import pandas as pd
import pytest

from agentsim.errors import InputError
from traces.schema import read_trace, validate, write_trace


def _trace(**extra):
    df = pd.DataFrame({
        "program_id": ["a", "a", "a", "b"],
        "turn": [0, 1, 2, 0],
        "new_input_tokens": [100, 20, 30, 50],
        "output_tokens": [10, 10, 10, 5],
        "tool": ["ls", "cat", None, None],
        "tool_duration_s": [0.5, 1.0, np.nan, np.nan],
    })
    for k, v in extra.items():
        df[k] = v
    return df


def _error(df) -> str:
    with pytest.raises(InputError) as e:
        validate(df)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_valid_trace_round_trips(tmp_path):
    df = _trace(shared_prefix_tokens=40, arrival_s=[1.0, 1.0, 1.0, 2.0])
    path = write_trace(df, tmp_path / "t.parquet", {"generator": "test"})
    back, meta = read_trace(str(path))
    assert meta == {"generator": "test"}
    pd.testing.assert_frame_equal(back, validate(df), check_like=True)  # column order may differ


def test_missing_column_names_it():
    msg = _error(_trace().drop(columns=["tool_duration_s"]))
    assert "missing column" in msg and "tool_duration_s" in msg


def test_non_contiguous_turns():
    df = _trace()
    df.loc[2, "turn"] = 3  # a: 0, 1, 3
    msg = _error(df)
    assert "'a' turn 3" in msg and "'turn'" in msg and "should be 2" in msg


def test_negative_tokens():
    df = _trace()
    df.loc[1, "new_input_tokens"] = -5
    msg = _error(df)
    assert "'a' turn 1" in msg and "'new_input_tokens'" in msg and "negative" in msg


def test_missing_tool_duration_before_last_turn():
    df = _trace()
    df.loc[1, "tool_duration_s"] = np.nan
    msg = _error(df)
    assert "'a' turn 1" in msg and "'tool_duration_s'" in msg and "missing before the last turn" in msg


def test_arrival_differs_within_program():
    msg = _error(_trace(arrival_s=[1.0, 1.0, 1.5, 2.0]))
    assert "'a' turn 2" in msg and "'arrival_s'" in msg and "differs" in msg


def test_shared_prefix_longer_than_first_prompt():
    msg = _error(_trace(shared_prefix_tokens=[60, 60, 60, 60]))  # b's turn 0 has 50
    assert "'b' turn 0" in msg and "'shared_prefix_tokens'" in msg and "exceeds" in msg


def test_non_parquet_file(tmp_path):
    bad = tmp_path / "notes.parquet"
    bad.write_text("program_id,turn\na,0\n")
    with pytest.raises(InputError) as e:
        read_trace(str(bad))
    assert "not a readable parquet file" in str(e.value) and "notes.parquet" in str(e.value)


def test_unknown_bundled_name():
    with pytest.raises(InputError) as e:
        read_trace("no_such_trace")
    msg = str(e.value)
    assert "'no_such_trace' not found" in msg and "swebench" in msg and "bfcl" in msg


def test_null_tool_reads_back_as_none(tmp_path):
    from traces.schema import read_trace, write_trace
    import pandas as pd
    df = pd.DataFrame({"program_id": ["a", "a"], "turn": [0, 1], "new_input_tokens": [10, 5], "output_tokens": [2, 2],
                       "tool": [None, None], "tool_duration_s": [0.5, None]})
    write_trace(df, tmp_path / "t.parquet", {})
    back, _ = read_trace(str(tmp_path / "t.parquet"))
    assert back["tool"].tolist() == [None, None]
