"""Never hang, never deadlock, never a traceback.

The four regression traces (tests/fixtures/regressions, found by random configurations)
and the progress watchdog that stops a run whose simulated clock no longer advances.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agentsim.cli import main
from agentsim.errors import SimulationError
from sim.simpy_replica import engine as engine_mod
from sim.simpy_replica.engine import SimpyReplica
from sim.simpy_replica.scheduler import Scheduler

REG = Path(__file__).parent / "fixtures" / "regressions"

# trace -> the flags of its `sim run` (tests/fixtures/regressions/README.md; the one-replica cases were
# found with a --router, which did nothing there and is now refused)
CASES = {
    "case4413": "--policy continuum-static --num-gpu-blocks 43 --max-num-batched-tokens 8192 --max-num-seqs 16 --replicas 1 "
                "--offload cpu:256MiB,ssd:2GiB --jps 0.3 --seed 874",
    "case20682": "--policy oracle --num-gpu-blocks 9 --max-num-batched-tokens 8192 --max-num-seqs 2 --replicas 1 "
                 "--offload cpu:1GiB --jps 0.3 --seed 702",
    "case21621": "--policy continuum-static --num-gpu-blocks 10 --max-num-batched-tokens 8192 --max-num-seqs 256 --replicas 2 "
                 "--router prefix --offload cpu:256MiB,ssd:2GiB --jps 2.0 --seed 908",
    "case21972": "--policy infercept --num-gpu-blocks 240 --max-num-batched-tokens 16 --max-num-seqs 256 --replicas 3 "
                 "--router cache_aware --offload cpu:1GiB --seed 674",
}


def argv(name: str, *extra: str) -> list[str]:
    return ["run", "--trace", str(REG / f"{name}.parquet"), *CASES[name].split(), "--no-progress", *extra]


@pytest.mark.parametrize("name", CASES)
def test_regression_finishes(name, tmp_path, capsys):
    # each used to spin forever at one instant (three) or end in a deadlock traceback
    # (infercept): the queue head was kept out by its own program's pin, with nothing running
    rc = main(argv(name, "--out", str(tmp_path / "o")))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (tmp_path / "o" / "summary.json").exists()
    assert "programs / calls" in out


def test_regression_also_finishes_without_offload(capsys):
    # README: case4413 hung without --offload too
    a = argv("case4413")
    i = a.index("--offload")
    del a[i:i + 2]
    assert main(a) == 0


def _old_unpin_for(self, call, short, now):
    """The no-deadlock rule before issue 36: the head's own pin was never dropped."""
    pid = call.req.program_id
    if self.running:
        if not self.policy.unpin_while_running:
            return False
        releasable = sum(self.pool.count_ref(blks, 1) for p, blks in self.pins.items() if p != pid)
        if releasable < short:
            return False
    victims = self.policy.unpin_victims(short, self, exclude=pid)
    for victim in victims:
        self.release_pin(victim, now, "victim")
    return bool(victims)


def _old_wake_at(self, now):
    """Before issue 36: a pin whose TTL ran out (kept while its program waits) counted as
    an event still to come, so the blocked replica woke at once, again and again."""
    return min(self.env.peek(), min((p.expiry for p in self.policy.pins.values()), default=float("inf")))


def test_watchdog_stops_a_frozen_clock_with_one_line_naming_the_state(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(Scheduler, "_unpin_for", _old_unpin_for)
    monkeypatch.setattr(SimpyReplica, "_wake_at", _old_wake_at)
    t0 = time.perf_counter()
    rc = main(argv("case4413", "--out", str(tmp_path / "o")))
    wall = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 2
    assert wall < 20  # seconds, not forever (about 1 s here, most of it start-up)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no progress ("), err
    line = lines[0]
    # what waits, what runs, what is pinned and for whom, free blocks
    for part in ("10000 passes", "at t=33.169", "waiting bfcl-0434#4 (42 blocks)", "running none",
                 "pinned 36 blocks for bfcl-0434 (36 blocks, expires t=33.169)", "free 6 of 42 blocks"):
        assert part in line, line
    assert line.count("replica 0: ") == 1
    assert not (tmp_path / "o").exists()  # nothing written


def test_watchdog_bound_is_passes_at_one_instant(monkeypatch):
    # a lower bound stops the same run sooner: the counter is what stops it, not a timer
    monkeypatch.setattr(Scheduler, "_unpin_for", _old_unpin_for)
    monkeypatch.setattr(SimpyReplica, "_wake_at", _old_wake_at)
    monkeypatch.setattr(engine_mod, "STALL_PASSES", 50)
    from sim.run.config import build_run, execute
    from sim.commands.run import config_from_args
    from agentsim.cli import build_parser

    args = build_parser("run").parse_args(argv("case4413"))
    with pytest.raises(SimulationError, match=r"no progress \(50 passes"):
        execute(build_run(config_from_args(args)))


def test_a_deadlock_is_one_line_naming_every_replica(monkeypatch, capsys):
    monkeypatch.setattr(Scheduler, "_unpin_for", _old_unpin_for)
    rc = main(argv("case21972"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    line = err[0]
    assert line.startswith("error: deadlock (nothing can run and nothing will change) at t=57.326: replica 1: "), line
    assert "pinned 238 blocks for p14 (238 blocks, expires t=inf); free 1 of 239 blocks" in line
    assert "; replica 0: " in line and "; replica 2: " in line  # the cluster adds the other replicas
    assert line.count("replica 1: ") == 1


def test_sweep_marks_a_failed_point_and_goes_on(monkeypatch, tmp_path, capsys):
    from sim.study import sweep as sweep_mod

    monkeypatch.setattr(Scheduler, "_unpin_for", _old_unpin_for)
    monkeypatch.setattr(SimpyReplica, "_wake_at", _old_wake_at)
    trace = str(REG / "case4413.parquet")
    out = tmp_path / "sw"
    rc = main(["sweep", "--out", str(out), "--axis", f"trace={trace}", "--axis", "policy=continuum-static,vllm",
               "--axis", "num_gpu_blocks=43", "--axis", "max_num_seqs=16", "--axis", "jps=0.3", "--axis", "seed=874",
               "--no-progress"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    t = sweep_mod.load_results(out)
    assert len(t) == 2
    bad = t[t["policy"] == "continuum-static"].iloc[0]
    good = t[t["policy"] == "vllm"].iloc[0]
    assert bad["error"].startswith("no progress (") and "free 6 of 42 blocks" in bad["error"]
    assert pd.isna(good["error"]) and good["mean_jct"] > 0
    assert "warning: 1 of 2 points failed" in cap.err
    # a rerun skips both (deterministic), and `sim plot` plots the point that finished
    assert main(["sweep", "--out", str(out), "--axis", f"trace={trace}", "--axis", "policy=continuum-static,vllm",
                 "--axis", "num_gpu_blocks=43", "--axis", "max_num_seqs=16", "--axis", "jps=0.3", "--axis", "seed=874",
                 "--no-progress"]) == 0
    assert "2 already in" in capsys.readouterr().out


def test_plan_marks_a_failed_candidate_and_goes_on(monkeypatch, tmp_path):
    from sim.study.plan import Question, SLO, candidates, load_prices, plan

    monkeypatch.setattr(Scheduler, "_unpin_for", _old_unpin_for)
    monkeypatch.setattr(SimpyReplica, "_wake_at", _old_wake_at)
    cands, _, profiles = candidates(["H100"], ["llama3.1-8b"], [1], ["continuum-static", "vllm"], ["none"], ["round_robin"],
                                    load_prices(), tmp_path / "p" / "profiles")
    q = Question(str(REG / "case4413.parquet"), 0.3, SLO("mean_jct", 1e9), (874,), None, 43, 2)
    res = plan(q, cands, tmp_path / "p", profiles)
    t = res.table.set_index("policy")
    assert t.loc["continuum-static", "status"] == "failed"
    assert t.loc["continuum-static", "error"].startswith("1 replicas: no progress (")
    assert t.loc["vllm", "status"] == "met"
    assert "failed: rank 2: 1 replicas: no progress" in (tmp_path / "p" / "plan.md").read_text()


def test_a_proxy_interval_too_small_to_finish_is_refused(capsys):
    # rounds of 1e-9 s: 10^9 rounds per simulated second, a run that never ended
    rc = main(["run", "--trace", "swebench", "--programs", "3", "--policy", "thunderagent", "--policy-arg", "interval=1e-9",
               "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "interval" in err[0] and "0.001" in err[0], err


def test_a_load_that_puts_arrivals_past_the_clocks_resolution_is_refused(capsys):
    # --jps 1e-300: arrivals near 1e300 s, where a step's time no longer moves the clock
    rc = main(["run", "--trace", "swebench", "--programs", "3", "--jps", "1e-300", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "give a larger --jps" in err[0], err


def _tie_run(ff: bool):
    from conftest import linear_profile, make_trace, simulate
    from sim.cluster.disagg import Disagg, find_link

    trace = make_trace([[(1, 5, "ls", 0.0), (1, 1, None, None)], [(1, 5, "ls", 0.0), (4, 1, None, None)], [(1, 1, None, None)]])
    prof = linear_profile(blocks=5, budget=16, seqs=2, c2=1e-6, c4=1e-5)
    return simulate(trace, "continuum-static", prof, np.zeros(3), fast_forward=ff, enable_chunked_prefill=False, cache="vllm",
                    disagg=Disagg(1, 1, find_link(None), max_local_prefill=0))


def test_stretch_equals_steps_when_the_victim_order_flips_ties():
    # continuum-static's victim order (latest program first) ties programs that arrived
    # together; the running list, put in that order before every step, comes back with
    # the tied calls swapped each step, so their blocks are allocated in the other order:
    # a stretch (one order for all its steps) differed from step-by-step (found by the
    # tiny-pool property; shrunk example). Now no stretch starts while the order would move.
    fast, slow = _tie_run(True), _tie_run(False)
    pd.testing.assert_frame_equal(fast.turns, slow.turns, check_exact=True)
    assert fast.summary == slow.summary
