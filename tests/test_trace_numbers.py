"""Issue 36 item 5: numbers in a trace are checked before any cast. Overflow, NaN,
infinities and fractional tokens are one line naming program, turn, field and the real
problem (was: a numpy RuntimeWarning on stderr, then "must be >= 1" for 1e20), and no
warning of any kind is raised on the way.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agentsim.cli import main

TRACE = Path(__file__).parent / "fixtures" / "regressions" / "case4413.parquet"


@pytest.mark.parametrize("col,value,words", [
    ("new_input_tokens", 1e20, "field 'new_input_tokens' is 1e+20, outside 0..1e+09"),
    ("new_input_tokens", -1e20, "field 'new_input_tokens' is -1e+20, outside 0..1e+09"),
    ("output_tokens", np.inf, "field 'output_tokens' is inf, outside 0..1e+09"),
    ("output_tokens", 2**63 + 10.0, "field 'output_tokens' is 9.223372036854776e+18, outside"),
    ("output_tokens", np.nan, "field 'output_tokens' is missing"),
    ("new_input_tokens", 2.5, "field 'new_input_tokens' is 2.5, not a whole number"),
    ("turn", 1e20, "field 'turn' is 1e+20, outside 0..1e+09"),
    ("shared_prefix_tokens", np.nan, "field 'shared_prefix_tokens' is missing"),
    ("tool_duration_s", 1e20, "field 'tool_duration_s' is 1e+20 s, beyond 1e+10 s"),
    ("tool_duration_s", np.inf, "field 'tool_duration_s' is not finite"),
    ("new_input_tokens", 10**30, "field 'new_input_tokens' is 1000000000000000000000000000000, outside"),
    ("output_tokens", "12x", "field 'output_tokens' is '12x', not a number"),
])
def test_numbers_checked_before_the_cast(col, value, words, tmp_path, capsys):
    df = pd.read_parquet(TRACE)
    df[col] = df[col].astype(str if isinstance(value, str) else object if isinstance(value, int) else float)
    df.loc[3, col] = value
    if isinstance(value, int):  # past int64: parquet keeps it only as text; read through the columns API
        from traces.schema import columns
        from agentsim.errors import InputError
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(InputError, match=r"trace program 'bfcl-0092' turn 3: " + words.replace("(", r"\(")):
                columns(df)
        return
    path = tmp_path / "t.parquet"
    df.to_parquet(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        rc = main(["run", "--trace", str(path), "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: trace program 'bfcl-0092' turn 3: " if col != "turn" else "error: trace program 'bfcl-0092' turn 1e+20"), lines[0]
    assert words in lines[0], lines[0]
