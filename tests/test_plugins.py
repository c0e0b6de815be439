"""Policies and routers from an installed package (agentsim/plugins.py): a small plugin
distribution, written to a temporary folder that subprocesses find on their path (as an
installed package's metadata is found), runs in `sim run --policy/--router` and inside a
real vLLM through PolicyScheduler, with no change to agentsim."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import START_ENV

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
from policies.base import Action, Policy, Retention
from sim.cluster.router import Router


class LongPin(Policy):
    """Pin every finished turn's KV for 30 s."""

    name = "long-pin"

    def retention(self, req, now, view):
        return Retention(Action.PIN, 30.0)


class FirstReplica(Router):
    """Send every call to replica 0."""

    name = "first-replica"

    def route(self, call, replicas):
        return 0
'''


def _dist(root: Path, entry_points: str, module: str = PLUGIN) -> Path:
    """A plugin package and its distribution metadata in `root`, as pip would install them."""
    (root / "agentplug").mkdir(parents=True)
    (root / "agentplug" / "__init__.py").write_text(module)
    meta = root / "agentplug-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: agentplug\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text(entry_points)
    return root


ENTRY_POINTS = ("[agentsim.policies]\nlong-pin = agentplug:LongPin\n\n"
                "[agentsim.routers]\nfirst-replica = agentplug:FirstReplica\n")


def _sim(args, plugin_root: Path | None, cwd: Path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(p) for p in (plugin_root, ROOT) if p] +
                                                       [os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "agentsim.cli", *args], cwd=cwd, env=env, capture_output=True, text=True)


RUN = ["run", "--trace", "swebench", "--programs", "12", "--jps", "1", "--num-gpu-blocks", "3000", "--replicas", "2"]


def test_an_installed_policy_and_router_run_by_name(tmp_path):
    plug = _dist(tmp_path / "site", ENTRY_POINTS)
    r = _sim([*RUN, "--policy", "long-pin", "--router", "first-replica", "--out", str(tmp_path / "out")], plug, tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["policy"] == "long-pin" and s["router"] == "first-replica"
    assert s["pins_hit"] + s["pins_expired"] > 0  # the plugin's retention ran
    assert [r["calls"] for r in s["per_replica"]][1] == 0  # the plugin's router sent nothing to replica 1


def test_help_lists_the_installed_plugins_names(tmp_path):
    """`sim run --help` names what installed packages declare, without importing them: a
    broken plugin leaves --help working."""
    plug = _dist(tmp_path / "site", ENTRY_POINTS + "broken = agentplug_missing:Nothing\n")
    r = _sim(["run", "--help"], plug, tmp_path)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stderr
    assert "installed plugins: long-pin" in text and "installed plugins: broken, first-replica" in text
    assert "installed plugins: " not in " ".join(_sim(["run", "--help"], None, tmp_path).stdout.split())


def test_without_the_package_the_names_are_unknown(tmp_path):
    r = _sim([*RUN, "--policy", "long-pin"], None, tmp_path)
    assert r.returncode == 2 and "long-pin" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("entry, flags, says", [
    ("[agentsim.policies]\nbroken = agentplug_missing:Nothing\n", ["--policy", "broken"],
     "plugin 'broken' (agentplug_missing:Nothing, entry point group agentsim.policies) cannot be imported: ModuleNotFoundError"),
    ("[agentsim.routers]\nodd = agentplug:LongPin\n", ["--router", "odd"],
     "plugin 'odd' (agentplug:LongPin, entry point group agentsim.routers) names LongPin, not a Router subclass"),
])
def test_a_broken_plugin_is_one_line_naming_it_and_leaves_the_bundled_names_alone(tmp_path, entry, flags, says):
    plug = _dist(tmp_path / "site", entry)
    r = _sim([*RUN, *flags], plug, tmp_path)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # plugins load when a name the registries lack is asked for: the bundled ones still run
    assert _sim([*RUN, "--policy", "vllm", "--router", "session"], plug, tmp_path).returncode == 0


def test_agentsim_declares_its_vllm_general_plugin():
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.general_plugins"]\nagentsim = "agentsim.plugins:vllm_plugin"' in text
    from agentsim.plugins import vllm_plugin

    vllm_plugin()  # importable and harmless in any process


ENGINE_CHILD = '''
import json
from calibrate.engine import start_engine
from vllm import SamplingParams
llm = start_engine(device="cpu", num_gpu_blocks=40, max_model_len=2048, seed=0,
                   scheduler_cls="sim.vllm_scheduler.PolicyScheduler",
                   additional_config={"agentsim": {"policy": "long-pin", "policy_args": {}}})
p = SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False, temperature=0.0, extra_args={"job_id": "a", "tool": "ls"})
llm.generate([{"prompt_token_ids": list(range(100, 400))}], [p], use_tqdm=False)
sched = llm.llm_engine.engine_core.engine_core.scheduler
print(json.dumps({"policy": sched.policy.name, "pinned": len(sched.pins)}))
'''


@pytest.mark.engine
def test_an_installed_policy_runs_inside_vllm(tmp_path):
    plug = _dist(tmp_path / "site", ENTRY_POINTS)
    env = {**START_ENV, "PYTHONPATH": os.pathsep.join([str(plug), str(ROOT), START_ENV.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", ENGINE_CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"policy": "long-pin", "pinned": 1}  # the plugin's pin holds the program's KV
