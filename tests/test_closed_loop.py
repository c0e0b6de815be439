"""Closed-loop workload (`sim run --workload closed --concurrency N`, issue 35 item 3): N
programs in flight, the next one starting when one finishes; agent steps per minute."""
import numpy as np
import pandas as pd
import pytest

from policies.registry import POLICIES
from sim.run.config import ClusterConfig, EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute


def _tiny(n=4, tool_s=10.0, arrival=None):
    """n programs of two calls (64 new tokens, 2 output tokens each), a 10 s tool between."""
    rows = []
    for i in range(n):
        for t in (0, 1):
            rows.append({"program_id": f"p{i}", "turn": t, "new_input_tokens": 64, "output_tokens": 2,
                         "tool": "sleep" if t == 0 else None, "tool_duration_s": tool_s if t == 0 else np.nan,
                         **({} if arrival is None else {"arrival_s": arrival})})
    return pd.DataFrame(rows)


def _run(frame=None, policy="vllm", **workload):
    cfg = SimConfig(workload=WorkloadConfig(**workload), policy=PolicyConfig(name=policy),
                    engine=EngineLimits(num_gpu_blocks=3000))
    return execute(build_run(cfg, trace=frame))


def test_steps_per_minute_by_hand():
    """4 programs of 2 calls, a 10 s tool each, 2 in flight: p0 and p1 start at 0 and end
    just after 10 s (two short calls and the tool); p2 and p3 take their places and end
    just after 20 s. 8 calls in about 20 s: 24 steps per minute, a little under."""
    res = _run(_tiny(), mode="closed", concurrency=2)
    p = res.programs.set_index("program_id")
    s = res.summary
    assert (p.loc[["p0", "p1"], "arrival"] == 0).all()
    # each later program starts at the instant an earlier one finishes, in trace order
    first_done = sorted(p.loc[["p0", "p1"], "finish"])
    assert [p.loc["p2", "arrival"], p.loc["p3", "arrival"]] == first_done
    assert 10.0 < first_done[0] < 10.1 and 20.0 < s["makespan_s"] < 20.2
    assert s["steps_per_minute"] == pytest.approx(8 * 60 / s["makespan_s"], rel=1e-12)
    assert 23.8 < s["steps_per_minute"] < 24.0
    tokens = 8 * 2 + (64 + 130) * 4  # output; prompts: turn 0 64, turn 1 64 + 2 + 64
    assert s["total_tokens_per_s"] == pytest.approx(tokens / s["makespan_s"])
    # never more than 2 programs in flight, and 2 while any waits
    for t in np.linspace(0, s["makespan_s"], 401)[:-1]:
        busy = int(((p["arrival"] <= t) & (t < p["finish"])).sum())
        assert busy == 2 or (busy <= 2 and t >= first_done[1])


def test_concurrency_of_all_programs_is_every_arrival_at_zero():
    closed = _run(_tiny(), mode="closed", concurrency=4)
    open_ = _run(_tiny(arrival=0.0))  # the trace's arrivals: all at 0
    pd.testing.assert_frame_equal(closed.turns, open_.turns)


def test_concurrency_one_runs_programs_back_to_back():
    res = _run(_tiny(3), mode="closed", concurrency=1)
    p = res.programs.sort_values("arrival")
    assert (p["arrival"].to_numpy()[1:] == p["finish"].to_numpy()[:-1]).all()
    assert res.summary["makespan_s"] == pytest.approx(p["jct"].sum())


@pytest.mark.parametrize("replicas,router", [(1, None), (2, "session"), (2, "least_loaded")])
def test_fast_forward_same_as_step_by_step(replicas, router):
    """Decode stretches cannot know when a closed-loop program starts (a finish elsewhere);
    the engine cuts a stretch at such an arrival, so results equal step-by-step's."""
    runs = []
    for ff in (True, False):
        cfg = SimConfig(workload=WorkloadConfig(trace="swebench", programs=12, mode="closed", concurrency=5),
                        policy=PolicyConfig(name="continuum"), engine=EngineLimits(num_gpu_blocks=1200, fast_forward=ff),
                        cluster=ClusterConfig(replicas=replicas, router=router))
        runs.append(execute(build_run(cfg)))
    assert runs[0].summary["peak_kv_usage"] > 0.9  # memory runs short: pins and evictions matter
    pd.testing.assert_frame_equal(runs[0].turns, runs[1].turns)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_runs_closed(policy):
    res = _run(None, policy, trace="swebench", programs=8, mode="closed", concurrency=3)
    p = res.programs
    assert len(p) == 8 and (p["arrival"] == 0).sum() == 3
    assert res.summary["steps_per_minute"] > 0


def test_bad_flags_one_line_exit_2(capsys):
    from agentsim.cli import main

    for args, says in ((["--workload", "closed", "--concurrency", "0"], "--concurrency"),
                       (["--workload", "closed"], "needs --concurrency"),
                       (["--concurrency", "2"], "applies only with --workload closed"),
                       (["--workload", "closed", "--concurrency", "2", "--jps", "1"], "--jps"),
                       (["--workload", "shut", "--concurrency", "2"], "--workload")):
        assert main(["run", "--programs", "2", "--no-progress", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error:") and says in err, (args, err)


def test_closed_config_round_trips(tmp_path):
    """config.json of a closed-loop run reproduces it (mode and concurrency are in it)."""
    import json

    from agentsim.cli import main

    out = tmp_path / "r"
    assert main(["run", "--programs", "6", "--workload", "closed", "--concurrency", "2", "--num-gpu-blocks", "3000",
                 "--no-progress", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["workload"]["mode"] == "closed" and cfg["workload"]["concurrency"] == 2
    assert main(["run", "--config", str(out / "config.json"), "--no-progress", "--out", str(tmp_path / "again")]) == 0
    a, b = (pd.read_parquet(d / "turns.parquet") for d in (out, tmp_path / "again"))
    pd.testing.assert_frame_equal(a, b)
    s = json.loads((out / "summary.json").read_text())
    assert s["steps_per_minute"] == pytest.approx(len(a) * 60 / s["makespan_s"])


def test_closed_loop_arrivals_from_python():
    from agentsim.errors import InputError
    from sim.run.workload import closed_loop_arrivals

    a = closed_loop_arrivals(5, 2)
    assert list(a[:2]) == [0.0, 0.0] and np.isnan(a[2:]).all()
    assert (closed_loop_arrivals(3, 8) == 0).all()  # more slots than programs: all start at once
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="--concurrency"):
            closed_loop_arrivals(3, bad)


def test_closed_loop_table_writes_its_block_and_the_results_page_marks_it(tmp_path, capsys):
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    from benchmarks import closed_loop_table as clt

    marked = re.findall(r"^<!-- closed_loop_table: (.*?) -->\n\n(Table: .*?)\n\n<!-- end closed_loop_table -->$",
                        (root / "docs" / "reference" / "results.md").read_text(), re.S | re.M)
    assert len(marked) == 1
    key, body = marked[0]
    rows = body.split("\n")[4:]
    assert [r.split(" | ")[0][2:] for r in rows] == re.search(r"--concurrency (\S+)", key).group(1).split(",")
    assert all(r.count("(x") == 3 for r in rows) and "(x1.00;" in rows[0]
    tiny = ["--programs", "4", "--concurrency", "1,2", "--num-gpu-blocks", "3000", "--policies", "vllm,continuum"]
    tiny_key = "--trace swebench --programs 4 --num-gpu-blocks 3000 --concurrency 1,2 --policies vllm,continuum --profile llama3.1-8b-h100"
    page = tmp_path / "results.md"
    page.write_text(f"before\n<!-- closed_loop_table: {tiny_key} -->\nold\n<!-- end closed_loop_table -->\nafter\n")
    text = clt.main([*tiny, "--write-docs", str(page)])
    assert text in capsys.readouterr().out and text in page.read_text() and "old" not in page.read_text()
    assert page.read_text().startswith("before\n") and page.read_text().endswith("after\n")
