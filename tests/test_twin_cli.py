"""`--scheduler vllm` input checks that need no vLLM (they run before it is imported), and
the twin check's first-difference classifier (benchmarks/twin_check.py)."""
import sys
from pathlib import Path

import pytest

from agentsim.cli import main
from agentsim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
from benchmarks import twin_check  # noqa: E402

_RUN = ["run", "--trace", "swebench", "--programs", "3", "--no-progress"]


def test_the_radix_cache_is_one_line_exit_2(capsys, tmp_path):
    rc = main([*_RUN, "--scheduler", "vllm", "--cache", "radix", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.count("\n") == 0 and "cannot run --cache radix" in err and "--scheduler simpy" in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_async_scheduling_refuses_the_radix_cache(capsys, tmp_path):
    rc = main([*_RUN, "--async-scheduling", "--cache", "radix", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "--async-scheduling" in err and "--cache radix" in err
    assert not (tmp_path / "o").exists()


def test_async_scheduling_on_simpy_runs(capsys, tmp_path):
    """The SimPy replica schedules asynchronously (sim/simpy_replica/engine.py _loop_async); the twin
    tests compare it with vLLM's AsyncScheduler (tests/test_twin_engine.py)."""
    rc = main([*_RUN, "--async-scheduling", "--out", str(tmp_path / "o")])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "o").exists()


def test_without_vllm_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    rc = main([*_RUN, "--scheduler", "vllm"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.count("\n") == 0 and "--scheduler vllm needs vLLM 0.32 installed" in err


def test_unknown_engine_is_refused(capsys):
    assert main([*_RUN, "--scheduler", "sglang"]) == 2
    assert "no such scheduler; give one of: simpy, vllm" in capsys.readouterr().err


def test_engine_field_in_the_config():
    from sim.run.config import SimConfig, parse_config

    assert SimConfig().engine.scheduler == "simpy"  # the SimPy replica stays the default
    assert parse_config({"engine": {"scheduler": "vllm"}}, "t").engine.scheduler == "vllm"
    with pytest.raises(InputError, match="engine.scheduler"):
        parse_config({"engine": {"scheduler": "x"}}, "t")


def test_first_difference_names_the_mechanism():
    same = [(0.0, {"a#0": 100}, 0), (0.1, {"a#0": 1, "b#0": 50}, 0)]
    assert twin_check.first_difference(same, same) is None
    admit = [(0.0, {"a#0": 100}, 0), (0.1, {"a#0": 1}, 0)]
    d = twin_check.first_difference(same, admit)
    assert d["step"] == 1 and d["mechanism"].startswith("admission order") and "SimPy only b#0" in d["mechanism"]
    chunk = [(0.0, {"a#0": 100}, 0), (0.1, {"a#0": 1, "b#0": 40}, 0)]
    assert twin_check.first_difference(same, chunk)["mechanism"].startswith("prefix hit at admission")
    chunk2 = [(0.0, {"a#0": 60}, 0), (0.1, {"a#0": 1}, 0)]
    assert twin_check.first_difference(admit, chunk2)["mechanism"].startswith("prefix hit")  # a's first step
    later = [(0.0, {"a#0": 100}, 0), (0.1, {"a#0": 2}, 0)]
    assert twin_check.first_difference(admit, later)["mechanism"].startswith("chunk size")
    pre = [(0.0, {"a#0": 100}, 0), (0.1, {"a#0": 1}, 1)]
    assert twin_check.first_difference(admit, pre)["mechanism"].startswith("preemption")
    late = [(0.0, {"a#0": 100}, 0), (0.2, {"a#0": 1}, 0)]
    assert twin_check.first_difference(admit, late)["mechanism"].startswith("step start")
    assert twin_check.first_difference(admit, admit[:1])["mechanism"].startswith("step count")
