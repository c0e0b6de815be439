"""The house's layering, checked on the source (ast): sim's sub-packages import only down
their direction table and no module of sim is in an import circle; sim imports nothing of
calibrate (not even inside a function), and no module of the project reads a private member (`._name`) or
imports a private name that another of its modules defines. Tests are white-box and exempt."""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentsim", "sim", "calibrate", "policies", "traces")
# A third party's private member, read on purpose and documented where it is read
THIRD_PARTY = {("sim/replica/clock.py", "_queue"): "SimPy's event queue, in the documented step_end adapter"}


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p))
            for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(tree: ast.Module) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names.add(n.module)
    return names


def _private_defined(tree: ast.Module) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
    return {x for x in out if x.startswith("_") and not x.startswith("__")}


def private_reads(modules: dict[str, ast.Module]) -> list[str]:
    """`x._name` (x not self, cls or super()) or `from pkg.mod import _name`, where _name is
    defined by another module of the project and not by the reading one."""
    defined = {path: _private_defined(tree) for path, tree in modules.items()}
    ours = set().union(*defined.values())
    bad = []
    for path, tree in modules.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
                base = n.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls") or \
                        isinstance(base, ast.Call) and getattr(base.func, "id", None) == "super":
                    continue
                if n.attr in ours and n.attr not in defined[path] and (path, n.attr) not in THIRD_PARTY:
                    bad.append(f"{path}:{n.lineno} reads {ast.unparse(n)}")
            elif isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] in PACKAGES:
                bad += [f"{path}:{n.lineno} imports {a.name} from {n.module}" for a in n.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return bad


def test_sim_imports_nothing_of_calibrate_anywhere_in_its_source():
    modules = _modules()
    bad = {path: sorted(m for m in _imported(tree) if m == "calibrate" or m.startswith("calibrate."))
           for path, tree in modules.items() if path.startswith("sim/")}
    assert len(bad) > 20 and not any(bad.values()), {p: m for p, m in bad.items() if m}
    # the check sees imports where they are: calibrate's own modules import sim
    assert any(m.startswith("sim.") for m in _imported(modules["calibrate/validate.py"]))


def test_no_module_reads_another_modules_private_members():
    assert private_reads(_modules()) == []


def test_the_private_member_check_finds_a_read_and_an_import():
    planted = {
        "sim/a.py": ast.parse("class A:\n    def __init__(self):\n        self._hidden = 1\n"),
        "sim/b.py": ast.parse("from sim.a import _helper\ndef f(a):\n    return a._hidden\n"),
        "sim/c.py": ast.parse("def _helper():\n    pass\nclass C:\n    def g(self):\n        return self._hidden\n"),
    }
    assert sorted(private_reads(planted)) == ["sim/b.py:1 imports _helper from sim.a", "sim/b.py:3 reads a._hidden"]


def test_no_replica_asks_whether_it_has_a_tier():
    # a replica without offload tiers holds sim/kv/tiers.py's NoTier, which answers as no
    # tier would; a `tier is None` check would bring back the branch at every call site
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "sim").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if "tier is None" in line or "tier is not None" in line]
    assert hits == []


def _top_level_names(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _names_imported_from(tree: ast.Module, module: str) -> set[str]:
    return {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == module
            for a in n.names}


# The engine view a policy reads and the rules around its pins, its victims and finished
# calls are the policy host's (sim/replica/policy_host.py), which both engines inherit,
# providing its block operations (HostedEngine).
HOST = "sim/replica/policy_host.py"
ENGINE_SCHEDULERS = {"sim/simpy_replica/scheduler.py": "Scheduler", "sim/vllm_replica/scheduler.py": "PolicyScheduler"}
VIEW_METHODS = {"free_blocks", "blocks_of", "avg_request_blocks", "prefill_reload_time", "offload_enabled",
                "reload_time", "running_tokens", "linear_step", "queue_delay"}
PIN_RULES = {"hold_pin", "release_pin", "expire_pins", "drop_reviewed_pins", "drop_pins_for", "offload_finished",
             "victim_ordered", "call_finished", "end_program"}
# The same name for another thing, which the host's method reads
SAME_NAME = {("sim/kv/tiers.py", "reload_time"): "a tier's own transfer time",
             ("sim/hardware/profile.py", "linear_step"): "the step model's linear fit",
             ("sim/vllm_replica/retention.py", "free_blocks"): "vLLM's BlockPool.free_blocks, overridden"}


def _protocol_stubs(tree: ast.Module) -> set[int]:
    """The methods of typing.Protocol classes (declarations, not definitions)."""
    return {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
            and any(getattr(b, "id", getattr(b, "attr", None)) == "Protocol" for b in c.bases)
            for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


def definers(modules: dict[str, ast.Module], names: set[str]) -> dict[str, set[str]]:
    """name -> the modules that define a function of that name (Protocol declarations aside)."""
    out: dict[str, set[str]] = {n: set() for n in names}
    for path, tree in modules.items():
        stubs = _protocol_stubs(tree)
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in names and id(n) not in stubs:
                out[n.name].add(path)
    return out


def copies_outside_the_host(modules: dict[str, ast.Module]) -> list[str]:
    return sorted(f"{path} defines {name}" for name, paths in definers(modules, VIEW_METHODS | PIN_RULES).items()
                  for path in paths if path != HOST and (path, name) not in SAME_NAME)


def test_the_engine_view_and_the_pin_rules_are_defined_once_in_the_policy_host():
    mods = _modules()
    assert copies_outside_the_host(mods) == []
    found = definers({HOST: mods[HOST]}, VIEW_METHODS | PIN_RULES)
    assert all(found.values()), sorted(n for n, p in found.items() if not p)


def test_the_check_finds_a_second_copy_of_a_view_method_or_pin_rule():
    planted = {HOST: "class PolicyHost:\n    def free_blocks(self):\n        pass\n",
               "sim/vllm_replica/x.py": "class S:\n    def release_pin(self, pid, now, reason):\n        pass\n",
               "policies/y.py": "from typing import Protocol\nclass V(Protocol):\n    def free_blocks(self): ...\n"
                                "class W:\n    def queue_delay(self):\n        return 0.0\n",
               "sim/kv/tiers.py": "class T:\n    def reload_time(self, tokens):\n        return 0.0\n"}
    assert copies_outside_the_host({p: ast.parse(s) for p, s in planted.items()}) == [
        "policies/y.py defines queue_delay", "sim/vllm_replica/x.py defines release_pin"]


def _provided(tree: ast.Module, cls: str) -> set[str]:
    """Methods a module's class defines and attributes it assigns on self."""
    c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {n.name for n in c.body if isinstance(n, ast.FunctionDef)} | {
        n.attr for n in ast.walk(c) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
        and getattr(n.value, "id", None) == "self"}


def test_both_engines_are_the_policy_host_and_provide_its_block_operations():
    mods = _modules()
    protocol = next(n for n in mods[HOST].body if isinstance(n, ast.ClassDef) and n.name == "HostedEngine")
    ops = {n.name for n in protocol.body if isinstance(n, ast.FunctionDef)}
    fields = {n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign)}
    assert {"count_free", "free_pinned", "block_keys"} <= ops and {"running", "block_size"} <= fields
    for path, cls in ENGINE_SCHEDULERS.items():
        tree = mods[path]
        c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        assert "PolicyHost" in {getattr(b, "id", None) for b in c.bases}, path
        assert "PolicyHost" in _names_imported_from(tree, "sim.replica.policy_host"), path
        assert ops - _provided(tree, cls) == set(), path
        # the rules the host applies come to the engines through it alone
        assert not _names_imported_from(tree, "policies.runtime"), path
        assert "PinTable" not in _names_imported_from(tree, "policies.pins"), path
    assert {"no_deadlock_victims", "offloads_dropped_pin"} <= _names_imported_from(mods[HOST], "policies.runtime")
    assert "PinTable" in _names_imported_from(mods[HOST], "policies.pins")
    # the vLLM adapter's fields come from vLLM's Scheduler or the simulator's engine; the SimPy ones:
    assert fields - _provided(mods["sim/simpy_replica/scheduler.py"], "Scheduler") == set()


# What each of sim's sub-packages may import of sim besides itself, every import counted
# (inside functions too). The modules at sim/'s top are entry points (sim.cli, the
# vllm_scheduler name vLLM loads).
ENGINES = {"simpy_replica", "vllm_replica"}
BELOW_REPLICAS = {"replica", "kv", "hardware"}
DIRECTIONS = {
    "kv": set(),
    "hardware": set(),
    "replica": {"kv", "hardware"},
    "simpy_replica": BELOW_REPLICAS,
    "vllm_replica": BELOW_REPLICAS,
    "cluster": BELOW_REPLICAS,  # the replica class is handed in: the cluster imports no engine
    "run": BELOW_REPLICAS | ENGINES | {"cluster"},
    "study": BELOW_REPLICAS | {"cluster", "run"},
    "commands": BELOW_REPLICAS | {"cluster", "run", "study"},
}


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _sim_imports(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """module -> the modules of sim it imports (`from sim.kv import tiers` counts as sim.kv.tiers)."""
    names = {_module_name(p) for p in modules}
    out = {}
    for path, tree in modules.items():
        got = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                got |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
                sub = {f"{n.module}.{a.name}" for a in n.names} & names
                got |= sub or {n.module}
        out[_module_name(path)] = {m for m in got if m == "sim" or m.startswith("sim.")} - {_module_name(path)}
    return out


def direction_breaks(modules: dict[str, ast.Module]) -> list[str]:
    bad = []
    for mod, imported in _sim_imports(modules).items():
        parts = mod.split(".")
        if parts[0] != "sim" or len(parts) < 3:
            continue  # sim's top-level modules
        allowed = DIRECTIONS[parts[1]] | {parts[1]}
        bad += [f"{mod} imports {m}" for m in sorted(imported) if len(m.split(".")) > 1 and m.split(".")[1] not in allowed]
    return bad


def import_circles(modules: dict[str, ast.Module]) -> str | None:
    ours = {_module_name(p) for p in modules}
    graph = {m: imported & ours for m, imported in _sim_imports(modules).items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return " -> ".join(e.args[1])
    return None


def _sim_modules() -> dict[str, ast.Module]:
    return {p: t for p, t in _modules().items() if p.startswith("sim/")}


def test_every_sub_package_of_sim_is_in_the_direction_table():
    subs = {p.name for p in (ROOT / "sim").iterdir() if (p / "__init__.py").is_file()}
    assert subs == set(DIRECTIONS)


def test_sim_sub_packages_import_only_down_their_direction_table():
    assert direction_breaks(_sim_modules()) == []


def test_no_module_of_sim_is_in_an_import_circle():
    assert import_circles(_sim_modules()) is None


@pytest.mark.parametrize("planted, found", [
    ({"sim/kv/a.py": "from sim.hardware import profile\n", "sim/hardware/profile.py": ""}, ["sim.kv.a imports sim.hardware.profile"]),
    ({"sim/cluster/c.py": "def f():\n    from sim.simpy_replica.engine import SimpyReplica\n", "sim/simpy_replica/engine.py": ""},
     ["sim.cluster.c imports sim.simpy_replica.engine"]),
    ({"sim/vllm_replica/e.py": "import sim.simpy_replica.scheduler\n"}, ["sim.vllm_replica.e imports sim.simpy_replica.scheduler"]),
    ({"sim/run/r.py": "from sim.kv import tiers\n", "sim/kv/tiers.py": ""}, []),
])
def test_the_direction_check_finds_an_upward_import(planted, found):
    assert direction_breaks({p: ast.parse(src) for p, src in planted.items()}) == found


def test_the_circle_check_finds_a_circle():
    planted = {"sim/run/a.py": "from sim.run import b\n", "sim/run/b.py": "def f():\n    from sim.run.a import x\n",
               "sim/run/c.py": "from sim.run import a\n"}
    assert import_circles({p: ast.parse(s) for p, s in planted.items()}) in ("sim.run.a -> sim.run.b -> sim.run.a",
                                                                              "sim.run.b -> sim.run.a -> sim.run.b")
    assert import_circles({p: ast.parse(s) for p, s in list(planted.items())[::2]}) is None


# ../shared is the team's folder beside the checkout: the tests may read it in place (and skip
# without it); nothing a user installs, runs or reads may name it. The GPU device tooling
# (benchmarks/gpu/) takes its independent reference probe scripts from there by design.
USER_FACING = ["README.md", "Makefile", "pyproject.toml", "setup.py", "mkdocs.yml", "sim", "calibrate", "traces",
               "policies", "agentsim", "docs", "notebooks", "benchmarks/*.py"]


def shared_mentions(root: Path) -> list[str]:
    files = [f for entry in USER_FACING for p in root.glob(entry)
             for f in ([p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()))]
    bad = []
    for f in files:
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # compiled files, figures
        bad += [f"{f.relative_to(root)}:{i}" for i, line in enumerate(text.splitlines(), 1)
                if "../shared" in line or '"shared" /' in line or "/ \"shared\"" in line]
    return bad


def test_nothing_a_user_runs_or_reads_names_the_teams_shared_folder():
    assert shared_mentions(ROOT) == []


def test_the_shared_folder_check_finds_a_mention(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("fine\nsee ../shared/measurements\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text('X = ROOT.parent / "shared" / "x"\n')
    assert sorted(shared_mentions(tmp_path)) == ["benchmarks/b.py:1", "docs/a.md:2"]
