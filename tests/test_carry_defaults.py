"""The measured specs' default context carry-over (traces/fit.py `carry`): each shipped spec's
mode and what its logs show (benchmarks/agent_log_stats.py), reasoning drawn on a share of
calls (`reasoning_calls`), a fitted trace's carry kept, bad carry fields refused. The twin
check of a spec's carry is in tests/test_twin_engine.py (it needs vLLM)."""
import json
from pathlib import Path

import numpy as np
import pytest

from agentsim.cli import main
from traces import fit

ROOT = Path(__file__).resolve().parents[1]
EXT = ROOT.parent / "shared" / "external-traces"
MINI = Path("/tmp/mini-swe-agent-trajs")  # as docs/reference/traces.md builds it
needs_ext = pytest.mark.skipif(not (EXT / "agentcgroup").is_dir(), reason=f"{EXT} not present (logs are read in place)")

# the defaults docs/traces.md states: a new spec must say what its logs show
EXPECTED = {"claude-code": "reasoning-dropped", "codex": "cached", "mini-swe-agent": "reasoning-dropped"}


def _shown(coef: float) -> str:
    """The mode a fitted reasoning coefficient shows: the next prompt keeps it (1) or not (0)."""
    return "reasoning-dropped" if coef < 0.5 else "cached"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_shipped_spec_generates_its_logs_carry(name):
    assert set(fit.shipped()) == set(EXPECTED)
    spec = fit.read_spec(name)
    assert spec.carry.mode == EXPECTED[name] and spec.carry.basis == "logs" and spec.carry.sources
    df, meta = fit.generate_from_spec(spec, 20, 0)
    assert (df["carry"] == EXPECTED[name]).all()
    assert meta["carry"]["mode"] == EXPECTED[name]
    assert df["reasoning_tokens"].sum() > 0


@needs_ext
def test_the_logs_show_the_shipped_modes():
    from benchmarks import agent_log_stats as als

    glm = als.glm_carry(EXT)
    assert glm["visible"] > 0.6 and _shown(glm["reasoning"]) == EXPECTED["claude-code"]
    assert glm["reasoning_pairs"] >= 30
    cx = als.codex_carry([r for r in als.tracelab_rounds(EXT) if r["provider"] == "codex"])
    # within the tool loop: kept (the smaller leftover); at a user turn: the loop's reasoning goes
    assert cx["kept_overhead"] < cx["dropped_overhead"] and EXPECTED["codex"] == "cached"
    assert cx["user_turns"] and all(abs(g + r) <= 0.2 * r + 10 for g, r in cx["user_turns"])


@pytest.mark.skipif(not MINI.is_dir(), reason=f"{MINI} not present (docs/reference/traces.md says how to build it)")
def test_the_mini_swe_agent_trajectories_show_its_mode():
    from benchmarks import agent_log_stats as als

    c = als.mini_swe_carry(MINI)
    assert c["visible"] > 0.8 and c["reasoning_pairs"] >= 100 and _shown(c["reasoning"]) == EXPECTED["mini-swe-agent"]
    assert fit.read_spec("mini-swe-agent").reasoning_calls == c["reasoning_calls"]


def test_reasoning_goes_to_a_drawn_share_of_calls_and_nothing_else_moves():
    spec = fit.read_spec("mini-swe-agent")
    assert 0 < spec.reasoning_calls < 0.1
    df, _ = fit.generate_from_spec(spec, 200, 0)
    on = df["reasoning_tokens"] > 0
    assert abs(on.mean() - spec.reasoning_calls) < 0.01
    assert abs(df["reasoning_tokens"].sum() / df["output_tokens"].sum() - spec.reasoning_share) < 0.3 * spec.reasoning_share
    every, _ = fit.generate_from_spec(spec.model_copy(update={"reasoning_calls": None}), 200, 0)
    assert (every["reasoning_tokens"] > 0).mean() > 0.5  # a sliver on every call: each prefix cut
    assert df.drop(columns="reasoning_tokens").equals(every.drop(columns="reasoning_tokens"))


def test_a_fit_keeps_the_traces_carry_and_reasoning_calls():
    src, _ = fit.generate_from_spec(fit.read_spec("mini-swe-agent"), 300, 1)
    prov = {"sources": [{"name": "test", "licence": "none"}], "derived": "test", "counts": {}}
    spec = fit.fit_trace(src, "again", prov)
    assert spec.carry.mode == "reasoning-dropped" and spec.carry.basis == "trace"
    assert spec.reasoning_calls == pytest.approx((src["reasoning_tokens"] > 0).mean(), abs=1e-4)
    df, _ = fit.generate_from_spec(spec, 50, 0)
    assert (df["carry"] == "reasoning-dropped").all()
    mixed = src.assign(carry=np.where(np.arange(len(src)) % 2, "cached", "rerendered"))
    assert fit.fit_trace(mixed, "mixed", prov).carry is None  # no one mode to default to


@pytest.mark.parametrize("change, says", [
    (lambda d: d.pop("reasoning_share"), "carry mode reasoning-dropped needs reasoning_share"),
    (lambda d: d["carry"].update(mode="dropped"), "carry.mode"),
    (lambda d: d.update(reasoning_calls=0), "reasoning_calls"),
])
def test_a_bad_carry_field_is_refused_with_one_line(tmp_path, capsys, change, says):
    d = json.loads((fit.SPECS_DIR / "claude-code.json").read_text())
    change(d)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    out = tmp_path / "t.parquet"
    assert main(["trace", "gen", "--spec", str(bad), "--programs", "2", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_trace_gen_says_the_specs_carry(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    assert main(["trace", "gen", "--spec", "codex", "--programs", "2", "-o", str(out)]) == 0
    assert "carry cached (logs)" in capsys.readouterr().out


def test_the_docs_table_is_what_the_shipped_specs_say():
    import re

    from benchmarks import spec_carry

    text = (ROOT / "docs" / "reference" / "traces.md").read_text()
    m = re.search(r"^<!-- spec_carry: --specs traces/data/specs -->\n\n(.*?)\n\n<!-- end spec_carry -->$", text, re.S | re.M)
    assert m and m[1] == spec_carry.table(fit.SPECS_DIR)
    assert all(f"| `{n}` | `{mode}` |" in m[1] for n, mode in EXPECTED.items())


def test_a_specs_carry_modes_are_the_schemas():
    from typing import get_args

    from traces.schema import CARRY_MODES

    assert tuple(get_args(fit.Carry.model_fields["mode"].annotation)) == tuple(CARRY_MODES)
