"""Context carry-over (traces/schema.py `carry`, `reasoning_tokens`): which part of a turn's
output the next prompt reuses from the prefix cache. The twin check of the modes is in
tests/test_twin_engine.py (it needs vLLM)."""
import numpy as np
import pandas as pd
import pytest

from agentsim.cli import main
from agentsim.errors import InputError
from conftest import linear_profile, make_trace, simulate
from sim.kv.content import ContentKeys, carried
from traces.schema import read_trace, validate
from traces.transform import carry_over

# two turns: 64 prompt tokens, 40 output tokens (16 of them reasoning), then 32 new tokens
PROG = [[(64, 40, "ls", 0.0), (32, 8, None, None)]]


def _trace(carry=None, reasoning=16):
    t = make_trace(PROG)
    t["reasoning_tokens"] = [reasoning, 0]
    if carry is not None:
        t["carry"] = carry
    return validate(t)


def _second_call(carry, reasoning=16):
    res = simulate(_trace(carry, reasoning), "vllm", linear_profile(blocks=64), np.zeros(1))
    return res.turns.iloc[1]


def test_cached_reuses_the_output_rerendered_stops_at_the_prompt():
    cached, rerendered = _second_call("cached"), _second_call("rerendered")
    # cached: prompt 64 + 40 output + 32 = 136 tokens, hit on the 6 full blocks of 64 + 39
    # computed tokens (the last output token is never written before the call ends)
    assert cached["prompt_tokens"] == rerendered["prompt_tokens"] == 136
    assert cached["cached_tokens"] == 96
    # re-rendered: the same length, but only the first prompt's 4 blocks are hit
    assert rerendered["cached_tokens"] == 64


def test_reasoning_dropped_shortens_the_prompt_and_breaks_the_prefix_where_it_began():
    dropped = _second_call("reasoning-dropped")
    assert dropped["prompt_tokens"] == 64 + 40 - 16 + 32
    assert dropped["cached_tokens"] == 64
    # with no reasoning nothing is dropped: as cached
    none = _second_call("reasoning-dropped", reasoning=0)
    assert (none["prompt_tokens"], none["cached_tokens"]) == (136, 96)


def test_no_carry_column_is_cached_exactly():
    plain = simulate(make_trace(PROG), "vllm", linear_profile(blocks=64), np.zeros(1)).turns
    cached = simulate(_trace("cached"), "vllm", linear_profile(blocks=64), np.zeros(1)).turns
    cols = ["scheduled", "first_token", "finish", "cached_tokens", "prompt_tokens"]
    assert plain[cols].equals(cached[cols])


def test_carried_context_keeps_the_prompts_keys_and_names_the_rest_anew():
    c = ContentKeys(16)
    c.append("sys", 40)
    c.append(("p", 0), 24)
    c.append_output(40)
    fork = carried(c, "rerendered", 40)
    assert fork.length == c.length and fork.prefix(4) == c.prefix(4)  # the 64 prompt tokens: 4 blocks
    assert fork.key(5) != c.key(5)  # a block ending in the carried output
    assert carried(c, "rerendered", 40).prefix(6) == fork.prefix(6)  # the same prompt, the same re-rendered text


def test_trace_carry_command_writes_the_columns(tmp_path, capsys):
    out = tmp_path / "c.parquet"
    assert main(["trace", "carry", "swebench", "--mode", "reasoning-dropped", "--reasoning-share", "0.25", "-o", str(out)]) == 0
    df, meta = read_trace(str(out))
    assert (df["carry"] == "reasoning-dropped").all()
    assert (df["reasoning_tokens"] == np.rint(0.25 * df["output_tokens"])).all()
    assert meta["carry"] == {"mode": "reasoning-dropped", "reasoning_share": 0.25, "source": "swebench"}
    assert "carry reasoning-dropped" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--mode", "dropped"], "--mode 'dropped' is not a carry mode"),
    (["--mode", "rerendered", "--reasoning-share", "0.2"], "--reasoning-share applies only with --mode reasoning-dropped"),
    (["--mode", "reasoning-dropped", "--reasoning-share", "1.5"], "--reasoning-share must be within [0, 1]"),
    (["--mode", "reasoning-dropped"], "needs each turn's reasoning tokens"),
])
def test_trace_carry_refuses_with_one_line(tmp_path, capsys, argv, says):
    out = tmp_path / "c.parquet"
    assert main(["trace", "carry", "swebench", *argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("change, field, problem", [
    ({"carry": "forgotten"}, "carry", "is 'forgotten'"),
    ({"reasoning_tokens": 41}, "reasoning_tokens", "exceeds output_tokens"),
    ({"reasoning_tokens": -1}, "reasoning_tokens", "is negative"),
])
def test_bad_carry_columns_are_refused_naming_the_field(change, field, problem):
    t = make_trace(PROG)
    t["reasoning_tokens"], t["carry"] = [16, 0], "cached"
    for k, v in change.items():
        t.loc[0, k] = v
    with pytest.raises(InputError, match=f"field '{field}' {problem}"):
        validate(t)


def test_reasoning_dropped_without_reasoning_tokens_is_refused():
    t = make_trace(PROG)
    t["carry"] = "reasoning-dropped"
    with pytest.raises(InputError, match="no reasoning_tokens column"):
        validate(t)


def test_a_dropped_reasoning_makes_a_long_program_fit():
    # 3 turns of 64 new tokens, two outputs of 4,000 tokens (3,990 reasoning): 8,208 tokens as generated
    prog = [[(64, 4000, "ls", 0.0), (64, 4000, "ls", 0.0), (64, 16, None, None)]]
    t = make_trace(prog)
    t["reasoning_tokens"] = [3990, 3990, 0]
    prof = linear_profile(blocks=600, max_len=8000)
    with pytest.raises(InputError, match="exceeds max_model_len 8000"):
        simulate(validate(t), "vllm", prof, np.zeros(1))
    t["carry"] = "reasoning-dropped"
    res = simulate(validate(t), "vllm", prof, np.zeros(1))
    assert res.turns["prompt_tokens"].tolist() == [64, 64 + 10 + 64, 64 + 10 + 64 + 10 + 64]
