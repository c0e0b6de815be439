"""InferCept's preserve / discard / swap decisions and ThunderAgent's pause / resume
controller on constructed cases (hand-computed), and both end to end."""
import math

import numpy as np
import pytest

from conftest import FakeView, linear_profile, random_trace, simulate
from policies.base import Request, Retention
from policies.infercept import InferceptPolicy, discard_waste
from policies.registry import make_policy
from policies.thunderagent import ACTING, PAUSED, REASONING, ThunderAgentController


class View(FakeView):
    """FakeView plus the optional facts InferCept reads (policies.base.OffloadView)."""

    def __init__(self, blocks, batch=4, R=1000, offload=True, **kw):
        super().__init__(blocks=blocks, **kw)
        self.batch, self.R, self.offload = batch, R, offload

    def running_tokens(self):
        return self.batch, self.R

    def linear_step(self):
        return 0.01, 0.001

    def offload_enabled(self):
        return self.offload

    def reload_time(self, tokens):
        return 1e-4 + tokens * 1e-5


def req(pid, turn=0, arrival=0.0, prog_arrival=0.0, tool_s=None, last=False, preempted=False):
    r = Request(f"{pid}#{turn}", pid, turn, arrival, prog_arrival, 100, 0, last, "t", preempted)
    r.true_tool_duration = tool_s
    return r


# --- InferCept -------------------------------------------------------------------------------
def test_discard_waste_hand_computed():
    # a = 1 ms/token, c = 10 ms, S = 384, c_h = 380, R = 1000
    # C = 160: n = 0, last = 160 -> 0.001*160*1160 = 185.6
    assert discard_waste(160, 380, 1000, 0.001, 0.01, 384) == pytest.approx(185.6)
    # C = 1600: n = 4, f_s = .394 -> .394*5*4/2*380 = 1497.2; f_ch*n*R = .38*4*1000 = 1520;
    # last = 80 -> .001*80*1080 = 86.4
    assert discard_waste(1600, 380, 1000, 0.001, 0.01, 384) == pytest.approx(1497.2 + 1520 + 86.4)


def paused(p, view, now=0.0):
    """short: 10 blocks, tool 0.5 s; long: 10 blocks, 100 s; big: 100 blocks, 100 s."""
    for pid, tool in (("short", 0.5), ("long", 100.0), ("big", 100.0)):
        assert p.on_finish(req(pid, tool_s=tool), now, view) == Retention("pin", math.inf)
    return p


def test_preserve_discard_swap_decisions():
    v = View({"short": 10, "long": 10, "big": 100})
    p = paused(InferceptPolicy(swap_budget_blocks=150), v)
    assert set(p.pins) == {"short", "long", "big"}  # every pause starts preserved
    # W_p: short .5*160 = 80 < W_d 185.6 -> preserve; long 100*160 = 16000 > 185.6 and
    # big 160000 > 3103.6 -> both candidates; big has the largest W_d -> swap target
    assert p.review_pins(0.0, v) == ["long"]
    assert p.swap_targets == ["big"] and p.swap_left == 150
    assert p.decisions["discard"] == 1 and p.decisions["preserve"] == 3
    # later, remaining time shrinks: at t = 99.9 big's W_p = .1*1600 = 160 < W_d -> kept
    assert p.review_pins(99.9, v) == [] and p.swap_targets == []


def test_a_steady_review_drops_nothing_while_time_passes_and_the_batch_decodes():
    """review_steady (the engine's licence to fast-forward decode stretches with pins held):
    after a review it answers True, no later review drops a pin while time passes and the
    running calls' KV grows; two swap targets of different sizes make it False."""
    rng = np.random.default_rng(3)
    steady = 0
    for _ in range(300):
        blocks = {f"p{i}": int(rng.choice([10, 10, 20, 40, 100])) for i in range(int(rng.integers(1, 6)))}
        v = View(dict(blocks), batch=int(rng.integers(1, 64)), R=int(rng.integers(0, 5000)))
        p = InferceptPolicy()
        for pid in blocks:
            p.on_finish(req(pid, tool_s=float(rng.exponential(20.0))), 0.0, v)
        now = float(rng.uniform(0, 10))
        for pid in p.review_pins(now, v):
            p.pin_released(pid, now, "discard")
        if not p.review_steady():
            assert len({blocks[t] for t in p.swap_targets}) > 1
            continue
        steady += 1
        R = v.R
        for _ in range(20):  # later steps: time passes, the decoding calls' KV grows
            now += float(rng.exponential(0.5))
            v.R = R = R + int(rng.integers(0, 200))
            assert p.review_pins(now, v) == []
    assert steady > 100
    two = InferceptPolicy(a_ms=0.0, c_ms=10.0)  # a = 0: W_d depends only on the chunks, so 10 and 20 blocks tie
    v = View({"a": 10, "b": 20}, batch=4, R=0)
    for pid in "ab":
        two.on_finish(req(pid, tool_s=100.0), 0.0, v)
    assert two.review_pins(0.0, v) == [] and sorted(two.swap_targets) == ["a", "b"] and not two.review_steady()


def test_swap_within_budget_else_not():
    v = View({"short": 10, "long": 10, "big": 100})
    p = paused(InferceptPolicy(swap_budget_blocks=150), v)
    p.review_pins(0.0, v)
    assert p.unpin_victims(50, v) == ["big"]
    assert p.release_action("big", "victim") == "offload" and p.swap_left == 50 and "big" in p.swapped
    assert p.release_action("short", "victim") == "free"  # not a swap target
    tight = paused(InferceptPolicy(swap_budget_blocks=50), v)
    tight.review_pins(0.0, v)
    assert tight.unpin_victims(50, v) == []  # big does not fit the budget, and calls run
    assert tight.release_action("big", "victim") == "free"
    idle = View({"short": 10, "long": 10, "big": 100}, batch=0, R=0)
    assert tight.unpin_victims(50, idle) != []  # nothing runs: the no-deadlock fallback


def test_budget_from_the_profile():
    v = View({})
    p = InferceptPolicy()
    p.review_pins(0.0, v)  # no pins: nothing to decide, but the budget is set
    # one saturated step: .01 + .001*384 = .394 s; a block (16 tokens) moves in 1.6e-4 s
    assert p.swap_left == int(0.394 / 1.6e-4)
    v.offload = False
    p.review_pins(0.0, v)
    assert p.swap_left == 0


def test_resume_order_preserved_swapped_returning_new():
    v = View({"a": 1, "b": 1})
    p = InferceptPolicy()
    p.on_finish(req("a", prog_arrival=5.0, tool_s=1.0), 0.0, v)  # preserved
    p.swapped.add("b")
    rs = [req("new", turn=0, prog_arrival=0.0), req("ret", turn=2, prog_arrival=1.0),
          req("b", turn=1, prog_arrival=4.0), req("a", turn=1, prog_arrival=5.0)]
    assert [r.program_id for r in sorted(rs, key=lambda r: p.order_key(r, 1.0, v))] == ["a", "b", "ret", "new"]


def test_remaining_time_without_the_oracle_is_the_tool_mean():
    p = InferceptPolicy(true_tool_time=False)
    p.record_tool_time("t", 2.0)
    p.record_tool_time("t", 4.0)
    p.on_finish(req("x", tool_s=100.0), 10.0, View({}))
    assert p.tool_end["x"] == 13.0


# --- ThunderAgent ------------------------------------------------------------------------------
def ctl():
    return ThunderAgentController(replicas=2, capacity_tokens=1000)  # reserve 100, interval 5 s


def test_new_programs_admitted_on_fewest_active_tokens_else_queued():
    c = ctl()
    assert c.on_new("a", 300, 0, 0.0) == 0  # tie -> lowest index; used(0) = 400
    assert c.on_new("b", 200, 0, 0.0) == 1
    assert c.on_new("c", 500, 0, 0.0) == 1  # both have room for 600; r1 has fewer tokens
    assert c.used(1) == 200 + 500 + 2 * 100
    assert c.on_new("d", 700, 0, 0.0) is None  # no replica has 800 free
    assert c.on_new("e", 10, 0, 0.0) is None  # d is queued: e queues behind it
    # round: NEW group by ascending tokens while the sum fits free capacity 600 + 100:
    # e (110) fits, d (800) does not; e goes to the replica with most free (r0)
    assert c.tick(5.0) == [("e", 0)]
    assert c.progs["d"].state == "new" and c.progs["e"].state == REASONING


def test_over_capacity_pauses_acting_smallest_first_then_marks_reasoning():
    c = ThunderAgentController(replicas=1, capacity_tokens=1000)
    for pid, tok in (("a", 200), ("b", 100), ("c", 150)):
        assert c.on_new(pid, tok, 0, 0.0) == 0
    c.on_finish("a", 400, False, 1.0)  # acting, 400
    c.on_finish("b", 300, False, 1.0)  # acting, 300
    # used = 400 + 300 + 150 + 300 = 1150 > 1000: pause b (smallest acting) -> 750
    assert c.tick(5.0) == []
    assert c.progs["b"].state == PAUSED and c.progs["a"].state == ACTING
    c.progs["c"].tokens = 900  # grown: used = 400 + 900 + 200 = 1500
    c.tick(10.0)  # pause a (-> 1000, fits) and nothing else
    assert c.progs["a"].state == PAUSED and not c.progs["c"].pause_after
    c.progs["c"].tokens = 950  # 1050 > 1000, no acting left: mark c
    c.tick(15.0)
    assert c.progs["c"].pause_after and c.progs["c"].state == REASONING
    c.on_finish("c", 960, False, 16.0)  # its request finished: now paused
    assert c.progs["c"].state == PAUSED


def test_resume_groups_in_order_while_they_fit_and_forced_resume():
    c = ThunderAgentController(replicas=1, capacity_tokens=1000)
    assert c.on_new("x", 300, 0, 0.0) == 0 and c.on_new("y", 250, 0, 0.0) == 0
    c.on_finish("x", 700, False, 1.0)  # acting: used = 800 + 350 = 1150
    assert c.tick(5.0) == [] and c.progs["x"].state == PAUSED  # 800 does not fit 650 free
    assert c.on_ready("x", 700, 6.0) is None  # its tool returned: the request is held
    assert c.on_new("n", 50, 0, 6.0) is None  # x is paused: n queues
    # queue: x (ready, group REASONING) before n (NEW); x needs 800 > 650: strict order, none
    assert c.tick(10.0) == []
    c.on_finish("y", 260, True, 11.0)  # y ends: 1000 free
    assert c.tick(15.0) == [("x", 0), ("n", 0)]  # 800 + 150 fit; placed largest first
    assert c.progs["x"].state == REASONING


def test_forced_resume_after_1800_s_and_no_idle_cluster():
    c = ThunderAgentController(replicas=1, capacity_tokens=1000)
    assert c.on_new("a", 900, 0, 0.0) == 0
    assert c.on_new("z", 500, 0, 0.0) is None
    assert c.tick(5.0) == []
    assert c.tick(1800.0) == [("z", 0)] and c.stats["forced"] == 1
    big = ThunderAgentController(replicas=1, capacity_tokens=1000)
    assert big.on_new("huge", 950, 0, 0.0) is None  # 1050 never fits
    assert big.tick(5.0) == [("huge", 0)]  # ours: nothing active anywhere -> the head goes


@pytest.mark.parametrize("replicas", [1, 2])
def test_thunderagent_end_to_end_conserves_calls(replicas):
    tr = random_trace(np.random.default_rng(5), 20)
    arr = np.sort(np.random.default_rng(6).uniform(0, 4, 20))
    p = linear_profile(blocks=140, c2=1e-6, c4=1e-5)
    res = simulate(tr, make_policy("thunderagent", interval="0.5"), p, arr, replicas=replicas)
    assert len(res.turns) == len(tr) and not res.turns.duplicated(["program_id", "turn"]).any()
    assert res.summary["router"] == "thunderagent-proxy"
    # 140 blocks for 20 programs: the proxy must pause some; every program it held
    # (paused, or queued on arrival) is resumed exactly once, or calls would be lost
    proxy = res.summary["proxy"]
    assert proxy["paused"] > 0 and proxy["resumed"] > 0
    assert proxy["resumed"] == proxy["paused"] + proxy["queued"]


def test_infercept_end_to_end_swaps_with_a_cpu_tier():
    tr = random_trace(np.random.default_rng(7), 30, max_turns=8)
    arr = np.sort(np.random.default_rng(8).uniform(0, 6, 30))
    p = linear_profile(blocks=130, c2=1e-6, c4=1e-5)
    res = simulate(tr, "infercept", p, arr, offload="cpu:64MiB@0.05")
    d = res.summary["decisions"]
    assert d["preserve"] == int((~res.turns["is_last"]).sum())
    assert len(res.turns) == len(tr)
    # 130 blocks under 30 programs: some preserved contexts must go to the CPU tier
    # instead of being freed, and some must come back from it
    assert d["swap"] > 0 and res.summary["tiers"]["cpu"]["bytes_written"] > 0
    assert res.summary["offload_loads"] > 0
