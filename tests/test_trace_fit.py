"""`sim trace fit` / `sim trace gen --spec` (traces/fit.py): the round trip, shipped specs,
seeds, refused inputs, and the measured statistics against the logs where present."""
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agentsim.errors import InputError
from traces import fit
from traces.schema import columns, read_columns, write_trace

ROOT = Path(__file__).resolve().parents[1]
EXT = ROOT.parent / "shared" / "external-traces"
MINI = Path("/tmp/mini-swe-agent-trajs")  # gruckion/mini-swe-agent's trajs folder, as docs/reference/traces.md builds it
needs_ext = pytest.mark.skipif(not (EXT / "agentcgroup").is_dir(), reason=f"{EXT} not present (logs are read in place, never bundled)")
PROV = {"sources": [], "derived": "test", "counts": {}}
ROUND_TRIP_KS = 0.05  # stated in docs/traces.md: per marginal, N = 2,000 programs
N = 2000


def cli(argv):
    from agentsim.cli import main

    return main(argv)


@pytest.fixture(scope="module")
def swe_spec():
    c, _ = read_columns("swebench")
    return c, fit.fit_columns(c, "swe", PROV)


def test_round_trip_fit_gen_fit_within_ks(swe_spec):
    c0, s1 = swe_spec
    d1, _ = fit.generate_from_spec(s1, N, 0)
    c1 = columns(d1)
    s2 = fit.fit_columns(c1, "swe2", PROV)
    d2, _ = fit.generate_from_spec(s2, N, 1)
    m0, m1, m2 = fit.marginals(c0), fit.marginals(c1), fit.marginals(c2 := columns(d2))
    checked = 0
    for k, v in m0.items():
        if len(v) < 100:  # a tool logged fewer than 100 times: its sample KS is noise
            continue
        assert fit.ks(m1[k], m2[k]) <= ROUND_TRIP_KS, k  # fit -> gen -> fit -> gen
        if len(v) >= 400:  # the source against its first generation (a 1% grid over fewer values is coarse)
            assert fit.ks(v, m1[k]) <= ROUND_TRIP_KS, k
        checked += 1
    assert checked >= 15 and set(s1.tools) == set(s2.tools)
    assert s2.shared_prefix_tokens == s1.shared_prefix_tokens == 1000


def test_tail_beyond_p95_and_cap():
    x = np.random.default_rng(0).lognormal(0, 1.5, 5000)
    d = fit.fit_dist(x)
    assert d.tail is not None and d.p[-1] == fit.P_TOP and d.cap == pytest.approx(2 * x.max(), rel=1e-5)
    draws = d.sample(np.random.default_rng(1), 200_000)
    assert draws.max() <= d.cap and np.quantile(draws, 0.99) == pytest.approx(np.quantile(x, 0.99), rel=0.25)
    small = fit.fit_dist([1.0, 2.0, 3.0])
    assert small.tail is None and small.p[-1] == 1.0 and small.q == pytest.approx(np.quantile([1, 2, 3], small.p))


def test_same_seed_same_trace_other_seed_other(swe_spec):
    _, s = swe_spec
    a, ma = fit.generate_from_spec(s, 50, 7)
    b, _ = fit.generate_from_spec(s, 50, 7)
    c, _ = fit.generate_from_spec(s, 50, 8)
    pd.testing.assert_frame_equal(a, b)
    assert not a["tool_duration_s"].equals(c["tool_duration_s"])
    assert ma["seed"] == 7 and ma["synthetic"] is True and ma["generator"] == "spec:swe"


def test_generated_contexts_stay_within_the_specs_max_context():
    """A program whose context reaches max_context gets no new input and one output token per
    turn after: it stays within max_context plus its remaining turns. Before the output was
    clipped, claude-code at seed 0 reached 131,362 tokens (limit 128,000), past the 131,072
    an H100 profile serves, and `sim run` refused the trace."""
    s = fit.read_spec("claude-code")
    df, _ = fit.generate_from_spec(s, 100, 0)
    ctx = (df["new_input_tokens"] + df["output_tokens"]).groupby(df["program_id"]).cumsum()
    assert ctx.max() > s.max_context - 1000  # some program runs into the limit at this seed
    assert ctx.max() <= s.max_context + s.max_turns


@pytest.mark.parametrize("name", ["claude-code", "codex", "mini-swe-agent"])
def test_shipped_specs_load_generate_and_carry_provenance(name, tmp_path):
    s = fit.read_spec(name)
    assert s.version == 2 and s.name == name
    src = s.provenance.sources[0]
    assert src.licence and src.url and s.provenance.derived
    out = tmp_path / "t.parquet"
    assert cli(["trace", "gen", "--spec", name, "--programs", "40", "--seed", "3", "-o", str(out)]) == 0
    c, meta = read_columns(str(out))
    assert len(set(c["program_id"])) == 40 and meta["generator"] == f"spec:{name}" and meta["provenance"]["sources"]
    assert (c["turn"] + 1).max() <= s.max_turns


def test_shipped_specs_say_what_they_rest_on():
    cc, cx, mini = (fit.read_spec(n) for n in ("claude-code", "codex", "mini-swe-agent"))
    assert cc.provenance.counts == {"programs": 111, "calls": 5631, "tool_calls": 5520}
    assert "GPL-2.0" in cc.provenance.sources[0].licence and cc.provenance.sources[0].commit.startswith("5af9e7b")
    assert cx.provenance.counts["programs"] == 1 and "ONE session" in cx.provenance.derived
    assert cx.reasoning_share == pytest.approx(0.30, abs=0.01)
    assert "MEASURED" in mini.provenance.derived and "tool durations NOT measured" in mini.provenance.derived
    assert mini.provenance.counts == {"programs": 500, "calls": 20163, "tool_calls": 19663}
    assert mini.provenance.sources[0].licence.startswith("MIT") and "2606.09613" in mini.provenance.sources[1].url
    assert set(fit.shipped()) == {"claude-code", "codex", "mini-swe-agent"}


def test_mini_swe_agent_spec_keeps_the_published_tool_statistics():
    s = fit.read_spec("mini-swe-agent")
    df, _ = fit.generate_from_spec(s, 2000, 0)
    c = columns(df)
    d = c["tool_duration_s"][np.isfinite(c["tool_duration_s"])]
    assert d.mean() == pytest.approx(0.87, rel=0.10) and d.std() == pytest.approx(4.1, rel=0.25)
    assert s.tools["pip"].mean == pytest.approx(19.9, rel=0.05) and s.tools["sed"].mean == pytest.approx(0.12, rel=0.05)
    assert s.turns.mean == pytest.approx(40.3, abs=0.05)  # the leaderboard run's 40.3 calls per instance


def test_cli_fit_then_gen_from_the_file(tmp_path, capsys):
    spec = tmp_path / "w.json"
    assert cli(["trace", "fit", str(ROOT / "traces" / "data" / "bfcl.parquet"), "--name", "b", "-o", str(spec)]) == 0
    assert "spec 'b' from 500 programs" in capsys.readouterr().out
    data = json.loads(spec.read_text())
    assert data["version"] == 2 and data["provenance"]["counts"]["programs"] == 500 and data["between"]["programs"] == 500
    assert set(data["tools"]) == {"web_search", "fetch_url", "archival_memory_search", "core_memory_append", "calculate"}
    out = tmp_path / "g.parquet"
    assert cli(["trace", "gen", "--spec", str(spec), "--programs", "30", "-o", str(out)]) == 0


def _refused(argv, capsys, pattern, tmp_path, out_name):
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(pattern, err), err
    assert not (tmp_path / out_name).exists() and not list(tmp_path.glob(".*tmp*"))


def test_bad_logs_refused_with_one_line_and_nothing_written(tmp_path, capsys):
    out = str(tmp_path / "w.json")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "junk.jsonl").write_text("not json{\n")
    (tmp_path / "text.txt").write_text("hello\n")
    single = tmp_path / "single.parquet"
    write_trace(pd.DataFrame({"program_id": ["a", "b"], "turn": [0, 0], "new_input_tokens": [10, 20], "output_tokens": [5, 5],
                              "tool": [None, None], "tool_duration_s": [np.nan, np.nan]}), single, {})
    cases = [
        (["--format", "claude-code", str(tmp_path / "empty.jsonl")], r"empty\.jsonl: is empty"),
        (["--format", "claude-code", str(tmp_path / "junk.jsonl")], r"junk\.jsonl line 1: is not valid JSON"),
        (["--format", "nope", str(tmp_path / "junk.jsonl")], r"--format 'nope' is unknown"),
        ([str(tmp_path / "text.txt")], r"LOGS .*text\.txt.*not a trace parquet; give --format"),
        ([str(tmp_path / "missing.parquet")], r"LOGS .*missing\.parquet.*no such file"),
        ([str(single)], r"LOGS .*single\.parquet: no tool calls"),
    ]
    for args, pattern in cases:
        _refused(["trace", "fit", *args, "-o", out], capsys, pattern, tmp_path, "w.json")
    # an output that cannot be written is refused before any log is read
    _refused(["trace", "fit", str(tmp_path / "junk.jsonl"), "-o", str(tmp_path)], capsys, r"--output .* is a directory",
             tmp_path, "w.json")


def test_bad_specs_refused_with_one_line(tmp_path, capsys):
    out = str(tmp_path / "t.parquet")
    (tmp_path / "junk.json").write_text("{")
    good = json.loads((fit.SPECS_DIR / "codex.json").read_text())
    (tmp_path / "v3.json").write_text(json.dumps({**good, "version": 3}))
    bad = {**good, "turns": {**good["turns"], "n": 0}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    cases = [
        (["--spec", str(tmp_path / "junk.json")], r"not readable JSON"),
        (["--spec", str(tmp_path / "v3.json")], r"version 3 is not one of 1, 2"),
        (["--spec", str(tmp_path / "bad.json")], r"field 'turns\.n' is 0"),
        (["--spec", "no-such-agent"], r"--spec 'no-such-agent': no such file or shipped spec; .*claude-code"),
        (["swebench", "--spec", "codex"], r"not both or neither"),
        ([], r"not both or neither"),
    ]
    for args, pattern in cases:
        _refused(["trace", "gen", *args, "-o", out], capsys, pattern, tmp_path, "t.parquet")


@needs_ext
def test_fit_reads_raw_claude_code_logs(tmp_path):
    spec = fit.fit_logs([str(EXT / "agentcgroup" / "experiments" / "all_images_local")], "claude-code")
    assert spec.provenance.counts["programs"] == 8 and {"Bash", "Read"} <= set(spec.tools)
    assert spec.provenance.sources[0].commit == "5af9e7b8f37a93513206c331c7ec0ff149e89f27"
    assert "GPL-2.0" in spec.provenance.sources[0].licence


@needs_ext
def test_shipped_specs_are_what_the_logs_give(tmp_path):
    from benchmarks import agent_log_stats as als

    written = als.write_specs(EXT, tmp_path, MINI if MINI.is_dir() else None)
    assert len(written) == (3 if MINI.is_dir() else 2)
    for p in written:
        assert p.read_text() == (fit.SPECS_DIR / p.name).read_text(), p.name


@needs_ext
def test_the_docs_table_is_what_the_logs_give():
    from benchmarks import agent_log_stats as als

    text = (ROOT / "docs" / "reference" / "traces.md").read_text()
    m = re.search(r"^<!-- agent_log_stats: --logs \$AGENTSIM_EXTERNAL_TRACES -->\n\n(.*?)\n\n<!-- end agent_log_stats -->$",
                  text, re.S | re.M)
    assert m and m[1] == als.stats(EXT)


@pytest.mark.skipif(not MINI.is_dir(), reason=f"{MINI} not present (docs/reference/traces.md says how to build it)")
def test_the_mini_swe_agent_docs_table_is_what_the_trajectories_give():
    from benchmarks import agent_log_stats as als

    text = (ROOT / "docs" / "reference" / "traces.md").read_text()
    m = re.search(rf"^<!-- agent_log_stats: --logs \$AGENTSIM_EXTERNAL_TRACES --mini-swe {MINI} -->\n\n(.*?)\n\n"
                  r"<!-- end agent_log_stats -->$", text, re.S | re.M)
    assert m and m[1] == als.mini_swe_stats(MINI)
