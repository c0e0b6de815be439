"""`sim plan`: the cheapest deployment that meets a latency SLO at a given load.

A candidate is a combination (GPU, model, tensor-parallel size, policy, offload, router);
a configuration is a candidate and a replica count; its cost is replicas x tp x the
GPU's price per hour (sim/hardware/specs/prices.json, list on-demand prices, or --prices FILE).
Profiles come from the zoo (sim/hardware/roofline.py): step times from measured kernels where the
shipped data covers the (GPU, model, tp), else a roofline estimate from sim/hardware/specs,
written to DIR/profiles/ and labelled in the table.

Search. The SLO metric is assumed to fall (weakly) as replicas are added, so each
candidate's smallest passing replica count is found by galloping (1, 2, 4, ...) and then
bisecting, instead of running every count. Best first: the next point goes to the
candidate whose cheapest untried count costs least (its lower bound), so a cheap answer
is found early; once some configuration passes at cost C, a candidate of replica cost u
only tries counts up to floor(C / u), and a candidate whose next count already costs
more than C is dropped without running it (equal costs are still searched, so ties are
broken as an exhaustive search would: lower metric, then input order). Every point runs
through sim.study.sweep (a point dict per seed, DIR/results.parquet), so an interrupted plan
resumes where it stopped and points can run on local processes or a Dask cluster. A
point whose simulation cannot go on (a deadlock, the progress watchdog) stops its
candidate's search with status "failed" and the message; the others go on.

Speed. Every point runs with the SLO as a bound (sim/run/bound.py): it stops as soon as the
SLO is known to fail, and counts as failing with its metric's lower bound; a point not
stopped is exact, so the answer is. One pool of warm workers serves the whole search,
fed point by point as points finish, their results taken in the order the points were sent
out, so the same inputs give the same plan however the finishes fall (search).
"""
from __future__ import annotations

import collections
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field
from tqdm import tqdm

from policies.registry import policy_params
from sim.hardware import roofline
from sim.kv.tiers import parse_offload
from sim.cluster.router import make_router, router_names
from sim.run.bound import BOUNDABLE, Bound, parse_limit
from sim.study.sweep import RESULTS, Workers, build_run, point_key, stopped_early, sweep
from agentsim.errors import InputError
from agentsim.files import atomic_write, check_output
from traces.validation import JSONFloat, Model, validated
from agentsim.bounds import COUNT_MAX, int_flag

PRICES_FILE = roofline.SPEC_DIR / "prices.json"
# Lower is better for all of them; names as in the run summary (sim/run/metrics.py).
SLO_METRICS = ("mean_jct", "p50_jct", "p90_jct", "p95_jct", "p99_jct", "max_jct", "mean_queue_delay",
               "mean_turn_latency", "p99_turn_latency")
STATUS_ORDER = {"met": 0, "cut": 1, "pruned": 2, "infeasible": 3, "failed": 4}


@dataclass(frozen=True)
class SLO:
    metric: str
    limit: float

    def met(self, value: float) -> bool:
        return bool(value <= self.limit)

    def __str__(self) -> str:
        return f"{self.metric}<={self.limit:g}"


def parse_slo(text: str) -> SLO:
    """'p95_jct<=60' -> SLO('p95_jct', 60.0); seconds, lower is better."""
    return SLO(*parse_limit(text, SLO_METRICS, "--slo"))


class _Price(Model):
    usd_per_gpu_hour: JSONFloat = Field(gt=0)


class _Prices(Model):
    prices: dict[str, _Price]


def load_prices(path: str | Path | None = None) -> dict[str, float]:
    """GPU name (canonical where sim/hardware/specs knows it) -> USD per GPU-hour."""
    path = Path(path) if path is not None else PRICES_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"--prices {str(path)!r} not found; give a JSON file like {PRICES_FILE.name}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"--prices {str(path)!r} is not valid JSON (line {e.lineno}: {e.msg}); fix it") from None
    m = validated(_Prices, raw, f"--prices {str(path)!r}",
                  'write {"prices": {"H100": {"usd_per_gpu_hour": 4.2, "source": URL, "date": DATE}}}')
    out = {}
    for name, p in m.prices.items():
        try:
            name = roofline.find_gpu(name)[0]
        except InputError:
            pass  # a GPU sim/hardware/specs does not know keeps its own name; it is never asked for
        out[name] = p.usd_per_gpu_hour
    return out


@dataclass(frozen=True)
class Candidate:
    gpu: str
    model: str
    tp: int
    policy: str
    offload: str | None
    router: str | None
    profile: str        # bundled name or path: the sweep's `profile` axis
    source: str         # measured kernels | roofline
    price: float        # USD per GPU-hour

    @property
    def unit_cost(self) -> float:
        """USD per hour of one replica."""
        return self.tp * self.price

    def label(self) -> str:
        return (f"{self.gpu} tp{self.tp} {self.policy}" + (f" {self.offload}" if self.offload else "")
                + (f" {self.router}" if self.router else ""))


@dataclass
class Question:
    """What is asked: the workload, the SLO and the search bounds shared by all candidates."""
    trace: str
    jps: float
    slo: SLO
    seeds: tuple[int, ...] = (0,)
    programs: int | None = None
    num_gpu_blocks: int | None = None      # a KV pool cut for every candidate (as the results tables do)
    max_replicas: int = 16
    early_stop: bool = True            # a point stops once its SLO is known to fail (sim/run/bound.py)

    def bound(self) -> Bound | None:
        """Each point's bound: the SLO over n seeds (Bound.scaled); None where the metric has none."""
        if not self.early_stop or self.slo.metric not in BOUNDABLE:
            return None
        return Bound(self.slo.metric, self.slo.limit).scaled(len(self.seeds))

    def points(self, c: Candidate, replicas: int) -> list[dict]:
        # one replica has nothing to route: run it once for all routers
        router = c.router if replicas > 1 else None
        base = {"trace": self.trace, "jps": self.jps, "policy": c.policy, "profile": c.profile,
                "replicas": replicas, "router": router, "offload": c.offload,
                "programs": self.programs, "num_gpu_blocks": self.num_gpu_blocks}
        return [{**base, "seed": s} for s in self.seeds]


def _names(values, what: str) -> list[str]:
    out = [str(v).strip() for v in values if str(v).strip()]
    if not out:
        raise InputError(f"no {what} given; give at least one")
    return out


def candidates(gpus, models, tps, policies, offloads, routers, prices: dict[str, float],
               profile_dir: str | Path) -> tuple[list[Candidate], list[str], dict[str, dict]]:
    """(candidates, notes (what was left out; caveats of a profile), roofline profiles to write: path -> JSON).
    Raises InputError for an unknown name, a GPU without a price, or nothing left."""
    gpu_names = list(dict.fromkeys(roofline.find_gpu(g)[0] for g in _names(gpus, "--gpu")))
    model_names = list(dict.fromkeys(roofline.find_model(m)[0] for m in _names(models, "--model")))
    missing = [g for g in gpu_names if g not in prices]
    if missing:
        raise InputError(f"the price table has no price for GPU {missing[0]}; add it to a copy of "
                         f"{PRICES_FILE.name} and give --prices FILE, or drop it from --gpu")
    tp_list = list(dict.fromkeys(int(t) for t in tps))
    if not tp_list or min(tp_list) < 1:
        raise InputError(f"--tp {tps!r}: give tensor-parallel sizes >= 1, e.g. --tp 1,2")
    pols = list(dict.fromkeys(_names(policies, "--policy")))
    for p in pols:
        policy_params(p)  # PolicyError for an unknown policy
    offs = list(dict.fromkeys(None if not parse_offload(o) else str(o).strip() for o in offloads)) or [None]
    routs = []
    for r in routers or ["round_robin"]:
        name = make_router(str(r).strip()).name  # InputError for one that is not a router
        routs.append(None if name == "round_robin" else name)  # round_robin is the sweep's default
    routs = list(dict.fromkeys(routs))

    notes, hardware, to_write = [], [], {}
    for g, m, tp in itertools.product(gpu_names, model_names, tp_list):
        try:
            prof, _ = roofline.roofline_profile(g, m, tp, measured=True)
        except InputError as e:
            notes.append(f"left out {g} x {m} at tp={tp}: {e}")
            continue
        notes += [f"{g} x {m} at tp={tp}: {c}" for c in prof["provenance"].get("caveats", [])]
        path = str((Path(profile_dir) / f"{g}-{m}-tp{tp}.json").resolve())
        to_write[path] = prof
        measured = prof["provenance"]["source"].startswith("measured-kernels")
        hardware.append((g, m, tp, path, "measured kernels" if measured else "roofline"))
    out = [Candidate(g, m, tp, pol, off, rout, prof, src, prices[g])
           for (g, m, tp, prof, src), pol, off, rout in itertools.product(hardware, pols, offs, routs)]
    if not out:
        raise InputError("no candidate configuration is left: " + ("; ".join(notes) or "nothing given")
                         + "; add a larger --tp or another --gpu")
    return out, notes, to_write


@dataclass
class _Search:
    """One candidate's replica search: lo fails (0 = nothing tried), hi passes (None = not yet)."""
    lo: int = 0
    hi: int | None = None
    hi_value: float = math.nan
    status: str = "open"
    points: int = 0
    error: str | None = None  # the first failed point's message (status "failed")

    def next(self, cap: int, bounded: bool) -> int | None:
        """The next replica count to try (<= cap), or None when the search is over (status
        set). `bounded`: cap comes from the cost of the best configuration so far."""
        if self.hi is not None and self.hi - self.lo == 1:
            self.status = "met"
            return None
        if self.lo + 1 > cap:
            self.status = "pruned" if self.points == 0 else ("cut" if bounded else "infeasible")
            return None
        if self.hi is None:
            return 1 if self.lo == 0 else min(2 * self.lo, cap)
        return (self.lo + min(self.hi, cap + 1)) // 2


@dataclass
class PlanResult:
    best: dict | None
    table: pd.DataFrame          # one row per candidate, ranked
    probes: pd.DataFrame         # one row per (candidate, replicas) tried
    ran: int                     # points simulated now
    resumed: int                 # points found in DIR/results.parquet
    pruned: int                  # candidates dropped by the cost bound before any point ran
    notes: list[str] = field(default_factory=list)
    stopped: int = 0             # configurations tried whose points stopped early (their metric a lower bound)


def search(q: Question, cands: list[Candidate], out: str | Path, workers: int = 1, dask: str | None = None,
           prune: bool = True, progress: bool = False) -> PlanResult:
    """Each candidate's smallest passing replica count (see the module docstring).

    One sweep fed as it goes: up to `workers` candidates have a point in flight; when one
    settles, its candidate's search moves on and the free worker gets the best-first next
    point (no round waits for its slowest point). Results are taken in the order their points
    were sent out, not as they finish (a point that finishes before an earlier one waits for
    it), so a plan with the same inputs and `workers` runs the same points and prints the same
    table on every run, however the machine's load orders the finishes."""
    states = [_Search() for _ in cands]
    width = max(1, workers)
    best_cost = math.inf
    probes: list[dict] = []
    bound = q.bound()
    flight: dict[int, tuple[int, set[str]]] = {}  # candidate -> (replicas, keys of its points not yet settled)
    lost: dict[str, str] = {}
    # point keys in the order they were sent out, each once while it waits: candidates can share a point (one
    # replica, two routers), which the sweep runs and settles once
    sent: collections.deque[str] = collections.deque()
    finished: dict[str, str | None] = {}  # finished, not yet taken: key -> the reason, where lost

    def cap_for(c: Candidate) -> tuple[int, bool]:
        if not prune or math.isinf(best_cost):
            return q.max_replicas, False
        limit = int(math.floor(best_cost / c.unit_cost + 1e-9))
        return min(q.max_replicas, limit), limit < q.max_replicas

    def fill() -> list[dict]:
        """Points of the next candidates, best first (cheapest untried count), up to `width` in flight."""
        pts = []
        for i in sorted(range(len(cands)), key=lambda i: ((states[i].lo + 1) * cands[i].unit_cost, i)):
            if len(flight) >= width:
                break
            s = states[i]
            if s.status != "open" or i in flight:
                continue
            r = s.next(*cap_for(cands[i]))
            if r is None:
                bar.update(1)
                continue
            mine = q.points(cands[i], r)
            flight[i] = (r, {point_key(p) for p in mine})
            sent.extend(k for k in dict.fromkeys(point_key(p) for p in mine) if k not in sent)
            pts += mine
        return pts

    def settled(key: str, table: pd.DataFrame, why: str | None) -> list[dict]:
        """A point finished: take every finish now next in sending order, each followed by fill()."""
        finished[key] = why
        pts = []
        while sent and sent[0] in finished:
            k = sent.popleft()
            take(k, table, finished.pop(k))
            pts += fill()
        return pts

    def take(key: str, table: pd.DataFrame, why: str | None) -> None:
        nonlocal best_cost
        if why is not None:
            lost[key] = why
        rows = None
        for i in [i for i, (_, keys) in flight.items() if key in keys]:
            r, keys = flight[i]
            keys.discard(key)
            if keys:
                continue
            del flight[i]
            rows = table.set_index("key") if rows is None else rows
            c, s = cands[i], states[i]
            mine = [point_key(p) for p in q.points(c, r)]
            s.points += len(mine)
            gone = [lost[k] for k in mine if k in lost]
            errors = list(rows.loc[[k for k in mine if k in rows.index], "error"].dropna()) if "error" in rows else []
            if gone or errors:  # the simulation could not go on, or its worker died (sim.study.sweep): stop this candidate
                s.status, s.error = "failed", f"{r} replicas: " + (errors[0] if errors else f"a point's {gone[0]}")
                bar.update(1)
                continue
            value = float(np.mean(rows.loc[mine, q.slo.metric].astype(float)))
            early = bool(stopped_early(rows.loc[mine]).any())  # a lower bound above the limit
            ok = q.slo.met(value) and not early
            probes.append({**_describe(c), "replicas": r, "usd_per_hour": r * c.unit_cost,
                           q.slo.metric: value, "meets_slo": ok, "stopped_early": early, "candidate": i})
            if ok:
                s.hi, s.hi_value = r, value
                best_cost = min(best_cost, r * c.unit_cost)
            else:
                s.lo = r
            bar.set_postfix_str(f"best ${best_cost:.2f}/h" if math.isfinite(best_cost) else "no passing config yet")

    with tqdm(total=len(cands), desc="plan", unit="cand", disable=not progress, leave=False) as bar, \
            Workers(workers, dask) as pool:  # warm: each worker imports and reads the trace once for the whole plan
        rep = sweep(fill(), out, workers=workers, dask=dask, progress=False, bound=bound, pool=pool, more=settled)
        if sent:  # every point sent out is settled by the sweep, so taken in order
            raise RuntimeError(f"sim plan: {len(sent)} points were sent out and never taken (first {sent[0]})")
        fill()  # nothing in flight: every open candidate gets its final status

    table = _table(q, cands, states)
    best = table.iloc[0].to_dict() if len(table) and table.iloc[0]["status"] == "met" else None
    return PlanResult(best, table, pd.DataFrame(probes), rep.ran, rep.skipped,
                      pruned=sum(s.status == "pruned" for s in states),
                      stopped=sum(p["stopped_early"] for p in probes))


def _describe(c: Candidate) -> dict:
    return {"gpu": c.gpu, "model": c.model, "tp": c.tp, "policy": c.policy, "offload": c.offload or "none",
            "router": c.router or "round_robin", "profile_source": c.source}


def _table(q: Question, cands: list[Candidate], states: list[_Search]) -> pd.DataFrame:
    rows = []
    for i, (c, s) in enumerate(zip(cands, states)):
        met = s.status == "met"
        rows.append({**_describe(c), "status": s.status,
                     "replicas": s.hi if met else None, "gpus": s.hi * c.tp if met else None,
                     "usd_per_hour": s.hi * c.unit_cost if met else None,
                     q.slo.metric: s.hi_value if met else None,
                     "min_replicas_lower_bound": s.lo + 1, "points": s.points, "profile": c.profile, "order": i,
                     "error": s.error})
    t = pd.DataFrame(rows)
    t["_s"] = t["status"].map(STATUS_ORDER)
    t = t.sort_values(["_s", "usd_per_hour", q.slo.metric, "order"], na_position="last", kind="stable")
    t = t.drop(columns=["_s", "order"]).reset_index(drop=True)
    t.insert(0, "rank", range(1, len(t) + 1))
    return t


def plan(q: Question, cands: list[Candidate], out: str | Path, profiles: dict[str, dict] | None = None,
         workers: int = 1, dask: str | None = None, prune: bool = True, progress: bool = False,
         notes: list[str] | None = None, command: str | None = None) -> PlanResult:
    """Write the roofline profiles, check every candidate's point, search, write the outputs."""
    out = check_output(out, "dir")
    if q.max_replicas < 1:
        raise InputError(f"--max-replicas must be >= 1 (got {q.max_replicas})")
    if not q.jps > 0:
        raise InputError(f"--jps must be > 0 (got {q.jps})")
    for path, prof in (profiles or {}).items():
        text = json.dumps(prof, indent=1) + "\n"
        if not Path(path).exists() or Path(path).read_text() != text:
            atomic_write(path, lambda t, text=text: Path(t).write_text(text))
    for c in cands:
        build_run(q.points(c, min(2, q.max_replicas))[0])  # a bad point fails here, before anything runs
    res = search(q, cands, out, workers=workers, dask=dask, prune=prune, progress=progress)
    res.notes = list(notes or [])
    write_outputs(q, res, out, command)
    return res


def markdown(q: Question, res: PlanResult, command: str | None = None) -> str:
    m = q.slo.metric
    cols = ["rank", "gpu", "model", "tp", "policy", "offload", "router", "profile_source", "replicas", "gpus",
            "usd_per_hour", m, "status"]
    head = ["rank", "GPU", "model", "tp", "policy", "offload", "router", "profile", "replicas", "GPUs", "$/h", f"{m} (s)", "status"]

    def cell(v, col):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if col == "usd_per_hour":
            return f"{v:.2f}"
        if col == m:
            return f"{v:.1f}"
        if col in ("replicas", "gpus", "tp", "rank"):
            return str(int(v))
        return str(v)

    lines = [f"Plan: trace {q.trace}" + (f" (first {q.programs} programs)" if q.programs else "")
             + f", {q.jps:g} programs/s, SLO {q.slo}, seeds {','.join(map(str, q.seeds))}"
             + (f", KV pool cut to {q.num_gpu_blocks} blocks" if q.num_gpu_blocks else "") + f", up to {q.max_replicas} replicas.", ""]
    if command:
        lines += ["    " + command, ""]
    b = res.best
    lines.append(f"Answer: {int(b['replicas'])} x {b['gpu']} tp{int(b['tp'])} ({b['profile_source']} profile), "
                 f"{b['policy']}, offload {b['offload']}, router {b['router']}: ${b['usd_per_hour']:.2f}/h, "
                 f"{m} {b[m]:.1f} s." if b else f"Answer: no candidate meets {q.slo} with up to {q.max_replicas} replicas.")
    lines += ["", f"Points: {res.ran} simulated, {res.resumed} found in {RESULTS}; "
                  f"{res.pruned} of {len(res.table)} candidates dropped by the cost bound before running"
                  + (f"; {res.stopped} of {len(res.probes)} configurations failed early (stopped once their {m} was "
                     f"known to exceed the limit: the figure's value for them is a lower bound)" if res.stopped else "")
                  + ".", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res.table.to_dict("records"):
        cells = [cell(r[c], c) for c in cols]
        if r["status"] != "met" and r["min_replicas_lower_bound"] > 1:  # the bound the search proved instead
            cells[cols.index("replicas")] = f"> {int(r['min_replicas_lower_bound']) - 1}"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "status: met = smallest passing replica count found; cut = stopped once more replicas would cost "
                  "more than the answer; pruned = not run, its first untried count already costs more; "
                  "infeasible = fails at the replica limit; failed = a simulation could not go on (below)."]
    lines += [f"failed: rank {int(r['rank'])}: {r['error']}" for r in res.table.to_dict("records") if r.get("error")]
    lines += [f"note: {n}" for n in res.notes]
    return "\n".join(lines) + "\n"


def figure(q: Question, res: PlanResult):
    """Cost against the SLO metric of every configuration tried; the Pareto front; the SLO."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    m, p = q.slo.metric, res.probes
    if len(p):
        early = p["stopped_early"] if "stopped_early" in p else pd.Series(False, index=p.index)
        for ok, stop, mark, name in ((True, False, "o", "meets SLO"), (False, False, "x", "misses SLO"),
                                     (False, True, "^", "misses SLO (stopped early: a lower bound)")):
            d = p[(p["meets_slo"] == ok) & (early == stop)]
            if len(d):
                ax.plot(d["usd_per_hour"], d[m], mark, linestyle="none", alpha=0.6, label=name)
        front = pareto(p, m)
        ax.plot(front["usd_per_hour"], front[m], "-", drawstyle="steps-post", color="k", label="Pareto front")
        ax.set_yscale("log")
    ax.axhline(q.slo.limit, color="r", linestyle="--", label=f"SLO {q.slo}")
    if res.best:
        ax.plot([res.best["usd_per_hour"]], [res.best[m]], "*", markersize=14, color="gold", markeredgecolor="k",
                linestyle="none", label="answer")
    ax.set_xlabel("cost (USD per hour, list on-demand)")
    ax.set_ylabel(f"{m} (s)")
    ax.set_title(f"plan: {q.trace}, JPS {q.jps:g}, SLO {q.slo}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def pareto(probes: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Configurations no other one beats on both cost and the metric, by cost."""
    d = probes.sort_values(["usd_per_hour", metric], kind="stable")
    keep, best = [], math.inf
    for i, v in zip(d.index, d[metric]):
        if v < best:
            keep.append(i)
            best = v
    return d.loc[keep]


def write_outputs(q: Question, res: PlanResult, out: Path, command: str | None = None) -> None:
    from sim.study import plot

    atomic_write(out / "plan.parquet", lambda t: res.table.to_parquet(t, index=False))
    atomic_write(out / "plan.md", lambda t: Path(t).write_text(markdown(q, res, command)))
    plot.save(figure(q, res), out / "plan.png")


# ---- CLI -----------------------------------------------------------------------------------

def register(sub) -> None:
    p = sub.add_parser("plan", help="the cheapest deployment (replicas x GPU x TP x policy x offload x router) meeting an SLO",
                       description="Search replicas per candidate (gallop, bisect, prune by cost) through the sweep "
                                   "machinery (resumable in --out). Prices: sim/hardware/specs/prices.json (list on-demand) or --prices. "
                                   f"SLO metrics: {', '.join(SLO_METRICS)}.")
    p.add_argument("--trace", default="swebench", help="bundled trace name or parquet path")
    p.add_argument("--jps", type=float, required=True, help="load: programs per second (Poisson arrivals)")
    p.add_argument("--slo", required=True, help="METRIC<=SECONDS, e.g. 'p95_jct<=60' (quote it in a shell)")
    p.add_argument("--gpu", required=True, help="comma-separated GPUs (sim/hardware/specs/gpus.json), e.g. H100,A100-80GB")
    p.add_argument("--model", default="llama3.1-8b", help="comma-separated models (sim/hardware/specs/models.json)")
    p.add_argument("--tp", default="1", help="comma-separated tensor-parallel sizes (default 1)")
    p.add_argument("--policy", default="vllm,continuum", help="comma-separated policies")
    p.add_argument("--offload", default="none", help="semicolon-separated offload options, e.g. 'none;cpu:200GiB'")
    p.add_argument("--router", default="round_robin,session",
                   help=f"comma-separated routers ({', '.join(router_names())}); default round_robin and session (a "
                        "program's turns on one replica, where its prefix cache is)")
    p.add_argument("--prices", default=None, help=f"price table JSON (default sim/hardware/specs/{PRICES_FILE.name})")
    p.add_argument("--max-replicas", type=int_flag(1, 4096), default=16)
    p.add_argument("--seeds", default="0", help="comma-separated arrival seeds; the metric is their mean")
    p.add_argument("--programs", type=int_flag(1, COUNT_MAX), default=None, help="the trace's first N programs")
    p.add_argument("--num-gpu-blocks", type=int_flag(1, COUNT_MAX), default=None, help="cut every candidate's KV pool to N blocks")
    p.add_argument("--out", required=True, help="directory: results.parquet (resumable), plan.parquet, plan.md, plan.png")
    p.add_argument("--md", default=None, help="also write the plan's markdown here")
    p.add_argument("--workers", type=int_flag(1, 4096), default=1, help="points in flight per round (local processes)")
    p.add_argument("--dask", default=None, metavar="ADDRESS", help="run points on an existing Dask cluster")
    p.add_argument("--no-early-stop", action="store_true",
                   help="run every point to its end (by default a point stops once its SLO is known to fail: "
                        f"{', '.join(BOUNDABLE)}; its metric is then a lower bound)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_plan)


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{flag} {text!r}: give comma-separated integers, e.g. {flag} 1,2") from None


def run_plan(args) -> int:
    if args.workers < 1:
        raise InputError(f"--workers must be >= 1 (got {args.workers})")
    slo = parse_slo(args.slo)
    seeds = _ints(args.seeds, "--seeds")
    if not seeds or min(seeds) < 0:
        raise InputError(f"--seeds {args.seeds!r}: give seeds >= 0, e.g. --seeds 0,1,2")
    q = Question(args.trace, args.jps, slo, tuple(seeds), args.programs, args.num_gpu_blocks, args.max_replicas,
                 early_stop=not args.no_early_stop)
    out = Path(args.out)
    cands, notes, profiles = candidates(args.gpu.split(","), args.model.split(","), _ints(args.tp, "--tp"),
                                        args.policy.split(","), args.offload.split(";"), args.router.split(","),
                                        load_prices(args.prices), out / "profiles")
    command = "sim plan " + " ".join(_quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["plan"] else None
    t0 = time.perf_counter()
    res = plan(q, cands, out, profiles, workers=args.workers, dask=args.dask,
               progress=not args.no_progress and sys.stderr.isatty(), notes=notes, command=command)
    text = markdown(q, res, command)
    if args.md:
        atomic_write(args.md, lambda t: Path(t).write_text(text))
    print(text, end="")
    print(f"{len(cands)} candidates in {time.perf_counter() - t0:.1f} s; wrote {out / 'plan.md'}, "
          f"{out / 'plan.parquet'}, {out / 'plan.png'}" + (f", {args.md}" if args.md else ""))
    return 0


def _quote(a: str) -> str:
    return f"'{a}'" if any(ch in a for ch in "<>;* ") else a
