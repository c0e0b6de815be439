"""rebuild-priced-ttl: the priced TTL by hand, when it pins, for how long, when it frees."""
import json

import numpy as np
import pytest

from conftest import FakeView
from policies.base import FREE, OFFLOAD, Action, PolicyError, Release, Request, Retention
from policies.rebuild_priced_ttl import RebuildPricedTTLPolicy, priced_ttl
from policies.registry import make_policy

S = [0.1, 0.2, 1.0, 5.0]  # a tool's observed durations


def req(pid="p", turn=1, prog_arrival=0.0, tokens=1000, tool="t", last=False, true=None):
    r = Request(f"{pid}-{turn}", pid, turn, 0.0, prog_arrival, tokens, 0, last, tool)
    r.true_tool_duration = true
    return r


def policy(samples=S, tool="t", **kw):
    p = RebuildPricedTTLPolicy(**kw)
    for s in samples:
        p.record_tool_time(tool, s)
    return p


# value(tau) = P(T <= tau) * B - E[min(T, tau)] over S:
#   tau   P     E[min]                    B = 2            B = 0.3    B = 10
#   0.1   1/4   (0.1 + 3*0.1)/4 = 0.1     0.5 - 0.1 = 0.4  -0.025     2.4
#   0.2   2/4   (0.3 + 2*0.2)/4 = 0.175   0.825            -0.025     4.825
#   1.0   3/4   (1.3 + 1*1.0)/4 = 0.575   0.925 (max)      -0.35      6.925
#   5.0   1     6.3/4 = 1.575             0.425            -1.275     8.425 (max)
@pytest.mark.parametrize("benefit, ttl", [(2.0, 1.0), (0.3, None), (10.0, 5.0), (0.0, None)])
def test_priced_ttl_hand_worked(benefit, ttl):
    assert priced_ttl(np.array(S), benefit) == ttl


def test_charging_the_whole_ttl_would_choose_differently():
    from policies.continuum import best_ttl

    # Eq. 2's charge (tau, not E[min]) at B = 2: 0.5-0.1=0.4, 1-0.2=0.8, 1.5-1=0.5, 2-5 < 0 -> 0.2;
    # the memory actually held makes 1.0 pay (0.925 > 0.825): the rule is not Continuum's.
    assert best_ttl(np.array(S), 2.0) == 0.2 and priced_ttl(np.array(S), 2.0) == 1.0


def test_pins_for_the_priced_ttl_plus_slack():
    p = policy(min_samples=4, kappa=2.0)  # B = 2 * 1000 tokens * 1 ms = 2 s
    v = FakeView(per_token=0.001)
    assert p.on_finish(req(pid="a", tokens=1000), 10.0, v) == Retention(Action.PIN, 1.1)
    assert p.pins["a"].expiry == pytest.approx(11.1)
    assert p.expired_pins(11.0, set()) == [] and p.expired_pins(11.2, set()) == ["a"]
    assert p.expired_pins(11.2, {"a"}) == []  # its next call waits: kept


def test_frees_when_no_ttl_pays_and_demotes_with_a_tier():
    v = FakeView(per_token=0.001)
    p = policy(min_samples=4, kappa=0.3)  # B = 0.3 s: every value < 0
    assert p.on_finish(req(pid="a", tokens=1000), 0.0, v) == OFFLOAD  # to the CPU tier (no tier: freed)
    assert "a" not in p.pins
    assert policy(min_samples=4, kappa=0.3, demote=False).on_finish(req(tokens=1000), 0.0, v) == FREE
    assert p.release_action("x", Release.EXPIRED) == Action.OFFLOAD
    assert policy(demote=False).release_action("x", Release.EXPIRED) == Action.FREE


def test_a_longer_context_is_worth_a_longer_pin():
    p = policy(min_samples=4, kappa=0.3)
    v = FakeView(per_token=0.001)
    assert p.on_finish(req(pid="short", tokens=1000), 0.0, v) == OFFLOAD  # B = 0.3
    assert p.on_finish(req(pid="long", tokens=10000), 0.0, v) == Retention(Action.PIN, 1.1)  # B = 3: tau 1.0 (1.675)
    assert p.on_finish(req(pid="huge", tokens=40000), 0.0, v) == Retention(Action.PIN, 5.1)  # B = 12: tau 5.0


def test_few_samples_use_every_tool_and_none_pins_across_the_step():
    v = FakeView(per_token=0.001)
    p = RebuildPricedTTLPolicy(kappa=2.0, slack=0.1)
    assert p.on_finish(req(pid="a"), 0.0, v) == Retention(Action.PIN, 0.1)  # nothing seen yet
    p = policy(tool="other", min_samples=4, kappa=2.0)  # 'other' has S; 't' has nothing
    assert p.on_finish(req(pid="b", tool="t"), 0.0, v) == Retention(Action.PIN, 1.1)  # the global S
    assert p.on_finish(req(pid="c", tool=None), 0.0, v) == Retention(Action.PIN, 1.1)
    p.record_tool_time("t", 50.0)
    p.min_samples = 1  # now 't' alone: S = [50] -> B = 2 < 50: free
    assert p.on_finish(req(pid="d", tool="t"), 0.0, v) == OFFLOAD


def test_last_step_is_never_pinned_and_tool_times_come_from_arrivals():
    p = RebuildPricedTTLPolicy(kappa=2.0)
    v = FakeView()
    assert p.on_finish(req(pid="a", last=True), 0.0, v) == FREE and not p.pins
    p.on_finish(req(pid="b", turn=0, tool="sleep"), 1.0, v)
    p.on_arrival(req(pid="b", turn=1), 6.0)
    assert list(p.samples["sleep"].values) == [5.0] and list(p._all.values) == [5.0]


def test_never_reads_the_future():
    v = FakeView(per_token=0.001)
    a, b = policy(min_samples=4, kappa=2.0), policy(min_samples=4, kappa=2.0)
    assert a.on_finish(req(pid="x", true=0.01), 0.0, v) == b.on_finish(req(pid="x", true=500.0), 0.0, v)


def test_order_victims_and_preemption_are_the_forks():
    p = policy(min_samples=4, kappa=2.0)
    v = FakeView(blocks={"p1": 3, "p2": 3, "p3": 3}, per_token=0.001)
    p.on_finish(req(pid="p1", prog_arrival=5.0, tokens=1000), 0.0, v)  # expiry 1.1
    p.on_finish(req(pid="p2", prog_arrival=1.0, tokens=40000), 0.0, v)  # expiry 5.1
    p.on_finish(req(pid="p3", prog_arrival=2.0, tokens=40000), 1.0, v)  # expiry 6.1
    rs = [req(pid="old", prog_arrival=0.5), req(pid="p1", prog_arrival=5.0), req(pid="new", prog_arrival=9.0)]
    assert [r.program_id for r in sorted(rs, key=lambda r: p.order_key(r, 2.0, v))] == ["p1", "old", "new"]
    assert p.unpin_while_running is False  # pins go to the queue head only in a deadlock
    assert p.unpin_victims(4, v, exclude="p3") == ["p2", "p1"]  # latest expiry first, head's own kept
    assert p.unpin_victims(3, v) == ["p3"]
    run = [req(pid="a", prog_arrival=1.0), req(pid="b", prog_arrival=3.0, last=True), req(pid="c", prog_arrival=2.0)]
    assert p.preemption_victim(run, v).program_id == "c"  # latest non-last program


def test_registry_parameters_are_checked():
    assert make_policy("rebuild-priced-ttl", kappa="6").kappa == 6.0
    for bad in ({"kappa": "0"}, {"slack": "-1"}, {"min_samples": "0"}):
        with pytest.raises(PolicyError):
            make_policy("rebuild-priced-ttl", **bad)


@pytest.mark.parametrize("offload", [None, "cpu:10GiB"])
def test_sim_run_finishes_every_call_once(tmp_path, offload):
    import pandas as pd

    from sim.cli import main
    from traces.schema import read_trace

    out = tmp_path / "r"
    args = ["run", "--trace", "swebench", "--policy", "rebuild-priced-ttl", "--programs", "30", "--jps", "0.5",
            "--num-gpu-blocks", "3000", "--out", str(out), "--no-progress"]
    assert main(args + (["--offload", offload] if offload else [])) == 0
    trace, _ = read_trace("swebench")
    keep = trace["program_id"].drop_duplicates().iloc[:30]
    turns = pd.read_parquet(out / "turns.parquet")
    assert len(turns) == len(trace[trace["program_id"].isin(keep)])
    assert not turns.duplicated(["program_id", "turn"]).any()
    s = json.loads((out / "summary.json").read_text())
    assert s["policy"] == "rebuild-priced-ttl" and s["programs"] == 30 and s["pins"] > 0
