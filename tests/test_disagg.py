"""Prefill/decode disaggregation (`--disagg xPyD`, sim/cluster/disagg.py): a call's time is its
prefill + KV transfer + decode, hand-computed from the profile's step model; Dynamo's
conditional disaggregation sends short (or well cached) prefills to the decode replica;
every call finishes once and no block leaks on either kind of replica; bad specs are one
line and exit 2."""
import json

import pytest

from conftest import linear_profile, make_trace, simulate
from sim.cli import main
from sim.run.config import PolicyConfig, SimConfig, WorkloadConfig, EngineLimits, ClusterConfig, build_run, execute
from sim.cluster.disagg import DEFAULT_LINK, Disagg, Link, _links, find_link, parse_disagg
from agentsim.errors import InputError

BS = 16
KV = 2 * 1 * 1 * 64 * 2 * BS  # linear_profile's KV bytes per block (1 layer, 1 KV head, head_dim 64, 2 bytes)
SLOW = Link("slow", bandwidth=KV * 100.0, latency=0.05)  # 100 blocks/s: the transfer shows in the times


def profile():
    return linear_profile(c0=0.01, c1=1e-4, c2=1e-8, c4=1e-6, c5=2e-8, blocks=1000)


def run(trace, arrivals, policy="vllm", disagg=Disagg(1, 1, SLOW), **kw):
    return simulate(trace, policy, profile(), arrivals, disagg=disagg, **kw)


def prefill_steps(st, n, cached=0):
    """One prefill chunk of n tokens after `cached` tokens already in KV (the step model's
    terms: q*k, k, q*cached with k = cached + n)."""
    k = cached + n
    return st(n, 1, float(n) * k, float(k), float(n) * cached)


def decode_steps(st, context, n):
    """n decode steps, the first at `context` tokens of context (its KV) + 1."""
    return sum(st(1, 1, float(k), float(k), float(k - 1)) for k in range(context + 1, context + n + 1))


def remote_call(st, prompt, out, p_cached=0, d_cached=0):
    """(prefill, transfer, decode) of a remotely prefilled call on 1P1D over SLOW: the
    prefill replica computes past its prefix hit, the decode replica receives the full
    blocks it lacks, computes the last partial block (sampling the first token) and
    decodes the rest."""
    full = (prompt - 1) // BS
    prefill = prefill_steps(st, prompt - p_cached, p_cached)
    transfer = SLOW.latency + (full - d_cached // BS) * KV / SLOW.bandwidth
    decode = prefill_steps(st, prompt - full * BS, full * BS) + decode_steps(st, prompt, out - 1)
    return prefill, transfer, decode


def test_one_call_is_prefill_plus_transfer_plus_decode():
    p = profile()
    st = p.step_time
    res = run(make_trace([[(2000, 5, None, None)]]), [0.0])
    prefill, transfer, decode = remote_call(st, 2000, 5)
    assert prefill == p.prefill_time(2000)  # one chunk: the profile's prefill time
    t = res.turns.iloc[0]
    assert res.programs["jct"].iloc[0] == pytest.approx(prefill + transfer + decode, rel=1e-12)
    first = prefill + transfer + prefill_steps(st, 2000 - 124 * BS, 124 * BS)
    assert t["first_token"] == pytest.approx(first, rel=1e-12)
    assert t["scheduled"] == 0.0 and t["cached_tokens"] == 0 and t["replica"] == 1
    assert t["computed_prompt_tokens"] == 2000 + 16  # the prefill, and the last block again on the decode replica
    d = res.summary["disaggregation"]
    assert (d["remote_prefills"], d["local_prefills"], d["transfer_blocks"]) == (1, 0, 124)
    assert d["transfer_bytes"] == 124 * KV and d["transfer_s"] == pytest.approx(transfer, rel=1e-12)
    assert [(r["role"], r.get("prefills")) for r in res.summary["per_replica"]] == [("prefill", 1), ("decode", None)]
    assert res.summary["replicas"] == 2


def test_the_default_link_prices_the_transfer():
    res = run(make_trace([[(2000, 5, None, None)]]), [0.0], disagg="1P1D")
    link = find_link(DEFAULT_LINK)
    assert res.summary["disaggregation"]["link"] == "rdma-ndr" == DEFAULT_LINK == _links()["default"]
    assert res.summary["disaggregation"]["transfer_s"] == link.time(124 * KV)
    assert link.bandwidth == 50e9 and link.latency == 1e-5


def test_link_classes_have_figures_and_sources():
    for name, c in _links()["classes"].items():
        assert c["bandwidth_GBps"] > 0 and c["latency_s"] > 0, name
        assert c["sources"]["bandwidth_GBps"] and c["sources"]["latency_s"], name
        assert find_link(name).bandwidth == c["bandwidth_GBps"] * 1e9


def test_a_short_prefill_runs_on_the_decode_replica_as_without_disaggregation():
    tr = make_trace([[(500, 5, None, None)]])  # 500 uncached tokens <= 1000: local
    res = run(tr, [0.0])
    p = profile()
    plain = simulate(tr, "vllm", p, [0.0])
    assert res.programs["jct"].iloc[0] == plain.programs["jct"].iloc[0]
    assert res.summary["disaggregation"]["local_prefills"] == 1 and res.summary["per_replica"][0]["prefills"] == 0


@pytest.mark.parametrize("policy", ["vllm", "continuum"])
def test_second_turn_local_or_remote_by_dynamos_rule(policy):
    # A's second turn adds 55 tokens to a context its decode replica holds: local.
    # B's adds 1505 (> 1000): remote; the prefill replica hits B's first prompt, and only
    # the blocks the decode replica lacks cross the link. B starts after A is done.
    tr = make_trace([[(2000, 5, "ls", 1.0), (50, 5, None, None)], [(2000, 5, "ls", 1.0), (1500, 5, None, None)]])
    res = run(tr, [0.0, 100.0], policy=policy)
    st = profile().step_time
    d = res.summary["disaggregation"]
    assert (d["remote_prefills"], d["local_prefills"]) == (3, 1)
    t = res.turns.set_index(["program_id", "turn"])
    lat = t["finish"] - t["arrival"]
    first = sum(remote_call(st, 2000, 5))
    assert lat["p000", 0] == pytest.approx(first, rel=1e-12) and lat["p001", 0] == pytest.approx(first, rel=1e-12)
    # A1: prompt 2055, the decode replica holds 125 full blocks (2000 tokens): 55 computed there
    assert lat["p000", 1] == pytest.approx(prefill_steps(st, 55, 2000) + decode_steps(st, 2055, 4), rel=1e-12)
    assert (t.loc[("p000", 1), "cached_tokens"], t.loc[("p000", 1), "computed_prompt_tokens"]) == (2000, 55)
    # B1: prompt 3505; prefill replica hit 2000, decode replica holds 2000: 219 - 125 = 94 blocks cross
    assert lat["p001", 1] == pytest.approx(sum(remote_call(st, 3505, 5, p_cached=2000, d_cached=2000)), rel=1e-12)
    assert (t.loc[("p001", 1), "cached_tokens"], t.loc[("p001", 1), "computed_prompt_tokens"]) == (2000, 1505 + 1)
    assert d["transfer_blocks"] == 124 + 124 + 94


def test_the_prefill_queue_limit_keeps_prefills_local():
    tr = make_trace([[(2000, 5, None, None)] for _ in range(4)])
    res = run(tr, [0.0] * 4, disagg=Disagg(1, 1, SLOW, max_prefill_queue=1))
    d = res.summary["disaggregation"]
    assert d["remote_prefills"] + d["local_prefills"] == 4 and 1 <= d["remote_prefills"] < 4
    res = run(tr, [0.0] * 4, disagg=Disagg(1, 1, SLOW, max_local_prefill=5000))
    assert res.summary["disaggregation"]["remote_prefills"] == 0


@pytest.mark.parametrize("policy", ["vllm", "continuum"])
@pytest.mark.parametrize("spec, router", [("1P1D", None), ("2P1D", None), ("1P2D", "session")])
def test_end_to_end_on_the_bundled_trace(policy, spec, router):
    # execute checks the end itself (sim/simulate.check_end): every call finished
    # exactly once, nothing waits, runs, is pinned or is in transfer, no block leaked in
    # any replica's pool, prefill or decode
    c = SimConfig(workload=WorkloadConfig(trace="swebench", programs=6, jps=1.0), policy=PolicyConfig(name=policy),
                  engine=EngineLimits(num_gpu_blocks=3000),
                  cluster=ClusterConfig(disagg=spec, router=router, disagg_local_prefill=256))
    run = build_run(c)
    assert run.config.cluster.replicas == sum(parse_disagg(spec))
    res = execute(run)
    t = res.turns
    assert len(t) == len(run.trace) and not t.duplicated(["program_id", "turn"]).any()
    d = res.summary["disaggregation"]
    assert d["remote_prefills"] + d["local_prefills"] == len(t) and d["remote_prefills"] > 0
    roles = [r["role"] for r in res.summary["per_replica"]]
    x, y = parse_disagg(spec)
    assert roles == ["prefill"] * x + ["decode"] * y
    assert set(t["replica"]) <= set(range(x, x + y))
    assert sum(r["prefills"] for r in res.summary["per_replica"][:x]) == d["remote_prefills"]


def test_disaggregated_stretches_are_exact():
    c = SimConfig(workload=WorkloadConfig(trace="swebench", programs=5, jps=1.0), policy=PolicyConfig(name="continuum"),
                  engine=EngineLimits(num_gpu_blocks=2500), cluster=ClusterConfig(disagg="2P2D", router="session",
                                                                               disagg_local_prefill=256))
    fast = execute(build_run(c))
    slow = execute(build_run(c.model_copy(update={"engine": c.engine.model_copy(update={"fast_forward": False})})))
    assert fast.summary == slow.summary
    assert fast.turns.equals(slow.turns)


def test_off_changes_nothing():
    tr = make_trace([[(2000, 5, "ls", 0.5), (300, 5, None, None)]])
    p = profile()
    plain = simulate(tr, "continuum", p, [0.0])
    off = run(tr, [0.0], policy="continuum", disagg=None)
    assert off.summary == plain.summary and "disaggregation" not in off.summary
    assert "role" not in off.summary["per_replica"][0]


def test_resolved_config_reruns_the_same():
    c = SimConfig(workload=WorkloadConfig(trace="swebench", programs=3, jps=1.0),
                  cluster=ClusterConfig(disagg="1p1d", disagg_link="NVLINK4"))
    first = build_run(c)
    assert (first.config.cluster.disagg, first.config.cluster.disagg_link, first.config.cluster.replicas) == ("1P1D", "nvlink4", 2)
    again = build_run(SimConfig.model_validate(json.loads(first.config.to_json())))
    assert again.config == first.config


def test_parse_disagg():
    assert parse_disagg("1P1D") == (1, 1) and parse_disagg(" 2p3d ") == (2, 3)
    assert parse_disagg(None) is None and parse_disagg("off") is None
    for bad in ("1P", "P1D", "1D1P", "1.5P1D", "-1P1D", "0P1D", "1P0D", "5000P1D"):
        with pytest.raises(InputError):
            parse_disagg(bad)


@pytest.mark.parametrize("argv, fragment", [
    (["--disagg", "1P"], "'1P' is not xPyD"),
    (["--disagg", "1P1Dx"], "is not xPyD"),
    (["--disagg", "0P1D"], "needs at least 1 prefill and 1 decode replica"),
    (["--disagg", "1P0D"], "needs at least 1 prefill and 1 decode replica"),
    (["--disagg", "2P1D", "--replicas", "2"], "drop --replicas or give 3"),
    (["--disagg", "1P1D", "--replicas", "4"], "drop --replicas or give 2"),
    (["--disagg", "1P1D", "--disagg-link", "pigeon"], "is not a link class"),
    (["--disagg", "1P1D", "--disagg-local-prefill", "-1"], "--disagg-local-prefill"),
])
def test_cli_bad_disagg_is_one_line(argv, fragment, capsys):
    code = main(["run", "--programs", "2", "--no-progress"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1, err


def test_cli_disaggregated_run(capsys):
    assert main(["run", "--trace", "swebench", "--programs", "4", "--jps", "0.5", "--num-gpu-blocks", "4000",
                 "--disagg", "1P1D", "--disagg-local-prefill", "256", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "disaggregation" in out and "1P1D over rdma-ndr" in out and "prefill," in out


def test_pins_live_on_the_decode_replica():
    # prefill dear enough (2 s for the context) that Continuum pins across a 0.2 s tool
    p = linear_profile(c0=0.01, c1=1e-3, blocks=1000)
    tr = make_trace([[(2000, 5, "ls", 0.2), (50, 5, None, None)]])
    res = simulate(tr, "continuum", p, [0.0], disagg=Disagg(1, 1, SLOW))
    assert res.summary["pins_hit"] == 1
    d = res.summary["disaggregation"]
    assert (d["remote_prefills"], d["local_prefills"]) == (1, 1)
    assert res.turns.set_index("turn").loc[1, "cached_tokens"] == 2000
