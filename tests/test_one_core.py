"""calibrate.engine.one_core: a CPU engine's measurements run on one pinned core (two OpenMP
threads on a busy 2-core machine stall), and the process gets its cores, torch thread count
and binding back afterwards (the engine tests calibrate inside the test session)."""
import os

import pytest

from calibrate.engine import one_core


def test_one_core_pins_then_gives_everything_back(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    with one_core("cpu") as core:
        assert os.sched_getaffinity(0) == {core} and core == max(cores)
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == str(core)
        torch.set_num_threads(1)  # what vLLM's CPU worker does for one bound core
    assert os.sched_getaffinity(0) == cores and torch.get_num_threads() == threads
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_one_core_restores_after_an_error_and_does_nothing_off_cpu(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    cores = os.sched_getaffinity(0)
    with pytest.raises(RuntimeError), one_core("cpu"):
        raise RuntimeError("engine failed to start")
    assert os.sched_getaffinity(0) == cores and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    with one_core("cuda") as core:
        assert core is None and os.sched_getaffinity(0) == cores
