"""Prefix sharing by content (traces/segments.py, sim/kv/content.py)."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import linear_profile, make_trace, simulate
from sim.kv.content import ContentKeys, PyContentKeys
from agentsim.errors import InputError
from traces.schema import read_trace, validate, write_trace

BS = 16


def with_segments(trace: pd.DataFrame, ids) -> pd.DataFrame:
    """ids(program, turn) -> a segment id for the whole new input, or None (unknown)."""
    t = trace.copy()
    t["segments"] = [None if ids(p, n) is None else [{"id": ids(p, n), "tokens": int(k)}]
                     for p, n, k in zip(t["program_id"], t["turn"], t["new_input_tokens"])]
    return validate(t)


def run(trace, arrivals, policy="vllm", offload=None, blocks=1000):
    p = linear_profile(blocks=blocks)
    return simulate(trace, policy, p, arrivals, offload=offload)


PROGRAM = [(300, 20, "ls", 1.0), (50, 10, "cat", 1.0), (70, 5, None, None)]


def full_hit(prompt: int) -> int:
    """vLLM reuses at most prompt - 1 tokens, in whole blocks."""
    return (prompt - 1) // BS * BS


def test_identical_programs_are_served_from_the_first_ones_blocks():
    tr = with_segments(make_trace([PROGRAM] * 3), lambda p, n: f"turn{n}")
    res = run(tr, [0.0, 10.0, 20.0])
    t = res.turns.set_index(["program_id", "turn"])
    prompts = [300, 300 + 20 + 50, 300 + 20 + 50 + 10 + 70]
    for p in ("p001", "p002"):
        assert t.loc[p]["cached_tokens"].tolist() == [full_hit(x) for x in prompts]
    assert t.loc["p000"]["cached_tokens"].iloc[0] == 0


def test_without_segments_programs_share_nothing():
    res = run(make_trace([PROGRAM] * 3), [0.0, 10.0, 20.0])
    assert (res.turns.query("turn == 0")["cached_tokens"] == 0).all()


def test_unknown_content_is_unique_and_divergence_stops_sharing():
    # same turn 0 (same task), tool results differ: only turn 0's prompt and output are shared
    tr = with_segments(make_trace([PROGRAM] * 2), lambda p, n: "task" if n == 0 else None)
    t = run(tr, [0.0, 10.0]).turns.set_index(["program_id", "turn"])
    assert t.loc[("p001", 0), "cached_tokens"] == full_hit(300)
    # turn 1: its own turn 0 had KV for 300 + 19 tokens (the last sampled token never ran), but
    # p000's turn 1 computed all 320 of the same prompt + output: that block is shared too;
    # the tool results differ, so nothing after it is
    assert t.loc[("p001", 1), "cached_tokens"] == (300 + 20) // BS * BS


def test_shared_content_is_reloaded_from_the_cpu_tier():
    # p001 (unrelated, 560 tokens) evicts p000's blocks from a 40-block pool; p002, a copy of
    # p000, finds its prompt in the CPU tier (LMCache's chunks are keyed by content too)
    tr = with_segments(make_trace([PROGRAM, [(560, 10, None, None)], PROGRAM]), lambda p, n: f"{p == 'p001'}{n}")
    t = run(tr, [0.0, 10.0, 20.0], offload="cpu:1GiB@25", blocks=40).turns.set_index(["program_id", "turn"])
    gpu, cpu = t.loc[("p002", 0), "cached_tokens"], t.loc[("p002", 0), "loaded_tokens"]
    assert gpu < 256 and cpu > 0 and gpu + cpu >= 256  # at least LMCache's first 256-token chunk


def test_keys_chain_like_vllm_block_hashes():
    def keys(runs, n):
        c = ContentKeys(BS)
        for cid, k in runs:
            c.append(cid, k)
        return [c.key(i) for i in range(n)]

    a = keys([("sys", 40), ("task-a", 40)], 5)
    b = keys([("sys", 40), ("task-b", 40)], 5)
    assert a[:2] == b[:2] and a[2:] != b[2:] and len(set(a[2:]) & set(b[2:])) == 0  # block 2 mixes sys and task
    # a shorter segment with the same id is a prefix of the longer: its full blocks agree
    assert keys([("sys", 33)], 2) == keys([("sys", 80)], 2)
    # the same tokens split differently into appends give the same keys
    assert keys([("x", 20), ("y", 30)], 3) == keys([("x", 20), ("y", 10), ("y2", 0)], 1) + keys([("x", 20), ("y", 30)], 3)[1:]
    # the same content after a different prefix is a different block (chained)
    assert keys([("p", 16), ("x", 16)], 2)[1] != keys([("q", 16), ("x", 16)], 2)[1]
    with pytest.raises(IndexError):
        ContentKeys(BS).key(0)


# a run: an input segment (id: a string, a (program, turn) pair, an int) or a call's output
_RUN = st.tuples(st.one_of(st.text(max_size=6), st.tuples(st.text(max_size=4), st.integers(0, 50)),
                           st.integers(-2**70, 2**70), st.just("<output>")), st.integers(0, 90))


@settings(max_examples=300, deadline=None)
@given(bs=st.sampled_from([1, 4, 16]), runs=st.lists(_RUN, max_size=12),
       asks=st.lists(st.tuples(st.booleans(), st.integers(-3, 400)), max_size=20))
def test_the_compiled_keys_are_the_python_reference_to_the_bit(bs, runs, asks):
    """sim/kv/_content.pyx against PyContentKeys: appends, then key and prefix asked in any
    order (past the context's end too): the same values, keys, digests and errors. The
    reference hashes the tuple (digest, run id, offset) itself, so this also checks the
    compiled replica of CPython's tuple hash."""
    a, b = ContentKeys(bs), PyContentKeys(bs)
    for cid, n in runs:
        for c in (a, b):
            c.append_output(n) if cid == "<output>" else c.append(cid, n)
    for prefix, i in asks:
        got = want = None
        try:
            got = a.prefix(i) if prefix else a.key(i)
        except IndexError as e:
            got = ("IndexError", str(e))
        try:
            want = b.prefix(i) if prefix else b.key(i)
        except IndexError as e:
            want = ("IndexError", str(e))
        assert got == want
        assert a.keys == b.keys
    assert (a.digest, a.length, a.runs) == (b.digest, b.length, b.runs)


def test_the_install_step_built_the_compiled_keys():
    from sim.kv import _content

    assert ContentKeys is _content.ContentKeys


def test_outputs_are_named_by_their_prompt():
    a, b, c = ContentKeys(BS), ContentKeys(BS), ContentKeys(BS)
    for k, task in ((a, "t"), (b, "t"), (c, "u")):
        k.append("sys", 16)
        k.append(task, 16)
        k.append_output(32)
    assert a.key(3) == b.key(3) != c.key(3)


def test_parquet_round_trip_keeps_segments(tmp_path):
    tr = with_segments(make_trace([PROGRAM] * 2), lambda p, n: None if n == 2 else f"s{n}")
    write_trace(tr, tmp_path / "t.parquet", {})
    back, _ = read_trace(str(tmp_path / "t.parquet"))
    assert back["segments"].tolist() == tr["segments"].tolist()
    a = run(tr, [0.0, 10.0]).summary
    assert run(back, [0.0, 10.0]).summary == a


@pytest.mark.parametrize("segs, problem", [
    ([{"id": "a", "tokens": 299}], "covers 299 tokens"),
    ([{"id": "", "tokens": 300}], "segments[0].id"),
    ([{"id": "a", "tokens": -1}, {"id": "b", "tokens": 301}], "segments[0].tokens"),
    ([{"id": "a", "tokens": 1.5}], "segments[0].tokens"),
    ("abc", "not a list of segments"),
    ([["a", 300]], "segments[0].id"),
])
def test_bad_segments_are_one_line(segs, problem):
    tr = make_trace([PROGRAM]).astype({"turn": int})
    tr["segments"] = [segs, None, None]
    with pytest.raises(InputError, match="program 'p000' turn 0") as e:
        validate(tr)
    assert problem in str(e.value) and "\n" not in str(e.value)


# --- where segments come from --------------------------------------------------------------
from pathlib import Path  # noqa: E402

from calibrate.validate import fit_trace  # noqa: E402
from traces.generate import generate  # noqa: E402
from traces.importers import import_trace  # noqa: E402
from traces.resample import resample  # noqa: E402
from traces.transform import repeat_turns  # noqa: E402

EXP = Path(__file__).resolve().parents[2] / "shared" / "external-traces" / "agentcgroup" / "experiments"
needs_ext = pytest.mark.skipif(not EXP.is_dir(), reason=f"{EXP} not present (read in place, never bundled)")
FIX = Path(__file__).parent / "fixtures" / "importers"


def first_turn_hits(trace, jps_gap=30.0):
    """Turn-0 cached tokens with programs one at a time (no contention)."""
    res = run(trace, np.arange(trace["program_id"].nunique()) * jps_gap, blocks=4000)
    return res.turns.query("turn == 0").set_index("program_id")["cached_tokens"]


def test_generator_tasks_share_first_prompts_without_changing_the_draws():
    plain, _ = generate("bfcl", 6, seed=3)
    shared, meta = generate("bfcl", 6, seed=3, tasks=2)
    assert meta["tasks"] == 2
    assert (plain["new_input_tokens"] == shared["new_input_tokens"]).all()
    first = shared[shared["turn"] == 0]["segments"].tolist()
    assert first[0][1]["id"] == first[2][1]["id"] != first[1][1]["id"]
    assert all(s is None for s in shared[shared["turn"] > 0]["segments"])
    hits = first_turn_hits(shared)
    base = first_turn_hits(plain)  # the system prompt only
    assert (hits.iloc[2:] > base.iloc[2:]).all() and (hits.iloc[:2] == base.iloc[:2]).all()
    with pytest.raises(InputError, match="--tasks 0"):
        generate("bfcl", 6, tasks=0)


def test_transforms_scale_segments_alike():
    tr = with_segments(make_trace([PROGRAM] * 2), lambda p, n: f"turn{n}")
    rep = repeat_turns(tr, 3)  # validate() inside checks every row's segments sum to its tokens
    a, b = (rep[rep["program_id"] == p]["segments"].tolist() for p in ("p000", "p001"))
    assert a == b and rep["segments"].notna().all()
    fit = fit_trace(tr, max_context=200)
    validate(fit)
    a, b = (fit[fit["program_id"] == p]["segments"].tolist() for p in ("p000", "p001"))
    assert a == b and sum(s["tokens"] for s in a[0]) == fit["new_input_tokens"].iloc[0] < 300


@needs_ext
def test_claude_code_sessions_share_the_system_prompt_and_task_texts():
    df, _ = import_trace("claude-code", [EXP / "all_images_haiku", EXP / "all_images_local"])
    first = df[df["turn"] == 0].set_index("program_id")["segments"]
    haiku = [s for p, s in first.items() if "haiku" in p]
    local = {p.split("/")[1]: s for p, s in first.items() if "local" in p}
    # the provider cache measured Claude Code's system prompt + tool schemas on Haiku's first calls
    assert {s[0]["tokens"] for s in haiku} <= {11174, 10900} and len({s[0]["id"] for s in haiku}) == 1
    # the local model's log measures no cache: no system segment, the task text is the whole first input
    for p, s in first.items():
        if "haiku" in p:
            assert s[1]["id"] == local[p.split("/")[1]][0]["id"]  # one task, one text, both models


@needs_ext
def test_resampled_copies_share_what_sessions_share():
    df, meta = import_trace("claude-code", [EXP / "all_images_haiku"], estimate_tokens=True)
    out, _ = resample([("haiku", df, meta)], programs=16, seed=0)
    ids = [s["id"] for segs in out["segments"] if segs is not None for s in segs]
    system = [i for i in ids if i.startswith("claude-code-system")]
    assert len(system) == 16  # every copy keeps the system prompt's id
    copies: dict[str, set] = {}  # a session's own content belongs to one copy only
    for pid, segs in zip(out["program_id"], out["segments"]):
        for s in segs or []:
            if "@r" in s["id"]:
                copies.setdefault(s["id"], set()).add(pid)
    assert copies and all(len(p) == 1 for p in copies.values())
    hits = first_turn_hits(out).sort_index()
    # every program after the first finds at least the system prompt (10,900 tokens in one session's log)
    assert hits.iloc[0] == 0 and (hits.iloc[1:] >= 10900 // BS * BS).all()


def test_mini_swe_agent_messages_become_segments():
    df, _ = import_trace("mini-swe-agent", FIX / "django__django-11099.traj.json")
    segs = df["segments"].tolist()
    assert len(segs[0]) >= 2  # system message, then the task
    assert all(sum(s["tokens"] for s in row) == n for row, n in zip(segs, df["new_input_tokens"]))
