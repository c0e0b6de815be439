"""The twin check: one run spec on both engines, the SimPy replica and vLLM's own scheduler
(`--scheduler vllm`, sim/vllm_replica/engine.py), both priced by the same profile step model.

    python benchmarks/twin_check.py [--trace swebench] [--programs 100] [--jps 0.5]
        [--num-gpu-blocks 1500] [--policies vllm,continuum] [--seed 0] [--profile NAME]
        [--replicas N --router NAME] [--disagg xPyD] [--offload TIERS] [--async-scheduling] [--no-log] [--speed] [--write-docs [--doc-section NAME]] [--json OUT]

Any difference between the two engines is a scheduling-semantics difference (admission,
chunking, preemption, prefix hits, eviction, pins), free of timing noise. Per policy:
mean and p95 JCT of both, per-program JCT MAPE (SimPy against vLLM), steps, preemptions,
prefix-hit tokens, pin outcomes, and the first step whose schedule differs with the
mechanism (admission, chunk size, preemption, prefix hit, step time). Targets (issue 32):
mean JCT within 1%, per-program MAPE within 3%, pin outcomes and preemptions within 2%,
the same policy ranking. Also each engine's speed (simulated s per wall s, whole run).
With --replicas, a cluster behind --router, each replica's engine of either kind (with
--disagg, prefill and decode replicas); the first differing step is the earliest over the
replicas. With --offload (e.g. cpu:20GiB), each replica's offload tiers: on vLLM's side
through the simulator's KV connector (sim/vllm_replica/connector.py).

--write-docs writes the table into docs/reference/validation.md between the markers
`<!-- twin-check:SECTION:begin -->` and `... :end -->` (--doc-section, default ci).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reference" / "validation.md"
MARK = "<!-- twin-check:{}:{} -->"  # a table's markers in the doc: MARK.format(section, "begin"/"end")
PIN_KEYS = ("pins_hit", "pins_expired", "pins_victim", "pins_discarded")
OFFLOAD_KEYS = ("offload_loaded_tokens", "offload_loads", "writethrough_bytes", "offload_bytes")
TARGETS = {"mean_jct": 0.01, "mape": 0.03, "pins": 0.02, "preemptions": 0.02}


@contextlib.contextmanager
def schedule_logs(logs: dict):
    """Log every non-empty step of both engines' schedulers: logs[engine] = [(start,
    {request id: tokens}, preemptions in the step)], one list per run (replica 0 first)."""
    from sim.vllm_replica.scheduler import PolicyScheduler
    from sim.simpy_replica.scheduler import Scheduler

    sim_schedule, vllm_schedule = Scheduler.schedule, PolicyScheduler.schedule
    pending: dict[int, int] = {}  # preemptions in empty steps count toward the next step (either engine)

    def sim_logged(self, now):
        pre = self.preemptions
        out = sim_schedule(self, now)
        n = pending.pop(id(self), 0) + self.preemptions - pre
        if out:
            logs.setdefault(("simpy", id(self)), []).append((now, {c.req.req_id: q for c, q in out}, n))
        elif n:
            pending[id(self)] = n
        return out

    def vllm_logged(self, *a, **kw):
        pre, now = self.preemptions, self.clock()
        out = vllm_schedule(self, *a, **kw)
        n = pending.pop(id(self), 0) + self.preemptions - pre
        if out.total_num_scheduled_tokens:
            logs.setdefault(("vllm", id(self)), []).append((now, dict(out.num_scheduled_tokens), n))
        elif n:
            pending[id(self)] = n
        return out

    Scheduler.schedule, PolicyScheduler.schedule = sim_logged, vllm_logged
    try:
        yield
    finally:
        Scheduler.schedule, PolicyScheduler.schedule = sim_schedule, vllm_schedule


def first_difference(a: list, b: list) -> dict | None:
    """The first step where the SimPy log `a` and the vLLM log `b` differ, and how."""
    seen: set[str] = set()  # calls scheduled before (an admission is a call's first step, or a resume)
    for i, ((ta, sa, pa), (tb, sb, pb)) in enumerate(zip(a, b)):
        if sa == sb and ta == tb and pa == pb:
            seen.update(sa)
            continue
        only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
        if pa != pb:
            how = f"preemption: SimPy preempted {pa}, vLLM {pb}"
        elif only_a or only_b:
            new = [r for r in only_a + only_b if r not in seen]
            kind = "admission order" if new else "which running calls run"
            how = f"{kind}: SimPy only {', '.join(only_a) or '-'}; vLLM only {', '.join(only_b) or '-'}"
        elif sa != sb:
            diff = [(r, sa[r], sb[r]) for r in sa if sa[r] != sb[r]]
            new = [r for r, _, _ in diff if r not in seen]
            kind = "prefix hit at admission (eviction order)" if new else "chunk size"
            how = f"{kind}: " + ", ".join(f"{r} {qa} vs {qb} tokens" for r, qa, qb in diff[:4])
        else:
            how = f"step start: {ta:.6f} s vs {tb:.6f} s (a call or pin reached one engine at another step)"
        return {"step": i, "t": min(ta, tb), "mechanism": how}
    if len(a) != len(b):
        return {"step": min(len(a), len(b)), "t": None, "mechanism": f"step count: SimPy {len(a)}, vLLM {len(b)}"}
    return None


def run_pair(spec: dict, policy: str, log: bool = True) -> dict:
    """One policy on both engines: per engine the summary and per-program JCTs (and the
    schedule logs when `log`: SimPy then runs step by step, with identical results)."""
    from sim.run.config import SimConfig, build_run, execute

    out = {}
    logs: dict = {}
    for engine in ("simpy", "vllm"):
        cfg = {**spec, "policy": {"name": policy, "args": spec.get("policy_args", {}).get(policy, {})}}
        cfg.pop("policy_args", None)
        cfg["engine"] = {**cfg.get("engine", {}), "scheduler": engine, "fast_forward": not log}
        r = build_run(SimConfig.model_validate(cfg))
        with schedule_logs(logs) if log else contextlib.nullcontext():
            t0 = time.perf_counter()
            res = execute(r)
            wall = time.perf_counter() - t0
        s = res.summary
        out[engine] = {"summary": s, "wall_s": wall, "jct": res.programs.set_index("program_id")["jct"]}
    if log:  # one log per replica, in the order the replicas were built
        per = {e: [v for (eng, _), v in logs.items() if eng == e] for e in ("simpy", "vllm")}
        diffs = [d for a, b in zip(per["simpy"], per["vllm"]) if (d := first_difference(a, b)) is not None]
        out["first_difference"] = min(diffs, key=lambda d: (d["t"] is None, d["t"] or 0.0), default=None)
    return out


def compare(pair: dict) -> dict:
    a, b = pair["simpy"], pair["vllm"]
    sa, sb = a["summary"], b["summary"]
    jb = b["jct"].reindex(a["jct"].index)

    def rel(x, y):
        return (x - y) / y if y else (0.0 if x == y else float("inf"))

    row = {
        "mean_jct": (sa["mean_jct"], sb["mean_jct"], rel(sa["mean_jct"], sb["mean_jct"])),
        "p95_jct": (sa["p95_jct"], sb["p95_jct"], rel(sa["p95_jct"], sb["p95_jct"])),
        "mape": float(np.mean(np.abs(a["jct"] - jb) / jb)),
        "steps": (sa["steps"], sb["steps"]),
        "preemptions": (sa["preemptions"], sb["preemptions"]),
        "cached": (sa["prefill_tokens_cached"], sb["prefill_tokens_cached"]),
        "peak_kv_usage": (sa["peak_kv_usage"], sb["peak_kv_usage"]),
        "pins": {k: (sa[k], sb[k]) for k in PIN_KEYS},
        "speed": (sa["makespan_s"] / a["wall_s"], sb["makespan_s"] / b["wall_s"]),
        "first_difference": pair.get("first_difference"),
    }
    if sa.get("offload"):  # what went through the offload tiers
        row["offload"] = {k: (sa[k], sb[k]) for k in OFFLOAD_KEYS}
    pins_a, pins_b = sum(sa[k] for k in PIN_KEYS), sum(sb[k] for k in PIN_KEYS)
    row["targets"] = {
        "mean_jct": abs(row["mean_jct"][2]) <= TARGETS["mean_jct"],
        "mape": row["mape"] <= TARGETS["mape"],
        "preemptions": abs(sa["preemptions"] - sb["preemptions"]) <= TARGETS["preemptions"] * max(sb["preemptions"], 1),
        "pins": all(abs(sa[k] - sb[k]) <= TARGETS["pins"] * max(pins_b, 1) for k in PIN_KEYS),
    }
    del pins_a
    return row


def ranking(rows: dict, engine: int) -> list[str]:
    return sorted(rows, key=lambda p: rows[p]["mean_jct"][engine])


def table(spec_line: str, rows: dict) -> str:
    lines = [f"Run: {spec_line}.", "",
             "| policy | mean JCT SimPy / vLLM (s) | diff | p95 JCT SimPy / vLLM (s) | per-program MAPE | steps | preemptions "
             "| prefix-hit tokens | pins hit / expired / victim / discarded | first differing step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p, r in rows.items():
        fd = r["first_difference"]
        first = "not searched (--no-log)" if not r.get("logged", True) else "none" if fd is None else f"step {fd['step']}" + (f" (t = {fd['t']:.2f} s)" if fd.get("t") is not None else "") + f": {fd['mechanism']}"
        pins = " / ".join(f"{r['pins'][k][0]}:{r['pins'][k][1]}" if k in r["pins"] else "-" for k in PIN_KEYS)
        lines.append(f"| {p} | {r['mean_jct'][0]:.2f} / {r['mean_jct'][1]:.2f} | {100 * r['mean_jct'][2]:+.2f}% "
                     f"| {r['p95_jct'][0]:.2f} / {r['p95_jct'][1]:.2f} | {100 * r['mape']:.2f}% "
                     f"| {r['steps'][0]} / {r['steps'][1]} | {r['preemptions'][0]} / {r['preemptions'][1]} "
                     f"| {r['cached'][0]} / {r['cached'][1]} | {pins} | {first} |")
    same = ranking(rows, 0) == ranking(rows, 1)
    speeds = "; ".join(f"{p} SimPy {r['speed'][0]:.0f}, vLLM {r['speed'][1]:.0f}" for p, r in rows.items() if r.get("speed_measured"))
    lines += ["", f"Ranking by mean JCT: SimPy {' < '.join(ranking(rows, 0))}; vLLM {' < '.join(ranking(rows, 1))} "
                  f"({'the same' if same else 'DIFFERENT'}). Pins as SimPy:vLLM."
                  + (f" Speed (simulated s per wall s, whole run with the schedule logs off): {speeds}." if speeds else "")]
    moved = "; ".join(f"{p} " + ", ".join(f"{k.replace('_', ' ')} {a}:{b}" for k, (a, b) in r["offload"].items())
                      for p, r in rows.items() if r.get("offload"))
    if moved:
        lines.append(f"Offload tiers (SimPy:vLLM): {moved}.")
    return "\n".join(lines)


def write_docs(text: str, section: str) -> None:
    doc = DOC.read_text()
    begin, end = MARK.format(section, "begin"), MARK.format(section, "end")
    if begin not in doc or end not in doc:
        raise SystemExit(f"{DOC} has no {begin} ... {end} markers")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    DOC.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="swebench")
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--jps", type=float, default=0.5)
    ap.add_argument("--num-gpu-blocks", type=int, default=1500)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default="vllm,continuum")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--router", default=None, help="with --replicas: the router (sim/cluster/router.py)")
    ap.add_argument("--disagg", default=None, metavar="xPyD", help="prefill/decode replicas (sim/cluster/disagg.py)")
    ap.add_argument("--offload", default=None, metavar="TIERS", help="offload tiers per replica, e.g. cpu:20GiB (sim/kv/tiers.py)")
    ap.add_argument("--async-scheduling", action="store_true", help="both engines schedule asynchronously (vLLM's GPU default)")
    ap.add_argument("--no-log", action="store_true", help="skip the schedule logs (no first differing step; SimPy with stretches)")
    ap.add_argument("--speed", action="store_true", help="also time both engines once more with the logs off")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--doc-section", default="ci", help="with --write-docs: which table of docs/reference/validation.md (its markers' name)")
    ap.add_argument("--json", default=None, help="write the rows as JSON here (after every policy)")
    ap.add_argument("--from-json", default=None, metavar="A.json[,B.json]",
                    help="no runs: the table from rows an earlier run wrote with --json (merged in order); "
                         "the other flags name the spec for its caption")
    args = ap.parse_args(argv)
    spec = {"workload": {"trace": args.trace, "programs": args.programs, "jps": args.jps, "seed": args.seed},
            "engine": {"num_gpu_blocks": args.num_gpu_blocks, **({"profile": args.profile} if args.profile else {}),
                       **({"async_scheduling": True} if args.async_scheduling else {})},
            "cluster": {"replicas": args.replicas, **({"router": args.router} if args.router else {}),
                        **({"disagg": args.disagg} if args.disagg else {}),
                        **({"offload": args.offload} if args.offload else {})}}
    rows = {}
    if args.from_json:
        for f in args.from_json.split(","):
            rows.update(json.loads(Path(f).read_text()))
        for r in rows.values():
            r.setdefault("logged", not args.no_log)
    for pol in [] if args.from_json else [p for p in args.policies.split(",") if p]:
        pair = run_pair(spec, pol, log=not args.no_log)
        rows[pol] = compare(pair)
        if args.speed and not args.no_log:
            rows[pol]["speed"] = compare(run_pair(spec, pol, log=False))["speed"]
        rows[pol]["speed_measured"] = args.speed or args.no_log
        rows[pol]["logged"] = not args.no_log
        r = rows[pol]
        if args.json:  # after every policy: a capped long run keeps what it finished
            Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
        print(f"{pol}: mean JCT {r['mean_jct'][0]:.3f} / {r['mean_jct'][1]:.3f} s ({100 * r['mean_jct'][2]:+.2f}%), "
              f"MAPE {100 * r['mape']:.2f}%, steps {r['steps']}, preemptions {r['preemptions']}, cached {r['cached']}, "
              f"pins {r['pins']}, speed {r['speed'][0]:.0f} / {r['speed'][1]:.0f} sim s per wall s, "
              f"first difference {r['first_difference']}, targets {r['targets']}", flush=True)
    spec_line = (f"`python benchmarks/twin_check.py --trace {args.trace} --programs {args.programs} --jps {args.jps} "
                 f"--num-gpu-blocks {args.num_gpu_blocks} --policies {args.policies} --seed {args.seed}"
                 + (f" --profile {args.profile}" if args.profile else "")
                 + (f" --replicas {args.replicas}" if args.replicas > 1 else "") + (f" --router {args.router}" if args.router else "")
                 + (f" --disagg {args.disagg}" if args.disagg else "")
                 + (f" --offload {args.offload}" if args.offload else "")
                 + (" --async-scheduling" if args.async_scheduling else "")
                 + (" --no-log" if args.no_log else "")
                 + (" --speed" if args.speed else "") + "`")
    text = table(spec_line, rows)
    print(text)
    if args.write_docs:
        write_docs(text, args.doc_section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
