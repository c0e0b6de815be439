"""benchmarks/trace_fit_holdout.py's parts that need no agent logs: the 95% interval of a
difference of mean JCTs, and the shuffle that takes what makes one session unlike another
out of a trace while keeping every marginal a spec fits."""
import numpy as np
import pandas as pd
import pytest

from benchmarks import trace_fit_holdout as h
from traces import fit
from traces.schema import read_columns, validate


def test_interval_is_welchs_on_the_ratio_of_the_means():
    from scipy.stats import ttest_ind

    x, y = [90.0, 100.0, 110.0, 95.0], [100.0, 120.0, 110.0]
    lo, hi = h.interval(x, y)
    d = np.mean(x) / np.mean(y) - 1
    assert lo < d < hi and (lo + hi) / 2 == pytest.approx(d)
    # the interval excludes 0 exactly when Welch's two-sided test rejects at 5%
    p = ttest_ind(x, y, equal_var=False).pvalue
    assert (lo > 0 or hi < 0) == (p < 0.05)
    far = h.interval([50.0, 51.0, 49.0], [100.0, 101.0, 99.0])
    assert far[1] < 0 and ttest_ind([50, 51, 49], [100, 101, 99], equal_var=False).pvalue < 0.05
    assert h.interval([1.0], [1.0, 2.0]) is None  # one value a side: no interval


def test_shuffle_keeps_the_marginals_and_mixes_the_sessions():
    c, _ = read_columns("swebench")
    df = c.frame().iloc[:2000].reset_index(drop=True)
    df = df[df["program_id"].isin(df["program_id"].unique()[:-1])].reset_index(drop=True)  # whole programs
    s = validate(h.shuffle_calls(df, 0))
    pid = df["program_id"].to_numpy()
    last = np.r_[pid[1:] != pid[:-1], True]
    for sel in (~last, last):  # output tokens: the same multiset among calls before a tool, and among last calls
        assert sorted(s.loc[sel, "output_tokens"]) == sorted(df.loc[sel, "output_tokens"])
    tools = lambda d: sorted(zip(d["tool"].fillna("-")[d["tool_duration_s"].notna()], d["tool_duration_s"].dropna()))  # noqa: E731
    assert tools(s) == tools(df)  # (tool, duration) pairs kept together
    assert (s["program_id"] == df["program_id"]).all() and (s["new_input_tokens"] == df["new_input_tokens"]).all()
    assert (s["output_tokens"] != df["output_tokens"]).mean() > 0.5
    m0, m1 = fit.marginals(read_columns_frame(df)), fit.marginals(read_columns_frame(s))
    assert all(fit.ks(m0[k], m1[k]) == 0 for k in ("turns", "output", "last_output", "tool_s"))
    # what goes: the sessions' own level (a program's mean tool time spreads less once shuffled)
    spread = lambda d: d.groupby("program_id")["tool_duration_s"].mean().std()  # noqa: E731
    assert spread(s) < spread(df)
    pd.testing.assert_frame_equal(h.shuffle_calls(df, 0), s)


def read_columns_frame(df):
    from traces.schema import columns

    return columns(df)


def test_workload_stats_by_hand(tmp_path):
    """Two programs of three calls: one terse with 1 s tools, one verbose with 10 s tools."""
    from traces.schema import write_trace

    df = pd.DataFrame({"program_id": ["a"] * 3 + ["b"] * 3, "turn": [0, 1, 2] * 2,
                       "new_input_tokens": [100, 10, 10] * 2, "output_tokens": [100, 100, 100, 300, 300, 300],
                       "tool": ["x", "x", None] * 2, "tool_duration_s": [1.0, 1.0, np.nan, 10.0, 10.0, np.nan]})
    path = write_trace(df, tmp_path / "two.parquet", {"generator": "test"})
    st = h.workload_stats(path)
    assert st["calls"] == 3 and st["out"] == 600 and st["tool"] == 11
    assert st["cv_out"] == pytest.approx(np.std([100, 300], ddof=1) / 200)
    assert st["cv_tool"] == pytest.approx(np.std([1, 10], ddof=1) / 5.5)
    assert st["ac_tool"] == pytest.approx(1.0)  # a program's tool times are alike (pairs within a program only)
