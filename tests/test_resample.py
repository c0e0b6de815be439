"""`sim trace resample`: the 16 AgentCgroup Claude Code sessions in ../shared/external-traces,
imported in place (never copied: GPL-2.0), resampled, and compared with the source.
Also the tool-name warning of `sim run` (issue 15, item 5)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import make_trace
from policies.registry import make_policy
from sim.cli import main
from sim.commands.run import tool_name_warning
from traces.importers import import_trace
from traces.resample import load_source, resample
from traces.schema import DATA_DIR, read_trace, write_trace

EXP = Path(__file__).resolve().parents[2] / "shared" / "external-traces" / "agentcgroup" / "experiments"
needs_ext = pytest.mark.skipif(not EXP.is_dir(), reason=f"{EXP} not present (the AgentCgroup logs are read in place, never bundled)")
N = 400  # 25 copies of each of the 16 sessions


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """The two sets imported as users would (`sim trace import claude-code DIR`), into a temp dir."""
    if not EXP.is_dir():
        pytest.skip(f"{EXP} not present")
    d = tmp_path_factory.mktemp("resample")
    out = []
    # the Haiku set logs placeholder output counts: estimate them from the text, as the importer advises
    for name, est in (("all_images_local", False), ("all_images_haiku", True)):
        df, meta = import_trace("claude-code", [EXP / name], estimate_tokens=est)
        out.append(write_trace(df, d / f"{name}.parquet", meta))
    return out


@pytest.fixture(scope="module")
def srcs(paths):
    return [(p.stem, *load_source(p)) for p in paths]


def source(srcs) -> pd.DataFrame:
    """Both sets as one trace; the sets hold the same tasks, so ids get the source's label."""
    return pd.concat([df.assign(program_id=label + ":" + df["program_id"]) for label, df, _ in srcs], ignore_index=True)


def tool_quantiles(df, tools, q=(50, 90)):
    # inverted_cdf: the empirical CDF's own quantile, the same for a sample and for copies of it
    # (numpy's default interpolation depends on the sample size)
    return {t: np.percentile(df.loc[df["tool"] == t, "tool_duration_s"], q, method="inverted_cdf") for t in tools}


def common_tools(src, min_calls=20):
    return [t for t, n in src["tool"].value_counts().items() if n >= min_calls]


def context_by_turn(df) -> pd.Series:
    """Prompt + output after turn t, averaged over the programs that reach turn t."""
    ctx = (df["new_input_tokens"] + df["output_tokens"]).groupby(df["program_id"]).cumsum()
    return ctx.groupby(df["turn"]).mean()


@needs_ext
def test_quantiles_and_growth_match_source(srcs):
    src = source(srcs)
    assert src["program_id"].nunique() == 16
    out, meta = resample(srcs, N, seed=0)
    assert out["program_id"].nunique() == N and "arrival_s" not in out.columns
    tools = common_tools(src)
    assert {"Bash", "Read", "Edit"} <= set(tools)
    want, got = tool_quantiles(src, tools), tool_quantiles(out, tools)
    for t in tools:
        assert got[t] == pytest.approx(want[t], rel=0.05), t
    # whole sessions: mean tokens added per call, and the mean context at every turn
    added = lambda df: (df["new_input_tokens"] + df["output_tokens"]).mean()
    assert added(out) == pytest.approx(added(src), rel=0.05)
    a, b = context_by_turn(out), context_by_turn(src)
    assert a.index.equals(b.index)
    np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=0.05)
    assert meta["sessions"] == 16 and meta["seed"] == 0


@needs_ext
def test_500_programs_not_a_multiple_of_16(srcs):
    """500 = 31 x 16 + 4: four sessions weigh 32/31. The duration at a quantile may then step
    to the next logged value (21% apart for TodoWrite's p90), so the CDF at the source's
    quantiles is compared (the 4 extra copies move it by < 4/500), and growth within 5%."""
    src = source(srcs)
    out, _ = resample(srcs, 500, seed=0)
    tools = common_tools(src)
    want = tool_quantiles(src, tools)
    for t in tools:
        s, j = (df.loc[df["tool"] == t, "tool_duration_s"] for df in (src, out))
        for v in want[t]:
            assert (j <= v).mean() == pytest.approx((s <= v).mean(), abs=0.02), t
    np.testing.assert_allclose(context_by_turn(out).to_numpy(), context_by_turn(src).to_numpy(), rtol=0.05)


@needs_ext
def test_jitter_keeps_each_tools_distribution(srcs):
    src = source(srcs)
    plain, _ = resample(srcs, N, seed=1)
    out, meta = resample(srcs, N, seed=1, jitter=0.05)
    assert meta["options"]["jitter"] == 0.05
    assert out[["program_id", "turn", "tool", "new_input_tokens"]].equals(plain[["program_id", "turn", "tool", "new_input_tokens"]])
    have = plain["tool_duration_s"].notna()
    assert (out.loc[have, "tool_duration_s"] != plain.loc[have, "tool_duration_s"]).mean() > 0.3  # copies differ
    assert out["tool_duration_s"].isna().equals(plain["tool_duration_s"].isna())
    # Jittered durations are logged durations of the same tool whose quantile moved by at
    # most W, with that quantile still uniform: the empirical CDF at the source's p50/p90
    # stays q in expectation. Its noise at 400 programs: only calls within W = 0.05 of the
    # threshold can cross it, each a Bernoulli (sd <= 0.5), over >= 36 x 25 calls of a tool:
    # sd <= sqrt(0.1 * 0.25 / 900) ~ 0.005, so 0.02 is 4 sd. (The duration at a quantile can
    # still jump to the next logged value, 20% apart for sparse tools, so values are not
    # compared.)
    tools = common_tools(src)
    want = tool_quantiles(src, tools)
    for t in tools:
        s = src.loc[src["tool"] == t, "tool_duration_s"]
        j = out.loc[out["tool"] == t, "tool_duration_s"]
        assert set(j) <= set(s), t  # no new values
        for v in want[t]:
            assert (j <= v).mean() == pytest.approx((s <= v).mean(), abs=0.02), t


@needs_ext
def test_same_seed_same_trace(srcs):
    a, ma = resample(srcs, 100, seed=7, jitter=0.05)
    b, mb = resample(srcs, 100, seed=7, jitter=0.05)
    c, _ = resample(srcs, 100, seed=8, jitter=0.05)
    assert a.equals(b) and ma == mb
    assert not a["program_id"].equals(c["program_id"])
    # each session used floor or ceil of 100/16 times
    used = a.groupby("program_id").size().index.str.split(":", n=1).str[1].value_counts()
    assert len(used) == 16 and set(used) <= {6, 7}


@needs_ext
def test_max_context(srcs):
    src = source(srcs)
    T = 30_000
    out, meta = resample(srcs, 64, seed=2, max_context=T)
    final = (out["new_input_tokens"] + out["output_tokens"]).groupby(out["program_id"]).sum()
    turns = out.groupby("program_id").size()
    assert final.max() <= T
    sess = lambda pid: pid.split(":", 1)[1]  # r<draw>:<source>:<session>
    src_final = (src["new_input_tokens"] + src["output_tokens"]).groupby(src["program_id"]).sum()
    assert meta["sessions_scaled"] == int((src_final > T).sum()) > 0
    for pid, g in out.groupby("program_id"):
        orig = src_final[sess(pid)]
        if orig <= T:
            assert final[pid] == orig  # untouched
        else:
            assert final[pid] > T - turns[pid]  # one factor, floored: uses the room
    # outputs and tool times are kept
    plain, _ = resample(srcs, 64, seed=2)
    assert out["output_tokens"].equals(plain["output_tokens"])
    assert out["tool_duration_s"].equals(plain["tool_duration_s"])


@needs_ext
def test_cli_writes_provenance(paths, tmp_path, capsys):
    out = tmp_path / "r.parquet"
    src_files = [str(p) for p in paths]
    assert main(["trace", "resample", *src_files, "--programs", "50", "--seed", "3", "--jitter",
                 "--max-context", "40000", "-o", str(out)]) == 0
    assert "50 programs from 16 sessions in 2 sources" in capsys.readouterr().out
    df, meta = read_trace(str(out))
    assert df["program_id"].nunique() == 50 and "arrival_s" not in df.columns
    assert meta["options"] == {"max_context": 40000, "jitter": 0.05} and meta["seed"] == 3
    assert [s["path"] for s in meta["sources"]] == src_files
    prov = meta["sources"][0]["provenance"]
    assert prov and prov[0]["license"].startswith("GPL-2.0") and "agentcgroup" in prov[0]["repo"]
    assert meta["sources"][1]["import"]["options"]["estimate_tokens"] is True


def one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: "), err
    for n in needles:
        assert n in err, err
    return err


@needs_ext
def test_bad_input(paths, srcs, tmp_path, capsys):
    src_files = [str(p) for p in paths]
    out = str(tmp_path / "r.parquet")
    log = str(EXP / "all_images_local" / "dask__dask-11628" / "attempt_1" / "trace.jsonl")
    one_line_error(capsys, ["trace", "resample", log, "-o", out], "not a trace parquet", "sim trace import")
    one_line_error(capsys, ["trace", "resample", str(DATA_DIR / "swebench.parquet"), "-o", out], "synthetic", "sim trace import")
    one_line_error(capsys, ["trace", "resample", str(tmp_path / "nope.parquet"), "-o", out], "no such file")
    one_line_error(capsys, ["trace", "resample", *src_files, "--programs", "0", "-o", out], "--programs: 0 is below 1")
    one_line_error(capsys, ["trace", "resample", *src_files, "--seed", "-1", "-o", out], "--seed: -1 is below 0")
    first = source(srcs).groupby("program_id")["new_input_tokens"].first()
    err = one_line_error(capsys, ["trace", "resample", *src_files, "--max-context", str(first.min() - 1), "-o", out],
                         "--max-context")
    # the session needing the largest window is named: a GLM session with 17k output tokens (kept)
    outs = source(srcs).groupby("program_id")["output_tokens"].sum()
    assert f"session {outs.idxmax()}'s output tokens ({outs.max()}" in err and f"at least {outs.max() + 1}" in err
    err = one_line_error(capsys, ["trace", "resample", "--max-context", str(first.min() - 1), src_files[1], "-o", out],
                         "first prompt")
    first_h = first[first.index.str.startswith("all_images_haiku:")]  # outputs there are small
    assert f"session {first_h.idxmax()}'s first prompt ({first_h.max()} tokens)" in err
    one_line_error(capsys, ["trace", "resample", *src_files, "--jitter", "--jitter-width", "0.9", "-o", out], "--jitter")
    assert not Path(out).exists()


def test_tool_name_warning(tmp_path, capsys):
    unnamed = make_trace([[(100, 10, None, 0.5), (20, 10, None, None)]] * 2)
    named = make_trace([[(100, 10, "ls", 0.5), (20, 10, None, None)]] * 2)
    single = make_trace([[(100, 10, None, None)]])
    w = tool_name_warning(unnamed, make_policy("continuum-static"))
    assert "no tool names" in w and "program-fcfs" in w
    assert "global CDF" in tool_name_warning(unnamed, make_policy("continuum"))
    assert "global CDF" in tool_name_warning(unnamed, make_policy("continuum-offload"))
    assert "mean over all tools" in tool_name_warning(unnamed, make_policy("infercept", true_tool_time=False))
    for p in ("vllm", "program-fcfs", "static-ttl", "oracle", "infercept", "autellix", "thunderagent"):
        assert tool_name_warning(unnamed, make_policy(p)) is None, p
    assert tool_name_warning(named, make_policy("continuum-static")) is None
    assert tool_name_warning(single, make_policy("continuum-static")) is None  # no tool calls at all
    path = tmp_path / "t.parquet"
    write_trace(unnamed, path, {})
    assert main(["run", "--trace", str(path), "--policy", "continuum-static", "--jps", "1", "--no-progress"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: the trace has no tool names; continuum-static")
