"""The run summary's arithmetic on hand-worked turns."""
import pytest

from sim.run.metrics import summarize, turn_columns


def _turns():
    # program 0: turn 0 arrives 0, ends 2; its tool runs until 5, turn 1 ends 6 -> JCT 6
    # program 1: one turn, arrives 1, waits 3 in the queue, ends 9 -> JCT 8
    rows = [(0, 0, 0.0, 0.5, 2.0), (0, 1, 5.0, 5.0, 6.0), (1, 0, 1.0, 4.0, 9.0)]
    return [{
        "program_id": p, "turn": t, "arrival": a, "program_arrival": 0.0 if p == 0 else 1.0, "scheduled": s,
        "first_token": s + 0.1, "finish": f, "queue_delay": s - a, "prompt_tokens": 100, "output_tokens": 10,
        "cached_tokens": 50 if t else 0, "computed_prompt_tokens": 50 if t else 100, "preemptions": 0,
        "exec_time": 3.0, "tool": "x", "is_last": t == 1 or p == 1, "replica": 0, "loaded_tokens": 0, "reload_s": 0.0,
    } for p, t, a, s, f in rows]


def test_summary_figures():
    s = summarize(turn_columns(_turns()), {})  # rows sorted by program and turn, as Recorder.sorted_turns gives them
    assert s["mean_jct"] == pytest.approx(7.0) and s["max_jct"] == pytest.approx(8.0)
    # turn latencies 2, 1, 8: a turn is measured from its own arrival, not its program's
    assert s["mean_turn_latency"] == pytest.approx(11 / 3)
    assert s["p99_turn_latency"] == pytest.approx(2 + 0.98 * 6)  # numpy's linear interpolation
    assert s["mean_queue_delay"] == pytest.approx((0.5 + 0 + 3) / 3)
    assert s["cache_hit_ratio"] == pytest.approx(50 / 300)  # only the second turn hit
    assert s["makespan_s"] == pytest.approx(9.0) and s["jobs_per_s"] == pytest.approx(2 / 9)
