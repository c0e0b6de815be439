"""Runs given a bound stop once the bound is known to fail (sim/run/bound.py), and only then;
sweeps and the planner use them, and keep their workers warm (sim/study/sweep.py Workers)."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import sim.study.sweep as sw
from agentsim.cli import main
from agentsim.errors import InputError
from sim.study import plan as pl
from sim.run.bound import BOUNDABLE, Bound, parse_bound, step_floor
from sim.run.config import execute
from sim.hardware.profile import StepModel

SMALL = {"trace": "swebench", "programs": 60, "jps": 1.0}


def call(pid: int, arrival: float, last: bool):
    return SimpleNamespace(req=SimpleNamespace(program_id=str(pid), program_arrival=float(arrival), is_last_step=last))


def programs(n: int, tools=()):
    """n programs, program i arriving at t = i; program i's turns wait tools[i] (a list) between them
    (default: 40 turns, no tool time)."""
    out = []
    for i in range(n):
        t = list(tools[i]) if i < len(tools) else [0.0] * 39
        out.append((str(i), [{"tool_duration_s": x, "output_tokens": 10} for x in t]
                    + [{"tool_duration_s": float("nan"), "output_tokens": 10}], float(i)))
    return out


def twenty(limit: float, metric: str = "p95_jct", tools=(), profile=None):
    w = Bound(metric, limit).watcher()
    w.start(programs(20, tools), profile)
    return w


def stepping(seconds: float):
    """A profile whose every step takes at least `seconds`."""
    return SimpleNamespace(step=StepModel(c0=seconds, c1=0.0, c2=0.0, c3=0.0, c4=0.0))


def test_hand_worked_stop():
    # p95 of 20 programs: h = 19 x 0.95 = 18.05, so p95 > 10 once v_18 > 10: 20 - 18 = 2 programs above 10 s.
    w = twenty(10.0)
    assert w.need == 2
    assert not w.finished(call(0, 0, True), 11.0)   # program 0: JCT 11 (one above); nothing else old yet
    # t = 12.5, a turn of program 5 (not its last): programs 1 and 2 arrived more than 10 s ago, unfinished
    assert w.finished(call(5, 5, False), 12.5)
    # lower bounds: 11 (prog 0), 11.5, 10.5, then 9.5 .. 0.5 (progs 3-12), 0 for progs 13-19 (not arrived)
    # sorted: v_18 = 11, v_19 = 11.5 -> 11 + 0.05 x 0.5
    assert w.value == pytest.approx(11.025, abs=1e-12)
    s = w.summary()
    assert s["stopped_early"] is True and s["p95_jct"] == w.value and s["stopped_at_s"] == 12.5
    assert s["finished_programs"] == 1 and s["calls"] == 2 and s["programs"] == 20
    assert "the JCTs of 3 of 20 programs exceed 10 s" in s["stop_reason"]


def test_hand_worked_no_stop():
    # Program 0 exceeds (JCT 11), every other one finishes 10 s after it arrived (not above): one program
    # above 10 s is never enough for p95 (two are), so the watcher never stops.
    w = twenty(10.0)
    assert not w.finished(call(0, 0, True), 11.0)
    for i in range(1, 20):
        assert not w.finished(call(i, i, True), i + 10.0)
    assert w.over == 1
    # (that run's p95 is 10 + 0.05 x 1 = 10.05: above 10 only through the interpolation toward v_19, which
    # no count of programs decides before the end, so the run goes on to its exact end)
    assert np.percentile([11.0] + [10.0] * 19, 95) == pytest.approx(10.05)


def test_hand_worked_stop_on_tool_time():
    # Programs 0 and 1 have two turns with a 9 s tool between them. At t = 4, program 0's first call
    # finishes: it cannot end before 4 + 9 = 13, a JCT above 10 (it arrived at 0). Program 1's first call
    # is still running at t = 4: its JCT is at least 4 - 1 + 9 = 12. Two programs above 10: p95 > 10.
    w = twenty(10.0, tools=[[9.0], [9.0]])
    assert w.stat[0] == 9.0 and not w.known  # tool time alone (9 s) is not above 10
    assert w.finished(call(0, 0, False), 4.0)
    assert w.known == {0, 1}
    # lower bounds: 13 (prog 0), 12 (prog 1), 1, 0 (progs 2, 3), 0 (4-19): v_18 = 12, v_19 = 13
    assert w.value == pytest.approx(12.05, abs=1e-12)
    # without the tool times the same moment decides nothing
    assert not twenty(10.0).finished(call(0, 0, False), 4.0)


def test_hand_worked_stop_on_step_time():
    # Steps of at least 0.1 s, 10 output tokens a call: a call takes at least 1 s. Programs 0 and 1 have
    # three calls and no tool time, the others one call.
    tools = [[0.0, 0.0], [0.0, 0.0]] + [[]] * 18
    w = twenty(10.0, tools=tools, profile=stepping(0.1))
    assert w.stat[0] == 3.0 and w.stat[5] == 1.0 and not w.known
    assert not w.finished(call(0, 0, False), 8.5)  # program 0: two calls still to run, at least 8.5 + 2 = 10.5
    assert w.known == {0}
    # t = 9.25: program 1 (arrived at 1) has its first call running and two more to come: 8.25 + 2 > 10
    assert w.finished(call(0, 0, False), 9.25)
    assert w.known == {0, 1} and w.value == pytest.approx(10.25, abs=1e-12)  # both 10.25: v_18 = v_19
    # the same moments without a floor on the step time decide nothing
    w = twenty(10.0, tools=tools)
    assert not w.finished(call(0, 0, False), 8.5) and not w.finished(call(0, 0, False), 9.25)


def test_step_floor():
    from sim.hardware.profile import load_profile

    prof = load_profile("llama3.1-8b-h100")
    assert step_floor(prof) == prof.step.time(1, 1, 0.0, 0.0, 0.0) > 0.006  # its weights' read
    bad = SimpleNamespace(step=StepModel(c0=0.01, c1=-1e-6, c2=0.0, c3=0.0, c4=0.0))
    assert step_floor(bad) == 0.0 and step_floor(None) == 0.0  # no floor where a term can fall


def test_tool_time_alone_can_decide():
    w = twenty(10.0, "max_jct", tools=[[0.0], [0.0], [6.0, 5.0]])  # program 2 waits 11 s on tools in all
    assert w.known == {2}  # before it arrives
    assert w.finished(call(0, 0, True), 0.5)  # at the first finished call
    assert w.value == 11.0


def test_max_and_mean_hand_worked():
    w = twenty(10.0, "max_jct")
    assert w.need == 1
    assert w.finished(call(3, 3, True), 13.5)  # one JCT of 10.5 > 10
    assert w.value == 13.5  # the lower bound of the max: program 0, arrived at 0, still running at 13.5
    m = twenty(5.0, "mean_jct")  # mean > 5 once the sum of lower bounds exceeds 100; checked every 16th call
    for _ in range(15):
        assert not m.finished(call(0, 0, False), 14.0)
    assert not m.finished(call(0, 0, False), 10.0)  # 16th: lower bounds 10, 9, ..., 0: sum 55
    for _ in range(15):
        assert not m.finished(call(0, 0, False), 14.0)
    assert m.finished(call(0, 0, False), 14.0)      # 32nd: 14 + 13 + ... + 0: sum 105 > 100
    assert m.value == pytest.approx(105 / 20)


@pytest.mark.parametrize("text", ["p95<=60", "p95_jct<60", "p95_jct<=0", "p95_jct<=nan", "p95_jct<=x",
                                  "mean_turn_latency<=5", ""])
def test_malformed_bound_is_one_input_error(text):
    with pytest.raises(InputError, match="is not METRIC<=SECONDS"):
        parse_bound(text)


@pytest.mark.parametrize("argv", [["run", "--programs", "5", "--bound", "p95<=20"],
                                  ["sweep", "--out", "OUT", "--axis", "programs=5", "--bound", "p95_jct<=-3"]])
def test_cli_malformed_bound_one_line_exit_2(argv, tmp_path, capsys):
    argv = [str(tmp_path / "sw") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bound" in err[0] and "is not METRIC<=SECONDS" in err[0], err
    assert not (tmp_path / "sw").exists()


def _run(point, bound=None):
    b = None if bound is None else parse_bound(bound)
    return execute(sw.build_run(sw.canonical(point)), watch=None if b is None else b.watcher()).summary


@pytest.fixture(scope="module")
def exact():
    return _run(SMALL)


def test_a_run_not_stopped_is_identical(exact):
    # a bound the run meets (its own p95 and more) never stops it: every figure to the last digit
    for metric in BOUNDABLE:
        s = _run(SMALL, f"{metric}<={exact[metric] * 1.001}")
        assert "stopped_early" not in s
        assert json.dumps(s, sort_keys=True) == json.dumps(exact, sort_keys=True)


@pytest.mark.parametrize("metric", list(BOUNDABLE))
def test_a_stopped_run_fails_its_bound_with_a_true_lower_bound(exact, metric):
    limit = exact[metric] * 0.5
    s = _run(SMALL, f"{metric}<={limit}")
    assert s["stopped_early"] is True
    assert limit < s[metric] <= exact[metric]  # fails the same SLO, never claims more than the full run has
    assert s["stopped_at_s"] < exact["makespan_s"] and s["calls"] < exact["calls"]
    assert parse_bound(s["bound"]) == Bound(metric, limit) and metric in s["stop_reason"]
    assert "mean_jct" not in s or metric == "mean_jct"  # no other metric of a partial run


def test_sweep_rows_with_a_bound_and_their_reuse(tmp_path, exact):
    pts = [{**SMALL, "seed": 0}]
    key = sw.point_key(sw.canonical(pts[0]))
    tight = f"p95_jct<={exact['p95_jct'] / 2}"
    rep = sw.sweep(pts, tmp_path, bound=tight)
    row = rep.table.set_index("key").loc[key]
    assert bool(row["stopped_early"]) and row["p95_jct"] > exact["p95_jct"] / 2 and row["bound"] == str(parse_bound(tight))
    # a tighter bound on the same metric is already failed by that row: reused
    assert sw.sweep(pts, tmp_path, bound=f"p95_jct<={exact['p95_jct'] / 4}").ran == 0
    # a looser bound, another metric, or none: run again, the row replaced (exact now)
    rep = sw.sweep(pts, tmp_path, bound=f"p95_jct<={exact['p95_jct'] * 2}")
    assert rep.ran == 1 and rep.table["key"].is_unique
    row = rep.table.set_index("key").loc[key]
    assert row["stopped_early"] == False and row["p95_jct"] == exact["p95_jct"]
    assert sw.sweep(pts, tmp_path).ran == 0  # a run not stopped serves a sweep without a bound
    rep = sw.sweep(pts, tmp_path / "b", bound=tight)
    assert sw.sweep(pts, tmp_path / "b").ran == 1  # ... a stopped one does not


def test_sweep_bound_per_point(tmp_path, exact):
    # a dict {key: Bound}: each point its own bound (sim tune's seed-by-seed limits); a point not in it has none
    a, b = {**SMALL, "seed": 0}, {**SMALL, "seed": 0, "policy": "continuum"}
    ka, kb = (sw.point_key(sw.canonical(p)) for p in (a, b))
    tight = Bound("p95_jct", exact["p95_jct"] / 2)
    rep = sw.sweep([a, b], tmp_path, bound={ka: tight}, workers=2)
    t = rep.table.set_index("key")
    assert bool(t.loc[ka, "stopped_early"]) and t.loc[ka, "bound"] == str(tight)
    assert pd.isna(t.loc[kb, "bound"]) and t.loc[kb, "p95_jct"] > 0 and t.loc[kb, "stopped_early"] is not True
    assert sw.sweep([a, b], tmp_path, bound={ka: Bound("p95_jct", exact["p95_jct"] / 4)}).ran == 0  # already failed
    rep = sw.sweep([a, b], tmp_path, bound={ka: Bound("p95_jct", exact["p95_jct"] * 2), kb: tight})
    assert rep.ran == 1  # a looser bound reruns a; b's exact row serves any bound
    assert rep.table.set_index("key").loc[ka, "p95_jct"] == exact["p95_jct"]


def test_worker_keeps_the_profile_for_the_next_point(tmp_path):
    a = sw.build_run(sw.canonical({**SMALL, "policy": "vllm"}))
    b = sw.build_run(sw.canonical({**SMALL, "policy": "continuum", "seed": 3}))
    assert a.profile is b.profile and a.trace is b.trace  # shared by points differing in policy or seed
    path = tmp_path / "p.json"
    path.write_text(json.dumps(a.profile.raw))
    c = sw.build_run(sw.canonical({**SMALL, "profile": str(path)}))
    path.write_text(json.dumps(a.profile.raw, indent=1))  # changed on disk: read again
    d = sw.build_run(sw.canonical({**SMALL, "profile": str(path)}))
    assert c.profile is not d.profile


def test_plan_keeps_one_pool_and_stops_failing_points_early(tmp_path, monkeypatch):
    made = []
    real = sw._local_pool
    monkeypatch.setattr(sw, "_local_pool", lambda n: made.append(n) or real(n))
    args = dict(gpus=["H100"], models=["llama3.1-8b"], tps=[1], policies=["vllm", "continuum"], offloads=["none"],
                routers=["round_robin", "session"], prices={"H100": 4.0}, profile_dir=tmp_path / "profiles")
    cands, _, profiles = pl.candidates(**args)
    q = pl.Question("swebench", 1.0, pl.parse_slo("p95_jct<=65"), programs=100, max_replicas=4)
    fast = pl.plan(q, cands, tmp_path / "fast", profiles, workers=2)
    assert made == [2]  # one pool for every round of the search: workers import once
    exact = pl.plan(pl.Question(**{**q.__dict__, "early_stop": False}), cands, tmp_path / "exact", profiles)
    cols = ["gpu", "policy", "router", "status", "replicas", "usd_per_hour", "p95_jct"]
    met = [t[t["status"] == "met"][cols].reset_index(drop=True) for t in (fast.table, exact.table)]
    assert len(met[0]) > 0
    pd.testing.assert_frame_equal(*met)  # the same answer and ranking of what meets the SLO
    assert fast.stopped > 0 and exact.stopped == 0
    ex = exact.probes.set_index(["candidate", "replicas"])["p95_jct"]
    for p in fast.probes.to_dict("records"):
        e = ex.get((p["candidate"], p["replicas"]))
        if p["stopped_early"]:
            assert not p["meets_slo"] and 65 < p["p95_jct"] and (e is None or p["p95_jct"] <= e)
        elif e is not None:
            assert p["p95_jct"] == e  # to the last digit
    assert "failed early" in (tmp_path / "fast" / "plan.md").read_text()


def test_plan_bound_over_seeds_scales():
    q = pl.Question("swebench", 1.0, pl.parse_slo("p95_jct<=40"), seeds=(0, 1, 2))
    assert q.bound() == Bound("p95_jct", 120.0)  # one seed above 3 x 40 puts the mean of three above 40
    assert pl.Question("swebench", 1.0, pl.parse_slo("mean_turn_latency<=4")).bound() is None
    assert pl.Question("swebench", 1.0, pl.parse_slo("p95_jct<=40"), early_stop=False).bound() is None


def test_workers_are_kept_across_sweeps(tmp_path):
    pts = [{**SMALL, "programs": 5, "seed": s} for s in range(4)]
    with sw.Workers(2) as pool:
        sw.sweep(pts[:2], tmp_path, pool=pool)
        first = pool.ex
        pids = {p.pid for p in first._processes.values()}
        sw.sweep(pts[2:], tmp_path, pool=pool)
        assert pool.ex is first and {p.pid for p in first._processes.values()} == pids
    assert pool.ex is None and len(sw.load_results(tmp_path)) == 4
    assert os.path.exists(tmp_path / "results.parquet")


def test_sweep_fed_as_it_goes(tmp_path):
    """sweep(more=...): each point settled once, with the table; what it returns runs in the same sweep;
    a point asked for again after it settled (or found in the table) is settled again at once."""
    base = {**SMALL, "programs": 5}
    sw.sweep([{**base, "seed": 9}], tmp_path)  # already in the table
    told = []

    def more(key, table, why):
        told.append(key)
        assert key in set(table["key"]) and why is None
        n = len(told)
        if n == 1:
            return [{**base, "seed": 1}, {**base, "seed": 2}]
        if n == 2:
            return [{**base, "seed": 9}, {**base, "seed": 1}]  # in the table; and settled already or in flight
        return []

    rep = sw.sweep([{**base, "seed": 0}], tmp_path, more=more)  # in order: 0, then 1 (asks for 9 and 1 again), then 2
    keys = {s: sw.point_key(sw.canonical({**base, "seed": s})) for s in (0, 1, 2, 9)}
    assert rep.ran == 3 and told[0] == keys[0]
    assert told == [keys[0], keys[1], keys[1], keys[9], keys[2]]  # seed 1 told again to its second asker
    assert len(rep.table) == 4 and rep.table["key"].is_unique


def test_plan_on_dask_one_client_same_answer(tmp_path, monkeypatch):
    """The planner on a Dask cluster: one client for the whole search (its workers stay warm),
    points stopped early there too, the same answer as in this process."""
    distributed = pytest.importorskip("distributed")
    clients = []
    real = distributed.Client

    class Counting(real):
        def __init__(self, *a, **k):
            clients.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(distributed, "Client", Counting)
    args = dict(gpus=["H100"], models=["llama3.1-8b"], tps=[1], policies=["vllm"], offloads=["none"],
                routers=["round_robin", "session"], prices={"H100": 4.0}, profile_dir=tmp_path / "profiles")
    cands, _, profiles = pl.candidates(**args)
    q = pl.Question("swebench", 1.0, pl.parse_slo("p95_jct<=65"), programs=100, max_replicas=4)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        on_dask = pl.plan(q, cands, tmp_path / "dask", profiles, workers=2, dask=cluster.scheduler_address)
    assert clients == [1] and on_dask.stopped > 0
    here = pl.plan(q, cands, tmp_path / "here", profiles)
    cols = ["gpu", "policy", "router", "status", "replicas", "usd_per_hour", "p95_jct"]
    met = [t[t["status"] == "met"][cols].reset_index(drop=True) for t in (on_dask.table, here.table)]
    pd.testing.assert_frame_equal(*met)
