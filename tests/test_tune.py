"""`sim tune` (sim/study/tune.py): the search space comes from what policies declare (a
policy registered later is searched without edits), the chosen configuration repeats
under `sim run --config`, pruned trials really could not win, the search is the same
for any number of workers and resumes from its runs, held-out gains are what the runs
say, and bad input is one line with nothing written."""
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import Field

from agentsim.cli import main
from policies import registry
from policies.base import Action, Policy, Retention
from sim.study import tune as T
from sim.study import tune_report as R
from sim.study import tune_space as S
from sim.study.sweep import load_results, point_key, canonical, run_point

# A small case under memory pressure, where continuum's parameters matter.
ROOT = Path(__file__).resolve().parents[1]
FIXED = {"trace": "swebench", "programs": 30, "jps": 0.5, "num_gpu_blocks": 2000}
WORK = ["--trace", "swebench", "--programs", "30", "--jps", "0.5", "--num-gpu-blocks", "2000"]
SMALL = [*WORK, "--policies", "vllm,continuum,static-ttl", "--trials", "14", "--batch", "4", "--seeds", "0,1",
         "--holdout-seeds", "2", "--no-progress"]


def tune(out, *extra):
    code = main(["tune", *SMALL, *extra, "-o", str(out)])
    assert code == 0
    return pd.read_parquet(out / "trials.parquet")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "a"
    return out, tune(out)


def test_trial_table_one_row_per_trial(small):
    out, t = small
    assert list(t["trial"]) == list(range(14))
    assert list(t.loc[t["baseline"], "policy"]) == ["vllm", "continuum", "static-ttl"]
    assert set(t["state"]) <= {"complete", "pruned", "failed"} and (t["seeds"] == "0,1").all()
    assert (t["pruned"] == (t["state"] == "pruned")).all()
    runs = load_results(out / T.RUNS).set_index("key")
    for r in t[t["state"] == "complete"].to_dict("records"):  # the mean over the seeds of its runs
        keys = r["run_keys"].split(",")
        assert len(keys) == 2
        assert r["mean_jct"] == pytest.approx(float(runs.loc[keys, "mean_jct"].mean()), rel=1e-12)
        assert json.loads(r["mean_jct_by_seed"]) == pytest.approx(list(runs.loc[keys, "mean_jct"]))
    searched = t[~t["baseline"] & (t["policy"] == "continuum")]
    assert len(searched) and searched["continuum.K"].notna().all()  # a searched parameter's column


def test_chosen_config_repeats_under_sim_run(small, tmp_path):
    out, t = small
    chosen = t.loc[t[(t["state"] == "complete")]["mean_jct"].idxmin()]
    assert main(["run", "--config", str(out / "config.json"), "--no-progress", "--out", str(tmp_path / "r")]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["policy"] == chosen["policy"]
    assert summary["mean_jct"] == json.loads(chosen["mean_jct_by_seed"])[0]  # the first tuning seed, exactly
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["policy"]["args"] == json.loads(chosen["params"])


def _point(r, seed):
    p = {k: v for k, v in json.loads(r["params"]).items() if v is not None}
    return {**FIXED, "policy": r["policy"], "seed": seed, **p}


def test_pruned_trials_could_not_beat_the_best(small):
    """A pruned trial, run to its end on every seed, is worse than the limit it was given: the
    best trial before its batch."""
    out, t = small
    pruned = t[t["state"] == "pruned"]
    assert len(pruned), "the case should prune something"
    for r in pruned.to_dict("records")[:2]:
        metric, _, limit = r["bound"].partition("<=")
        full = []
        for seed, key in zip((0, 1), r["run_keys"].split(",")):
            assert point_key(canonical(_point(r, seed))) == key
            full.append(run_point(_point(r, seed))[0][metric])
        assert np.mean(full) > float(limit)
        assert r[metric] <= np.mean(full) + 1e-9  # the table's value is a lower bound
        best_before = t[(t["trial"] < r["trial"]) & (t["state"] == "complete")]["mean_jct"].min()
        assert float(limit) >= best_before - 1e-9


def test_figure_shows_the_best_so_far(small):
    out, t = small
    data = json.loads((out / "tune.json").read_text())
    line = data[0]["lines"]["best so far"]
    done = t[(t["state"] == "complete")]
    assert line["y"][-1] == pytest.approx(done["mean_jct"].min())
    assert (np.diff(line["y"]) <= 1e-12).all()


def test_holdout_report_is_what_the_runs_say(small):
    out, t = small
    md = (out / "tune.md").read_text()
    runs = load_results(out / T.RUNS)
    assert (runs["seed"] == 2).any()  # the held-out seed ran
    fixed = t[t["baseline"] & (t["state"] == "complete")].sort_values(["mean_jct", "trial"]).iloc[0]
    chosen = t[t["state"] == "complete"].sort_values(["mean_jct", "trial"]).iloc[0]

    def held(r):
        return float(runs.set_index("key").loc[point_key(canonical(_point(r, 2))), "mean_jct"])

    gain_t = (fixed["mean_jct"] - chosen["mean_jct"]) / fixed["mean_jct"]
    gain_h = (held(fixed) - held(chosen)) / held(fixed)
    assert f"{gain_t:+.1%} on the tuning seeds, {gain_h:+.1%} on the held-out seeds" in md
    res = json.loads((out / "result.json").read_text())
    assert res["gain"]["tuning_gain"] == pytest.approx(gain_t) and res["gain"]["holdout_gain"] == pytest.approx(gain_h)
    assert (res["chosen"]["trial"], res["fixed"]["trial"]) == (chosen["trial"], fixed["trial"])
    assert res["holdout"]["chosen"]["mean_jct"] == pytest.approx(held(chosen))


def test_same_search_with_workers_and_resumed(small, tmp_path):
    out, t = small
    again = tune(tmp_path / "b", "--workers", "2")
    pd.testing.assert_frame_equal(t, again)
    capsys_free = tune(out)  # the same DIR: every run is found, none simulated
    pd.testing.assert_frame_equal(t, capsys_free)
    assert "Runs: 0 simulated" in (out / "tune.md").read_text()


def test_same_search_on_a_dask_cluster(small, tmp_path, monkeypatch, environ_kept):
    from distributed import LocalCluster

    _, t = small
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        on_dask = tune(tmp_path / "k", "--dask", cluster.scheduler_address)
    pd.testing.assert_frame_equal(t, on_dask)


def test_another_sampler_seed_searches_differently(small, tmp_path):
    _, t = small
    other = tune(tmp_path / "c", "--seed", "7")
    assert not other["params"].equals(t["params"])


def test_no_early_stop_prunes_nothing(tmp_path):
    t = tune(tmp_path / "d", "--no-early-stop", "--trials", "8")
    assert (t["state"] == "complete").all() and t["bound"].isna().all()


def test_multi_objective_pareto(tmp_path):
    t = tune(tmp_path / "m", "--objective", "mean_jct,p95_jct", "--trials", "10")
    assert t["bound"].isna().all()  # nothing bounds several objectives
    q = T.Question({}, {}, ("mean_jct", "p95_jct"))
    front = t[R.pareto_mask(q, t)]
    done = t[t["state"] == "complete"]
    for r in front.to_dict("records"):  # no trial beats a front member in both
        assert not ((done["mean_jct"] <= r["mean_jct"]) & (done["p95_jct"] <= r["p95_jct"])
                    & ((done["mean_jct"] < r["mean_jct"]) | (done["p95_jct"] < r["p95_jct"]))).any()
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    pick = front.sort_values(["mean_jct", "trial"]).iloc[0]
    assert cfg["policy"]["name"] == pick["policy"] and cfg["policy"]["args"] == json.loads(pick["params"])
    data = json.loads((tmp_path / "m" / "tune.json").read_text())
    drawn = data[1]["lines"]["Pareto front"]
    assert sorted(drawn["x"]) == sorted(front["mean_jct"]) and sorted(drawn["y"]) == sorted(front["p95_jct"])


def test_slo_infeasible_trials_are_never_chosen(tmp_path):
    t = tune(tmp_path / "s", "--slo", "p99_turn_latency<=60", "--trials", "8")
    assert (t.loc[t["feasible"], "p99_turn_latency"] <= 60).all()
    assert (~t.loc[(t["state"] == "complete") & (t["p99_turn_latency"] > 60), "feasible"]).all()
    if (tmp_path / "s" / "config.json").exists():
        cfg = json.loads((tmp_path / "s" / "config.json").read_text())
        ok = t[t["feasible"]].sort_values(["mean_jct", "trial"]).iloc[0]
        assert cfg["policy"]["args"] == json.loads(ok["params"])


# ---- the space comes from the registry ---------------------------------------------------

class _Hold(Policy):
    """Pin each turn's KV for `hold` seconds (or not at all unless `on`)."""

    name = "test-hold"

    def __init__(self, hold: float = 2.0, on: bool = True, flavour: str = "plain", offset: float = 0.0,
                 note: str = "x,y") -> None:
        super().__init__()
        self.hold, self.on = hold, on

    def retention(self, req, now, view):
        return Retention(Action.PIN, self.hold) if self.on else Retention(Action.FREE)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(registry.RANGES, "hold", Field(gt=0, lt=5))
    monkeypatch.setitem(registry.RANGES, "offset", Field(ge=0))
    monkeypatch.setitem(registry.VALIDATORS, "flavour", registry._choice("plain", "fancy"))
    monkeypatch.setitem(registry.POLICIES, "test-hold", _Hold)
    registry.params_model.cache_clear()
    yield
    registry.params_model.cache_clear()


def test_space_from_declared_parameters(registered):
    s = S.derive_space("test-hold")
    dims = {d.name: d for d in s.dims}
    assert dims["hold"].kind == "float" and dims["hold"].log
    assert dims["hold"].low == pytest.approx(2.0 / S.SPAN) and 2.0 < dims["hold"].high < 5  # the declared lt
    assert dims["on"].choices == (False, True) and dims["flavour"].choices == ("plain", "fancy")
    assert s.held == {"offset": 0.0, "note": "x,y"}  # no scale (0) and free text: held
    k = {d.name: d for d in S.derive_space("continuum").dims}["T_window"]
    assert k.kind == "int" and k.low >= 1 and k.high == 100 * S.SPAN


def test_param_overrides(registered):
    spaces = {"test-hold": S.derive_space("test-hold"), "continuum": S.derive_space("continuum")}
    S.apply_param(spaces, "offset=0:3")
    S.apply_param(spaces, "test-hold.hold=0.5,1.5")
    S.apply_param(spaces, "K=40")
    S.apply_param(spaces, "test-hold.note=a,b")  # free text: held as a whole
    dims = {d.key: d for s in spaces.values() for d in s.dims}
    assert (dims["test-hold.offset"].low, dims["test-hold.offset"].high, dims["test-hold.offset"].log) == (0, 3, False)
    assert dims["test-hold.hold"].choices == (0.5, 1.5)
    assert spaces["continuum"].held["K"] == 40 and "continuum.K" not in dims
    assert spaces["test-hold"].held["note"] == "a,b"


def test_a_registered_policy_is_searched_without_edits(registered, tmp_path):
    t = tune(tmp_path / "h", "--policies", "vllm,test-hold", "--trials", "8", "--holdout-seeds", "none")
    assert "test-hold" in list(T.policies_from(None))
    mine = t[(t["policy"] == "test-hold") & ~t["baseline"]]
    assert len(mine) and mine["test-hold.hold"].between(0.25, 5).all()
    assert {json.loads(p)["offset"] for p in mine["params"]} == {0.0}


def test_default_search_keeps_to_what_a_deployment_can_run():
    """The oracle (true tool durations) is searched only when named; infercept by default
    holds true_tool_time=False, in its fixed trial too; named, it is searched as declared."""
    from sim.commands.tune import register
    import argparse
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    q = __import__("sim.commands.tune", fromlist=["question"]).question(
        ap.parse_args(["tune", *WORK, "-o", "x"]))
    assert "oracle" not in q.spaces and "continuum" in q.spaces
    inf = q.spaces["infercept"]
    assert inf.held["true_tool_time"] is False and inf.fixed == {"true_tool_time": False}
    assert "true_tool_time" not in {d.name for d in inf.dims}
    named = __import__("sim.commands.tune", fromlist=["question"]).question(
        ap.parse_args(["tune", *WORK, "--policies", "oracle,infercept", "-o", "x"]))
    assert set(named.spaces) == {"oracle", "infercept"} and named.spaces["infercept"].fixed == {}
    assert "true_tool_time" in {d.name for d in named.spaces["infercept"].dims}
    # a user's --param takes the parameter over: the fixed trial at the declared default
    spaces = {"infercept": S.derive_space("infercept", deployed=True)}
    S.apply_param(spaces, "true_tool_time=true,false")
    assert spaces["infercept"].fixed == {}


def test_every_policy_reading_the_future_says_so():
    """A policy whose code reads Request.true_tool_duration (only the simulator knows it)
    declares Policy.deployable (False, or the parameters that turn it off)."""
    import inspect
    for name, cls in registry.POLICIES.items():
        src = "".join(inspect.getsource(c) for c in cls.__mro__ if c.__module__.startswith("policies.")
                      and c.__name__ != "Policy")
        if ".true_tool_duration" in src:  # an attribute read (a docstring may name it)
            assert S.deployable(name) is not True, name
    assert S.deployable("oracle") is False and S.deployable("vllm") is True


def test_fixed_trial_takes_the_deployable_values(tmp_path):
    t = tune(tmp_path / "d", "--policies", "vllm,infercept", "--trials", "4", "--holdout-seeds", "none")
    base = t[t["baseline"] & (t["policy"] == "infercept")]
    assert len(base) == 1 and json.loads(base["params"].iloc[0])["true_tool_time"] is True  # named: as declared
    q = T.Question(FIXED, {"infercept": S.derive_space("infercept", deployed=True)}, seeds=(0,), holdout=(),
                   trials=2, batch=2)
    res = T.search(q, tmp_path / "e")
    fixed = res.trials[res.trials["baseline"]]
    assert json.loads(fixed["params"].iloc[0])["true_tool_time"] is False
    assert all(json.loads(p)["true_tool_time"] is False for p in res.trials["params"])


@pytest.mark.parametrize("extra, match", [
    (["--policies", "vllm,nosuch"], "unknown policy 'nosuch'"),
    (["--param", "continuum.nosuch=1:2"], "has no parameter 'nosuch'"),
    (["--param", "pin_seconds=1:2"], "none of the searched policies"),
    (["--param", "K=-5:10"], "--param 'K=-5:10'"),
    (["--param", "K=10:5"], "LO < HI"),
    (["--holdout-seeds", "1,5"], "overlap --seeds"),
    (["--seeds", "0,0"], "--seeds"),
    (["--set", "seed=3"], "tune sets 'seed' itself"),
    (["--set", "nosuch=3"], "not a run axis"),
    (["--objective", "speed"], "--objective 'speed'"),
    (["--slo", "mean_jct<60"], "--slo"),
    (["--trials", "3"], "--trials 3"),
    (["--workers", "2", "--dask", "tcp://x:1"], "--workers does not apply"),
    (["--set", "num_gpu_blocks=999999999"], "exceeds the"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, match):
    out = tmp_path / "bad"
    assert main(["tune", *SMALL, *extra, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_gain_and_survival_arithmetic():
    q = T.Question({}, {}, ("mean_jct",))
    fixed = T.Trial(0, "vllm", {}, {}, True, state="complete", values={"mean_jct": 100.0})
    chosen = T.Trial(1, "continuum", {}, {}, False, state="complete", values={"mean_jct": 80.0})
    res = T.TuneResult(pd.DataFrame(), chosen, fixed, {"chosen": {"mean_jct": 90.0}, "fixed": {"mean_jct": 100.0}}, None)
    s = R.survival(q, res)
    assert s["tuning_gain"] == pytest.approx(0.2) and s["holdout_gain"] == pytest.approx(0.1)
    assert s["survived"] == pytest.approx(0.5)
    up = T.Question({}, {}, ("jobs_per_s",))
    assert R._gain(up, 2.0, 3.0) == pytest.approx(0.5) and math.isnan(R._gain(up, 0.0, 3.0))
