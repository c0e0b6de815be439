"""The `openhands` synthetic generator (traces/generate.py): statistics of real OpenHands runs."""
import numpy as np
import pandas as pd
import pytest

from traces import generate as gen
from traces.schema import read_trace, validate

SPEC = gen.SPECS["openhands"]


@pytest.fixture(scope="module")
def trace():
    return gen.generate("openhands", programs=400, seed=0)


def test_validates_and_is_synthetic(trace):
    df, meta = trace
    pd.testing.assert_frame_equal(validate(df.copy()), df)
    assert meta["generator"] == "openhands" and meta["synthetic"] and "2506.18824" in meta["source"]
    assert set(df["tool"].dropna()) <= set(SPEC.tools)
    last = df.groupby("program_id")["turn"].transform("max") == df["turn"]
    assert df.loc[last, "tool"].isna().all() and df.loc[~last, "tool_duration_s"].notna().all()


def test_more_turns_than_swebench(trace):
    df, _ = trace
    swe, _ = gen.generate("swebench", programs=400, seed=0)
    oh_turns, swe_turns = df.groupby("program_id").size(), swe.groupby("program_id").size()
    assert oh_turns.mean() > 2 * swe_turns.mean()  # 29 against 10.9
    assert oh_turns.max() <= SPEC.max_turns


def test_stated_medians(trace):
    """The medians the spec cites: turns 24.5 (Bouzenia & Pradel's 40 runs), output per call 433,
    and per tool its reused duration median and its result-token median (the next turn's new
    input). Front-loading long programs under the context limit shrinks some later turns, hence
    the tolerances."""
    df, _ = trace
    turns = df.groupby("program_id").size()
    assert abs(turns.median() - SPEC.turns_median) <= 1.5
    assert turns.mean() == pytest.approx(SPEC.turns[0], rel=0.05)
    assert df["output_tokens"].median() == pytest.approx(SPEC.output[0], rel=0.06)
    nxt = df.groupby("program_id")["new_input_tokens"].shift(-1)
    for tool, (w, med_ms, _, res_med, _) in SPEC.tools.items():
        rows = df["tool"] == tool
        if w < 0.02:  # too few calls for a median
            continue
        assert (rows.mean()) == pytest.approx(w, abs=0.015), tool
        assert df.loc[rows, "tool_duration_s"].median() * 1000 == pytest.approx(med_ms, rel=0.2), tool
        assert nxt[rows].median() == pytest.approx(res_med, rel=0.2), tool


def test_contexts_fit_and_prefix_is_shared(trace):
    df, _ = trace
    final = df.groupby("program_id").apply(lambda d: int((d["new_input_tokens"] + d["output_tokens"]).sum()),
                                           include_groups=False)
    assert final.max() <= gen.CONTEXT_LIMIT
    assert (df["shared_prefix_tokens"] == SPEC.shared_prefix).all()


def test_deterministic_for_a_seed(tmp_path):
    a, ma = gen.generate("openhands", programs=30, seed=7)
    b, mb = gen.generate("openhands", programs=30, seed=7)
    c, _ = gen.generate("openhands", programs=30, seed=8)
    pd.testing.assert_frame_equal(a, b)
    assert ma == mb and not a.equals(c)


def test_cli_writes_it(tmp_path, capsys):
    from agentsim.cli import main

    out = tmp_path / "oh.parquet"
    assert main(["trace", "gen", "openhands", "--programs", "5", "-o", str(out)]) == 0
    df, meta = read_trace(out)
    assert df["program_id"].nunique() == 5 and meta["generator"] == "openhands"


def test_bundle_leaves_openhands_out():
    assert gen.BUNDLED == ("swebench", "bfcl") and "openhands" in gen.SPECS


def test_stats_script_classifies_tools_as_the_spec_names_them():
    from traces.openhands_stats import tool_of

    def act(name, **args):
        import json
        return repr({"arguments": json.dumps(args), "name": name})

    assert tool_of(act("execute_bash", command="cd /workspace/x && python reproduce.py")) == "python"
    assert tool_of(act("execute_bash", command="python -m pytest tests/a.py")) == "pytest"
    assert tool_of(act("execute_bash", command="grep -rn foo .")) == "grep"
    assert tool_of(act("execute_bash", command="django-admin check")) == "other_bash"
    assert tool_of(act("str_replace_editor", command="view", path="/a.py")) == "editor_view"
    assert tool_of("not a dict") == "unparsed"
    kinds = {"python", "pytest", "grep", "find", "ls", "pip", "head", "other_bash",
             "editor_view", "editor_str_replace", "editor_create"}
    assert set(SPEC.tools) == kinds
