"""Workload specs fitted from agent logs: `sim trace fit LOGS... -o workload.json`, and
`sim trace gen --spec workload.json|NAME` samples one into a trace.

A spec (`WorkloadSpec`, JSON, `version` 2; version 1 still loads) holds one agent's marginals, each a
`Dist`: an empirical quantile function on a probability grid up to `p_top` (0.95 when a
tail is fitted) and, beyond it, a generalized Pareto fitted by maximum likelihood
(scipy) to the exceedances over the `p_top` quantile; draws are capped at `cap` (twice the
largest logged value). A marginal with fewer than TAIL_MIN values keeps its whole
empirical quantile function (no tail).

- `turns`: LLM calls per program (rounded, >= 1, <= `max_turns`).
- `first_input`: turn 0's new tokens beyond `shared_prefix_tokens` (the system prompt
  shared by every program: the trace's `shared_prefix_tokens`, else the turn-0 segment
  that two or more programs share, median over programs).
- `new_input`: tokens a later turn adds (tool results, user text) as a function of the
  context before it: one `Dist` per context bin (`context_edges`, quantile bins of >= 50
  calls each).
- `output`, `last_output`: generated tokens of a call before a tool and of a program's
  last call. `reasoning_share` (optional): the share of output tokens that is reasoning,
  where the log says (a trace's `reasoning_tokens`); a generated trace's rows get
  round(share x output) reasoning tokens; with `reasoning_calls` (the share of calls that
  reason, where the log shows fewer than all) only a drawn share of calls get reasoning,
  share / reasoning_calls of their output (capped at all of it), so the mean stays.
- `carry` (optional): the default context carry-over of the agent's calls
  (traces/schema.py `carry`: mode, and whether the spec's logs show it or the client's
  documented behaviour decides it, with the evidence and sources); a generated trace's
  rows get the mode (`sim trace carry` sets another).
- `tool_mix`: the tool called after a turn, per turn-position bucket (`from_turn`);
  `tools`: each tool's duration in seconds. A tool the log does not name is `(unknown)`
  in the spec and null in the trace.
- `provenance`: sources (repo, commit, licence), what was derived, counts.

- `between` (version 2; optional): how programs differ (class Between). Each call's
  output, tool time and new input is drawn at a quantile Phi(z), z = the program's offset
  plus an AR(1) residual along its calls; the offsets are normal with the spread, the
  correlations (with one another and with the program's turns) and the residual
  autocorrelation estimated by moments from the logs' normal scores, and calls' z keep
  variance 1, so every marginal above is unchanged. `tool_lift` makes the next tool depend
  on the previous one; tool time's residual has its own lag-1 correlation after a repeated
  tool (`tool_ar1_same`: a program's next test run is about as slow as its last). A version-1 spec, or one fitted on fewer than BETWEEN_MIN programs,
  has none: every program is drawn alike, and programs differ less than logged sessions do.

Generation (`generate_from_spec`) draws programs turn by turn from
numpy.random.default_rng(seed), as traces/generate.py does: the same spec and seed give
the same trace. Turns per program are stratified (one draw per 1/N quantile slice). The
factors draw from their own stream, so the rest of a seed's draws are as without them.
A later turn's output, then its new input, are clipped so that the context stays within
`max_context` (plus one output token per turn a program spends at it).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from agentsim.errors import InputError
from agentsim.resources import TRACE_ROW_BYTES, check_memory
from agentsim.files import atomic_write, check_output
from traces.validation import JSONFloat, JSONInt, Model, validated

VERSION = 2  # 2: `between` (per-program factors); version 1 files still load, with no factors
VERSIONS = (1, 2)
SPECS_DIR = Path(__file__).parent / "data" / "specs"
UNKNOWN_TOOL = "(unknown)"
P_TOP = 0.95  # the empirical part of a Dist with a tail
TAIL_MIN = 200  # values needed before a tail is fitted (>= 10 exceedances)
GRID = 0.01  # probability step of the empirical quantile grid
CAP_FACTOR = 2.0  # draws never exceed this times the largest logged value
BIN_MIN = 50  # calls per context bin of new_input
MAX_BINS = 6
POSITION_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 40)  # tool_mix buckets start at these turns


class Tail(Model):
    kind: Literal["genpareto"]
    shape: JSONFloat  # xi (scipy's c), clipped to [-0.5, 0.9]: a finite mean
    scale: JSONFloat = Field(gt=0)


class Dist(Model):
    """Quantile function: q[i] at probability p[i] (p from 0 to p_top, increasing),
    linear in between; beyond p_top the tail (exceedances over q[-1]), at most cap."""
    n: JSONInt = Field(ge=1)  # values it was fitted on
    p: list[JSONFloat]
    q: list[JSONFloat]
    tail: Tail | None = None
    cap: JSONFloat
    mean: JSONFloat  # of the logged values (for reading; not used to draw)

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        u = rng.random(size)
        return self.ppf(u)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        p, q = np.asarray(self.p), np.asarray(self.q)
        top = p[-1]
        x = np.interp(np.minimum(u, top), p, q)
        if self.tail is not None and top < 1:
            from scipy.stats import genpareto

            beyond = u > top
            if beyond.any():
                v = (u[beyond] - top) / (1 - top)
                x[beyond] = q[-1] + genpareto.ppf(np.minimum(v, 1 - 1e-12), self.tail.shape, scale=self.tail.scale)
        return np.minimum(x, self.cap)


class ContextBin(Model):
    below: JSONFloat | None = None  # upper edge of the context before the turn; None: no bound
    dist: Dist


class ToolMix(Model):
    from_turn: JSONInt = Field(ge=0)
    weights: dict[str, JSONFloat]  # tool -> share of calls at these positions


class Source(Model):
    name: str
    url: str | None = None
    commit: str | None = None
    licence: str
    files: str | None = None


class Carry(Model):
    """A spec's default context carry-over and what it rests on."""
    mode: Literal["cached", "rerendered", "reasoning-dropped"]  # traces/schema.py CARRY_MODES
    basis: Literal["logs", "documented", "trace"]  # measured in the logs; the client's documented behaviour; the fitted trace's column
    evidence: str
    sources: list[str] = []


class Provenance(Model):
    sources: list[Source]
    derived: str  # what was computed from the sources
    counts: dict[str, int]  # programs, calls, tool_calls
    notes: str = ""


FACTORS = ("output", "tool", "new_input")  # the marginals a program's own offset moves


class Between(Model):
    """How programs differ from one another (fit_between). A call's normal score z (the
    normal quantile of its rank in its marginal) is its program's offset b plus a residual
    e: z = b + resid_sd * e, e an AR(1) series along the program's calls (unit variance,
    lag-1 correlation ar1). The offsets and the program's turns score (the normal quantile
    of its turns' rank) are jointly normal: per factor a program-level mean and sd, and
    corr over `names` (\"turns\" first, then the factors). resid_sd is set so that calls' z
    keep variance 1, so each marginal stays the fitted one."""
    programs: JSONInt = Field(ge=2)  # programs the factors were estimated on
    names: list[Literal["turns", "output", "tool", "new_input"]]
    mean: list[JSONFloat]  # per factor (names[1:])
    sd: list[JSONFloat]
    resid_sd: list[JSONFloat]
    ar1: list[JSONFloat]
    corr: list[list[JSONFloat]]
    # tool sequences: lift[a][b] = P(next tool b | this tool a) / (b's share), pooled over
    # positions (TOOL_PRIOR pseudo-calls at the pooled shares per row); a later call draws b
    # with weight tool_mix(b) x lift[a][b], so tool_mix stays the mix at each position
    tool_lift: dict[str, dict[str, JSONFloat]] | None = None
    # the tool factor's residual: lag-1 correlation ar1 after a change of tool, this after a
    # repeat (a program's next test run is as slow as its last); None: ar1 for both
    tool_ar1_same: JSONFloat | None = Field(default=None, gt=-1, lt=1)

    @model_validator(mode="after")
    def _shapes(self):
        k = len(self.names) - 1
        if self.names[:1] != ["turns"] or len(set(self.names)) != len(self.names) or k < 1:
            raise ValueError("names must be 'turns' then distinct factors (output, tool, new_input)")
        if not all(len(v) == k for v in (self.mean, self.sd, self.resid_sd, self.ar1)):
            raise ValueError(f"mean, sd, resid_sd and ar1 need one value per factor ({k})")
        c = np.asarray(self.corr, dtype=float)
        if c.shape != (k + 1, k + 1) or not np.allclose(c, c.T, atol=1e-6) or not np.allclose(np.diag(c), 1):
            raise ValueError(f"corr must be a symmetric {k + 1}x{k + 1} correlation matrix")
        if np.linalg.eigvalsh(c).min() < -1e-6:
            raise ValueError("corr is not positive semi-definite")
        if any(v < 0 for v in self.sd + self.resid_sd) or any(not -1 < v < 1 for v in self.ar1):
            raise ValueError("sd and resid_sd must be >= 0 and ar1 within (-1, 1)")
        return self

    def factor(self, name: str) -> int | None:
        return self.names.index(name) - 1 if name in self.names else None

    def without(self, name: str) -> "Between | None":
        """These factors less one (a marginal the spec does not take from the logs)."""
        i = self.factor(name)
        if i is None:
            return self
        keep = [j for j in range(len(self.names)) if j != i + 1]
        if len(keep) < 2:
            return None
        f = [j - 1 for j in keep[1:]]
        return Between(programs=self.programs, names=[self.names[j] for j in keep], tool_lift=self.tool_lift,
                       tool_ar1_same=None if name == "tool" else self.tool_ar1_same,
                       mean=[self.mean[j] for j in f], sd=[self.sd[j] for j in f], resid_sd=[self.resid_sd[j] for j in f],
                       ar1=[self.ar1[j] for j in f], corr=[[self.corr[a][b] for b in keep] for a in keep])


class WorkloadSpec(Model):
    version: Literal[1, 2] = VERSION
    name: str
    provenance: Provenance
    programs: JSONInt = Field(ge=1)  # programs the spec was fitted on
    turns: Dist
    max_turns: JSONInt = Field(ge=1)
    shared_prefix_tokens: JSONInt = Field(ge=0)
    first_input: Dist
    new_input: list[ContextBin]
    output: Dist
    last_output: Dist
    reasoning_share: JSONFloat | None = Field(default=None, ge=0, le=1)
    reasoning_calls: JSONFloat | None = Field(default=None, gt=0, le=1)  # share of calls with reasoning; None: every call
    carry: Carry | None = None  # None: cached
    max_context: JSONInt = Field(ge=1)
    tool_mix: list[ToolMix]
    tools: dict[str, Dist]
    between: Between | None = None  # None: every program drawn alike (version 1, or too few programs)

    @field_validator("carry")
    @classmethod
    def _dropped_needs_a_share(cls, v, info):
        if v is not None and v.mode == "reasoning-dropped" and info.data.get("reasoning_share") is None:
            raise ValueError("carry mode reasoning-dropped needs reasoning_share (the reasoning part of each output)")
        return v

    @model_validator(mode="after")
    def _between_needs_v2(self):
        if self.between is not None and self.version < 2:
            raise ValueError("between needs version 2")
        lift = self.between.tool_lift if self.between is not None else None
        if lift and not (set(lift) | {b for row in lift.values() for b in row}) <= set(self.tools):
            raise ValueError("between.tool_lift names a tool that tools does not")
        if lift and any(not v > 0 for row in lift.values() for v in row.values()):
            raise ValueError("between.tool_lift values must be > 0")
        return self


# --- fitting -------------------------------------------------------------------------------

def fit_dist(values, p_top: float = P_TOP) -> Dist:
    """The empirical quantile function of values (linear interpolation, numpy's default),
    with a generalized Pareto tail beyond p_top when there are TAIL_MIN values or more."""
    x = np.sort(np.asarray(values, dtype=float))
    if len(x) == 0:
        raise ValueError("no values")
    tail = None
    top = 1.0
    if len(x) >= TAIL_MIN:
        top = p_top
        thr = float(np.quantile(x, top))
        exc = x[x > thr] - thr
        if len(exc) >= 10 and np.ptp(exc) > 0:
            from scipy.stats import genpareto

            c, _, scale = genpareto.fit(exc, floc=0)
            c = float(np.clip(c, -0.5, 0.9))
            if not scale > 0:
                scale = float(exc.mean())
            tail = Tail(kind="genpareto", shape=round(c, 6), scale=float(f"{scale:.6g}"))
        else:
            top = 1.0
    n_grid = int(round(top / GRID))
    p = np.linspace(0, top, n_grid + 1)
    q = np.quantile(x, p)
    return Dist(n=len(x), p=[round(float(v), 4) for v in p], q=[float(f"{v:.6g}") for v in q], tail=tail,
                cap=float(f"{CAP_FACTOR * x[-1]:.6g}"), mean=float(f"{x.mean():.6g}"))


def _context_bins(ctx: np.ndarray, new: np.ndarray) -> list[ContextBin]:
    k = int(min(MAX_BINS, max(1, len(ctx) // BIN_MIN)))
    edges = np.unique(np.quantile(ctx, np.linspace(0, 1, k + 1)[1:-1])) if k > 1 else np.array([])
    bins = []
    lo = -np.inf
    for hi in list(edges) + [None]:
        sel = (ctx >= lo) & (ctx < (np.inf if hi is None else hi))
        if sel.sum() == 0:
            continue
        bins.append(ContextBin(below=None if hi is None else float(hi), dist=fit_dist(new[sel])))
        lo = hi if hi is not None else lo
    bins[-1] = ContextBin(below=None, dist=bins[-1].dist)
    return bins


def _shared_prefix(cols) -> int:
    from traces import segments

    first = cols["turn"] == 0
    if "shared_prefix_tokens" in cols:
        return int(np.median(cols["shared_prefix_tokens"][first]))
    if segments.COLUMN in cols:
        heads = [s[0] for s in cols[segments.COLUMN][first] if s]
        ids: dict[str, list[int]] = {}
        for h in heads:
            ids.setdefault(h["id"], []).append(int(h["tokens"]))
        shared = [t for v in ids.values() if len(v) >= 2 for t in v]
        if shared:
            return int(np.median(shared + [0] * (int(first.sum()) - len(shared))))
    return 0


def normal_scores(values, groups=None, rng=None) -> np.ndarray:
    """Each value's normal quantile of its mid-rank within its group, ties broken at random
    (so a marginal with many equal values still gives scores of variance about 1)."""
    x = np.asarray(values, dtype=float)
    g = np.zeros(len(x), dtype=np.int64) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    rng = rng if rng is not None else np.random.default_rng(0)
    order = np.lexsort((rng.random(len(x)), x, g))
    size = np.bincount(g)
    start = np.r_[0, np.cumsum(size)[:-1]]
    rank = np.empty(len(x))
    rank[order] = np.arange(len(x)) - start[g[order]]
    from scipy.special import ndtri

    return ndtri((rank + 0.5) / size[g])


def _inflation(phi: float, n: np.ndarray) -> np.ndarray:
    """n x the variance of the mean of n unit-variance AR(1) values with lag-1 correlation phi."""
    n = np.asarray(n, dtype=float)
    if abs(phi) < 1e-9:
        return np.ones_like(n)
    return (1 + phi) / (1 - phi) - 2 * phi * (1 - phi ** n) / (n * (1 - phi) ** 2)


def _one_factor(prog: np.ndarray, z: np.ndarray, programs: int, rep: np.ndarray | None = None):
    """One factor by the method of moments: (which programs have calls, their mean z, the
    offsets' program-level mean and debiased sd, resid_sd, ar1, ar1 after a repeated tool).
    ar1 and the call-weighted offset variance Vw solve: pooled lag-1 correlation of z within
    programs = Vw + (1 - Vw) ar1, and sum n_i m_i^2 / N = Vw + (1 - Vw) x mean inflation
    (_inflation); the residual keeps calls' z at variance 1. With rep (call i's tool is call
    i-1's), pairs that repeat a tool and pairs that change it get an ar1 each."""
    n = np.bincount(prog, minlength=programs).astype(float)
    has = n > 0
    m = np.bincount(prog, z, minlength=programs)[has] / n[has]
    nn = n[has]
    same = prog[1:] == prog[:-1]

    def lag1(sel):
        if sel.sum() < 10:
            return 0.0
        r = float(np.corrcoef(z[:-1][sel], z[1:][sel])[0, 1])
        return r if np.isfinite(r) else 0.0

    groups = [same] if rep is None else [same & ~rep[1:], same & rep[1:]]
    acs = [lag1(g) for g in groups]
    share = np.array([g.sum() for g in groups], dtype=float)
    share = share / share.sum() if share.sum() > 0 else np.full(len(groups), 1 / len(groups))
    big_s = float((nn * m ** 2).sum() / nn.sum())
    phis, vw = [0.0] * len(groups), 0.0
    for _ in range(50):
        c = float(_inflation(float(share @ np.asarray(phis)), nn).sum() / nn.sum())
        vw = float(np.clip((big_s - c) / (1 - c), 0.0, 0.95)) if c < 1 else 0.0
        phis = [float(np.clip((ac - vw) / (1 - vw), -0.9, 0.95)) for ac in acs]
    se2 = 1 - vw
    phi = float(share @ np.asarray(phis))
    var_b = float(np.var(m, ddof=1) - np.mean(se2 * _inflation(phi, nn) / nn)) if len(m) > 1 else 0.0
    return (has, m, float(m.mean()), float(np.sqrt(max(var_b, 0.0))), float(np.sqrt(se2)), phis[0],
            phis[1] if rep is not None else None)


def _psd_corr(c: np.ndarray) -> np.ndarray:
    c = np.clip(np.nan_to_num((c + c.T) / 2), -1, 1)
    w, v = np.linalg.eigh(c)
    c = (v * np.maximum(w, 1e-3)) @ v.T
    d = np.sqrt(np.diag(c))
    return c / np.outer(d, d)


BETWEEN_MIN = 10  # programs needed to estimate how they differ


TOOL_PRIOR = 10.0  # pseudo-calls per row of tool_lift, at the pooled shares (rare tools stay near 1)


def tool_lift(prog: np.ndarray, names: np.ndarray) -> dict[str, dict[str, float]] | None:
    """lift[a][b] of a tool sequence (programs' tool calls in order): (pairs a->b + prior x w_b)
    / ((pairs from a + prior) x w_b), w the pooled tool shares."""
    same = prog[1:] == prog[:-1]
    if same.sum() < 10:
        return None
    tools, idx = np.unique(names, return_inverse=True)
    w = np.bincount(idx, minlength=len(tools)) / len(idx)
    pairs = np.zeros((len(tools), len(tools)))
    np.add.at(pairs, (idx[:-1][same], idx[1:][same]), 1)
    lift = (pairs + TOOL_PRIOR * w[None, :]) / ((pairs.sum(1, keepdims=True) + TOOL_PRIOR) * w[None, :])
    return {a: {b: round(float(lift[i, j]), 4) for j, b in enumerate(tools)} for i, a in enumerate(tools)}


def fit_between(n_turns: np.ndarray, seqs: dict[str, tuple], lift=None,
                seed: int = 0) -> Between | None:
    """Between-program factors from per-call normal scores: seqs[factor] = (program index,
    z) in call order within each program; n_turns per program; lift: tool_lift. None
    with < BETWEEN_MIN programs."""
    P = len(n_turns)
    if P < BETWEEN_MIN:
        return None
    zt = normal_scores(n_turns, rng=np.random.default_rng(seed))
    names, stats, cols = ["turns"], [], [zt]
    tool_same = None
    for f in FACTORS:
        if f not in seqs or len(seqs[f][1]) < 2 * BETWEEN_MIN:
            continue
        has, m, mu, sd, rsd, phi, phi_same = _one_factor(seqs[f][0], seqs[f][1], P, *seqs[f][2:])
        if f == "tool":
            tool_same = phi_same
        full = np.full(P, np.nan)
        full[has] = m
        names.append(f)
        stats.append((mu, sd, rsd, phi))
        cols.append(full)
    if len(names) < 2:
        return None
    x = np.column_stack(cols)
    ok = np.isfinite(x).all(axis=1)
    cov = np.cov(x[ok].T) if ok.sum() > 2 else np.eye(len(names))
    var = np.r_[np.var(zt, ddof=1), [st[1] ** 2 for st in stats]]
    corr = np.eye(len(names))
    for i in range(len(names)):
        for j in range(i):
            if var[i] > 0 and var[j] > 0:
                corr[i, j] = corr[j, i] = cov[i, j] / np.sqrt(var[i] * var[j])
    corr = _psd_corr(corr)
    r4 = lambda v: round(float(v), 4)  # noqa: E731
    return Between(programs=P, names=names, mean=[r4(st[0]) for st in stats], sd=[r4(st[1]) for st in stats],
                   resid_sd=[r4(st[2]) for st in stats], ar1=[r4(st[3]) for st in stats],
                   corr=[[r4(v) for v in row] for row in corr], tool_lift=lift,
                   tool_ar1_same=None if tool_same is None else r4(tool_same))


def fit_columns(cols, name: str, provenance: dict, reasoning_share: float | None = None,
                max_context: int | None = None, reasoning_calls: float | None = None,
                carry: Carry | None = None) -> WorkloadSpec:
    """A spec from a checked trace (traces.schema.Columns) and its provenance dict;
    max_context: the largest context a program may reach (default: the largest logged).
    Reasoning share, share of calls that reason and carry default to the trace's own
    (`reasoning_tokens`; a `carry` column with one mode)."""
    pid, turn = cols["program_id"], cols["turn"]
    new, out = cols["new_input_tokens"].astype(float), cols["output_tokens"].astype(float)
    tool, dur = cols["tool"], cols["tool_duration_s"]
    last = np.r_[pid[1:] != pid[:-1], True]
    first = turn == 0
    n_turns = turn[last] + 1
    has_tool = ~last & np.isfinite(dur)
    if not has_tool.any():
        raise InputError("no tool calls")
    starts = np.flatnonzero(first)
    prog = np.cumsum(first) - 1
    shared = _shared_prefix(cols)
    if reasoning_share is None and "reasoning_tokens" in cols and out.sum() > 0:
        reasoning_share = float(cols["reasoning_tokens"].sum() / out.sum())
    if reasoning_calls is None and "reasoning_tokens" in cols and reasoning_share:
        on = float(np.mean(cols["reasoning_tokens"] > 0))
        reasoning_calls = round(on, 4) if on < 1 else None
    if carry is None and "carry" in cols and len(set(cols["carry"])) == 1:
        carry = Carry(mode=cols["carry"][0], basis="trace", evidence="the carry column of the fitted trace")
    # context before each turn: everything earlier in its program
    total = new + out
    cum = np.cumsum(total)
    before = cum - total - np.r_[0, cum][starts][prog]
    later = ~first
    names = np.array([UNKNOWN_TOOL if t is None else str(t) for t in tool], dtype=object)
    tools = {t: fit_dist(dur[has_tool & (names == t)]) for t in sorted(set(names[has_tool]))}
    mix = []
    for i, b in enumerate(POSITION_BUCKETS):
        hi = POSITION_BUCKETS[i + 1] if i + 1 < len(POSITION_BUCKETS) else np.inf
        sel = has_tool & (turn >= b) & (turn < hi)
        if not sel.any():
            continue
        ks, cs = np.unique(names[sel].astype(str), return_counts=True)
        mix.append(ToolMix(from_turn=b, weights={k: round(c / sel.sum(), 6) for k, c in zip(ks, cs)}))
    if mix[0].from_turn != 0:
        mix[0] = ToolMix(from_turn=0, weights=mix[0].weights)
    final_ctx = np.bincount(prog, total)
    new_bins = _context_bins(before[later], new[later]) if later.any() else [ContextBin(below=None, dist=fit_dist([0]))]
    edges = np.asarray([b.below for b in new_bins[:-1]], dtype=float)
    rng = np.random.default_rng(0)  # ties in the normal scores: the fit is deterministic
    seqs = {"output": (prog[~last], normal_scores(out[~last], rng=rng)),
            "tool": (prog[has_tool], normal_scores(dur[has_tool], names[has_tool].astype(str), rng=rng),
                     np.r_[False, (names[has_tool][1:] == names[has_tool][:-1]) & (prog[has_tool][1:] == prog[has_tool][:-1])]),
            "new_input": (prog[later], normal_scores(new[later], np.searchsorted(edges, before[later], side="right"), rng=rng))}
    return WorkloadSpec(
        name=name, provenance=Provenance.model_validate(provenance), programs=len(starts),
        turns=fit_dist(n_turns), max_turns=int(n_turns.max()), shared_prefix_tokens=shared,
        first_input=fit_dist(np.maximum(new[first] - shared, 1)),
        new_input=new_bins,
        output=fit_dist(out[~last]) if (~last).any() else fit_dist(out[last]),
        last_output=fit_dist(out[last]), reasoning_share=reasoning_share, reasoning_calls=reasoning_calls, carry=carry,
        max_context=int(final_ctx.max()) if max_context is None else int(max_context), tool_mix=mix, tools=tools,
        between=fit_between(n_turns, seqs, tool_lift(prog[has_tool], names[has_tool].astype(str))),
    )


def fit_trace(df, name: str, provenance: dict, reasoning_share: float | None = None) -> WorkloadSpec:
    from traces.schema import columns

    return fit_columns(columns(df), name, provenance, reasoning_share)


def _provenance_from_meta(fmt, metas, programs, calls, tool_calls) -> dict:
    """Sources: per input its files, and the repo, commit and licence of a PROVENANCE.md
    above them (traces.resample.provenance), or what a trace's metadata records."""
    from traces.resample import provenance

    sources = []
    for m in metas:
        files = [str(f) for f in m.get("source_files", [])]
        rows = provenance(files) if files else []
        for r in rows or [m.get("provenance") or {}]:
            lic = r.get("license") or r.get("licence")
            sources.append({"name": files[0] if len(files) == 1 else f"{len(files)} files" if files else str(m.get("generator", "trace")),
                            "url": r.get("repo"), "commit": (r.get("commit") or "").strip("` ")[:40] or None,
                            "licence": lic or "not recorded (that of the logs)",
                            "files": f"{len(files)} file(s), format {m.get('format', fmt)}" if files else None})
    return {"sources": sources,
            "derived": "sim trace fit: empirical quantiles (1% grid) with a generalized-Pareto tail beyond p95, "
                       "per marginal; between-program factors and tool sequences by moments (traces/fit.py)",
            "counts": {"programs": programs, "calls": calls, "tool_calls": tool_calls}}


def load_logs(paths, fmt: str | None, **opts):
    """(checked columns, [metadata]) of the logs: with fmt, read by that importer; without,
    each path must be a trace parquet (`sim trace import`, `sim trace gen`)."""
    import pandas as pd

    from traces.schema import columns, read_columns

    if not paths:
        raise InputError("LOGS: give one or more log files")
    if fmt is not None:
        from traces.importers import FORMATS, import_trace

        if fmt not in FORMATS:
            raise InputError(f"--format {fmt!r} is unknown; choose one of {', '.join(FORMATS)}")

        df, meta = import_trace(fmt, list(paths), **opts)
        return columns(df), [meta]
    frames, metas = [], []
    for i, p in enumerate(paths):
        if not str(p).endswith(".parquet"):
            raise InputError(f"LOGS {str(p)!r}: not a trace parquet; give --format FORMAT for raw logs "
                             f"(claude-code, tracelab, mini-swe-agent, ...) or import them first")
        if not Path(p).is_file():
            raise InputError(f"LOGS {str(p)!r}: no such file; check the path")
        c, m = read_columns(str(p))
        f = c.frame()
        f["program_id"] = f"{i}:" + f["program_id"].astype(str)
        frames.append(f)
        metas.append(m)
    common = set.intersection(*(set(f.columns) for f in frames))  # an optional column only some traces have is dropped
    return columns(pd.concat([f[[c for c in f.columns if c in common]] for f in frames], ignore_index=True)), metas


def fit_logs(paths, fmt: str | None = None, name: str | None = None, **opts) -> WorkloadSpec:
    cols, metas = load_logs(paths, fmt, **opts)
    where = " ".join(map(str, paths))
    n_tool = int((np.isfinite(cols["tool_duration_s"])).sum())
    if n_tool == 0:
        raise InputError(f"LOGS {where}: no tool calls (every program is one LLM call); "
                         f"a workload spec needs tool times: give logs of agent sessions")
    prov = _provenance_from_meta(fmt, metas, int((cols["turn"] == 0).sum()), len(cols), n_tool)
    return fit_columns(cols, name or Path(str(paths[0])).stem.split(".")[0], prov)


def write_spec(spec: WorkloadSpec, path) -> Path:
    text = json.dumps(spec.model_dump(mode="json", exclude_none=True), indent=1) + "\n"
    text = re.sub(r"\[\s*([-0-9.e+,\s]+?)\s*\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text)
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def shipped() -> list[str]:
    return sorted(p.stem for p in SPECS_DIR.glob("*.json"))


def read_spec(name_or_path: str) -> WorkloadSpec:
    """A spec file, or a shipped spec's name (traces/data/specs/NAME.json)."""
    p = Path(name_or_path)
    if not p.is_file():
        if p.parent == Path(".") and (SPECS_DIR / f"{p.name.removesuffix('.json')}.json").is_file():
            p = SPECS_DIR / f"{p.name.removesuffix('.json')}.json"
        else:
            raise InputError(f"--spec {name_or_path!r}: no such file or shipped spec; give a JSON written by "
                             f"`sim trace fit` or one of {', '.join(shipped()) or 'none'}")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"--spec {str(p)!r} is not readable JSON ({type(e).__name__}); give a file written by `sim trace fit`") from None
    if isinstance(data, dict) and data.get("version") not in VERSIONS:
        raise InputError(f"--spec {str(p)!r}: version {data.get('version')!r} is not one of "
                         f"{', '.join(map(str, VERSIONS))}; refit it with `sim trace fit`")
    return validated(WorkloadSpec, data, f"--spec {str(p)!r}", "give a file written by `sim trace fit`")


# --- generation ----------------------------------------------------------------------------

def generate_from_spec(spec: WorkloadSpec, programs: int = 500, seed: int = 0):
    """A validated trace (DataFrame) of `programs` programs drawn from spec, and its metadata."""
    import pandas as pd

    from traces.schema import validate

    if isinstance(programs, bool) or not isinstance(programs, (int, np.integer)) or programs < 1:
        raise InputError(f"--programs {programs!r}: give a whole number >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"--seed {seed!r}: give a whole number >= 0")
    rows = programs * max(float(spec.turns.mean), 1.0)
    check_memory(rows * TRACE_ROW_BYTES, f"--programs {programs}: about {rows:,.0f} calls of spec {spec.name!r}",
                 "give fewer --programs")
    rng = np.random.default_rng(seed)
    # turns by stratified draws (one per 1/programs quantile slice, in random order): the trace's
    # turn distribution follows the spec's closely even at 100 programs, as resampling's balanced
    # draws do; iid draws moved the mean by 2 sd of the mean at seed 0 (56.5 calls against 50.7)
    u = (rng.permutation(programs) + rng.random(programs)) / programs
    n = np.clip(np.rint(spec.turns.ppf(u)), 1, spec.max_turns).astype(np.int64)
    shared = spec.shared_prefix_tokens
    tool_names = sorted(spec.tools)
    ctx = np.zeros(programs)
    rows_new, rows_out, rows_tool, rows_dur = ([] for _ in range(4))
    edges = [b.below for b in spec.new_input[:-1]]
    mixes = sorted(spec.tool_mix, key=lambda m: m.from_turn)
    fac = _Factors(spec.between, u, seed, tool_names) if spec.between is not None else None
    for t in range(int(n.max())):
        act = np.flatnonzero(n > t)
        k = len(act)
        if t == 0:
            new = shared + np.maximum(np.rint(spec.first_input.sample(rng, k)), 1)
        else:
            b = np.searchsorted(np.asarray(edges, dtype=float), ctx[act], side="right") if edges else np.zeros(k, int)
            u = rng.random(k)
            if fac is not None:
                u = fac.u("new_input", act, u)
            new = np.empty(k)
            for j, cb in enumerate(spec.new_input):
                sel = b == j
                new[sel] = cb.dist.ppf(u[sel])
            new = np.maximum(np.rint(new), 0)
        last = n[act] == t + 1
        u = rng.random(k)
        if fac is not None:  # a program's last output stays its own marginal, drawn alike
            u = np.where(last, u, fac.u("output", act, u))
        out = np.where(last, spec.last_output.ppf(u), spec.output.ppf(u))
        out = np.maximum(np.rint(out), 1)
        if t > 0:  # keep the context within the logged max: the output too, else a program at the
            # limit grew by an output per turn (claude-code: 131,362 tokens against 128,000, past an H100's 131,072)
            out = np.clip(out, 1, np.maximum(spec.max_context - ctx[act], 1))
            new = np.clip(new, 0, np.maximum(spec.max_context - ctx[act] - out, 0))
        mix = [m for m in mixes if m.from_turn <= t][-1]
        w = np.array([mix.weights.get(x, 0.0) for x in tool_names])
        w = w / w.sum()
        ti = rng.choice(len(tool_names), size=k, p=w)
        if fac is not None:
            ti = fac.tools(act, ti, last, w)
        u = rng.random(k)
        if fac is not None:
            u = fac.u("tool", act, u)
        dur = np.empty(k)
        for j, name in enumerate(tool_names):
            sel = ti == j
            dur[sel] = spec.tools[name].ppf(u[sel])
        tl = np.array([None if tool_names[i] == UNKNOWN_TOOL else tool_names[i] for i in ti], dtype=object)
        tl[last] = None
        dur[last] = np.nan
        ctx[act] += new + out
        if fac is not None:
            fac.step(act)
        rows_new.append((act, new)), rows_out.append(out), rows_tool.append(tl), rows_dur.append(dur)
    prog = np.concatenate([a for a, _ in rows_new])
    turn = np.concatenate([np.full(len(a), t) for t, (a, _) in enumerate(rows_new)])
    width = max(4, len(str(programs - 1)))
    df = pd.DataFrame({
        "program_id": [f"{spec.name}-{i:0{width}d}" for i in prog],
        "turn": turn,
        "new_input_tokens": np.concatenate([v for _, v in rows_new]).astype(np.int64),
        "output_tokens": np.concatenate(rows_out).astype(np.int64),
        "tool": pd.Series(np.concatenate(rows_tool), dtype=object),
        "tool_duration_s": np.concatenate(rows_dur),
        "shared_prefix_tokens": np.full(len(prog), shared, dtype=np.int64),
    })
    if spec.reasoning_share is not None:
        share = np.full(len(df), spec.reasoning_share)
        if spec.reasoning_calls is not None and spec.reasoning_calls < 1:
            # only some calls reason (mini-swe-agent's: 3%): with every call given a sliver, a
            # reasoning-dropped carry would cut every prefix; drawn from their own stream
            on = np.random.default_rng([seed, 2]).random(len(df)) < spec.reasoning_calls
            share = np.where(on, min(spec.reasoning_share / spec.reasoning_calls, 1.0), 0.0)
        df["reasoning_tokens"] = np.rint(share * df["output_tokens"]).astype(np.int64)
    if spec.carry is not None:
        df["carry"] = spec.carry.mode
    meta = {"generator": f"spec:{spec.name}", "spec_version": spec.version, "seed": int(seed), "programs": int(programs),
            "synthetic": True, "source": f"sampled from workload spec {spec.name!r} (traces/fit.py)",
            "shared_prefix_tokens": shared, "provenance": spec.provenance.model_dump(mode="json")}
    if spec.carry is not None:
        meta["carry"] = {"mode": spec.carry.mode, "reasoning_share": spec.reasoning_share, "source": f"spec {spec.name!r} ({spec.carry.basis})"}
    return validate(df), meta


class _Factors:
    """Per-program offsets and AR(1) residuals of a spec's `between`, drawn from their own
    stream (default_rng([seed, 1])) so that everything else a seed draws stays as without them."""

    def __init__(self, b: Between, u_turns: np.ndarray, seed: int, tool_names: list[str]):
        from scipy.special import ndtri

        rng = np.random.default_rng([seed, 1])
        P, k = len(u_turns), len(b.names) - 1
        c = np.asarray(b.corr, dtype=float)
        r, cbb = c[0, 1:], c[1:, 1:]
        w, v = np.linalg.eigh(cbb - np.outer(r, r))
        root = v * np.sqrt(np.maximum(w, 0))
        zt = ndtri(np.clip(u_turns, 1e-12, 1 - 1e-12))
        std = zt[:, None] * r[None, :] + rng.standard_normal((P, k)) @ root.T
        self.b = np.asarray(b.mean) + std * np.asarray(b.sd)
        self.rsd, self.phi = np.asarray(b.resid_sd), np.asarray(b.ar1)
        self.same_phi = b.tool_ar1_same
        self.e = rng.standard_normal((P, k))
        self.rng, self.col = rng, {f: i for i, f in enumerate(b.names[1:])}
        self.prev = np.full(P, -1)
        self.lift = None
        if b.tool_lift:
            names = tool_names
            self.lift = np.array([[b.tool_lift.get(a, {}).get(c, 1.0) for c in names] for a in names])

    def tools(self, act: np.ndarray, ti: np.ndarray, last: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The drawn tools; a program past its first tool draws from w x lift[its previous tool]."""
        if self.lift is not None:
            prev = self.prev[act]
            seq = prev >= 0
            if seq.any():
                rows = w[None, :] * self.lift[prev[seq]]
                cum = np.cumsum(rows / rows.sum(1, keepdims=True), axis=1)
                u = self.rng.random(int(seq.sum()))
                ti = ti.copy()
                ti[seq] = np.minimum((u[:, None] >= cum).sum(1), len(w) - 1)
        i = self.col.get("tool")
        if i is not None and self.same_phi is not None:  # the tool residual moves here, by whether the tool repeats
            prev = self.prev[act]
            phi = np.where(ti == prev, self.same_phi, self.phi[i])
            step = prev >= 0
            e = self.e[act, i]
            self.e[act, i] = np.where(step, phi * e + np.sqrt(1 - phi ** 2) * self.rng.standard_normal(len(act)), e)
        self.prev[act[~last]] = ti[~last]
        return ti

    def u(self, factor: str, act: np.ndarray, u: np.ndarray) -> np.ndarray:
        from scipy.special import ndtr

        i = self.col.get(factor)
        if i is None:
            return u
        return ndtr(self.b[act, i] + self.rsd[i] * self.e[act, i])

    def step(self, act: np.ndarray) -> None:
        """The next call's residuals of the programs still running."""
        e = self.e[act]
        new = self.phi * e + np.sqrt(1 - self.phi ** 2) * self.rng.standard_normal((len(act), len(self.phi)))
        i = self.col.get("tool")
        if i is not None and self.same_phi is not None:
            new[:, i] = e[:, i]  # moved by tools()
        self.e[act] = new


# --- distances -----------------------------------------------------------------------------

def marginals(cols) -> dict[str, np.ndarray]:
    """The marginals a spec fits, from a checked trace: for round-trip distances."""
    pid, turn = cols["program_id"], cols["turn"]
    last = np.r_[pid[1:] != pid[:-1], True]
    dur = cols["tool_duration_s"]
    out = {"turns": (turn[last] + 1).astype(float),
           "first_input": cols["new_input_tokens"][turn == 0].astype(float),
           "new_input": cols["new_input_tokens"][turn > 0].astype(float),
           "output": cols["output_tokens"][~last].astype(float),
           "last_output": cols["output_tokens"][last].astype(float),
           "tool_s": dur[np.isfinite(dur)]}
    names = np.array([UNKNOWN_TOOL if t is None else t for t in cols["tool"]], dtype=object)
    for t in sorted(set(names[np.isfinite(dur)])):
        out[f"tool_s:{t}"] = dur[np.isfinite(dur) & (names == t)]
    return out


def ks(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov distance (sup of the CDF difference)."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    if len(a) == 0 or len(b) == 0:
        return float("nan")
    x = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, x, side="right") / len(a) - np.searchsorted(b, x, side="right") / len(b))))


# --- CLI -----------------------------------------------------------------------------------

def _fit_cmd(args) -> int:
    check_output(args.output, "file", "--output")
    spec = fit_logs(args.logs, args.format, args.name, subagents=args.subagents, chars_per_token=args.chars_per_token,
                    estimate_tokens=args.estimate_tokens or None)
    path = write_spec(spec, args.output)
    c = spec.provenance.counts
    print(f"wrote {path}: spec {spec.name!r} from {c['programs']} programs, {c['calls']} calls, "
          f"{c['tool_calls']} tool calls ({len(spec.tools)} tools)")
    return 0


def register(tsub) -> None:
    p = tsub.add_parser("fit", help="fit a workload spec (JSON) from agent logs",
                        description="Fit a workload spec from agent logs: turns, tool times per tool, tokens, "
                                    "tool mix by turn position; `sim trace gen --spec` samples it.")
    p.add_argument("logs", metavar="LOGS", nargs="+",
                   help="trace parquets (sim trace import / gen), or raw logs with --format")
    p.add_argument("--format", default=None, metavar="FORMAT",
                   help="read LOGS with this importer (claude-code, tracelab, mini-swe-agent, openai-chat, ...)")
    p.add_argument("--name", default=None, help="the spec's name (default: the first log's stem)")
    p.add_argument("--subagents", choices=["drop", "keep"], default=None, help="claude-code: as `sim trace import`")
    p.add_argument("--chars-per-token", type=float, default=None, help="as `sim trace import`")
    p.add_argument("--estimate-tokens", action="store_true",
                   help="as `sim trace import`: output tokens from characters where the log's counts are placeholders")
    p.add_argument("-o", "--output", required=True, metavar="workload.json", help="where to write the spec")
    p.set_defaults(func=_fit_cmd)
