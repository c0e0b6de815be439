"""Issue 36 item 6: faults in sweeps. A worker process killed mid-point (a real Dask
LocalCluster, and the local pool): no result lost, every point present once. A point
whose worker dies every time: reported, not stored, the rest finish. A full disk while
the table is rewritten: the table is the previous one (never half written), one line,
and the same sweep resumes.
"""
from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import sim.study.sweep as sw
from agentsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
# points of 0.5-1 s each on a shared 2-core machine, so that a kill lands inside one
GRID = {"trace": "swebench", "programs": 150, "jps": 1, "num_gpu_blocks": 3000, "seed": list(range(6))}


def comparable(t: pd.DataFrame) -> pd.DataFrame:
    return t.drop(columns="wall_s").sort_values("key").reset_index(drop=True)


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    sw.sweep(sw.expand_grid(GRID), out)
    return comparable(sw.load_results(out))


def test_dask_worker_killed_mid_point_loses_nothing(serial, tmp_path, monkeypatch, environ_kept):
    from distributed import Client, LocalCluster

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    killed = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        def killer():
            with Client(cluster.scheduler_address, timeout="20s") as c:
                pids = c.run(os.getpid)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    busy = [w for w, tasks in c.processing().items() if tasks]
                    if busy:  # running a point (one thread a worker, no more points submitted than threads)
                        killed.append(busy[0])
                        os.kill(pids[busy[0]], signal.SIGKILL)
                        return
                    time.sleep(0.05)

        t = threading.Thread(target=killer)
        t.start()
        rep = sw.sweep(sw.expand_grid(GRID), tmp_path, dask=cluster.scheduler_address)
        t.join()
    assert killed, "no worker was killed"
    assert rep.lost == [] and rep.ran == len(serial)
    table = sw.load_results(tmp_path)
    assert table["key"].is_unique  # every point once
    pd.testing.assert_frame_equal(comparable(table), serial)


def test_local_worker_killed_mid_point_loses_nothing(serial, tmp_path, monkeypatch):
    killed, renewed = [], []
    real_renew = sw._renew
    monkeypatch.setattr(sw, "_renew", lambda ex, n: renewed.append(n) or real_renew(ex, n))

    def killer():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            kids = multiprocessing.active_children()
            if len(kids) >= 2 and sw.load_results(tmp_path).shape[0] >= 1:  # one point done, two running
                killed.append(kids[0].pid)
                os.kill(kids[0].pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    t = threading.Thread(target=killer)
    t.start()
    rep = sw.sweep(sw.expand_grid(GRID), tmp_path, workers=2)
    t.join()
    assert killed and renewed  # the death was seen and the pool replaced
    assert rep.lost == [] and rep.ran == len(serial)
    table = sw.load_results(tmp_path)
    assert table["key"].is_unique
    pd.testing.assert_frame_equal(comparable(table), serial)


def die_on_seed_1(point):
    """A point function whose worker dies on one point, every time (spawned workers
    import it from this module)."""
    if point["seed"] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"key": sw.point_key(point), "seed": point["seed"]}, None


def test_a_point_that_kills_its_worker_every_time_is_reported_not_stored():
    todo = [sw.canonical({"seed": s}) for s in range(4)]
    out = list(sw._completed(todo, die_on_seed_1, 2, None))
    done = sorted(r[0]["seed"] for p, r, why in out if r is not None)
    lost = [(p["seed"], why) for p, r, why in out if r is None]
    assert done == [0, 2, 3]  # the others finish (some run again on a fresh pool)
    assert len(lost) == 1 and lost[0][0] == 1
    assert f"its worker died {sw.TRIES} " in lost[0][1] and "BrokenProcessPool" in lost[0][1]


def test_full_disk_keeps_the_table_whole_and_the_sweep_resumes(tmp_path, monkeypatch, capsys):
    real = pd.DataFrame.to_parquet
    calls = []

    def enospc(self, path, *a, **k):
        calls.append(path)
        if len(calls) == 3:  # the third rewrite of the table: half a file, then the disk is full
            Path(path).write_bytes(b"PAR1" + b"\0" * 100)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, path, *a, **k)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", enospc)
    argv = ["sweep", "--out", str(tmp_path), "--axis", "trace=swebench", "--axis", "programs=3",
            "--axis", "seed=0,1,2,3", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "keeps the 2 points written before" in err[0], err
    assert sorted(os.listdir(tmp_path)) == [".lock", "results.parquet"]  # no temp file left
    assert len(sw.load_results(tmp_path)) == 2  # the previous table, whole
    monkeypatch.setattr(pd.DataFrame, "to_parquet", real)
    assert main(argv) == 0
    assert "4 points: 2 already in" in capsys.readouterr().out
    t = sw.load_results(tmp_path)
    assert len(t) == 4 and t["key"].is_unique


def test_cli_names_a_lost_point_and_exits_1(tmp_path, monkeypatch, capsys):
    real = sw._completed

    def losing(todo, fn, workers, dask):  # the second point's worker died every time
        for i, (p, res, why) in enumerate(real(todo, fn, workers, dask)):
            yield (p, None, "its worker died 3 times running it alone (BrokenProcessPool: killed)") if i == 1 else (p, res, why)

    monkeypatch.setattr(sw, "_completed", losing)
    argv = ["sweep", "--out", str(tmp_path), "--axis", "trace=swebench", "--axis", "programs=3", "--axis", "seed=0,1,2",
            "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: 1 points lost with their worker processes and not stored"), err
    assert len(sw.load_results(tmp_path)) == 2
    monkeypatch.setattr(sw, "_completed", real)
    assert main(argv) == 0  # the same command runs the lost point
    assert "3 points: 2 already in" in capsys.readouterr().out
