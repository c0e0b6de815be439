"""End-to-end runs of the simulator: hand-computed JCTs, determinism, no leaks, CLI."""
import json

import numpy as np
import pandas as pd
import pytest

from conftest import linear_profile, make_trace, random_trace, simulate
from policies.registry import POLICIES
from sim.cli import main


def run(trace, arrivals, policy="vllm", ff=True, offload=None, **prof):
    p = linear_profile(**prof)
    return simulate(trace, policy, p, arrivals, fast_forward=ff, offload=offload)


def test_one_program_hand_computed():
    # step = 0.01 + 0.001 * tokens. Turn 0: prefill 100 (0.11 s, first token), 4 decodes
    # (0.011 s each) -> 0.154. Tool 1 s -> turn 1 arrives 1.154 with prompt 100+5+20 = 125;
    # 104 tokens had KV (the last sampled token never runs), 6 full blocks (96 tokens) are
    # cached, so it prefills 29 tokens (0.039 s) then 2 decodes: finish 1.154+0.039+0.022.
    tr = make_trace([[(100, 5, "ls", 1.0), (20, 3, None, None)]])
    res = run(tr, [0.0])
    t = res.turns
    assert t["finish"].tolist() == pytest.approx([0.154, 1.215])
    assert t["cached_tokens"].tolist() == [0, 96]
    assert t["computed_prompt_tokens"].tolist() == [100, 29]
    assert res.programs["jct"].iloc[0] == pytest.approx(1.215)


def test_two_programs_share_steps_hand_computed():
    # p0: prompt 100, 3 outputs; p1 arrives at 0.05, prompt 50, 2 outputs.
    # step1 [0, 0.11): p0 prefill 100. step2 [0.11, 0.171): p0 decode + p1 prefill 50 = 51 tok.
    # step3 [0.171, 0.183): p0 decode + p1 decode (2 tok) -> both done at 0.183.
    tr = make_trace([[(100, 3, None, None)], [(50, 2, None, None)]])
    res = run(tr, [0.0, 0.05])
    jct = dict(zip(res.programs["program_id"], res.programs["jct"]))
    assert jct["p000"] == pytest.approx(0.183)
    assert jct["p001"] == pytest.approx(0.183 - 0.05)
    assert res.turns.set_index("program_id")["queue_delay"]["p001"] == pytest.approx(0.06)


def test_deterministic_same_seed_same_summary():
    tr = random_trace(np.random.default_rng(1), 30)
    arr = np.sort(np.random.default_rng(2).uniform(0, 20, 30))
    a = run(tr, arr, blocks=120).summary
    b = run(tr, arr, blocks=120).summary
    assert a == b


# the GPU step model (sim/hardware/profile.py): weights floor, launch floor of prefill steps, smooth max
GPU_TERMS = {"w": 0.012, "launch": 0.03, "p": 5.7}
MOE_TERMS = {"routed": 0.02, "routed_share": 0.0625}  # the routed experts a step's tokens go to


@pytest.mark.parametrize("gpu", [{}, GPU_TERMS, MOE_TERMS], ids=["linear", "gpu-terms", "moe"])
def test_decode_stretches_match_step_by_step(gpu):
    tr = random_trace(np.random.default_rng(3), 25)
    arr = np.sort(np.random.default_rng(4).uniform(0, 10, 25))
    fast = run(tr, arr, blocks=150, c2=1e-6, c4=1e-5, c5=2e-6, **gpu)
    slow = run(tr, arr, blocks=150, c2=1e-6, c4=1e-5, c5=2e-6, ff=False, **gpu)
    assert fast.summary["steps"] == slow.summary["steps"]
    assert fast.summary["preemptions"] == slow.summary["preemptions"]
    np.testing.assert_allclose(fast.turns["finish"], slow.turns["finish"], rtol=1e-9)
    assert (fast.turns["cached_tokens"] == slow.turns["cached_tokens"]).all()


def test_lone_replica_stretch_runs_through_the_step_an_arrival_lands_in(monkeypatch):
    """A lone replica hears of an arrival only at the end of the step it lands in, so its
    stretch runs through that step (sim/simpy_replica/engine.py mid_step_reads) instead of stopping
    before it: one step fewer run alone per arrival, and the same results bit for bit."""
    import sim.simpy_replica.engine

    # p000 decodes 200 tokens (0.011 s a step); p001 arrives at 0.5 s, inside a step
    tr = make_trace([[(100, 200, None, None)], [(50, 3, None, None)]])
    lengths = []
    account = sim.simpy_replica.engine.SimpyReplica._account
    monkeypatch.setattr(sim.simpy_replica.engine.SimpyReplica, "_account", lambda self, now, dts, sch: lengths.append(len(dts)) or account(self, now, dts, sch))
    fast = run(tr, [0.0, 0.5])
    ff_lengths, lengths[:] = lengths[:], []
    slow = run(tr, [0.0, 0.5], ff=False)
    pd.testing.assert_frame_equal(fast.turns, slow.turns, check_exact=True)
    assert fast.summary["steps"] == slow.summary["steps"] == len(lengths)
    # prefill, one stretch to the end of the step p001 arrives in, p001's prefill, then decodes
    assert ff_lengths[0] == 1 and ff_lengths[2] == 1
    assert 0.11 + sum(0.011 for _ in range(ff_lengths[1])) >= 0.5 > 0.11 + 0.011 * (ff_lengths[1] - 1)


@pytest.mark.parametrize("offload", [None, "cpu:1MiB@0.05,ssd:2MiB@0.01"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_leaks_on_random_traces_under_pressure(policy, offload):
    # execute asserts itself that every block ends free or cached (BlockPool.check),
    # every tier within capacity, and no pin outlives its program; here also that every
    # call finished exactly once. Tiny CPU and SSD tiers force LRU evictions in both.
    for seed in range(8 if offload is None else 4):
        rng = np.random.default_rng(seed)
        tr = random_trace(rng, 15)
        arr = np.sort(rng.uniform(0, 5, 15))
        res = run(tr, arr, policy=policy, offload=offload, blocks=int(rng.integers(130, 200)),
                  budget=int(rng.integers(64, 512)), seqs=int(rng.integers(2, 16)))
        assert len(res.turns) == len(tr)
        assert not res.turns.duplicated(["program_id", "turn"]).any()
        if offload:
            assert res.summary["tiers"]["cpu"]["evicted"] > 0


def test_cli_run_writes_results(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--trace", "swebench", "--policy", "vllm", "--jps", "0.5", "--programs", "5",
                 "--num-gpu-blocks", "4000", "--out", str(out), "--no-progress"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["programs"] == 5 and s["num_gpu_blocks"] == 4000
    printed = capsys.readouterr().out
    assert "JCT mean" in printed
    assert (out / "programs.parquet").exists() and (out / "turns.parquet").exists()
    # 5 programs on 4,000 blocks never fill the pool: one line says policies cannot differ
    assert s["peak_kv_usage"] < 0.9
    assert [ln for ln in printed.splitlines() if ln.startswith("note: the KV pool was never under pressure")]


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--policy", "nope"], "unknown policy 'nope'"),
    (["run", "--trace", "nosuch"], "trace 'nosuch' not found"),
    (["run", "--block-size", "32"], "contradicts profile"),
    (["run", "--num-gpu-blocks", "99999999"], "exceeds the"),
    (["run", "--jps", "0", "--programs", "2"], "--jps must be > 0"),
    (["run", "--policy-arg", "x"], "is not K=V"),
    (["run", "--jps", "abc"], "invalid float value"),
])
def test_cli_bad_input_is_one_line(argv, fragment, capsys):
    try:
        code = main(argv + ["--no-progress"])
    except SystemExit as e:  # argparse's own errors exit
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_malformed_profile_is_one_line(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text('{"model": {}, "engine": {"block_size": 16}}')
    assert main(["run", "--profile", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "missing section 'step_time'" in err and err.count("\n") == 1
    bad.write_text("{not json")
    assert main(["run", "--profile", str(bad), "--no-progress"]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_prefill_time_matches_the_simulated_chunked_prefill():
    # a lone 5,000-token prompt with a 2,048-token budget runs as 3 chunks in the engine
    prof = linear_profile(c2=1e-7, c4=1e-6, c5=3e-7, budget=2048, blocks=1000)
    res = run(make_trace([[(5000, 1, None, None)]]), [0.0], c2=1e-7, c4=1e-6, c5=3e-7, budget=2048, blocks=1000)
    assert res.turns["finish"].iloc[0] == pytest.approx(prof.prefill_time(5000))


def test_a_context_needing_every_block_is_refused_not_deadlocked():
    # 60 blocks of 16 tokens: vLLM keeps one as its null block, so 59 (944 tokens) are usable
    from agentsim.errors import InputError

    ok = make_trace([[(900, 45, None, None)]])  # 944 tokens of KV (the last sampled token has none)
    assert len(run(ok, [0.0], blocks=60).turns) == 1
    with pytest.raises(InputError, match="59 usable KV blocks"):
        run(make_trace([[(899, 60, None, None)]]), [0.0], blocks=60)


def test_summary_lists_the_most_pinned_tools_and_says_when_memory_never_ran_short():
    from sim.commands.run import format_summary

    tr, arr = random_trace(np.random.default_rng(5), 30), np.arange(30) * 0.5
    s = run(tr, arr, policy="static-ttl", blocks=5000).summary
    s["ttl_by_tool"] = {f"t{i:02d}": {"pins": (i * 7) % 15, "mean_ttl_s": 1.0} for i in range(15)}  # 15 tools
    text = format_summary(s)
    shown = [ln.split()[1] for ln in text.splitlines() if ln.startswith("  TTL ") and "other" not in ln]
    pins = {t: v["pins"] for t, v in s["ttl_by_tool"].items()}
    assert len(shown) == 12 and min(pins[t] for t in shown) >= max(pins[t] for t in pins if t not in shown)
    assert "3 more in summary.json" in text
    notes = [ln for ln in text.splitlines() if ln.startswith("note:")]
    assert s["peak_kv_usage"] < 0.9 and len(notes) == 1 and "the KV pool was never under pressure" in notes[0]
    assert "retention policies cannot differ" in notes[0] and "--num-gpu-blocks" in notes[0]
    tight = run(tr, np.zeros(30), policy="static-ttl", blocks=80).summary
    assert tight["peak_kv_usage"] >= 0.9 and "never under pressure" not in format_summary(tight)


def test_summary_says_how_steps_were_scheduled_and_priced():
    from sim.commands.run import format_summary

    tr = make_trace([[(200, 20, None, None)]])
    host = {**linear_profile().raw, "host": {"step_s": 1e-3}}
    from sim.hardware.profile import parse_profile

    lines = {}
    for prof, a in [(linear_profile(), False), (parse_profile(host, "h"), False), (parse_profile(host, "h"), True)]:
        s = simulate(tr, "vllm", prof, [0.0], async_scheduling=a).summary
        lines[(prof.step.host > 0, a)] = next(ln for ln in format_summary(s).splitlines() if ln.startswith("scheduling"))
    assert lines[False, False].endswith("synchronous, device time only (the profile has no host section)")
    assert lines[True, False].endswith("synchronous, host time added to each step")
    assert lines[True, True].endswith("asynchronous, host time overlapped with each step")


def test_a_reader_that_goes_away_gets_no_traceback():
    import subprocess
    import sys

    # `true` exits at once without reading: the summary, printed a second later, meets a closed pipe
    p = subprocess.run(f"{sys.executable} -m sim.cli run --programs 3 --no-progress | true", shell=True,
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_summary_names_the_policys_own_decisions():
    # each policy counts its own DECISIONS: soft retention's "retained", not InferCept's three
    from sim.commands.run import format_summary

    tr, arr = random_trace(np.random.default_rng(5), 20), np.zeros(20)
    s = run(tr, arr, policy="continuum-soft", blocks=400).summary
    line = next(ln for ln in format_summary(s).splitlines() if ln.startswith("retained"))
    assert line.split()[-1] == str(s["decisions"]["retained"])
