"""Property-based tests (hypothesis): random small traces (some programs copies of others,
so that calls on different replicas end at one instant) x every policy x pool sizes
(30-200 blocks, and 5-50 with short calls),
token budgets, chunked prefill on/off, 1-3 replicas, every router, offload on/off, both
KV cache models (vLLM's block pool, SGLang's radix tree), prefill/decode
disaggregation (1P1D, 2P1D, 1P2D), client retention hints (kv_priority, kv_ttl_s), carry
modes (rerendered, reasoning-dropped, mixed by row) and programs drawn from the shipped
measured workload specs (scaled to the small pools); and random wrong values in profiles
and anywhere in importer records. `make test` runs a
bounded number of examples; `make fuzz` sets AGENTSIM_FUZZ_EXAMPLES=1500."""
import functools
import json
import os

import numpy as np
import pytest
import pandas as pd
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import linear_profile, make_trace, simulate
from policies.registry import POLICIES
from sim.cluster.router import router_names
from sim.cluster.disagg import Disagg, Link, find_link, parse_disagg
from agentsim.errors import InputError

EXAMPLES = int(os.environ.get("AGENTSIM_FUZZ_EXAMPLES", "60"))
# CI's bounded run is the same every time (a known-open case must not make CI flaky);
# `make fuzz` explores new examples on every run.
# print_blob: a failure found by `make fuzz` prints the @reproduce_failure line that replays it
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="AGENTSIM_FUZZ_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], print_blob=True)

def _programs(max_input: int, max_output: int):
    turns = st.tuples(st.integers(1, max_input), st.integers(1, max_output), st.sampled_from(["ls", "cat", "pytest", None]),
                      st.floats(0, 3, allow_nan=False))
    return st.lists(st.lists(turns, min_size=1, max_size=4), min_size=1, max_size=6)


programs = _programs(300, 40)


SPEC_POOL = 64  # programs drawn once per shipped spec; an example picks some of them


@functools.lru_cache(maxsize=None)
def _spec_pool(name: str) -> list[list[tuple[int, int, str | None, float]]]:
    """SPEC_POOL programs of a shipped measured workload spec (traces/data/specs), their first
    6 turns as (new input, output, tool, tool time): drawn once per process (a spec's
    generator prices every turn, about 0.2 s a call)."""
    from traces.fit import generate_from_spec, read_spec

    df, _ = generate_from_spec(read_spec(name), SPEC_POOL, seed=0)
    df = df[df["turn"] < 6]
    return [[(int(r.new_input_tokens), int(r.output_tokens), None if pd.isna(r.tool) else str(r.tool),
              0.0 if np.isnan(r.tool_duration_s) else float(r.tool_duration_s)) for r in g.itertuples()]
            for _, g in df.groupby("program_id", sort=False)]


@st.composite
def spec_programs(draw, max_input: int, max_output: int, n: int):
    """n programs of a shipped measured spec, tokens scaled down to the strategy's range (the
    spec's shape, not its size: its contexts reach 128k tokens), tool times capped at 3 s."""
    from traces.fit import shipped

    pool = _spec_pool(draw(st.sampled_from(shipped())))
    progs = [pool[i] for i in draw(st.lists(st.integers(0, len(pool) - 1), min_size=n, max_size=n))]
    f_in = min(1.0, max_input / max(i for p in progs for i, _, _, _ in p))
    f_out = min(1.0, max_output / max(o for p in progs for _, o, _, _ in p))
    return [[(max(1, round(i * f_in)), max(1, round(o * f_out)), tool, min(3.0, d)) for i, o, tool, d in p] for p in progs]


def _carry_and_hints(draw, trace, cache: str):
    """A carry mode (or none, or one per row) and client retention hints (soft retention
    needs vLLM's block pool: none with the radix cache) laid on a drawn trace."""
    from traces.schema import CARRY_MODES, validate
    from traces.transform import carry_over

    n = len(trace)
    carry = draw(st.sampled_from([None, "rerendered", "reasoning-dropped", "mixed"]))
    if carry is not None:
        share = None if carry == "rerendered" else draw(st.sampled_from([0.0, 0.4, 1.0]))
        trace = carry_over(trace, "reasoning-dropped" if carry == "mixed" else carry, share)
        if carry == "mixed":
            trace["carry"] = np.array(draw(st.lists(st.sampled_from(CARRY_MODES), min_size=n, max_size=n)), dtype=object)
    hints = draw(st.sampled_from([None, None, "priority", "ttl", "both"])) if cache == "vllm" else None
    if hints in ("priority", "both"):
        trace["kv_priority"] = [np.nan if v is None else float(v) for v in
                                draw(st.lists(st.none() | st.integers(0, 100), min_size=n, max_size=n))]
    if hints in ("ttl", "both"):
        trace["kv_ttl_s"] = [np.nan if v is None else v for v in
                             draw(st.lists(st.none() | st.floats(0, 3, allow_nan=False), min_size=n, max_size=n))]
    return validate(trace)


@st.composite
def configs(draw, programs=programs, blocks=st.integers(30, 200), replicas=st.integers(1, 3), scale=(300, 40)):
    progs = draw(programs)
    # copies of programs: identical calls on two replicas end their steps at one instant,
    # the ties whose order stretches once changed (sim.replica.clock.step_end)
    for i, j in draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=2)):
        if max(i, j) < len(progs):
            progs[j] = progs[i]
    shared = draw(st.sampled_from([0, 16, 32])) if min(p[0][0] for p in progs) >= 32 else 0
    c = dict(
        arrivals=np.sort(np.asarray(draw(st.lists(st.floats(0, 5, allow_nan=False) | st.sampled_from([0.0, 1.0]),
                                                  min_size=len(progs), max_size=len(progs))))),
        policy=draw(st.sampled_from(sorted(POLICIES))), blocks=draw(blocks),
        budget=draw(st.sampled_from([16, 64, 256, 8192])), seqs=draw(st.integers(1, 16)),
        chunked=draw(st.booleans()), replicas=draw(replicas), router=draw(st.sampled_from(router_names())),
        offload=draw(st.sampled_from([None, "cpu:1MiB@0.05", "cpu:1MiB@0.05,ssd:2MiB@0.01"])),
        cache=draw(st.sampled_from(["vllm", "radix"])),
        disagg=draw(st.sampled_from([None, None, "1P1D", "2P1D", "1P2D"])), local_prefill=draw(st.sampled_from([0, 64, 1000])),
        slow_link=draw(st.booleans()),
    )
    # drawn last, so that the configurations above are those drawn before these joined:
    # a quarter of the runs replay as many programs of a measured spec instead
    if draw(st.integers(0, 3)) == 3:
        progs = draw(spec_programs(*scale, n=len(progs)))
        shared = shared if min(p[0][0] for p in progs) >= 32 else 0
    trace = make_trace([[(i, o, None if t == len(p) - 1 else tool, None if t == len(p) - 1 else d)
                         for t, (i, o, tool, d) in enumerate(p)] for p in progs], shared_prefix=shared)
    return {"trace": _carry_and_hints(draw, trace, c["cache"]), **c}


def _simulate(c, policy, ff=True, scheduler="simpy", **fields):
    prof = linear_profile(blocks=c["blocks"], budget=c["budget"], seqs=c["seqs"], c2=1e-6, c4=1e-5)
    dg = None
    if c["disagg"]:  # x prefill + y decode replicas instead of `replicas`; a slow link makes transfers count
        x, y = parse_disagg(c["disagg"])
        dg = Disagg(x, y, Link("slow", 4096 * 100.0, 0.01) if c["slow_link"] else find_link(None), max_local_prefill=c["local_prefill"])
    return simulate(c["trace"], policy, prof, c["arrivals"], fast_forward=ff, enable_chunked_prefill=c["chunked"], cache=c["cache"],
                    replicas=1 if dg else c["replicas"], router=c["router"], offload=c["offload"], disagg=dg, scheduler=scheduler,
                    **fields)


@SETTINGS
@given(configs())
def test_invariants_under_random_configurations(c):
    _check_invariants(c)


# Where issue 36's hangs and deadlock were found: pools of 5-50 blocks, short calls (so
# that most programs fit such a pool), 1-4 replicas. A run whose clock freezes is stopped
# by the engine's progress watchdog within a second (a SimulationError), never a hang.
tiny = configs(programs=_programs(40, 12), blocks=st.integers(5, 50), replicas=st.integers(1, 4), scale=(40, 12))


@SETTINGS
@given(tiny)
def test_invariants_on_tiny_pools(c):
    _check_invariants(c)


def _check_invariants(c):
    try:
        base = _simulate(c, "vllm")  # an input the simulator refuses is refused for every policy
    except InputError:
        assume(False)
    assert len(base.turns) == len(c["trace"])
    if c["cache"] == "radix" and POLICIES[c["policy"]].retains:  # soft retention needs vLLM's block pool
        with pytest.raises(InputError, match="soft retention"):
            _simulate(c, c["policy"])
        return
    # execute checks itself: every call finished exactly once, nothing waits or
    # runs at the end, no pin outlives its program, no block or tier leak (check_end).
    # A policy deadlock or a frozen clock raises SimulationError: none may where plain vLLM finishes.
    res = _simulate(c, c["policy"])
    t, s = res.turns, res.summary
    assert len(t) == len(c["trace"]) and not t.duplicated(["program_id", "turn"]).any()
    assert (t["arrival"] <= t["scheduled"] + 1e-12).all()
    assert (t["scheduled"] <= t["first_token"] + 1e-12).all() and (t["first_token"] <= t["finish"] + 1e-12).all()
    tool = c["trace"].groupby("program_id")["tool_duration_s"].sum()
    jct = res.programs.set_index("program_id")["jct"]
    assert (jct >= tool.reindex(jct.index) - 1e-9).all()
    kv = res.kv_usage
    assert (kv["pinned_blocks"] <= kv["used_blocks"]).all() and (kv["used_blocks"] <= c["blocks"] - 1).all()
    for k in ("cache_hit_ratio", "cpu_hit_ratio", "mean_kv_usage", "peak_kv_usage"):
        assert 0.0 <= s[k] <= 1.0 + 1e-12, k
    assert s["pinned_block_seconds"] >= 0
    _check_admissions(t)
    # decode stretches (on replicas' own clocks behind the session router) are exact:
    # the same run step by step gives the same tables and summary, to the last bit
    slow = _simulate(c, c["policy"], ff=False)
    pd.testing.assert_frame_equal(res.turns, slow.turns, check_exact=True)
    pd.testing.assert_frame_equal(res.kv_usage, slow.kv_usage, check_exact=True)
    assert res.summary == slow.summary


def _check_admissions(t):
    """Per admission, prompt tokens cached + loaded + computed = the prompt once it is
    prefilled (the last admission always; an earlier one preempted mid-prefill, less);
    the first admission's three are the flat columns; admissions add up to the totals."""
    for row in t.itertuples():
        c, ld, n, prompt = row.admission_cached, row.admission_loaded, row.admission_computed, row.prompt_tokens
        assert row.admissions == len(c) == len(ld) == len(n) >= 1
        assert min(c) >= 0 and min(ld) >= 0 and min(n) >= 0
        assert c[-1] + ld[-1] + n[-1] == prompt, row
        assert all(ci + li + ni <= prompt for ci, li, ni in zip(c, ld, n)), row
        assert (row.cached_tokens, row.loaded_tokens, row.computed_tokens) == (c[0], ld[0], n[0])
        assert (row.cached_tokens_total, row.loaded_tokens_total, row.computed_prompt_tokens) == (sum(c), sum(ld), sum(n))
        assert row.loaded_tokens_total <= row.reloaded_tokens_total


@SETTINGS
@given(configs())
def test_async_stretches_are_exact_under_random_configurations(c):
    """Asynchronous decode stretches (sim/simpy_replica/engine.py _stretch_async: their last step left in
    flight, cut one step later than a synchronous stretch) give step-by-step's tables and
    summary to the last bit."""
    assume(c["cache"] != "radix")  # refused asynchronously
    try:
        fast = _simulate(c, c["policy"], async_scheduling=True)
    except InputError:
        assume(False)
    slow = _simulate(c, c["policy"], ff=False, async_scheduling=True)
    _check_admissions(fast.turns)
    pd.testing.assert_frame_equal(fast.turns, slow.turns, check_exact=True)
    pd.testing.assert_frame_equal(fast.kv_usage, slow.kv_usage, check_exact=True)
    assert fast.summary == slow.summary


# --- wrong types and shapes in input files: a result or one error line, never a traceback ---

junk = st.one_of(st.none(), st.booleans(), st.integers(-10**13, 10**13), st.floats(), st.text(max_size=5),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _one_line(e: Exception) -> None:
    assert "\n" not in str(e)


@SETTINGS
@given(section=st.sampled_from(["engine", "step_time", "model", "pcie"]), key=st.sampled_from(
    ["block_size", "num_gpu_blocks", "max_num_batched_tokens", "enable_chunked_prefill", "c0", "c1", "c5", "w", "p",
     "routed", "routed_share", "num_layers", "dtype_bytes", "bandwidth_GBps", "latency_s"]), value=junk)
def test_profile_fuzz(section, key, value):
    from sim.hardware.profile import load_profile, parse_profile

    raw = json.loads(json.dumps(load_profile("llama3.1-8b-a100-80gb").raw))
    raw[section][key] = value
    try:
        parse_profile(raw, "fuzz")
    except InputError as e:
        _one_line(e)


FIX = os.path.join(os.path.dirname(__file__), "fixtures", "importers")


# Every importer's fixture with one place, down to nested fields, replaced by a value of
# another type or shape, removed, or given a field it lacks: either a valid trace or one
# error line; never a traceback.
IMPORTS = [  # (format, fixture): JSON Lines hold one record a line, else one JSON document
    ("claude-code", "claude_code_session.jsonl"), ("tracelab", "tracelab_good.jsonl"),
    ("llmservingsim", "llmservingsim_sessions.jsonl"), ("mini-swe-agent", "django__django-11099.traj.json"),
    ("openai-chat", "openai_chat_log.jsonl"), ("openai-chat", "openai_chat_log.json"),
    ("continuum-timestamps", "scheduler_timestamps.json"),
]
shapes = st.recursive(junk, lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
                      max_leaves=4)


def _places(x, at=()):
    """Paths to every value inside a JSON document."""
    yield at
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        yield from _places(v, at + (k,))


def _load_fixture(name):
    text = open(os.path.join(FIX, name)).read()
    if name.endswith(".jsonl"):
        return [json.loads(x) for x in text.splitlines() if x.strip()]
    return json.loads(text)


def _get(doc, at):
    for k in at:
        doc = doc[k]
    return doc


@SETTINGS
@given(case=st.sampled_from(IMPORTS), data=st.data())
def test_importer_fuzz(case, data, tmp_path_factory):
    from traces.importers import import_trace

    fmt, name = case
    doc = _load_fixture(name)
    places = list(_places(doc))
    action = data.draw(st.sampled_from(["replace", "remove", "add"]), label="action")
    if action == "add":  # a field the format knows, where it is absent or elsewhere
        keys = sorted({k for at in places if at and isinstance(_get(doc, at[:-1]), dict) for k in [at[-1]]})
        at = data.draw(st.sampled_from([at for at in places if isinstance(_get(doc, at), dict)]), label="object")
        _get(doc, at)[data.draw(st.sampled_from(keys), label="key")] = data.draw(shapes, label="value")
    else:
        at = data.draw(st.sampled_from([at for at in places if at]), label="place")
        parent = _get(doc, at[:-1])
        if action == "remove" and isinstance(parent, dict):
            del parent[at[-1]]
        else:
            parent[at[-1]] = data.draw(shapes, label="value")
    path = tmp_path_factory.mktemp("imp") / name
    path.write_text("\n".join(json.dumps(r) for r in doc) + "\n" if name.endswith(".jsonl") else json.dumps(doc))
    try:
        df, _ = import_trace(fmt, [path])
    except InputError as e:
        _one_line(e)
        assert name in str(e), e  # every refusal names the file
    else:
        assert len(df) > 0
