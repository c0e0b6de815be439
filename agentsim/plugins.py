"""Policies and routers from installed packages: the entry-point groups `agentsim.policies`
and `agentsim.routers`.

A package declares, in its pyproject.toml,

    [project.entry-points."agentsim.policies"]
    my-pin = "mypkg.policies:MyPin"        # a Policy subclass with name = "my-pin"

    [project.entry-points."agentsim.routers"]
    my-router = "mypkg.routers:MyRouter"   # a Router subclass

and once it is installed `sim run/sweep/plan --policy my-pin --router my-router` know them,
as does a vLLM serving with `--scheduler-cls sim.vllm_scheduler.PolicyScheduler`: each
registry (policies/registry.py, sim/cluster/router.py) loads its group, once per process,
when a name it does not know is asked for, and agentsim's own vLLM general plugin
(`vllm_plugin`, group `vllm.general_plugins`) loads the policies in each vLLM process. An entry
point may also name a module that registers its classes itself (register_policy,
register_router). Stdlib only: it runs inside vLLM.
"""
from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from agentsim.errors import InputError

POLICY_GROUP = "agentsim.policies"
ROUTER_GROUP = "agentsim.routers"


def declared(group: str) -> list[str]:
    """The names the installed packages declare in `group`, without importing them (for help
    texts: a broken plugin must not break `--help`)."""
    return sorted({ep.name for ep in entry_points(group=group)})


def load_group(group: str, register: Callable[[type], type], base: type) -> list[str]:
    """Import every entry point of `group`; register each class it names (a subclass of
    `base`). One line naming the plugin when one cannot be imported or names something else.
    Returns the entry points' names."""
    names = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            obj = ep.load()
        except Exception as e:  # a third party's import: any error, reported as one line
            raise InputError(f"plugin {ep.name!r} ({ep.value}, entry point group {group}) cannot be imported: "
                             f"{type(e).__name__}: {e}; fix or uninstall the package that declares it") from None
        if isinstance(obj, type):
            if not issubclass(obj, base):
                raise InputError(f"plugin {ep.name!r} ({ep.value}, entry point group {group}) names {obj.__name__}, "
                                 f"not a {base.__name__} subclass")
            register(obj)
        names.append(ep.name)
    return names


def vllm_plugin() -> None:
    """vLLM's general plugin hook (entry-point group `vllm.general_plugins`): in every vLLM
    process, make the installed packages' policies known to PolicyScheduler."""
    from policies.registry import load_plugins

    load_plugins()
