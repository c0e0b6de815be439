"""`sim tune`'s search space, from what each policy declares.

What is searched. A trial is a policy family and a value for each of its parameters. The
parameters come from the policy's constructor, as a sweep's axes do (policies.registry:
`params_model`, with the declared types and RANGES): a bool is searched over both values,
a text parameter with fixed choices over them, a number with a positive default over
[default / SPAN, default x SPAN] (log scale) clipped to its declared range. A number whose
default is 0, negative or None has no scale to search around and a free text parameter
nothing to choose from: each is held at its default unless `--param` gives a range, a
list or a value. So a policy registered anywhere (a plugin included) is searched as it
declares itself, with no list here.

A policy that reads what only the simulator knows (Policy.deployable) is held, in the
default search, at the parameter values a deployment could run (sim/commands/tune.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from policies.registry import POLICIES, params_model, policy_params
from sim.run.config import scalar_kind
from sim.study.sweep import parse_value
from agentsim.errors import InputError
from traces.validation import validated

SPAN = 8.0  # a number with a positive default is searched over [default / SPAN, default x SPAN]


@dataclass(frozen=True)
class Dim:
    """One searched parameter of one policy."""
    policy: str
    name: str
    kind: str                      # "int", "float" or "cat"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple = ()

    @property
    def key(self) -> str:
        return f"{self.policy}.{self.name}"

    def suggest(self, trial):
        if self.kind == "cat":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, log=self.log)

    def describe(self) -> str:
        if self.kind == "cat":
            return f"{self.name} in {{{', '.join(map(str, self.choices))}}}"
        return f"{self.name} in [{self.low:g}, {self.high:g}]{' log' if self.log else ''}"


@dataclass
class Space:
    """A policy's searched dimensions and the parameters held (name -> value); `fixed`:
    the values its fixed (reference) trial takes other than its defaults."""
    policy: str
    dims: list[Dim]
    held: dict[str, object]
    fixed: dict[str, object] = field(default_factory=dict)


def _limits(metadata) -> tuple[float, bool, float, bool]:
    """(low, low exclusive, high, high exclusive) of a field's declared range."""
    lo, lo_ex, hi, hi_ex = -math.inf, False, math.inf, False
    for m in metadata:
        for attr, ex in (("ge", False), ("gt", True)):
            if getattr(m, attr, None) is not None:
                lo, lo_ex = float(getattr(m, attr)), ex
        for attr, ex in (("le", False), ("lt", True)):
            if getattr(m, attr, None) is not None:
                hi, hi_ex = float(getattr(m, attr)), ex
    return lo, lo_ex, hi, hi_ex


def _choices(metadata) -> tuple:
    for m in metadata:
        opts = getattr(getattr(m, "func", None), "options", None)  # policies.registry._choice
        if opts:
            return tuple(opts)
    return ()


def deployable(policy: str) -> bool | dict:
    """Policy.deployable of a registered policy: True, False (it reads what only the
    simulator knows) or {parameter: value} (deployable with those values)."""
    return getattr(POLICIES[policy], "deployable", True)


def derive_space(policy: str, deployed: bool = False) -> Space:
    """The default search space of a policy, from its declared parameters (module docstring);
    `deployed`: the parameters a deployment must hold (Policy.deployable) are held at
    those values, in its fixed trial too."""
    dims, held = [], {}
    must = deployable(policy) if deployed else True
    fixed = dict(must) if isinstance(must, dict) else {}
    for name, f in params_model(policy).model_fields.items():
        if name in fixed:
            held[name] = fixed[name]
            continue
        kind, d = scalar_kind(f.annotation), f.default
        lo, lo_ex, hi, hi_ex = _limits(f.metadata)
        choices = _choices(f.metadata)
        if kind is bool:
            dims.append(Dim(policy, name, "cat", choices=(False, True)))
        elif choices:
            dims.append(Dim(policy, name, "cat", choices=choices))
        elif kind in (int, float) and isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0:
            low, high = d / SPAN, d * SPAN
            if low <= lo:
                low = lo + (d - lo) / SPAN if lo_ex else lo
            if high >= hi:
                high = hi - (hi - d) / SPAN if hi_ex else hi
            if kind is int:
                low, high = math.ceil(low - 1e-9), math.floor(high + 1e-9)
                low = max(low, math.floor(lo) + 1 if lo_ex else math.ceil(lo)) if math.isfinite(lo) else low
            if high > low:
                dims.append(Dim(policy, name, "int" if kind is int else "float", low, high, log=low > 0))
            else:
                held[name] = d
        else:
            held[name] = d
    return Space(policy, dims, held, fixed)


def _check_value(policy: str, name: str, value, text: str):
    """A value of a policy's parameter, converted and range-checked as --policy-arg's."""
    m = validated(params_model(policy), {name: value}, f"--param {text!r}", error=InputError)
    return getattr(m, name)


def apply_param(spaces: dict[str, Space], text: str) -> None:
    """`--param [POLICY.]NAME=SPEC`: SPEC LO:HI (or LO:HI:log) a range, V1,V2,... a choice,
    V a held value; for every searched policy that has NAME, or POLICY's alone."""
    target, sep, spec = text.partition("=")
    target, spec = target.strip(), spec.strip()
    if not sep or not target or not spec:
        raise InputError(f"--param {text!r} is not [POLICY.]NAME=SPEC; write e.g. --param max_ttl=0.5:20, "
                         f"--param continuum.K=50,100 or --param unpin_while_running=true")
    pol, dot, name = target.rpartition(".")
    if dot:
        if pol not in spaces:
            raise InputError(f"--param {text!r}: policy {pol!r} is not searched; searched: {', '.join(spaces)}")
        names = [pol]
        if name not in policy_params(pol):
            raise InputError(f"--param {text!r}: policy {pol!r} has no parameter {name!r}; known: "
                             f"{', '.join(policy_params(pol)) or 'none'}")
    else:
        names = [p for p in spaces if name in policy_params(p)]
        if not names:
            raise InputError(f"--param {text!r}: none of the searched policies ({', '.join(spaces)}) has a parameter "
                             f"{name!r}")
    for p in names:
        s = spaces[p]
        f = params_model(p).model_fields[name]
        kind = scalar_kind(f.annotation)
        s.dims = [d for d in s.dims if d.name != name]
        s.held.pop(name, None)
        s.fixed.pop(name, None)  # the user's search of it: the fixed trial at its declared default
        parts = spec.split(":")
        if len(parts) in (2, 3) and kind in (int, float) and (len(parts) == 2 or parts[2].strip().lower() == "log"):
            low, high = (_check_value(p, name, v.strip(), text) for v in parts[:2])
            log = len(parts) == 3
            if not high > low or (log and not low > 0):
                raise InputError(f"--param {text!r}: give LO < HI" + (" and LO > 0 for a log range" if log else ""))
            s.dims.append(Dim(p, name, "int" if kind is int else "float", low, high, log=log))
        elif "," in spec and (kind is not str or _choices(f.metadata)):
            vals = list(dict.fromkeys(_check_value(p, name, parse_value(v), text) for v in spec.split(",")))
            s.dims.append(Dim(p, name, "cat", choices=tuple(vals)))
        else:
            s.held[name] = _check_value(p, name, spec if kind is str else parse_value(spec), text)


def distribution(d: Dim):
    """Optuna's distribution of a dimension."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if d.kind == "cat":
        return CategoricalDistribution(list(d.choices))
    if d.kind == "int":
        return IntDistribution(int(d.low), int(d.high), log=d.log)
    return FloatDistribution(d.low, d.high, log=d.log)

