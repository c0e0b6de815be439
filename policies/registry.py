"""Policy names (the CLI's --policy values) and construction with checked parameters."""
from __future__ import annotations

import inspect
import typing
from functools import cache

from pydantic import AfterValidator, Field, create_model

from policies.autellix import AutellixPolicy
from policies.base import Policy, PolicyError
from policies.contextserve import ContextServePolicy
from policies.continuum import ContinuumPolicy, StaticTTLPolicy
from policies.continuum_offload import ContinuumOffloadPolicy
from policies.infercept import PRESERVE, RESUME_ORDERS, InferceptPolicy
from policies.oracle import OraclePolicy
from policies.program_fcfs import ProgramFCFSPolicy
from policies.rebuild_priced_ttl import RebuildPricedTTLPolicy
from policies.soft import TTL_MODES, ClientTTLPinPolicy, ClientTTLPolicy, ContinuumSoftPolicy, parse_tool_ttls
from policies.static import ContinuumStaticPolicy
from policies.thunderagent import ThunderAgentPolicy
from traces.validation import Model, validated


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
    "contextserve": ContextServePolicy,
    "rebuild-priced-ttl": RebuildPricedTTLPolicy,
    "continuum-soft": ContinuumSoftPolicy,
    "client-ttl": ClientTTLPolicy,
    "client-ttl-pin": ClientTTLPinPolicy,
}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Make a Policy subclass available by its `name` (`--policy`, `policy.name`), its
    constructor's parameters checked as the bundled ones' (numeric ones need a RANGES
    entry); usable as a class decorator (docs/extending.md)."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)) or not isinstance(cls.name, str) or cls.name == Policy.name:
        raise TypeError("register_policy takes a Policy subclass with its own `name`")
    POLICIES[cls.name] = cls
    params_model.cache_clear()
    return cls


def _bounds(v: str) -> str:
    b = [float(x) for x in v.split(",")]  # a ValueError here is reported as the field's problem
    if not all(0 <= x < float("inf") for x in b) or b != sorted(b):
        raise ValueError("should be ascending finite seconds >= 0, comma-separated")
    return v


# Ranges of policy parameters, by name (a name means the same in every policy that has
# it); the types come from the constructors' annotations. Every numeric parameter
# must be listed (tests/test_refused_inputs.py checks), so none is accepted unchecked.
# ThunderAgent's `interval` >= 1 ms: rounds of 1e-9 s took the run 10^9 rounds a second
# of simulated time, a run that never ended (issue 36).
RANGES: dict[str, object] = {
    "K": Field(ge=0), "T_window": Field(ge=1), "T_init": Field(ge=0), "cold_tool_mean": Field(gt=0),
    "eta_min_programs": Field(ge=0), "max_ttl": Field(ge=0), "epsilon": Field(ge=0),
    "threshold": Field(ge=0), "pin_seconds": Field(ge=0), "beta": Field(ge=0),
    "S": Field(ge=1), "a_ms": Field(ge=0), "c_ms": Field(ge=0), "swap_budget_blocks": Field(ge=-1),
    "interval": Field(ge=0.001), "acting_weight": Field(ge=0), "reserve_tokens": Field(ge=0),
    "force_resume_s": Field(ge=0),
    "fast_ttl": Field(ge=0), "quantile": Field(gt=0, lt=1), "min_samples": Field(ge=1),
    "prior_median_s": Field(gt=0), "prior_kappa": Field(gt=0), "prior_alpha": Field(gt=0), "prior_beta": Field(gt=0),
    "kappa": Field(gt=0), "slack": Field(ge=0),
    "ttl": Field(ge=0), "priority": Field(ge=0, le=100), "min_priority": Field(ge=0, le=100), "half_life": Field(gt=0),
}


def _choice(*options: str):
    def check(v: str) -> str:
        if v not in options:
            raise ValueError(f"should be one of {', '.join(options)}")
        return v
    check.options = options  # what a search may choose from (sim/study/tune.py)
    return AfterValidator(check)


# Text parameters that name one of a few choices (InferCept's ablation switches).
CHOICES: dict[str, object] = {
    "preserve": _choice(*PRESERVE), "resume_order": _choice(*RESUME_ORDERS), "ttl_mode": _choice(*TTL_MODES),
}


def _tool_ttls(v: str) -> str:
    parse_tool_ttls(v)  # its ValueError is reported as the field's problem
    return v


VALIDATORS: dict[str, object] = {"bounds": AfterValidator(_bounds), "tool_ttls": AfterValidator(_tool_ttls), **CHOICES}
_NONE_WORDS = ("", "none", "null")


@cache
def params_model(name: str) -> type[Model]:
    """A pydantic model of the policy's constructor parameters: declared types
    (strings from --policy-arg are converted; 'maybe' is no bool), ranges from RANGES."""
    cls = _cls(name)
    hints = typing.get_type_hints(cls.__init__)
    fields = {}
    for k, p in inspect.signature(cls.__init__).parameters.items():
        if k == "self":
            continue
        extra = [x for x in (RANGES.get(k), VALIDATORS.get(k)) if x is not None]
        fields[k] = (typing.Annotated[(hints[k], *extra)] if extra else hints[k], p.default)
    return create_model(f"{cls.__name__}Params", __base__=Model, **fields)


def policy_params(name: str) -> dict[str, object]:
    """Parameter names and defaults of a policy (for --help and sweeps)."""
    sig = inspect.signature(_cls(name).__init__)
    return {k: p.default for k, p in sig.parameters.items() if k != "self"}


def _cls(name: str) -> type[Policy]:
    if name not in POLICIES:
        load_plugins()
    if name not in POLICIES:
        raise PolicyError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}")
    return POLICIES[name]


def make_policy(name: str, **params) -> Policy:
    """Build a policy from checked parameters (strings from `--policy-arg k=v` are
    converted to the declared type; out-of-range values are refused: PolicyError)."""
    cls = _cls(name)
    known = policy_params(name)
    for k, v in params.items():
        if k not in known:
            raise PolicyError(f"policy {name!r} has no parameter {k!r}; known: {', '.join(known) or 'none'}")
        if known[k] is None and isinstance(v, str) and v.strip().lower() in _NONE_WORDS:
            params[k] = None  # 'none' for a parameter whose default is None
    m = validated(params_model(name), params, f"policy {name!r} (--policy-arg)", error=PolicyError)
    return cls(**{k: getattr(m, k) for k in params})


@cache
def load_plugins() -> tuple[str, ...]:
    """Register the installed packages' policies (entry-point group agentsim.policies,
    agentsim/plugins.py), once per process; a name lookup calls it."""
    from agentsim.plugins import POLICY_GROUP, load_group

    return tuple(load_group(POLICY_GROUP, lambda cls: POLICIES.get(cls.name) is cls or register_policy(cls), Policy))
