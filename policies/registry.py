"""Policy names (the CLI's --policy values) and construction with checked parameters."""
from __future__ import annotations

import inspect

from policies.autellix import AutellixPolicy
from policies.base import Policy, PolicyError
from policies.continuum import ContinuumPolicy, StaticTTLPolicy
from policies.continuum_offload import ContinuumOffloadPolicy
from policies.infercept import InferceptPolicy
from policies.oracle import OraclePolicy
from policies.program_fcfs import ProgramFCFSPolicy
from policies.static import ContinuumStaticPolicy
from policies.thunderagent import ThunderAgentPolicy


class VLLMPolicy(Policy):
    """vLLM's default: request-level FCFS, free the KV cache at the end of every turn."""

    name = "vllm"


POLICIES: dict[str, type[Policy]] = {
    "vllm": VLLMPolicy,
    "continuum": ContinuumPolicy,
    "continuum-static": ContinuumStaticPolicy,
    "static-ttl": StaticTTLPolicy,
    "program-fcfs": ProgramFCFSPolicy,
    "autellix": AutellixPolicy,
    "oracle": OraclePolicy,
    "infercept": InferceptPolicy,
    "thunderagent": ThunderAgentPolicy,
    "continuum-offload": ContinuumOffloadPolicy,
}


def policy_params(name: str) -> dict[str, object]:
    """Parameter names and defaults of a policy (for --help and sweeps)."""
    sig = inspect.signature(_cls(name).__init__)
    return {k: p.default for k, p in sig.parameters.items() if k != "self"}


def _cls(name: str) -> type[Policy]:
    if name not in POLICIES:
        raise PolicyError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}")
    return POLICIES[name]


def make_policy(name: str, **params) -> Policy:
    """Build a policy; string values (from `--policy-arg k=v`) are converted to the default's type."""
    cls = _cls(name)
    known = policy_params(name)
    kwargs = {}
    for k, v in params.items():
        if k not in known:
            raise PolicyError(f"policy {name!r} has no parameter {k!r}; known: {', '.join(known) or 'none'}")
        default = known[k]
        if isinstance(v, str) and isinstance(default, (bool, int, float)):
            try:
                v = v.lower() in ("1", "true", "yes") if isinstance(default, bool) else type(default)(v)
            except ValueError:
                raise PolicyError(f"policy {name!r} parameter {k!r}={v!r} is not a {type(default).__name__}") from None
        kwargs[k] = v
    return cls(**kwargs)
