"""Regression tests: wrong results, deadlocks, hangs, inputs refused too late or read as
something else."""
import numpy as np
import pytest

from conftest import linear_profile, make_trace, simulate
from policies.registry import make_policy
from sim.hardware.engine_config import EngineConfig
from sim.simpy_replica.scheduler import Scheduler


def _run(trace, arrivals, policy="vllm", policy_args=None, **prof):
    p = linear_profile(**prof)
    return simulate(trace, make_policy(policy, **(policy_args or {})), p, arrivals)


# --- wrong results: pinned blocks shared by several pins counted once per pin -------------

def test_pinned_blocks_count_shared_blocks_once():
    s = Scheduler(EngineConfig(num_gpu_blocks=20), make_policy("vllm"))
    shared = s.pool.allocate(3)
    a, b = s.pool.allocate(2), s.pool.allocate(1)
    s.pool.touch(shared)  # a second holder of the shared prefix
    s.hold_pin("a", shared + a, 0.0)
    s.hold_pin("b", shared + b, 1.0)
    assert s.pinned_blocks == 6  # 3 shared + 2 + 1, not 5 + 4
    assert s.pinned_blocks <= s.pool.num_used
    s.release_pin("a", 2.0, "expired")
    assert s.pinned_blocks == 4
    s.release_pin("b", 4.0, "expired")
    assert s.pinned_blocks == 0
    # distinct blocks over time: 5 for [0,1), 6 for [1,2), 4 for [2,4)
    assert s.pinned_block_seconds == pytest.approx(5 + 6 + 8)


def test_pinned_never_exceeds_used_with_a_shared_prompt():
    # many programs share a 160-token system prompt and pin it during their tools
    rng = np.random.default_rng(0)
    progs = [[(200, 8, "ls", 1.5)] * 6 + [(20, 4, None, None)] for _ in range(12)]
    res = _run(make_trace(progs, shared_prefix=160), np.sort(rng.uniform(0, 1, 12)), "continuum-static", blocks=400)
    kv = res.kv_usage
    assert kv["pinned_blocks"].max() > 0
    assert (kv["pinned_blocks"] <= kv["used_blocks"]).all()


# --- deadlock: every running call preempted in one step ------------------------------------

def test_infercept_does_not_deadlock_when_its_only_running_call_is_preempted():
    # found by random search: a pool just above the largest context; InferCept's preserved
    # contexts leave a lone running call unable to grow, it preempts itself, and the
    # waiting calls were never admitted in the now-empty step ("deadlock ... nothing can run")
    rng = np.random.default_rng(6)
    n = int(rng.integers(3, 20))
    progs = []
    for _ in range(n):
        nt = int(rng.integers(1, 6))
        progs.append([(int(rng.integers(40, 1500)) if t == 0 else int(rng.integers(0, 600)), int(rng.integers(1, 200)),
                       None if t == nt - 1 else "ls", None if t == nt - 1 else float(rng.exponential(1.0)))
                      for t in range(nt)])
    tr = make_trace(progs, shared_prefix=int(rng.integers(0, 3)) * 32)
    arr = np.sort(rng.uniform(0, n / 50, n))
    for policy in ("vllm", "infercept"):
        assert len(_run(tr, arr, policy, blocks=255).turns) == len(tr)


# --- refused up front, one line, exit 2, nothing written -----------------------------------

from sim.cli import main  # noqa: E402


def _cli(argv, capsys, tmp_path=None):
    code = main(argv + (["--no-progress"] if argv[0] == "run" else []))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    if tmp_path is not None:
        assert not any(tmp_path.rglob("*.parquet")) and not any(tmp_path.rglob("summary.json"))
    return err


RUN = ["run", "--trace", "swebench", "--programs", "2", "--jps", "1"]


@pytest.mark.parametrize("args, words", [
    (["--policy", "thunderagent", "--policy-arg", "interval=0"], "'interval' is '0'"),  # hung forever
    (["--policy", "thunderagent", "--policy-arg", "interval=-1"], "'interval' is '-1'"),
    (["--policy", "continuum", "--policy-arg", "max_ttl=abc"], "'max_ttl' is 'abc'"),  # None default: never converted
    (["--policy", "continuum", "--policy-arg", "cold_tool_mean=0"], "'cold_tool_mean' is '0'"),  # ZeroDivisionError
    (["--policy", "continuum", "--policy-arg", "max_ttl=-1"], "'max_ttl' is '-1'"),  # read as a negative TTL
    (["--policy", "continuum", "--policy-arg", "max_ttl=nan"], "'max_ttl' is 'nan'"),
    (["--policy", "continuum", "--policy-arg", "max_ttl=inf"], "'max_ttl' is 'inf'"),
    (["--policy", "continuum", "--policy-arg", "K=-1"], "'K' is '-1'"),
    (["--policy", "oracle", "--policy-arg", "epsilon=nan"], "'epsilon' is 'nan'"),
    (["--policy", "continuum", "--policy-arg", "unpin_while_running=maybe"], "'unpin_while_running' is 'maybe'"),  # was False
    (["--seed", "-1"], "'--seed' is -1"),  # numpy ValueError
    (["--max-num-batched-tokens", "512", "--no-enable-chunked-prefill"], "cannot be prefilled whole"),  # deadlocked after simulating
    (["--offload", "cpu:1KB@25"], "smaller than one chunk"),  # a tier that held nothing
])
def test_bad_run_input_is_refused_up_front(args, words, capsys, tmp_path):
    err = _cli(RUN + args + ["--out", str(tmp_path / "r")], capsys, tmp_path)
    assert words in err


def test_out_naming_an_existing_file_is_refused(tmp_path, capsys):
    f = tmp_path / "results"
    f.write_text("keep me")
    assert f"--out '{f}' is a file" in _cli(RUN + ["--out", str(f)], capsys)  # agentsim.files.check_output
    assert f.read_text() == "keep me"


def test_policy_args_keep_their_meaning():
    p = make_policy("continuum", max_ttl="none", K="10", unpin_while_running="yes")
    assert p.max_ttl is None and p.K == 10 and p.unpin_while_running is True
    assert make_policy("continuum", max_ttl="2.5").max_ttl == 2.5
    assert make_policy("continuum-static", unpin_while_running="0").unpin_while_running is False


def test_every_numeric_policy_parameter_has_a_declared_range():
    from policies.registry import POLICIES, RANGES, policy_params

    for name in POLICIES:
        for k, default in policy_params(name).items():
            if isinstance(default, (int, float)) and not isinstance(default, bool) or default is None:
                assert k in RANGES, f"{name}.{k} has no range in policies/registry.py RANGES"


# --- profiles --------------------------------------------------------------------------

def _profile(tmp_path, section, key, value):
    import json

    raw = json.loads(open("sim/hardware/profiles/llama3.1-8b-a100-80gb.json").read())
    raw[section][key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))  # NaN / Infinity are what json writes for them
    return path


@pytest.mark.parametrize("section, key, value, words", [
    ("step_time", "c1", float("nan"), "'step_time.c1' is nan"),  # failed mid-run
    ("step_time", "c2", float("inf"), "'step_time.c2' is inf"),
    ("step_time", "c0", "0.01", "'step_time.c0' is '0.01'"),
    ("engine", "num_gpu_blocks", 1e12, "'engine.num_gpu_blocks'"),  # MemoryError
    ("engine", "enable_chunked_prefill", "no", "'engine.enable_chunked_prefill' is 'no'"),  # read as True
    ("engine", "max_num_seqs", True, "'engine.max_num_seqs' is True"),
    ("pcie", "bandwidth_GBps", float("nan"), "'pcie.bandwidth_GBps' is nan"),
])
def test_bad_profile_values_are_refused(section, key, value, words, tmp_path, capsys):
    path = _profile(tmp_path, section, key, value)
    err = _cli(RUN + ["--profile", str(path), "--out", str(tmp_path / "r")], capsys, tmp_path)
    assert words in err


# --- traces ----------------------------------------------------------------------------

def test_null_program_id_is_refused_by_validation():
    import pandas as pd

    from agentsim.errors import InputError
    from traces.schema import validate

    df = make_trace([[(100, 5, "ls", 1.0), (20, 3, None, None)], [(50, 5, None, None)]])
    df.loc[2, "program_id"] = None
    with pytest.raises(InputError, match="field 'program_id' is missing"):
        validate(pd.DataFrame(df))


def test_malformed_parquet_metadata_is_one_line(tmp_path, capsys):
    import pyarrow.parquet as pq

    from traces.schema import META_KEY, resolve

    table = pq.read_table(resolve("swebench"))
    bad = tmp_path / "t.parquet"
    pq.write_table(table.replace_schema_metadata({META_KEY: b"{not json"}), bad)
    err = _cli(["run", "--trace", str(bad), "--programs", "1"], capsys)
    assert "parquet metadata 'agentsim'" in err and "Invalid JSON" in err


# --- importers: records of the wrong type -----------------------------------------------

FIX = __import__("pathlib").Path(__file__).parent / "fixtures" / "importers"


def _edit_jsonl(src, tmp_path, line, edit):
    import json

    recs = [json.loads(x) for x in (FIX / src).read_text().splitlines() if x.strip()]
    edit(recs[line])
    path = tmp_path / src
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return path


def _edit_traj(tmp_path, edit):
    import json

    data = json.loads((FIX / "django__django-11099.traj.json").read_text())
    edit(data["messages"][2])
    path = tmp_path / "x.traj.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("fmt, make, words", [
    ("claude-code", lambda t: _edit_jsonl("claude_code_session.jsonl", t, 0, lambda r: r.update(uuid={"a": 1})),
     "line 1: field 'uuid' is {'a': 1}"),
    ("claude-code", lambda t: _edit_jsonl("claude_code_session.jsonl", t, 1, lambda r: r["message"].update(id=["x"])),
     "line 2 message: field 'id' is ['x']"),
    ("tracelab", lambda t: _edit_jsonl("tracelab_good.jsonl", t, 0, lambda r: r.update(timing_events={"a": 1})),
     "line 1: field 'timing_events'"),
    ("tracelab", lambda t: _edit_jsonl("tracelab_good.jsonl", t, 0, lambda r: r.update(timing_events=5)),
     "line 1: field 'timing_events' is 5"),
    ("mini-swe-agent", lambda t: _edit_traj(t, lambda m: m["extra"].update(response=["x"])),
     "messages[2]: field 'extra.response' is ['x']"),
    ("mini-swe-agent", lambda t: _edit_traj(t, lambda m: m["extra"].update(actions="grep x")),  # was tool 'g'
     "messages[2]: field 'extra.actions' is 'grep x'"),
])
def test_importer_records_of_the_wrong_type(fmt, make, words, tmp_path, capsys):
    path = make(tmp_path)
    out = tmp_path / "out.parquet"
    err = _cli(["trace", "import", fmt, str(path), "-o", str(out)], capsys)
    assert words in err and str(path) in err and not out.exists()


# --- flags that apply only with another (agentsim/requires.py) ---------------------------

def _requires_argv(rule, args, tmp_path):
    """The command line of a rule's command around `args` (the flag, with or without its condition)."""
    import pandas as pd  # noqa: F401 - the resample source below

    out = str(tmp_path / "o.parquet")
    if rule.command == "run":
        return ["run", "--programs", "2", *args, "--no-progress"]
    if rule.command == "trace gen":
        return ["trace", "gen", *args, "--programs", "3", "-o", out]
    if rule.command == "trace resample":
        return ["trace", "resample", str(tmp_path / "src.parquet"), *args, "-o", out]
    if rule.command == "trace carry":
        return ["trace", "carry", "swebench", *args, "-o", out]
    if rule.command == "validate":
        return ["validate", *args]
    if rule.command == "calibrate":
        return ["calibrate", *args, "--out", str(tmp_path / "p.json")]
    raise AssertionError(f"no command line for {rule.command!r}: add one here")


def _all_rules():
    from agentsim.requires import RULES, rules

    return [r for c in dict.fromkeys([*(r.command for r in RULES), "calibrate"]) for r in rules(c)]


@pytest.mark.parametrize("rule", _all_rules(), ids=lambda r: f"{r.command}:{r.flag}")
def test_every_dependent_flag_is_refused_without_its_condition_and_accepted_with_it(rule, tmp_path, capsys):
    from agentsim import requires
    from agentsim.cli import command_key, parse
    from sim.commands.run import config_from_args

    err = _cli(_requires_argv(rule, rule.without, tmp_path), capsys)
    assert err == f"error: {rule.line()}\n"
    argv = _requires_argv(rule, rule.with_, tmp_path)
    args = parse(argv)
    view = config_from_args(args) if rule.command == "run" else args
    assert rule.given(view) and rule.holds(view)
    requires.check(command_key(args), view)  # no row of the command refuses it


@pytest.mark.parametrize("extra", [["--disagg-link", "nvlink4", "--disagg", "1P1D"], ["--concurrency", "2", "--workload", "closed"],
                                   ["--policy", "continuum", "--policy-arg", "max_ttl=5"]])
def test_a_dependent_flag_with_its_condition_runs(extra, tmp_path, capsys):
    assert main(["run", "--programs", "2", *extra, "--no-progress", "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()


def test_a_dependent_field_in_a_config_file_or_a_sweep_point_is_refused_too(tmp_path, capsys):
    import json

    from agentsim.errors import InputError
    from sim.study.sweep import build_run

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"workload": {"programs": 2}, "cluster": {"disagg_link": "nvlink4"}}))
    assert "--disagg-link applies only with --disagg xPyD" in _cli(["run", "--config", str(cfg)], capsys)
    with pytest.raises(InputError, match="--disagg-local-prefill applies only with --disagg xPyD"):
        build_run({"programs": 2, "disagg_local_prefill": 5})
    # given at its default value is given all the same: in the file, and on the command line over a file
    cfg.write_text(json.dumps({"workload": {"programs": 2}, "cluster": {"disagg_link": "rdma-ndr"}}))
    assert "--disagg-link applies only with --disagg xPyD" in _cli(["run", "--config", str(cfg)], capsys)
    cfg.write_text(json.dumps({"workload": {"programs": 2}}))
    assert "--disagg-prefill-queue applies only with" in _cli(["run", "--config", str(cfg), "--disagg-prefill-queue", "3"], capsys)
    with pytest.raises(InputError, match="--router applies only with --replicas 2 or more"):
        build_run({"programs": 2, "router": "session"})  # a sweep point's router axis on one replica


def test_given_means_on_the_command_line_even_at_the_default_value():
    from agentsim.cli import given_dests

    assert given_dests(["validate", "--server-run", "r.json", "--jps", "2.0"]) == {"server_run", "jps"}
    assert given_dests(["validate", "--server-run", "r.json"]) == {"server_run"}
    assert given_dests(["trace", "resample", "s.parquet", "--seed", "0", "-o", "o.parquet"]) == {"sources", "seed", "output"}


# --- resources before work: a huge count refused at once, naming the size and the limit ---

GiB = 2**30


@pytest.fixture(scope="module")
def resample_source(tmp_path_factory):
    """A trace imported as `sim trace resample` needs one (the Claude Code fixture)."""
    src = tmp_path_factory.mktemp("source") / "src.parquet"
    assert main(["trace", "import", "claude-code", str(FIX / "claude_code_session.jsonl"), "-o", str(src)]) == 0
    return str(src)


@pytest.mark.parametrize("argv, words", [
    (["trace", "gen", "openhands", "--programs", "1000000000000"], "--programs 1000000000000: about 29,450,000,000,000 openhands calls"),
    (["trace", "gen", "--spec", "codex", "--programs", "1000000000000"], "calls of spec 'codex'"),
    (["trace", "resample", "SRC", "--programs", "1000000000000"], "--programs 1000000000000: about 3,000,000,000,000 calls (3.0 per session of the sources)"),
    (["run", "--programs", "2", "--turn-repeat", "100000000"], "2,200,000,000 calls (22 trace rows x --turn-repeat 100000000)"),
    (["run", "--programs", "2", "--replicas", "100000000"], "--replicas 100000000 of 27,371 KV blocks each"),
    (["sweep", "--reps", "1000000000000"], "1,000,000,000,000 sweep points"),
    (["sweep", "--axis", "seed=" + ",".join(map(str, range(2000))), "--axis", "jps=" + ",".join(map(str, range(1, 2000)))],
     "3,998,000 sweep points"),
])
def test_a_huge_count_is_refused_before_any_work(argv, words, tmp_path, capsys, monkeypatch, resample_source):
    import time

    monkeypatch.setenv("AGENTSIM_MEMORY_BYTES", str(16 * GiB))
    argv = [resample_source if a == "SRC" else a for a in argv]
    out = ["--out", str(tmp_path / "o")] if argv[0] in ("run", "sweep") else ["-o", str(tmp_path / "o.parquet")]
    t0 = time.perf_counter()
    err = _cli(argv + out, capsys, tmp_path)
    assert words in err and "of memory, more than the 16.00 GiB available (AGENTSIM_MEMORY_BYTES)" in err, err
    assert time.perf_counter() - t0 < 20  # refused before the work, not after it
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.parquet").exists()


def test_the_memory_estimate_is_its_rows_times_their_size(tmp_path, capsys, monkeypatch):
    """trace gen swebench: programs x 10.9 mean turns x 1 KiB; one byte less is refused."""
    from agentsim.resources import TRACE_ROW_BYTES

    need = round(100 * 10.9 * TRACE_ROW_BYTES)
    argv = ["trace", "gen", "swebench", "--programs", "100", "-o", str(tmp_path / "t.parquet")]
    monkeypatch.setenv("AGENTSIM_MEMORY_BYTES", str(need - 1))
    assert "about 1,090 swebench calls need about 1.06 MiB" in _cli(argv, capsys)
    monkeypatch.setenv("AGENTSIM_MEMORY_BYTES", str(need))
    assert main(argv) == 0
    monkeypatch.setenv("AGENTSIM_MEMORY_BYTES", "lots")
    assert "AGENTSIM_MEMORY_BYTES='lots' is not a whole number of bytes" in _cli(argv, capsys)


# --- the exact messages of issue 54 ----------------------------------------------------------

def test_profile_naming_a_directory_names_the_flag(tmp_path, capsys):
    err = _cli(RUN + ["--profile", str(tmp_path)], capsys)  # was exit 1, "Is a directory"
    assert err == f"error: --profile {str(tmp_path)!r}: cannot read it (Is a directory); give a profile JSON file or a bundled name\n"


def test_the_offload_suggestion_is_a_value_the_command_accepts(tmp_path, capsys):
    import re

    path = _profile(tmp_path, "pcie", "bandwidth_GBps", None)
    err = _cli(RUN + ["--profile", str(path), "--offload", "cpu:1GB"], capsys)
    suggested = re.search(r"e\.g\. --offload (\S+),", err).group(1)
    assert suggested == "cpu:1GB@25"  # was cpu:0GiB@25, itself refused
    assert main(RUN + ["--profile", str(path), "--offload", suggested, "--no-progress"]) == 0
    capsys.readouterr()


def test_a_profile_section_of_the_wrong_type_is_not_called_missing(tmp_path, capsys):
    path = _profile(tmp_path, "step_time", "c0", 0.0)
    import json

    raw = json.loads(path.read_text())
    raw["step_time"] = [0.01, 1e-4]
    path.write_text(json.dumps(raw))
    assert "section 'step_time' is a list, not an object of fields" in _cli(RUN + ["--profile", str(path)], capsys)


def test_an_openai_chat_start_time_of_the_wrong_type_is_not_called_missing(tmp_path, capsys):
    path = _edit_jsonl("openai_chat_log.jsonl", tmp_path, 0, lambda r: r.update(start_time=True))
    err = _cli(["trace", "import", "openai-chat", str(path), "-o", str(tmp_path / "o.parquet")], capsys)
    assert "line 1: field 'start_time' is true, a boolean, not a timestamp" in err


def test_a_seed_past_int64_prints_its_limit_exactly(tmp_path, capsys):
    err = _cli(RUN + ["--seed", str(2**63)], capsys)
    assert "field '--seed' is 9223372036854775808: Input should be less than or equal to 9223372036854775807" in err
    for cmd in (["trace", "gen", "swebench"], ["trace", "resample", "x.parquet"]):
        err = _cli(cmd + ["--seed", str(2**63), "-o", str(tmp_path / "t.parquet")], capsys)
        assert "argument --seed: 9223372036854775808 is above 9223372036854775807; give a whole number in 0..9223372036854775807" in err
    assert main(RUN + ["--seed", str(2**63 - 1), "--no-progress"]) == 0  # the limit itself runs
    capsys.readouterr()


def test_a_shared_prefix_past_the_context_names_the_flag(tmp_path, capsys):
    from traces.generate import SHARED_PREFIX_MAX

    argv = ["trace", "gen", "swebench", "--programs", "5", "-o", str(tmp_path / "t.parquet")]
    err = _cli(argv + ["--shared-prefix", "10000000"], capsys)
    assert f"--shared-prefix 10000000 does not fit a program's context" in err and f"give at most {SHARED_PREFIX_MAX}" in err
    assert main(argv + ["--shared-prefix", str(SHARED_PREFIX_MAX)]) == 0
    capsys.readouterr()


def test_roofline_max_model_len_above_the_models_is_refused_as_vllm_does(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["profile", "roofline", "--gpu", "H100", "--model", "llama3.1-8b", "--out", str(out)]
    err = _cli(argv + ["--max-model-len", "200000"], capsys)
    assert "--max-model-len 200000 exceeds the 131072 tokens meta-llama/Llama-3.1-8B-Instruct allows" in err and not out.exists()
    assert main(argv + ["--max-model-len", "131072"]) == 0
    capsys.readouterr()


# --- bounds on every whole-number flag ------------------------------------------------------

def _whole_number_flags():
    import argparse

    from agentsim.cli import build_parser

    stack = [("", build_parser())]
    while stack:
        key, parser = stack.pop()
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                stack.extend((f"{key} {n}".strip(), p) for n, p in a.choices.items())
            elif a.type is int or hasattr(a.type, "bounds"):
                yield key, a


def test_every_whole_number_flag_refuses_a_value_past_its_bound():
    """Each whole-number flag of every command has an upper bound that refuses 2**64 (sim run's
    through its config field, the others through agentsim.bounds.int_flag), and a lower one."""
    import argparse

    from agentsim.errors import InputError
    from sim.run.config import from_flat, parse_config

    unbounded, seen = set(), 0
    for key, a in _whole_number_flags():
        seen += 1
        if key == "run":
            for bad in (2**64, -1):
                with pytest.raises(InputError, match="less than or equal|greater than or equal"):
                    parse_config(from_flat({a.dest: bad}), "sim run", style="flag")
        elif hasattr(a.type, "bounds"):
            low, high = a.type.bounds
            assert low >= 0 and high <= 2**63 - 1, a.option_strings
            for bad in (high + 1, low - 1):
                with pytest.raises(argparse.ArgumentTypeError):
                    a.type(str(bad))
        else:
            unbounded.add((key, a.option_strings[-1]))
    assert not unbounded and seen > 50, unbounded


@pytest.mark.parametrize("argv", [
    ["calibrate", "--max-num-seqs", "0", "--out", "p.json"], ["validate", "--max-context", "-5"],
    ["profile", "roofline", "--gpu", "H100", "--model", "llama3.1-8b", "--tp", "16"],
    ["plan", "--trace", "swebench", "--jps", "1", "--slo", "p95_jct<=60", "--num-gpu-blocks", "0", "--out", "o"],
    ["tune", "--trials", str(2**64), "--out", "o"],
])
def test_count_flags_out_of_bounds_are_one_line(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = _cli(argv, capsys)
    assert "is below" in err or "is above" in err, err
    assert err.count("\n") == 1 and not any(tmp_path.iterdir())
