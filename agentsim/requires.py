"""Flags that apply only with another: one table, one refusal line.

A flag given without its condition would do nothing and still be recorded (config.json, a
sweep row) as if it applied. Each such flag is a row of RULES (or of the rows made from the
policy and router registries), and `check` refuses it with one line, "<flag> applies only
with <condition>; add <condition> or drop <flag>" (exit 2). `sim run`'s rows read the run's
config, so a --config file and a sweep point are checked as the flags are (sim.run.config.
build_run); the other commands' rows read the parsed command line (agentsim.cli.main).
"Given" means written by the user: on the command line or in the --config file, even at
its default value (`--disagg-link rdma-ndr` without --disagg is refused too). So a run's
config.json leaves out the fields whose condition does not hold (`inapplicable`), and
`sim run --config DIR/config.json` reruns it. A sweep point holds every axis, so there a
field counts as given when it is away from its default (sim.study.sweep.point_config).
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
    field: str = ""  # a run row's config field, "section.field": left out of config.json when its condition fails

    def line(self) -> str:
        return f"{self.flag} applies only with {self.condition}; {self.fix or f'add {self.condition} or drop {self.flag}'}"


def _set(section: str, field: str) -> Callable[[Any], bool]:
    """A config field the user wrote (pydantic's fields set: the --config file's and the
    flags'), whatever its value; null is not a value."""
    def given(c) -> bool:
        part = getattr(c, section)
        return field in part.model_fields_set and getattr(part, field) is not None
    return given


def given_flag(dest: str) -> Callable[[Any], bool]:
    """A flag on the command line (agentsim.cli.given_dests), even at its default value."""
    return lambda a: dest in getattr(a, "given_dests", ())


def _disagg(c) -> bool:
    return c.cluster.disagg is not None and str(c.cluster.disagg).strip().lower() not in ("", "none", "off")


def _routed(c) -> bool:
    """More than one replica serves calls: the router picks one of them (with --disagg xPyD,
    one of the y decode replicas; sim/cluster/cluster.py submit). A spec that does not parse
    holds here: build_run refuses it with its own line."""
    from sim.cluster.disagg import parse_disagg

    try:
        split = parse_disagg(c.cluster.disagg)
    except InputError:  # named by make_disagg
        return True
    return (split[1] if split else c.cluster.replicas) > 1


def _router_places(c) -> bool:
    """The policy leaves placement to the router (ThunderAgent's proxy places calls itself:
    Policy.make_controller)."""
    from policies.base import Policy
    from policies.registry import POLICIES

    cls = POLICIES.get(c.policy.name)
    return cls is None or cls.make_controller is Policy.make_controller


def _router_given(c) -> bool:
    """--router given, and a router's name (an unknown name is refused as such by make_router,
    the more useful line)."""
    from sim.cluster.router import router_names

    return _set("cluster", "router")(c) and c.cluster.router in router_names()


_ROUTED = "--replicas 2 or more (or --disagg xPyD with y >= 2)"


_DISAGG = ("--disagg", "1P1D")
RULES: tuple[Requires, ...] = (
    Requires("run", "--disagg-link", "--disagg xPyD", _set("cluster", "disagg_link"), _disagg,
             ("--disagg-link", "rdma-ndr"), ("--disagg-link", "rdma-ndr", *_DISAGG), field="cluster.disagg_link"),
    Requires("run", "--disagg-local-prefill", "--disagg xPyD", _set("cluster", "disagg_local_prefill"), _disagg,
             ("--disagg-local-prefill", "5"), ("--disagg-local-prefill", "5", *_DISAGG), field="cluster.disagg_local_prefill"),
    Requires("run", "--disagg-prefill-queue", "--disagg xPyD", _set("cluster", "disagg_prefill_queue"), _disagg,
             ("--disagg-prefill-queue", "7"), ("--disagg-prefill-queue", "7", *_DISAGG), field="cluster.disagg_prefill_queue"),
    Requires("run", "--router", _ROUTED, _router_given, _routed, ("--router", "round_robin"),
             ("--router", "round_robin", "--replicas", "2"),
             "one replica serves every call, so nothing is routed; add --replicas N or drop --router", field="cluster.router"),
    Requires("run", "--router-arg", _ROUTED, lambda c: bool(c.cluster.router_args), _routed,
             ("--router-arg", "cache_threshold=0.5", "--disagg", "2P1D"),
             ("--router", "cache_aware", "--router-arg", "cache_threshold=0.5", "--disagg", "1P2D"),
             "one replica serves every call, so nothing is routed; add --replicas N or drop --router-arg",
             field="cluster.router_args"),
    Requires("run", "--router", "a policy that lets the router place calls (not thunderagent: its proxy places them)",
             _router_given, _router_places, ("--router", "session", "--replicas", "2", "--policy", "thunderagent"),
             ("--router", "session", "--replicas", "2", "--policy", "vllm"),
             "drop --router or give another --policy", field="cluster.router"),
    Requires("run", "--concurrency", "--workload closed", _set("workload", "concurrency"),
             lambda c: c.workload.mode == "closed", ("--concurrency", "2"), ("--concurrency", "2", "--workload", "closed"),
             field="workload.concurrency"),
    Requires("run", "--jps", "--workload open", _set("workload", "jps"), lambda c: c.workload.mode == "open",
             ("--jps", "1", "--workload", "closed", "--concurrency", "2"), ("--jps", "1"),
             "with --workload closed a program starts when another finishes; drop --jps", field="workload.jps"),
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


# `sim validate --server-run` replays the result's own requests on --profile: every other flag
# of `sim validate` (a row each, from its parser, so a new flag gets one) drives a real engine.
SERVER_RUN_FLAGS = ("server_run", "json", "profile")


def _server_run_rules() -> list[Requires]:
    from agentsim.cli import subparser

    out = []
    for a in subparser("validate")._actions:
        if not a.option_strings or a.dest in SERVER_RUN_FLAGS or a.dest == "help":
            continue
        flag = a.option_strings[-1]
        value = () if a.nargs == 0 else (str(a.choices[0]) if a.choices else "3",)
        out.append(Requires(
            "validate", flag, "a real engine run (not --server-run)", given_flag(a.dest), lambda v: v.server_run is None,
            ("--server-run", "r.json", flag, *value), (flag, *value, *(("--shape", "decode") if flag == "--merge" else ())),
            f"--server-run replays the result's own requests, arrivals and token counts on --profile; drop {flag}"))
    return out


def _calibrate_rules() -> list[Requires]:
    """`sim calibrate --refit` and `--from-probes` start no engine: the flags that shape one
    apply only without them (--gpu-memory-utilization sizes --from-probes' KV pool too)."""
    from agentsim.cli import subparser

    out = [Requires("calibrate", "--refit", "no --from-probes", lambda v: v.refit is not None, lambda v: v.from_probes is None,
                    ("--from-probes", "x.json", "--refit", "p.json"), ("--refit", "p.json"),
                    "--from-probes makes the profile from its kernel timings; drop --refit or --from-probes")]
    for a in subparser("calibrate")._actions:
        if not a.option_strings or a.dest in ("help", "out", "from_probes", "refit"):
            continue
        flag, value = a.option_strings[-1], () if a.nargs == 0 else (str(a.choices[-1]) if a.choices else "3",)
        both = a.dest != "gpu_memory_utilization"
        out.append(Requires(
            "calibrate", flag, "an engine run (not --refit or --from-probes)" if both else "an engine run or --from-probes (not --refit)",
            given_flag(a.dest),
            (lambda v: v.refit is None and v.from_probes is None) if both else (lambda v: v.refit is None),
            ("--refit", "p.json", flag, *value), (flag, *value),
            f"--refit{' and --from-probes start' if both else ' starts'} no engine; drop {flag}"))
    return out


def rules(command: str) -> list[Requires]:
    """The rows of one command (its key as agentsim.cli.OUTPUTS writes it)."""
    return ((_server_run_rules() if command == "validate" else []) + [r for r in RULES if r.command == command]
            + (_param_rules() if command == "run" else []) + (_calibrate_rules() if command == "calibrate" else []))


def inapplicable(config) -> list[tuple[str, str]]:
    """The (section, field) of each run row whose condition fails on `config`: a resolved
    config leaves them out (not given, they are their defaults), so that rerunning it
    passes `check`."""
    return [tuple(r.field.split(".")) for r in RULES if r.command == "run" and r.field and not r.holds(config)]


def check(command: str, view, where: str = "") -> None:
    """The first row of `command` whose flag is given without its condition, as one InputError line."""
    for r in rules(command):
        if r.given(view) and not r.holds(view):
            raise InputError(f"{where}: {r.line()}" if where else r.line())
