"""Sweeps: grid expansion, the point -> run translation, resumability, parallel and Dask
runs giving identical tables, the CLI, and the Fig. 14 trace transform."""
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import sim.study.sweep as sw
from conftest import make_trace, trace_and_profile_files, simulate
from policies.registry import make_policy
from sim.cli import main
from sim.run.simulate import arrivals_for
from agentsim.errors import InputError
from traces.transform import repeat_turns

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return trace_and_profile_files(tmp_path_factory.mktemp("sweep-in"), seed=3, programs=30, blocks=400)


def grid(files):
    trace, prof = files
    return sw.expand_grid({"trace": trace, "profile": prof, "policy": ["vllm", "continuum", "continuum-static"],
                           "pin_seconds": [0.5, 2.0], "jps": [0.5, 3.0], "num_gpu_blocks": 64, "rep": [0, 1]})


def comparable(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns="wall_s").sort_values("key").reset_index(drop=True)


@pytest.fixture(scope="module")
def serial(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    sw.sweep(grid(files), out)
    return comparable(sw.load_results(out))


def test_grid_drops_parameters_a_policy_lacks(files):
    pts = grid(files)
    # vllm and continuum once per (jps, rep); continuum-static once per pin_seconds too
    assert len(pts) == (1 + 1 + 2) * 2 * 2
    assert sorted({p["pin_seconds"] for p in pts if p["policy"] == "continuum-static"}) == [0.5, 2.0]
    assert all("pin_seconds" not in p for p in pts if p["policy"] != "continuum-static")


def test_key_ignores_spelled_out_defaults_and_number_types():
    assert sw.point_key({"policy": "continuum"}) == sw.point_key({"policy": "continuum", "K": 100.0, "jps": None, "seed": 0})
    assert sw.point_key({"jps": 1}) == sw.point_key({"jps": "1.0"})
    assert sw.point_key({"jps": 1}) != sw.point_key({"jps": 1, "rep": 1})
    assert sw.point_key({"policy": "continuum", "max_ttl": None}) != sw.point_key({"policy": "continuum", "max_ttl": 2})


def test_unknown_axes_and_bad_values_are_one_line_errors():
    with pytest.raises(InputError, match="unknown axis 'ttl'.*known axes: trace.*parameters of vllm, continuum: .*max_ttl"):
        sw.expand_grid({"policy": ["vllm", "continuum"], "ttl": [1, 2]})
    with pytest.raises(InputError, match="unknown axis 'pin_seconds' for policy 'vllm'"):
        sw.build_run({"policy": "vllm", "pin_seconds": 2})
    with pytest.raises(InputError, match="axis 'seed' value 'x' is not an int"):
        sw.expand_grid({"seed": ["x"]})
    with pytest.raises(InputError, match="axis 'replicas' must be >= 1"):
        sw.build_run({"replicas": 0})
    with pytest.raises(InputError, match="num-gpu-blocks"):  # the profile's limits hold in sweeps too
        sw.build_run({"num_gpu_blocks": 10**9})


def test_point_runs_like_sim_run(files):
    """The translation applies every axis: a row equals the run built by hand."""
    trace_path, prof_path = files
    row, kv = sw.run_point({"trace": trace_path, "profile": prof_path, "policy": "continuum-static", "pin_seconds": 0.7,
                            "jps": 2.0, "seed": 5, "num_gpu_blocks": 70, "programs": 20, "max_num_seqs": 8}, save_kv=True)
    from sim.hardware.profile import load_profile
    from traces.schema import read_trace
    trace, _ = read_trace(trace_path)
    trace = trace[trace["program_id"].isin(trace["program_id"].unique()[:20])]
    prof = load_profile(prof_path)
    res = simulate(trace, make_policy("continuum-static", pin_seconds=0.7), prof, arrivals_for(trace, 2.0, 5),
                   num_gpu_blocks=70, max_num_seqs=8)
    for k in ("mean_jct", "p95_jct", "cache_hit_ratio", "pins", "steps", "num_gpu_blocks"):
        assert row[k] == res.summary[k]
    assert row["n_programs"] == 20 and row["programs"] == 20
    assert all(v["mean_ttl_s"] == pytest.approx(0.7) for v in json.loads(row["ttl_by_tool"]).values())
    pd.testing.assert_frame_equal(kv, res.kv_usage)
    # a repetition draws other arrivals; rep 0 is the seed itself
    other, _ = sw.run_point({"trace": trace_path, "profile": prof_path, "jps": 2.0, "seed": 5, "rep": 1})
    same, _ = sw.run_point({"trace": trace_path, "profile": prof_path, "jps": 2.0, "seed": 5})
    assert other["mean_jct"] != same["mean_jct"]


def test_parallel_equals_serial(files, serial, tmp_path):
    rep = sw.sweep(grid(files), tmp_path, workers=2)
    assert rep.ran == len(serial)
    pd.testing.assert_frame_equal(comparable(sw.load_results(tmp_path)), serial)


def test_resumed_after_interrupt_equals_serial(files, serial, tmp_path, monkeypatch):
    calls = []
    real = sw.run_point

    def interrupted(point, save_kv=False):
        calls.append(point)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real(point, save_kv)

    monkeypatch.setattr(sw, "run_point", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sw.sweep(grid(files), tmp_path, save_kv=True)
    part = sw.load_results(tmp_path)
    assert len(part) == 5  # every finished point was saved, nothing half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "kv", "results.parquet"]
    assert {p.stem for p in (tmp_path / "kv").iterdir()} == set(part["key"])
    monkeypatch.setattr(sw, "run_point", real)
    rep = sw.sweep(grid(files), tmp_path, save_kv=True)
    assert (rep.skipped, rep.ran) == (5, len(serial) - 5)
    pd.testing.assert_frame_equal(comparable(sw.load_results(tmp_path)), serial)
    assert sw.sweep(grid(files), tmp_path).ran == 0


def test_failing_point_keeps_finished_ones(files, tmp_path):
    trace, prof = files
    pts = sw.expand_grid({"trace": trace, "profile": prof, "jps": 1.0, "num_gpu_blocks": [64, 3]})
    with pytest.raises(InputError, match="KV blocks"):
        sw.sweep(pts, tmp_path)
    assert sw.load_results(tmp_path)["num_gpu_blocks"].tolist() == [64]


@pytest.fixture
def environ_kept():
    """distributed's Nanny sets OMP_NUM_THREADS=1 (and MKL_, OPENBLAS_) in *this* process's
    environment before spawning a worker and never restores it (nanny.py, its
    pre-spawn-environ): every later subprocess of the test run, the validation matrix's vLLM
    engines included, inherited it (their replays ran 1.5x slower than alone; why is not
    understood; CHANGELOG.md, "One thread in CI")."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_dask_cluster_equals_serial(files, serial, tmp_path, monkeypatch, environ_kept):
    from distributed import LocalCluster
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        rep = sw.sweep(grid(files), tmp_path, dask=cluster.scheduler_address)
    assert rep.ran == len(serial)
    pd.testing.assert_frame_equal(comparable(sw.load_results(tmp_path)), serial)


def test_second_sweep_on_same_dir_is_refused(files, tmp_path):
    with open(tmp_path / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        with pytest.raises(InputError, match="another sweep is writing"):
            sw.sweep(grid(files)[:1], tmp_path)


def test_cli_sweep_resumes_and_reports(files, tmp_path, capsys):
    trace, prof = files
    (tmp_path / "grid.json").write_text(json.dumps([{"policy": "vllm"}, {"policy": "continuum", "max_ttl": [None, 0.1]}]))
    argv = ["sweep", "--out", str(tmp_path / "r"), "--grid", str(tmp_path / "grid.json"), "--axis", f"trace={trace}",
            "--axis", f"profile={prof}", "--axis", "jps=1,2", "--axis", "num_gpu_blocks=64", "--reps", "2", "--no-progress"]
    assert main(argv) == 0
    assert "12 points: 0 already" in capsys.readouterr().out
    t = sw.load_results(tmp_path / "r")
    assert len(t) == 12 and set(t["rep"]) == {0, 1} and set(t["jps"]) == {1.0, 2.0}
    assert main(argv + ["--workers", "2"]) == 0
    assert "12 points: 12 already" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [
    (["--axis", "bogus=1"], "unknown axis 'bogus'"),
    (["--axis", "jps"], "is not NAME=V1,V2"),
    (["--axis", "policy=nope"], "unknown policy 'nope'"),
    (["--reps", "0"], "argument --reps: 0 is below 1"),
    (["--workers", "0"], "argument --workers: 0 is below 1"),
])
def test_cli_bad_input(tmp_path, capsys, argv, msg):
    assert main(["sweep", "--out", str(tmp_path), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_repeat_turns_scales_tokens_and_keeps_tools():
    tr = make_trace([[(100, 10, "ls", 0.5), (31, 7, "cat", 2.0), (9, 4, None, None)], [(50, 3, None, None)]], shared_prefix=30)
    assert repeat_turns(tr, 1).equals(tr)
    r = repeat_turns(tr, 3)
    p0, p1 = r[r["program_id"] == "p000"], r[r["program_id"] == "p001"]
    assert p0["turn"].tolist() == list(range(9)) and len(p1) == 3
    assert p0["new_input_tokens"].tolist() == [34, 11, 3] * 3 and p0["output_tokens"].tolist() == [4, 3, 2] * 3
    assert p0["tool"].tolist() == ["ls", "cat", "cat"] * 2 + ["ls", "cat", None]  # joints reuse the last tool call
    assert p0["tool_duration_s"].iloc[2] == 2.0 and p1["tool"].iloc[:2].isna().all() and p1["tool_duration_s"].iloc[0] == 0.0
    assert r["shared_prefix_tokens"].iloc[0] == 10
    # total tokens stay within one token per turn of the original
    assert tr[["new_input_tokens", "output_tokens"]].to_numpy().sum() <= r[["new_input_tokens", "output_tokens"]].to_numpy().sum() \
        <= tr[["new_input_tokens", "output_tokens"]].to_numpy().sum() + 2 * len(r)
    with pytest.raises(InputError, match="turn repeat"):
        repeat_turns(tr, 0)


def test_turn_repeat_axis_runs_the_transformed_trace(files):
    trace, prof = files
    one, _ = sw.run_point({"trace": trace, "profile": prof, "jps": 1.0, "num_gpu_blocks": 64})
    three, _ = sw.run_point({"trace": trace, "profile": prof, "jps": 1.0, "num_gpu_blocks": 64, "turn_repeat": 3})
    assert three["calls"] == 3 * one["calls"] and three["n_programs"] == one["n_programs"]


def test_cluster_axes_reach_the_run(files, monkeypatch):
    """replicas/router/offload reach the simulation (parsed once: router built, tiers as specs)."""
    from sim.kv.tiers import TierSpec

    trace, prof = files
    seen = []

    def takes(run, **_):
        seen.append({"replicas": run.config.cluster.replicas, "router": run.router.name, "offload": run.tiers})
        raise KeyboardInterrupt  # enough: the options arrived

    point = {"trace": trace, "profile": prof, "jps": 1.0, "replicas": 2, "router": "session", "offload": "cpu:1GiB@25"}
    monkeypatch.setattr(sw, "execute", takes)
    with pytest.raises(KeyboardInterrupt):
        sw.run_point(point)
    with pytest.raises(KeyboardInterrupt):
        sw.run_point({"trace": trace, "profile": prof, "jps": 1.0})
    assert seen == [{"replicas": 2, "router": "session", "offload": (TierSpec("cpu", 2**30, 25.0),)},
                    {"replicas": 1, "router": "round_robin", "offload": ()}]
    assert sw.point_key({"jps": 1.0, "replicas": 1, "router": None}) == sw.point_key({"jps": 1.0})



def test_router_parameters_are_axes_of_the_routers_that_have_them(files, tmp_path, monkeypatch):
    """A router's parameter (cache_aware's cache_threshold) sweeps as a policy's does: it
    applies to the grid's routers that have it, reaches the router, is a column of the
    table, and at its default keeps the key of the point without it."""
    from sim.cluster.router import Router, register_router, _CLASSES

    trace, prof = files
    base = {"trace": trace, "profile": prof, "jps": 1.0, "num_gpu_blocks": 64, "replicas": 2, "programs": 12}
    pts = sw.expand_grid({**base, "router": ["session", "cache_aware"], "cache_threshold": [0.1, 0.9]})
    assert sorted((p["router"], p.get("cache_threshold")) for p in pts) == [
        ("cache_aware", 0.1), ("cache_aware", 0.9), ("session", None)]
    assert sw.point_key({**base, "router": "cache_aware"}) == sw.point_key({**base, "router": "cache_aware", "cache_threshold": 0.3})
    assert sw.point_config(pts[0] if pts[0]["router"] == "cache_aware" else pts[1]).cluster.router_args["cache_threshold"] == 0.1

    sw.sweep(pts, tmp_path / "out", progress=False)
    table = sw.load_results(tmp_path / "out")
    assert sorted(table["cache_threshold"].dropna()) == [0.1, 0.9]
    assert "cache_threshold" in sw.axis_columns()

    seen = []
    monkeypatch.setattr(sw, "execute", lambda run, **_: seen.append(run.router.cache_threshold) or (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        sw.run_point({**base, "router": "cache_aware", "cache_threshold": 0.7})
    assert seen == [0.7]

    with pytest.raises(InputError, match="unknown axis 'cache_threshold' for policy 'vllm' and router 'session'"):
        sw.build_run({**base, "router": "session", "cache_threshold": 0.5})
    with pytest.raises(InputError, match="unknown axis 'balance_abss'.*parameters of vllm, cache_aware: balance_abs"):
        sw.expand_grid({"router": "cache_aware", "balance_abss": [1]})
    with pytest.raises(InputError, match="axis 'balance_abs' value 1.5 is not an int"):
        sw.expand_grid({"router": "cache_aware", "balance_abs": [1.5]})

    @register_router
    class Clashing(Router):  # a parameter named as one of continuum's: an axis could not tell them apart
        name = "clashing_test_router"

        def __init__(self, max_ttl: float = 1.0) -> None:
            self.max_ttl = max_ttl
    try:
        with pytest.raises(InputError, match="policy continuum and router clashing_test_router both have a parameter 'max_ttl'"):
            sw.expand_grid({"policy": "continuum", "router": "clashing_test_router", "max_ttl": [2.0]})
    finally:
        del _CLASSES["clashing_test_router"]

# --- sweeps that die cleanly (issue 17 item 4): subprocesses signalled as a terminal would --

LINUX = Path("/proc/self/stat").exists()
SLOW_GRID = ["--axis", "trace=swebench", "--axis", "programs=60", "--axis", "jps=1", "--axis", "num_gpu_blocks=3000",
             "--axis", "seed=" + ",".join(map(str, range(8)))]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _workers(parent: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent and \
                    b"spawn_main" in (stat.parent / "cmdline").read_bytes():
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def _wait(cond, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    return cond()


def _start_sweep(out: Path) -> subprocess.Popen:
    """`sim sweep --workers 2` in its own process group (the terminal's Ctrl-C signals the group)."""
    proc = subprocess.Popen([sys.executable, "-m", "agentsim.cli", "sweep", "--out", str(out), *SLOW_GRID, "--workers", "2",
                             "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    kids = _wait(lambda: len(_workers(proc.pid)) >= 2 and _workers(proc.pid), 90)
    assert kids, "the sweep started no workers"
    return proc


def _rows(out: Path) -> int:
    return len(sw.load_results(out))


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_first_ctrl_c_starts_no_queued_point_and_keeps_finished_ones(tmp_path):
    proc = _start_sweep(tmp_path)
    before = _rows(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130 and "no new points start" in err and "Traceback" not in err, err
    after = _rows(tmp_path)
    assert before <= after <= before + 2 < 8  # only the two running points finished
    with sw._lock(tmp_path):  # released
        pass


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_second_ctrl_c_exits_within_two_seconds(tmp_path):
    proc = _start_sweep(tmp_path)
    kids = _workers(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 2.0
    assert proc.returncode == 130 and "Traceback" not in err and "leaked" not in err, err
    assert _wait(lambda: not any(_alive(k) for k in kids), 2.0), "workers outlived the sweep"
    assert _rows(tmp_path) < 8


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_workers_die_with_a_killed_sweep_and_the_lock_is_free(tmp_path):
    proc = _start_sweep(tmp_path)
    kids = _workers(proc.pid)
    proc.kill()  # SIGKILL: no handler runs in the parent
    proc.communicate(timeout=30)
    assert _wait(lambda: not any(_alive(k) for k in kids), 5.0), "workers outlived their sweep"
    with sw._lock(tmp_path):
        assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())


def _hold_lock(path: Path, owner: str) -> subprocess.Popen:
    """Another process holding DIR/.lock whose text names `owner` ('{pid}' = its own pid)."""
    code = ("import fcntl, os, sys, time\n"
            "f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.truncate(0)\n"
            "f.write(sys.argv[2].format(pid=os.getpid())); f.flush(); print('held', flush=True); time.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(path), owner], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_stale_lock_of_a_dead_owner_is_taken_over(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = _hold_lock(tmp_path / ".lock", f"{dead.pid} 12345\n")  # e.g. an orphaned worker of a killed sweep
    try:
        with sw._lock(tmp_path):
            assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
            with pytest.raises(InputError, match=f"another sweep \\(pid {os.getpid()}\\) is writing"):
                with sw._lock(tmp_path):
                    pass
        assert f"from sweep pid {dead.pid}" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_lock_of_a_live_owner_is_obeyed(tmp_path):
    holder = _hold_lock(tmp_path / ".lock", "{pid} -\n")
    try:
        with pytest.raises(InputError, match=f"another sweep \\(pid {holder.pid}\\) is writing"):
            sw.sweep(grid_for_lock(), tmp_path)
    finally:
        holder.kill()
        holder.wait()


def grid_for_lock():
    return sw.expand_grid({"trace": "swebench", "programs": 2, "jps": 1.0})
