"""The run specification (sim/run/config.py): config files, flags over files, the resolved
config.json reproducing a run, bad files as one line, validation's runs, and the layer
rule that sim imports no calibrate."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import linear_profile, random_trace, trace_and_profile_files, simulate
from policies.registry import POLICIES, make_policy, policy_params
from sim.cli import main
from sim.run.config import EngineLimits, PolicyConfig, SimConfig, WorkloadConfig, build_run, execute, leaves

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--trace", "swebench", "--programs", "12", "--jps", "1", "--num-gpu-blocks", "3000", "--no-progress"]
_WALL = ("wall_s", "sim_s_per_wall_s")


def _outputs(d: Path) -> dict:
    s = json.loads((d / "summary.json").read_text())
    for k in _WALL:
        s.pop(k)
    return {"summary": s, **{n: pd.read_parquet(d / f"{n}.parquet") for n in ("turns", "programs", "kv_usage")}}


def _same(a: dict, b: dict) -> None:
    assert a["summary"] == b["summary"]
    for n in ("turns", "programs", "kv_usage"):
        pd.testing.assert_frame_equal(a[n], b[n], check_exact=True)


@pytest.mark.parametrize("extra", [
    ["--policy", "continuum", "--policy-arg", "max_ttl=3", "--replicas", "2", "--router", "session"],
    ["--policy", "infercept", "--offload", "cpu:2GiB", "--no-enable-chunked-prefill", "--seed", "3", "--turn-repeat", "2"],
], ids=["continuum-2-replicas", "infercept-offload"])
def test_rerun_from_written_config_is_identical(extra, tmp_path, capsys):
    assert main(["run", *SMALL, *extra, "--out", str(tmp_path / "a")]) == 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert main(["run", "--config", str(tmp_path / "a" / "config.json"), "--no-progress", "--out", str(tmp_path / "b")]) == 0
    _same(_outputs(tmp_path / "a"), _outputs(tmp_path / "b"))
    assert json.loads((tmp_path / "b" / "config.json").read_text()) == cfg
    capsys.readouterr()


def test_written_config_is_resolved(tmp_path, capsys):
    assert main(["run", *SMALL, "--policy", "continuum", "--policy-arg", "K=7", "--out", str(tmp_path)]) == 0
    c = json.loads((tmp_path / "config.json").read_text())
    assert set(c) == {"workload", "policy", "engine", "cluster"}
    assert c["policy"] == {"name": "continuum", "args": {**policy_params("continuum"), "K": 7}}
    assert c["engine"]["profile"] == "llama3.1-8b-h100" and c["engine"]["num_gpu_blocks"] == 3000
    assert None not in [c["engine"][k] for k in ("block_size", "max_num_batched_tokens", "max_num_seqs",
                                                 "max_model_len", "enable_chunked_prefill", "scheduler_reserve_full_isl")]
    # what does not apply to this run (one replica, no --disagg, open loop) is left out, so
    # that rerunning the file gives no flag without its condition (agentsim/requires.py)
    assert not {"router", "router_args", "disagg_link", "disagg_local_prefill", "disagg_prefill_queue"} & set(c["cluster"])
    assert "concurrency" not in c["workload"]
    assert main(["run", "--config", str(tmp_path / "config.json"), "--no-progress", "--out", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == c
    assert main(["run", *SMALL, "--disagg", "1P2D", "--out", str(tmp_path / "pd")]) == 0
    c = json.loads((tmp_path / "pd" / "config.json").read_text())["cluster"]
    assert (c["router"], c["disagg_link"], c["disagg_local_prefill"]) == ("round_robin", "rdma-ndr", 1000)
    capsys.readouterr()


def test_yaml_config_with_flags_over_it(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text(
        "workload: {trace: swebench, programs: 6, jps: 2.0}\n"
        "policy:\n  name: continuum\n  args: {K: 5, max_ttl: 2.0}\n"
        "engine: {num_gpu_blocks: 2500}\n")
    assert main(["run", "--config", str(tmp_path / "run.yaml"), "--programs", "4", "--policy-arg", "K=9",
                 "--no-progress", "--out", str(tmp_path / "r")]) == 0
    c = json.loads((tmp_path / "r" / "config.json").read_text())
    assert c["workload"]["programs"] == 4 and c["workload"]["jps"] == 2.0  # the flag wins, the file fills the rest
    assert c["policy"]["args"]["K"] == 9 and c["policy"]["args"]["max_ttl"] == 2.0
    assert c["engine"]["num_gpu_blocks"] == 2500
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["programs"] == 4
    capsys.readouterr()


@pytest.mark.parametrize("name, text, words", [
    ("c.json", '{"engine": {"num_blokcs": 5}}', "field 'engine.num_blokcs'"),
    ("c.json", '{"workload": {"programs": "five"}}', "field 'workload.programs'"),
    ("c.json", '{"workload": {"seed": -1}}', "field 'workload.seed'"),
    ("c.json", '{"engine": {"enable_chunked_prefill": "no"}}', "field 'engine.enable_chunked_prefill'"),
    ("c.json", '{"clusters": {}}', "field 'clusters'"),
    ("c.json", '{"workload": ', "is not valid JSON"),
    ("c.yaml", "- a\n- b\n", "not list"),
    ("c.yaml", "workload: {jps: .nan}\n", "field 'workload.jps'"),
    ("c.json", '{"policy": {"name": "continuum", "args": {"K": "x"}}}', "policy.args: field 'K' is 'x'"),
    ("c.json", '{"policy": {"name": "continuum", "args": {"pin_seconds": 2}}}', "field 'policy.args.pin_seconds'"),
    ("c.json", '{"policy": {"name": "nope"}}', "unknown policy 'nope'"),
])
def test_bad_config_file_is_one_line_naming_file_and_field(name, text, words, tmp_path, capsys):
    f = tmp_path / name
    f.write_text(text)
    assert main(["run", "--config", str(f), "--no-progress", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert words in err and str(f) in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_missing_config_file_is_one_line(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path / "nope.json"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "nope.json" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    return trace_and_profile_files(tmp_path_factory.mktemp("cfg-in"), seed=7, programs=10, blocks=300)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_rebuilds_from_its_resolved_config(policy, small_files):
    """Filling in every default (policy parameters, engine limits) changes nothing."""
    trace, prof = small_files
    given = SimConfig(workload=WorkloadConfig(trace=trace, jps=3.0, seed=1), policy=PolicyConfig(name=policy),
                      engine=EngineLimits(profile=prof, num_gpu_blocks=150))
    first = build_run(given)
    again = build_run(SimConfig.model_validate(json.loads(first.config.to_json())))
    assert again.config == first.config
    assert execute(again).summary == execute(first).summary


def test_every_leaf_is_a_flag_and_a_sweep_axis():
    from sim.study.sweep import RUN_AXES
    assert list(RUN_AXES) == [k for k in leaves() if k != "block_size"]  # only ever the profile's
    text = subprocess.run([sys.executable, "-m", "agentsim.cli", "run", "--help"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    from sim.run.config import FLAG_NAMES
    for name, (*_, help_) in leaves().items():
        assert "--" + FLAG_NAMES.get(name, name).replace("_", "-") in text
        assert help_.split()[0] in text, name  # help text comes from the config


def test_validation_sim_run_uses_the_real_engines_limits():
    """calibrate/validate.sim_run builds through build_run, on the real engine's limits
    (even above the profile's pool) and the replay's own trace and arrivals."""
    from calibrate.validate import sim_run

    prof = linear_profile(c2=1e-7, blocks=100)
    tr = random_trace(np.random.default_rng(2), 12)
    arr = np.sort(np.random.default_rng(3).uniform(0, 4, 12))
    engine = {"num_gpu_blocks": 140, "block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 6,
              "max_model_len": 4096, "enable_chunked_prefill": True, "scheduler_reserve_full_isl": False}
    got = sim_run(tr, arr, "continuum", prof, engine, {"K": "5"})
    want = simulate(tr, make_policy("continuum", K=5), prof, arr, num_gpu_blocks=140, block_size=16,
                    max_num_batched_tokens=512, max_num_seqs=6, max_model_len=4096, enable_chunked_prefill=True,
                    scheduler_reserve_full_isl=False)
    assert got.summary == want.summary and got.summary["num_gpu_blocks"] == 140


def test_sim_imports_no_calibrate():
    """Layers: calibrate depends on sim, never the reverse (the CLI lives in agentsim/)."""
    code = ("import pkgutil, importlib, sys, sim\n"
            "mods = [m.name for m in pkgutil.iter_modules(sim.__path__, 'sim.')]\n"
            "for m in mods: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'calibrate' or m.startswith('calibrate.'))\n"
            "assert len(mods) > 10 and not bad, (mods, bad)\n"
            "import agentsim.cli\n"
            "agentsim.cli.build_parser()\n"
            "assert 'calibrate.cli' in sys.modules\n")  # the check itself can see calibrate
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_docs_page_lists_every_field():
    text = (ROOT / "docs" / "reference" / "config.md").read_text()
    from sim.run.config import FLAG_NAMES
    for name, (sec, field, kind, *_) in leaves().items():
        flag = FLAG_NAMES.get(name, name).replace("_", "-")
        assert f"| `{sec}.{field}` | `--{'[no-]' if kind is bool else ''}{flag}" in text, name


@pytest.mark.parametrize("argv, words", [
    (["run", "--num-blocks", "3000"], "--num-blocks is now --num-gpu-blocks"),
    (["run", "--num-blocks=3000"], "--num-blocks is now --num-gpu-blocks"),
    (["run", "--no-chunked-prefill"], "--no-chunked-prefill is now --no-enable-chunked-prefill"),
    (["run", "--engine", "vllm"], "--engine is now --scheduler"),
    (["sweep", "--axis", "num_blocks=3000"], "axis 'num_blocks' is now 'num_gpu_blocks'"),
])
def test_the_limits_old_names_are_told_their_vllm_name(argv, words, tmp_path, capsys, monkeypatch):
    """The engine limits are spelled as vLLM spells them (num_gpu_blocks, enable_chunked_prefill,
    scheduler_reserve_full_isl) in flags, config fields and sweep axes alike; the old spelling is
    one line naming the new one, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    assert main(argv + ["--out", "o"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("old, new", [("num_blocks", "num_gpu_blocks"), ("reserve_full_prompt", "scheduler_reserve_full_isl"),
                                      ("chunked_prefill", "enable_chunked_prefill"), ("kind", "scheduler")])
def test_a_config_file_with_an_old_limit_name_is_told_the_new_one(old, new, tmp_path, capsys):
    (tmp_path / "c.json").write_text(json.dumps({"engine": {old: {"num_blocks": 3000, "kind": "vllm"}.get(old, True)}}))
    assert main(["run", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"field 'engine.{old}' is now 'engine.{new}'" in err and not (tmp_path / "o").exists()


def test_one_spelling_of_the_limits_from_config_to_profile_to_runtime():
    """A run config's engine fields, a profile's `engine` keys and the runtime EngineConfig
    share vLLM's names (vLLM 0.32: CacheConfig.num_gpu_blocks, SchedulerConfig.*)."""
    from dataclasses import fields

    from sim.hardware.engine_config import EngineConfig
    runtime = {f.name for f in fields(EngineConfig)}
    config = set(EngineLimits.model_fields)
    profile = set(EngineConfig(num_gpu_blocks=10).profile_section())
    limits = {"num_gpu_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
              "enable_chunked_prefill", "scheduler_reserve_full_isl"}
    assert limits <= runtime and limits <= config and limits == profile
    vllm = pytest.importorskip("vllm.config")
    known = set(vllm.CacheConfig.__dataclass_fields__) | set(vllm.SchedulerConfig.__dataclass_fields__) | {"max_model_len"}
    assert limits <= known
