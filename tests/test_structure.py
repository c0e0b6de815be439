"""The house's layering, checked on the source (ast): sim imports nothing of calibrate (not
even inside a function), and no module of the project reads a private member (`._name`) or
imports a private name that another of its modules defines. Tests are white-box and exempt."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentsim", "sim", "calibrate", "policies", "traces")
# A third party's private member, read on purpose and documented where it is read
THIRD_PARTY = {("sim/engine.py", "_queue"): "SimPy's event queue, in the documented step_end adapter"}


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
    # a replica without offload tiers holds sim/cpu_tier.py's NoTier, which answers as no
    # tier would; a `tier is None` check would bring back the branch at every call site
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "sim").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if "tier is None" in line or "tier is not None" in line]
    assert hits == []


def _top_level_names(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _names_imported_from(tree: ast.Module, module: str) -> set[str]:
    return {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == module
            for a in n.names}


def test_both_engines_take_the_policy_rules_from_one_place():
    # The rules a policy relies on are written once (policies/runtime.py, policies/pins.py)
    # and imported by the SimPy scheduler and the vLLM adapter alike; neither engine
    # defines its own copy under the same name.
    mods = _modules()
    engines = ("sim/scheduler.py", "sim/vllm_scheduler.py")
    shared = {"policies.runtime": {"no_deadlock_victims"}, "policies.pins": {"PinTable"}}
    for path in engines:
        for module, names in shared.items():
            assert names <= _names_imported_from(mods[path], module), (path, module)
    rules = set().union(*(_top_level_names(mods[p]) for p in ("policies/runtime.py", "policies/pins.py")))
    for path in engines:
        assert not rules & _top_level_names(mods[path]), (path, rules & _top_level_names(mods[path]))
