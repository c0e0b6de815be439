"""ContextServe (policies/contextserve.py): the three branches, the NIG posterior by hand,
the fallback to Continuum's TTL, bad input, and an end-to-end run on the bundled trace."""
import json
import math

import numpy as np
import pytest

from conftest import FakeView
from policies.base import FREE, PolicyError, Request, Retention
from policies.contextserve import FAST, NIG, SLOW, UNCERTAIN, ContextServePolicy
from policies.continuum import ContinuumPolicy
from policies.registry import make_policy


def req(tool, pid="p", tokens=2200, last=False):
    return Request(f"{pid}-1", pid, 1, 0.0, 0.0, tokens, 0, last, tool)


def fed(policy, tool, seconds):
    for t in seconds:
        policy.record_tool_time(tool, t)
    return policy


# --- the three branches ------------------------------------------------------------------
def test_each_branch_taken():
    p = fed(ContextServePolicy(min_samples=3), "python", [0.2, 0.3, 0.25])
    v = FakeView()  # B = T*eta + PrefillReload = 0 + 2.2 s
    assert p.on_finish(req("ls", "a"), 10.0, v) == Retention("pin", 2.0)  # FAST: the fixed TTL
    assert p.on_finish(req("pytest", "b"), 10.0, v) == FREE  # SLOW: free at once
    r = p.on_finish(req("python", "c"), 10.0, v)  # UNCERTAIN: the NIG quantile
    assert r.action == "pin" and r.ttl == pytest.approx(p.nig_ttl("python")) and 0.25 < r.ttl < 2.2
    assert set(p.pins) == {"a", "c"} and p.pins["a"].expiry == 12.0
    assert dict(p.ttl_source) == {"fast": 1, "slow": 1, "nig": 1}
    # the fixed TTL is a parameter; 0 means FAST frees too
    assert ContextServePolicy(fast_ttl=0.5).retention(req("cat"), 0.0, v) == Retention("pin", 0.5)
    assert ContextServePolicy(fast_ttl=0.0).retention(req("cat"), 0.0, v) == FREE


@pytest.mark.parametrize("tool, cls", [
    ("ls", FAST), ("git", FAST), ("git status", FAST), ("git status -s", FAST), ("cat a.py", FAST),
    ("pytest", SLOW), ("pip", SLOW), ("pip install numpy", SLOW), ("make -j4", SLOW), ("docker build .", SLOW),
    ("git commit -m x", UNCERTAIN), ("pip list", UNCERTAIN), ("python", UNCERTAIN), ("grep -rn x .", UNCERTAIN),
    ("lsof", UNCERTAIN), ("makefile", UNCERTAIN), (None, UNCERTAIN), ("   ", UNCERTAIN),
])
def test_default_rules_names_and_command_lines(tool, cls):
    assert ContextServePolicy().classify(tool) == cls


def test_rules_are_parameters_longest_prefix_wins():
    p = make_policy("contextserve", fast="git status,git", slow="git clone")
    assert p.classify("git clone https://x") == SLOW  # longer than 'git'
    assert p.classify("git log") == FAST
    assert p.classify("git") == UNCERTAIN  # a name whose rules are in both lists
    none = make_policy("contextserve", slow="")  # an empty list: no SLOW command
    assert none.slow_rules == () and none.classify("pytest") == UNCERTAIN


def test_bad_rules_and_parameters_are_refused():
    with pytest.raises(PolicyError, match="in both the fast and the slow list"):
        make_policy("contextserve", fast="ls,make", slow="make")
    with pytest.raises(PolicyError, match="empty command"):
        make_policy("contextserve", fast="ls,,cat")
    for k, v in (("quantile", "1.0"), ("quantile", "0"), ("min_samples", "0"), ("prior_kappa", "0"), ("fast_ttl", "-1")):
        with pytest.raises(PolicyError, match=k):
            make_policy("contextserve", **{k: v})


def test_cli_bad_parameter_is_one_line(capsys):
    from sim.cli import main

    assert main(["run", "--policy", "contextserve", "--policy-arg", "slow=ls", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'ls' is in both the fast and the slow list" in err and len(err.splitlines()) == 1


# --- the NIG posterior, by hand ----------------------------------------------------------
def test_nig_posterior_hand_worked():
    # x = log t = [1, 3], prior mu0 = 0, kappa0 = alpha0 = beta0 = 1: mean 2, S = 2;
    # kappa_n = 3, mu_n = (0 + 2*2)/3 = 4/3, alpha_n = 1 + 1 = 2,
    # beta_n = 1 + 2/2 + 1*2*(2 - 0)^2 / (2*3) = 2 + 4/3 = 10/3
    est = NIG()
    est.add(1.0)
    est.add(3.0)
    assert est.posterior(0.0, 1.0, 1.0, 1.0) == pytest.approx((4 / 3, 3.0, 2.0, 10 / 3))
    # predictive: Student-t, 2*alpha_n = 4 dof, scale^2 = (10/3)*4/(2*3) = 20/9; t_4's
    # quantile in closed form: 2*sqrt(cos(acos(sqrt(a))/3)/sqrt(a) - 1), a = 4q(1-q)
    q = 0.9
    a = 4 * q * (1 - q)
    t4 = 2 * math.sqrt(math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a) - 1)
    assert est.quantile(q, 0.0, 1.0, 1.0, 1.0) == pytest.approx(math.exp(4 / 3 + math.sqrt(20 / 9) * t4))


def test_policy_ttl_is_the_predictive_quantile_hand_worked():
    # one sample t = e^2 (x = 2), prior median 1 s (mu0 = 0), kappa0 = 1, alpha0 = beta0 = 1/2:
    # kappa_n = 2, mu_n = 1, alpha_n = 1, beta_n = 1/2 + 0 + 1*1*4/(2*2) = 3/2,
    # scale^2 = (3/2)*3/(1*2) = 9/4; t with 2 dof: quantile (2q-1)/sqrt(2q(1-q))
    p = make_policy("contextserve", min_samples=1, prior_median_s=1.0, prior_kappa=1.0, prior_alpha=0.5,
                    prior_beta=0.5, quantile=0.9, cost_check=False)
    p.record_tool_time("python", math.exp(2.0))
    ttl = math.exp(1.0 + 1.5 * 0.8 / math.sqrt(2 * 0.9 * 0.1))  # 45.99 s
    assert p.retention(req("python"), 0.0, FakeView()) == Retention("pin", pytest.approx(ttl))
    # a higher quantile, a longer pin; the estimate is per name: 'python -c x' learns from 'python'
    assert make_policy("contextserve", min_samples=1, quantile=0.99).nig_ttl("python") is None
    hi = fed(make_policy("contextserve", min_samples=1, quantile=0.99), "python", [math.exp(2.0)])
    lo = fed(make_policy("contextserve", min_samples=1, quantile=0.5), "python -c x", [math.exp(2.0)])
    assert lo.nig_ttl("python") < hi.nig_ttl("python")
    assert lo.nig_ttl("python") == pytest.approx(math.exp(1.0))  # the t median is its location


def test_welford_matches_numpy_on_many_samples():
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 2.0, 5000)
    est = NIG()
    for v in x:
        est.add(float(v))
    assert est.mean == pytest.approx(x.mean()) and est.m2 == pytest.approx(((x - x.mean()) ** 2).sum())


def test_cost_check_frees_a_pin_longer_than_the_benefit():
    p = fed(ContextServePolicy(min_samples=3), "python", [5.0, 6.0, 7.0])  # quantile ~ 8 s > B = 2.2 s
    assert p.nig_ttl("python") > 2.2
    assert p.retention(req("python", tokens=2200), 0.0, FakeView()) == FREE
    assert p.retention(req("python", tokens=20000), 0.0, FakeView()).action == "pin"  # B = 20 s
    off = fed(ContextServePolicy(min_samples=3, cost_check=False), "python", [5.0, 6.0, 7.0])
    assert off.retention(req("python", tokens=2200), 0.0, FakeView()) == Retention("pin", p.nig_ttl("python"))


# --- below the sample threshold: Continuum's TTL -----------------------------------------
def test_fallback_to_continuum_below_min_samples():
    v = FakeView()
    cs, ref = ContextServePolicy(K=4, min_samples=5), ContinuumPolicy(K=4)
    # |S| = 8 > K, |S[python]| = 4 <= K: Continuum's Eq. 2 on the global CDF
    # [.4 x4, .5, 1, 1, 3], B = 2.2: .4 -> .7, .5 -> .875, 1 -> .925, 3 -> -.8 -> tau = 1
    for pol in (cs, ref):
        fed(pol, "ls", [0.5, 1.0, 1.0, 3.0])
        fed(pol, "python", [0.4] * 4)
    assert cs.nig_ttl("python") is None  # 4 < 5 samples
    assert cs.retention(req("python"), 0.0, v) == ref.retention(req("python"), 0.0, v) == Retention("pin", 1.0)
    assert cs.ttl_source == {"global": 1}
    fed(cs, "python", [0.4])  # the 5th sample: the NIG quantile from now on
    fed(ref, "python", [0.4])
    r = cs.retention(req("python"), 0.0, v)
    assert r.ttl == pytest.approx(cs.nig_ttl("python")) and r.ttl != 1.0
    assert cs.ttl_source["nig"] == 1
    # no tool parsed: always Continuum's TTL (its global CDF), however much was learned
    assert cs.retention(req(None), 0.0, v) == ref.retention(req(None), 0.0, v)
    # cold start (|S| <= K): Continuum's T_default, ln(B) with B = 2.2 s
    cold = ContextServePolicy()
    assert cold.retention(req("python"), 0.0, v) == Retention("pin", pytest.approx(math.log(2.2)))
    assert cold.ttl_source == {"default": 1}


def test_order_and_last_step_are_continuums():
    p, ref, v = ContextServePolicy(), ContinuumPolicy(), FakeView()
    assert p.on_finish(req("ls", last=True), 0.0, v) == FREE and not p.pins
    p.on_finish(req("ls", "pinned"), 0.0, v)
    ref.on_finish(req("ls", "pinned", tokens=100000), 0.0, v)
    rs = [Request("a", "old", 3, 9.0, 1.0, 10), Request("b", "pinned", 1, 8.0, 5.0, 10),
          Request("c", "pre", 1, 9.5, 7.0, 10, preempted=True)]
    assert [r.req_id for r in sorted(rs, key=lambda r: p.order_key(r, 10.0, v))] == ["c", "b", "a"]
    assert [p.order_key(r, 10.0, v) for r in rs] == [ref.order_key(r, 10.0, v) for r in rs]


# --- end to end --------------------------------------------------------------------------
def test_sim_run_on_the_bundled_trace_finishes_every_call_once(tmp_path, capsys):
    from sim.cli import main
    from traces.schema import read_trace

    out = tmp_path / "r"
    assert main(["run", "--trace", "swebench", "--policy", "contextserve", "--programs", "30", "--jps", "0.5",
                 "--num-gpu-blocks", "3000", "--out", str(out), "--no-progress"]) == 0
    import pandas as pd

    trace, _ = read_trace("swebench")
    keep = trace["program_id"].drop_duplicates().iloc[:30]
    calls = trace[trace["program_id"].isin(keep)]
    turns = pd.read_parquet(out / "turns.parquet")
    assert len(turns) == len(calls) and not turns.duplicated(["program_id", "turn"]).any()
    s = json.loads((out / "summary.json").read_text())
    assert s["policy"] == "contextserve" and s["programs"] == 30 and s["pins"] > 0
    ttl = s["ttl_by_tool"]
    assert ttl["ls"]["mean_ttl_s"] == 2.0 and "pytest" not in ttl and "pip" not in ttl  # FAST pins, SLOW never
    assert any(0 < ttl[t]["mean_ttl_s"] != 2.0 for t in ("grep", "sed", "find", "cd", "python") if t in ttl)
