"""InferCept's ablation switches (benchmarks/infercept_ablation.py): each one changes the
decision it names, the defaults are the code's form, and all of them off is Continuum."""
import math

import numpy as np
import pytest

from conftest import FakeView, linear_profile, random_trace, simulate
from policies.base import FREE, PolicyError, Request, Retention
from policies.infercept import InferceptPolicy
from policies.registry import make_policy

OFF = {"true_tool_time": False, "preserve": "continuum-ttl", "discard": False,
       "unpin_while_running": False, "resume_order": "continuum"}


class View(FakeView):
    def __init__(self, blocks, batch=4, R=1000):
        super().__init__(blocks=blocks)
        self.batch, self.R = batch, R

    def running_tokens(self):
        return self.batch, self.R

    def linear_step(self):
        return 0.01, 0.001

    def offload_enabled(self):
        return False


def req(pid, turn=0, prompt=100, tool_s=None, prog_arrival=0.0, preempted=False):
    r = Request(f"{pid}#{turn}", pid, turn, 0.0, prog_arrival, prompt, 0, False, "t", preempted)
    r.true_tool_duration = tool_s
    return r


def test_defaults_are_the_code_form():
    p = InferceptPolicy()
    assert (p.true_tool_time, p.preserve, p.discard, p.unpin_while_running, p.resume_order) == \
        (True, "until-return", True, True, "infercept")
    assert p.reviews_pins and p.ttl_model is None


def test_true_tool_time_off_uses_the_tool_mean_in_w_p():
    # 'x' holds 10 blocks (C = 160, W_d = 185.6 at a = 1 ms, c = 10 ms, R = 1000, c_h = 380);
    # true tool time 100 s -> W_p = 16000 > W_d: a candidate; the tool's mean 0.5 s -> W_p = 80: kept
    v = View({"x": 10, "y": 100})
    kept = []
    for true in (True, False):
        p = InferceptPolicy(true_tool_time=true)
        p.record_tool_time("t", 0.5)
        p.on_finish(req("x", tool_s=100.0), 0.0, v)
        p.on_finish(req("y", tool_s=100.0), 0.0, v)  # a bigger candidate takes the swap-target slot
        kept.append(p.review_pins(0.0, v))
    assert kept == [["x"], []]


def test_preserve_continuum_ttl_pins_for_eq2_ttl_or_frees():
    v = FakeView({})  # prefill/reload 1 ms per token, T = 0, eta = 1 (cold start)
    p = InferceptPolicy(preserve="continuum-ttl")
    # 10,000 tokens: benefit 10 s -> T_default = ln 10 s (Exp(1 s) tools)
    assert p.on_finish(req("big", prompt=10_000, tool_s=1.0), 5.0, v) == Retention("pin", pytest.approx(math.log(10)))
    assert p.pins["big"].expiry == pytest.approx(5.0 + math.log(10))
    assert p.expired_pins(5.0 + math.log(10) + 1e-9, set()) == ["big"]
    # 100 tokens: benefit 0.1 s < 1 s -> tau* = 0: freed at the finish, not preserved
    assert p.on_finish(req("small", prompt=100, tool_s=1.0), 5.0, v) == FREE and "small" not in p.pins
    # the code's form preserves both until return
    q = InferceptPolicy()
    assert q.on_finish(req("small", prompt=100, tool_s=1.0), 5.0, v) == Retention("pin", math.inf)
    assert q.expired_pins(1e9, set()) == []


def test_preserve_continuum_ttl_learns_as_continuum():
    p, c = InferceptPolicy(preserve="continuum-ttl"), make_policy("continuum")
    v = FakeView({})
    for pol in (p, c):
        for i in range(150):
            pol.record_tool_time("t", 0.01 * i)
        pol.on_schedule(req("a", turn=1), 7.0)  # not served from a pin: T = 7 s
        for n in (2, 3, 5):
            pol.on_program_end(f"done{n}", n, 0.0)
    assert p.ttl_model.T == c.T == 7.0 and p.ttl_model.eta == c.eta
    r = req("z", prompt=3000, tool_s=1.0)
    assert p.on_finish(r, 0.0, v) == c.on_finish(r, 0.0, v) != FREE


def test_discard_off_never_discards():
    v = View({"short": 10, "long": 10, "big": 100})
    for discard, want in ((True, ["long"]), (False, [])):
        p = InferceptPolicy(discard=discard, swap_budget_blocks=150)
        for pid, tool in (("short", 0.5), ("long", 100.0), ("big", 100.0)):
            p.on_finish(req(pid, tool_s=tool), 0.0, v)
        assert p.review_pins(0.0, v) == want
        assert p.swap_targets == (["big"] if discard else [])
        assert p.reviews_pins is discard


def test_unpin_while_running_off_is_continuums_rule():
    assert InferceptPolicy().unpin_while_running is True
    assert make_policy("infercept", unpin_while_running="0").unpin_while_running is False


def test_resume_order_continuum():
    v = View({"a": 1})
    rs = [req("new", turn=0, prog_arrival=0.0), req("ret", turn=2, prog_arrival=1.0),
          req("pre", turn=1, prog_arrival=3.0, preempted=True), req("a", turn=1, prog_arrival=5.0)]
    order = {}
    for o in ("infercept", "continuum"):
        p = InferceptPolicy(resume_order=o)
        p.on_finish(req("a", tool_s=1.0), 0.0, v)  # preserved
        order[o] = [r.program_id for r in sorted(rs, key=lambda r: p.order_key(r, 1.0, v))]
    assert order["infercept"] == ["a", "ret", "pre", "new"]  # preserved, returning/preempted, new
    assert order["continuum"] == ["pre", "a", "new", "ret"]  # preempted, pinned, program arrival


@pytest.mark.parametrize("k, v", [("resume_order", "fifo"), ("preserve", "forever"), ("discard", "maybe")])
def test_bad_switch_values_are_refused(k, v):
    with pytest.raises(PolicyError, match=k):
        make_policy("infercept", **{k: v})


def test_end_to_end_each_switch_matters_and_all_off_is_continuum():
    tr = random_trace(np.random.default_rng(0), 30, max_turns=8)
    arr = np.sort(np.random.default_rng(1).uniform(0, 6, 30))
    p = linear_profile(blocks=130, c2=1e-6, c4=1e-5)

    def run(name, **kw):
        return simulate(tr, make_policy(name, **kw), p, arr).summary

    base = run("infercept")["mean_jct"]
    for k, v in OFF.items():
        assert run("infercept", **{k: v})["mean_jct"] != pytest.approx(base, rel=1e-3), k
    off, cont = run("infercept", **OFF), run("continuum")
    assert off["mean_jct"] == cont["mean_jct"] and off["cache_hit_ratio"] == cont["cache_hit_ratio"]
    assert off["mean_jct"] != pytest.approx(base, rel=1e-3)
