"""vLLM's request metrics (TTFT, TPOT, ITL, E2EL, queue time): per call in turns.parquet,
mean / median / std / p99 in the summary under `vllm bench serve`'s names; and the
per-call `loaded_tokens` of a preempted call (issue 36 item 7)."""
import math

import numpy as np
import pytest

from policies.base import Request
from sim.replica.call import Call
from sim.run.metrics import Recorder, request_metrics, summarize, turn_columns

# (program, turn, arrival, scheduled, first token, finish, output tokens), worked by hand:
#   A: TTFT 1.0, TPOT (2.0 - 1.0) / 10 = 0.1, E2EL 2.0, queue 0.5
#   B: TTFT 0.2, TPOT (6.0 - 5.2) / 4 = 0.2, E2EL 1.0, queue 0.0
#   C: one output token: TTFT 3.5, no TPOT (vLLM leaves it out), E2EL 3.5, queue 3.0
ROWS = [(0, 0, 0.0, 0.5, 1.0, 2.0, 11), (0, 1, 5.0, 5.0, 5.2, 6.0, 5), (1, 0, 1.0, 4.0, 4.5, 4.5, 1)]


def _turns():
    return [{
        "program_id": p, "turn": t, "arrival": a, "program_arrival": 0.0 if p == 0 else 1.0, "scheduled": s,
        "first_token": ft, "finish": f, "queue_delay": s - a, "prompt_tokens": 100, "output_tokens": n,
        "cached_tokens": 0, "computed_prompt_tokens": 100, "preemptions": 0, "exec_time": 1.0, "tool": "x",
        "is_last": t == 1 or p == 1, "replica": 0, "loaded_tokens": 0, "reload_s": 0.0,
    } for p, t, a, s, ft, f, n in ROWS]


def test_summary_request_metrics_by_hand():
    s = summarize(turn_columns(_turns()), {})
    ms = 1000
    # TTFT 1.0, 0.2, 3.5 s; numpy's p99 of three values: the middle one + 0.98 of the gap above it
    assert s["mean_ttft_ms"] == pytest.approx(4.7 / 3 * ms)
    assert s["median_ttft_ms"] == pytest.approx(1.0 * ms)
    assert s["p99_ttft_ms"] == pytest.approx((1.0 + 0.98 * 2.5) * ms)
    assert s["std_ttft_ms"] == pytest.approx(np.std([1.0, 0.2, 3.5]) * ms)
    # TPOT 0.1, 0.2 s (the one-token call has none)
    assert s["mean_tpot_ms"] == pytest.approx(150.0)
    assert s["median_tpot_ms"] == pytest.approx(150.0)
    assert s["p99_tpot_ms"] == pytest.approx(199.0)
    assert s["std_tpot_ms"] == pytest.approx(50.0)
    # ITL: every token gap of every call, 1.8 s of decode over 10 + 4 gaps
    assert s["mean_itl_ms"] == pytest.approx(1.8 / 14 * ms)
    # E2EL 2.0, 1.0, 3.5 s
    assert s["mean_e2el_ms"] == pytest.approx(6.5 / 3 * ms)
    assert s["median_e2el_ms"] == pytest.approx(2.0 * ms)
    assert s["p99_e2el_ms"] == pytest.approx((2.0 + 0.98 * 1.5) * ms)
    # queue time 0.5, 0.0, 3.0 s
    assert s["mean_queue_time_ms"] == pytest.approx(3.5 / 3 * ms)
    assert s["median_queue_time_ms"] == pytest.approx(0.5 * ms)
    assert s["p99_queue_time_ms"] == pytest.approx((0.5 + 0.98 * 2.5) * ms)
    assert s["mean_e2el_ms"] == pytest.approx(s["mean_turn_latency"] * ms)  # the same quantity


def test_no_call_of_two_tokens_gives_zero_tpot_as_vllm():
    t = turn_columns([r for r in _turns() if r["output_tokens"] == 1])
    m = request_metrics(t)
    assert m["mean_tpot_ms"] == 0.0 and m["p99_tpot_ms"] == 0.0 and m["mean_itl_ms"] == 0.0


def _call(arrival, scheduled, first, n_out, prompt=100):
    req = Request(req_id="p#0", program_id="p", turn=0, arrival=arrival, program_arrival=arrival,
                  prompt_tokens=prompt, is_last_step=True, tool=None, true_tool_duration=None)
    c = Call(req=req, seq_no=0, prompt_len=prompt, max_output=n_out)
    c.scheduled_at, c.first_token_at, c.num_output, c.cached_tokens = scheduled, first, n_out, 0
    return c


def test_turn_row_columns():
    rec = Recorder()
    rec.record(_call(1.0, 1.5, 2.0, 11), now=4.0)
    rec.record(_call(1.0, 1.0, 1.25, 1), now=1.25)
    a, b = rec.turns
    assert (a["ttft"], a["tpot"], a["e2el"], a["queue_delay"]) == pytest.approx((1.0, 0.2, 3.0, 0.5))
    assert b["ttft"] == pytest.approx(0.25) and math.isnan(b["tpot"]) and b["e2el"] == pytest.approx(0.25)


def test_run_columns_agree_with_summary():
    """A real run: the columns are what the summary's figures are made of."""
    from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute

    res = execute(build_run(SimConfig(workload=WorkloadConfig(trace="swebench", programs=6, jps=1.0),
                                      policy=PolicyConfig(name="vllm"), engine=EngineLimits(num_gpu_blocks=3000))))
    t, s = res.turns, res.summary
    assert np.allclose(t["ttft"], t["first_token"] - t["arrival"])
    assert np.allclose(t["e2el"], t["finish"] - t["arrival"])
    assert (t["ttft"] > 0).all() and (t["ttft"] <= t["e2el"]).all()
    multi = t["output_tokens"] > 1
    assert np.allclose(t.loc[multi, "tpot"], (t["finish"] - t["first_token"])[multi] / (t["output_tokens"][multi] - 1))
    assert s["mean_ttft_ms"] == pytest.approx(t["ttft"].mean() * 1000)
    assert s["p99_tpot_ms"] == pytest.approx(np.percentile(t.loc[multi, "tpot"], 99) * 1000)
    assert s["median_e2el_ms"] == pytest.approx(t["e2el"].median() * 1000)
    assert s["mean_queue_time_ms"] == pytest.approx(s["mean_queue_delay"] * 1000)


def test_loaded_tokens_of_a_preempted_call_stay_within_its_prompt():
    """Issue 36 item 7: a call preempted and readmitted reloads from the CPU tier at each
    admission; `loaded_tokens` is its last admission's (at most the prompt), the sum over
    admissions is `reloaded_tokens_total`. Measured: swebench-0009 turn 3 here, a prompt of
    4,128 tokens, preempted twice, reloads 5,504 tokens in all, 3,104 at its last admission."""
    from sim.run.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute

    res = execute(build_run(SimConfig(workload=WorkloadConfig(trace="swebench", programs=20, jps=1.0),
                                      policy=PolicyConfig(name="infercept"), engine=EngineLimits(num_gpu_blocks=1500),
                                      cluster=ClusterConfig(offload="cpu:4GiB"))))
    t = res.turns
    over = t[t["reloaded_tokens_total"] > t["prompt_tokens"]]
    assert len(over) >= 1 and (over["preemptions"] >= 1).all()  # the case the old column read wrong
    assert (t["loaded_tokens"] <= t["prompt_tokens"]).all()
    assert (t["loaded_tokens"] <= t["reloaded_tokens_total"]).all()
    once = t["preemptions"] == 0
    assert (t.loc[once, "loaded_tokens"] == t.loc[once, "reloaded_tokens_total"]).all()  # one admission: the same
    assert t["reloaded_tokens_total"].sum() == res.summary["offload_loaded_tokens"]  # every load, counted once
    p = res.programs
    assert p["reloaded_tokens_total"].sum() == t["reloaded_tokens_total"].sum()
    assert p["loaded_tokens"].sum() == t["loaded_tokens"].sum()


def test_each_admission_adds_up_to_the_prompt_after_preemptions_with_offload():
    """Issue 54: cached_tokens was the first admission's hit and loaded_tokens the last's
    reload, so a preempted call could show more than its prompt. Every admission now has
    its cached, loaded and computed prompt tokens side by side; the flat columns are the
    first admission's."""
    from sim.run.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute

    res = execute(build_run(SimConfig(workload=WorkloadConfig(trace="swebench", programs=20, jps=1.0),
                                      policy=PolicyConfig(name="infercept"), engine=EngineLimits(num_gpu_blocks=1500),
                                      cluster=ClusterConfig(offload="cpu:4GiB"))))
    t = res.turns
    again = t[t["admissions"] > 1]
    assert (again["preemptions"] >= 1).all() and (t["admissions"] == t["preemptions"] + 1).all()
    # a readmission that reloaded: the case the old pair of columns read wrong
    assert any(sum(ld[1:]) > 0 for ld in again["admission_loaded"])
    for c, ld, n, p in zip(t["admission_cached"], t["admission_loaded"], t["admission_computed"], t["prompt_tokens"]):
        assert c[-1] + ld[-1] + n[-1] == p and all(a + b + k <= p for a, b, k in zip(c, ld, n))
    assert (t["cached_tokens"] + t["loaded_tokens"] + t["computed_tokens"] <= t["prompt_tokens"]).all()
    assert (t["computed_prompt_tokens"] == [sum(n) for n in t["admission_computed"]]).all()
    assert (t["loaded_tokens_total"] <= t["reloaded_tokens_total"]).all()
