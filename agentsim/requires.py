"""Flags that apply only with another: one table, one refusal line.

A flag given without its condition would do nothing and still be recorded (config.json, a
sweep row) as if it applied. Each such flag is a row of RULES (or of the rows made from the
policy and router registries), and `check` refuses it with one line, "<flag> applies only
with <condition>; add <condition> or drop <flag>" (exit 2). `sim run`'s rows read the run's
config, so a --config file and a sweep point are checked as the flags are (sim.run.config.
build_run); the other commands' rows read the parsed command line (agentsim.cli.main).
A new flag that depends on another gets a row here; tests/test_refused_inputs.py walks the
table: each row refused without its condition and accepted with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from agentsim.errors import InputError


@dataclass(frozen=True)
class Requires:
    command: str  # "run" (read on the SimConfig) or a command line's key ("validate", "trace gen")
    flag: str  # as the refusal names it
    condition: str  # as the refusal names it
    given: Callable[[Any], bool]
    holds: Callable[[Any], bool]
    without: tuple[str, ...]  # the walking test: arguments giving the flag without its condition ...
    with_: tuple[str, ...]  # ... and with it
    fix: str = ""  # the advice, when "add <condition> or drop <flag>" does not fit

    def line(self) -> str:
        return f"{self.flag} applies only with {self.condition}; {self.fix or f'add {self.condition} or drop {self.flag}'}"


def _changed(section: str, field: str) -> Callable[[Any], bool]:
    """A config field set away from its default (a file or a sweep point writes every field)."""
    def given(c) -> bool:
        part = getattr(c, section)
        return getattr(part, field) != type(part).model_fields[field].default
    return given


def _disagg(c) -> bool:
    return c.cluster.disagg is not None and str(c.cluster.disagg).strip().lower() not in ("", "none", "off")


_DISAGG = ("--disagg", "1P1D")
RULES: tuple[Requires, ...] = (
    Requires("run", "--disagg-link", "--disagg xPyD", _changed("cluster", "disagg_link"), _disagg,
             ("--disagg-link", "nvlink4"), ("--disagg-link", "nvlink4", *_DISAGG)),
    Requires("run", "--disagg-local-prefill", "--disagg xPyD", _changed("cluster", "disagg_local_prefill"), _disagg,
             ("--disagg-local-prefill", "5"), ("--disagg-local-prefill", "5", *_DISAGG)),
    Requires("run", "--disagg-prefill-queue", "--disagg xPyD", _changed("cluster", "disagg_prefill_queue"), _disagg,
             ("--disagg-prefill-queue", "7"), ("--disagg-prefill-queue", "7", *_DISAGG)),
    Requires("run", "--concurrency", "--workload closed", lambda c: c.workload.concurrency is not None,
             lambda c: c.workload.mode == "closed", ("--concurrency", "2"), ("--concurrency", "2", "--workload", "closed")),
    Requires("run", "--jps", "--workload open", lambda c: c.workload.jps is not None, lambda c: c.workload.mode == "open",
             ("--jps", "1", "--workload", "closed", "--concurrency", "2"), ("--jps", "1"),
             "with --workload closed a program starts when another finishes; drop --jps"),
    Requires("run", "--async-scheduling", "--cache vllm", lambda c: c.engine.async_scheduling,
             lambda c: c.cluster.cache == "vllm", ("--async-scheduling", "--cache", "radix"), ("--async-scheduling",),
             "it models vLLM's engine core, not SGLang's radix cache; drop --cache radix or --async-scheduling"),
    Requires("trace gen", "--tokens-mode", "a generator name (not --spec)", lambda a: a.tokens_mode is not None,
             lambda a: a.spec is None, ("--spec", "codex", "--tokens-mode", "final"), ("swebench", "--tokens-mode", "final"),
             "a workload spec fixes its own token counts; drop --tokens-mode or --spec"),
    Requires("trace gen", "--shared-prefix", "a generator name (not --spec)", lambda a: a.shared_prefix is not None,
             lambda a: a.spec is None, ("--spec", "codex", "--shared-prefix", "100"), ("swebench", "--shared-prefix", "100"),
             "a workload spec fixes its own shared prefix; drop --shared-prefix or --spec"),
    Requires("trace gen", "--tasks", "a generator name (not --spec)", lambda a: a.tasks is not None,
             lambda a: a.spec is None, ("--spec", "codex", "--tasks", "3"), ("swebench", "--tasks", "3"),
             "drop --tasks or --spec"),
    Requires("trace resample", "--jitter-width", "--jitter", lambda a: a.jitter_width is not None, lambda a: a.jitter,
             ("--jitter-width", "0.2"), ("--jitter-width", "0.2", "--jitter")),
    Requires("trace carry", "--reasoning-share", "--mode reasoning-dropped", lambda a: a.reasoning_share is not None,
             lambda a: a.mode == "reasoning-dropped", ("--mode", "rerendered", "--reasoning-share", "0.2"),
             ("--mode", "reasoning-dropped", "--reasoning-share", "0.2")),
    Requires("validate", "--json", "--server-run", lambda a: a.json is not None, lambda a: a.server_run is not None,
             ("--json", "v.json"), ("--json", "v.json", "--server-run", "r.json")),
    Requires("validate", "--merge", "--shape", lambda a: a.merge, lambda a: a.shape is not None,
             ("--merge",), ("--merge", "--shape", "decode")),
    Requires("validate", "--policy-arg", "--trace runs (not --shape)", lambda a: bool(a.policy_arg),
             lambda a: a.shape is None, ("--policy-arg", "K=5", "--shape", "decode"), ("--policy-arg", "K=5"),
             "the shapes carry their own policy parameters; drop --policy-arg or --shape"),
)


def _param_rules() -> list[Requires]:
    """`--policy-arg K=V` applies only with a policy that has K; `--router-arg K=V` with a
    router that has K (a name no policy or router has is refused by the registry itself)."""
    from policies.registry import POLICIES, policy_params
    from sim.cluster.router import router_names, router_params

    out = []
    for flag, kind, names, params, field, pick in (
            ("--policy-arg", "--policy", sorted(POLICIES), policy_params, "policy", lambda c: c.policy.name),
            ("--router-arg", "--router", router_names(), router_params, "router", lambda c: c.cluster.router or "round_robin")):
        having: dict[str, list[str]] = {}
        for n in names:
            for k in params(n):
                having.setdefault(k, []).append(n)
        for k, owners in sorted(having.items()):
            others = [n for n in names if n not in owners]
            if not others:
                continue
            args = (lambda c: c.policy.args) if field == "policy" else (lambda c: c.cluster.router_args)
            extra = ("--replicas", "2") if field == "router" else ()
            value = str(params(owners[0])[k])
            out.append(Requires(
                "run", f"{flag} {k}", f"{kind} {owners[0]}" if len(owners) == 1 else f"{kind} {', '.join(owners[:-1])} or {owners[-1]}",
                (lambda key, get: lambda c: key in get(c))(k, args), (lambda ok, get: lambda c: get(c) in ok)(set(owners), pick),
                (kind, others[0], *extra, flag, f"{k}={value}"), (kind, owners[0], *extra, flag, f"{k}={value}"),
                f"give {kind} {owners[0]} (or another that has {k}) or drop {flag} {k}"))
    return out


def rules(command: str) -> list[Requires]:
    """The rows of one command (its key as agentsim.cli.OUTPUTS writes it)."""
    return [r for r in RULES if r.command == command] + (_param_rules() if command == "run" else [])


def check(command: str, view, where: str = "") -> None:
    """The first row of `command` whose flag is given without its condition, as one InputError line."""
    for r in rules(command):
        if r.given(view) and not r.holds(view):
            raise InputError(f"{where}: {r.line()}" if where else r.line())
