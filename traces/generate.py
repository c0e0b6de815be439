"""Synthetic agent traces matching the Continuum paper's Table 2 statistics (and OpenHands').

The traces are SYNTHETIC: no real agent ran. They reproduce the published
(mean, sd) of turns per program, tool time (ms, over all tool calls) and tokens per
program for SWE-Bench and BFCL v4; real logs come in through traces.importers.
`openhands` follows the statistics of real OpenHands runs (turns, tool mix, result and output
sizes; sources in its spec): its turns are lognormal (median and mean), and its tool time and
tokens per program are the per-call draws, not mapped onto targets (none published that fit).
It is not bundled: `sim trace gen openhands -o oh.parquet`.

    sim trace gen swebench -o swe.parquet [--programs 500] [--seed 0] [--tokens-mode sum|final] [--shared-prefix N] [--tasks K]
    python -m traces.generate --bundle     # rewrites traces/data/{swebench,bfcl}.parquet (seed 0, 500 programs; not openhands)

Model of one program (all draws from numpy.random.default_rng(seed), so a seed
gives an identical trace):
  * turns ~ rounded normal(mean, sd), clipped to >= 1;
  * after every turn but the last the agent calls one tool, drawn from a fixed mix.
    SWE-Bench tools are the first word of a bash command (cat/ls/echo fast, python
    and pytest slow, `cd repo && ...` rare but with by far the heaviest tail); BFCL
    tools are web_search (slow, narrow), fetch_url (fast median, long tail) and
    memory/calculator calls. Each tool's duration is lognormal with its own median
    and sigma, and its result adds lognormal new_input_tokens to the next turn
    (capped at 16,384 tokens, as agent frameworks truncate tool output);
  * turn 0's input = the shared system prompt (`shared_prefix_tokens`; default
    1,000 for SWE-Bench: system prompt + tool docs; 800 for BFCL: function docs)
    + the task; each turn outputs a few hundred tokens, the last one a bit more.

Exact sample statistics. A heavy tail (SWE-Bench tool CV 3.8) makes the sample sd
of ~5,000 draws wander by tens of percent between seeds, so each trace is corrected
after drawing: the turn normals are standardised to sample mean 0 / sd 1, and tool
durations x become c*x**p with p, c solved so that the trace's sample mean and sd
(ddof=1) equal the targets. The power map keeps every duration positive, keeps the
order of calls, and keeps each tool lognormal (its sigma is multiplied by p; the
per-tool parameters are tuned so that p is ~0.9-1.0, 0.995 for seed 0 in both traces;
over seeds 0-19 p spans 0.86-1.00 for SWE-Bench and 0.78-1.11 for BFCL, whose
fetch_url tail makes the sample sd noisier). The medians are set so the scale c is
~1 for seed 0 (1.12 SWE-Bench, 1.00 BFCL).

Tails, the paper's Figure 5: the slowest 10% of fetch_url calls carry 52.5% of
fetch_url's total time and the slowest 10% of cd calls 94.1% of cd's. The sigmas of
fetch_url (1.45) and cd (3.1) are set for that: seed 0, 500 programs measures 52.5%
and 93.4%. Sample shares of a few hundred calls vary by seed (seeds 0-19: fetch_url
47-57%, cd 81-98%). BFCL's tool-time CV (1.11) leaves room for such a fetch_url tail
only if fetch_url carries a small share of the time, so its median (~0.5 s) is well
below web_search's (~3 s). Tokens per
program get the same kind of map (p ~0.7 SWE-Bench, ~0.9 BFCL): each program's
non-shared tokens are scaled by its own factor and the rounding residual goes to the
last turn's output, so tokens per program hit the targets exactly (integers). A shared
prefix so long that the prefix alone exceeds a program's target cannot be matched:
such programs keep 1% of their other tokens and the token targets are missed.

Sharing model (`--tasks K`): program i works on task i mod K, and the trace gets content
segments (traces/segments.py): turn 0 is the system prompt (one id for all programs)
then the task text (one id per task), so programs on one task share their whole first
prompt (up to the shorter task draw: the draw stands for the task text plus the
program's own instructions), and through greedy decoding the first output. Tool
results are each program's own. Without `--tasks` no segments are written and the
system prompt is shared through `shared_prefix_tokens` alone (the bundled traces).

"Tokens per program" is ambiguous in the paper. Default `tokens_mode="sum"`: the sum
over the program's calls of (prompt + output), with prompt_t = prompt_{t-1} +
output_{t-1} + new_input_t — what an engine without prefix caching processes. With
`"final"` (the final context length, sum of all new_input and output tokens) BFCL's
(93K, 68K) would put a large share of programs past Llama-3.1's 131,072-token
context, while with "sum" the final contexts are a few tens of K; in "sum" mode the
generator also keeps every program's final context <= 131,072 (by moving a
too-long program's later tokens into its first prompt, which keeps its sum).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces import segments
from agentsim.errors import InputError
from traces.schema import DATA_DIR, validate, write_trace
from agentsim.bounds import COUNT_MAX, SEED_MAX, int_flag
from agentsim.resources import TRACE_ROW_BYTES, check_memory

CONTEXT_LIMIT = 131_072  # Llama-3.1's context window
FRONT_LOAD_ROOM = 1024  # kept below CONTEXT_LIMIT for settle()'s rounding
SHARED_PREFIX_MAX = CONTEXT_LIMIT - FRONT_LOAD_ROOM - 2  # a shared prefix that leaves one task and one output token
RESULT_CAP = 16_384  # tool output truncation
TOKENS_MODES = ("sum", "final")


@dataclass(frozen=True)
class Spec:
    turns: tuple[float, float]  # targets (mean, sd), paper Table 2
    tool_ms: tuple[float, float] | None  # None: tool durations are the per-tool draws, not mapped
    tokens: tuple[float, float] | None  # None: tokens are the per-call draws, not mapped
    shared_prefix: int
    task: tuple[float, float]  # turn 0 tokens after the shared prefix: (median, sigma)
    output: tuple[float, float]  # per-turn output tokens: (median, sigma)
    last_output: float  # median of the last turn's output (final answer / patch)
    # tool: (weight, median ms, sigma, result tokens median, result sigma)
    tools: dict[str, tuple[float, float, float, float, float]]
    # "normal": turns = rint(mean + sd z); "lognormal": turns = rint(exp(mu + s z)) with the
    # lognormal's (median, mean) = turns_median, turns[0] (its sd follows); z standardised either way
    turns_dist: str = "normal"
    turns_median: float | None = None
    max_turns: int | None = None  # the agent's iteration limit (turns clipped to it)


SPECS = {
    "swebench": Spec(
        turns=(10.9, 2.1), tool_ms=(925.0, 3550.0), tokens=(70_126.0, 19_732.0),
        shared_prefix=1000, task=(900.0, 0.5), output=(180.0, 0.5), last_output=350.0,
        tools={
            "cat": (0.18, 4, 0.8, 900, 0.8), "ls": (0.09, 4, 0.7, 120, 0.6),
            "grep": (0.11, 25, 1.0, 300, 1.0), "find": (0.06, 60, 1.2, 200, 0.9),
            "sed": (0.08, 6, 0.8, 40, 0.5), "python": (0.14, 900, 1.15, 300, 1.0),
            "pytest": (0.06, 4500, 1.05, 800, 0.9), "cd": (0.10, 3, 3.1, 200, 1.2),
            "git": (0.05, 30, 1.0, 400, 1.0), "echo": (0.04, 2, 0.6, 20, 0.5),
            "pip": (0.02, 4000, 1.0, 250, 0.8), "head": (0.04, 4, 0.7, 400, 0.5),
            "mkdir": (0.01, 3, 0.5, 10, 0.3), "rm": (0.02, 4, 0.6, 10, 0.3),
        },
    ),
    "bfcl": Spec(
        turns=(6.3, 2.3), tool_ms=(1923.0, 2133.0), tokens=(93_256.0, 68_687.0),
        shared_prefix=800, task=(150.0, 0.6), output=(120.0, 0.5), last_output=300.0,
        tools={
            "web_search": (0.42, 3000, 0.4, 2400, 0.4), "fetch_url": (0.30, 470, 1.45, 8000, 0.7),
            "archival_memory_search": (0.12, 1000, 0.6, 1100, 0.5),
            "core_memory_append": (0.08, 120, 0.6, 60, 0.4), "calculate": (0.08, 40, 0.5, 30, 0.3),
        },
    ),
    # OpenHands (CodeActAgent) on SWE-bench issues. The Continuum paper (§6.1, Fig. 9 and Table 5)
    # runs OpenHands on Multi-SWE-bench (Go) and says only that its programs have more turns than
    # SWE-bench's (§6.2: "the average turn number count is higher"); it publishes no statistics of
    # them. The figures below are from real OpenHands runs:
    #   [BP] Bouzenia & Pradel, arXiv 2506.18824 (RQ1: iterations and token usage): their public
    #        data, github.com/sola-st/llm-agents-study (MIT) at commit e84f66f, 40 OpenHands
    #        trajectories, 1,113 tool calls; every [BP] number is printed by
    #        `python -m traces.openhands_stats PATH_TO_THAT_CLONE` (traces/openhands_stats.py).
    #   [NB] nebius/SWE-rebench-openhands-trajectories dataset card, Table 1 (OpenHands v0.54.0,
    #        Qwen3-Coder-480B, 67,074 trajectories): turns max 100, average 64.3; the same table gives
    #        SWE-Gym/OpenHands-Sampled-Trajectories (SWE-Gym, arXiv 2412.21139) max 50, average 18.9.
    # No source publishes OpenHands tool durations (none of these datasets has timestamps).
    "openhands": Spec(
        # turns [BP]: mean 29.45, sd 22.46, median 24.5, max 100 over 40 trajectories (between
        # SWE-Gym's 18.9 and nebius' 64.3 averages [NB]). Skewed (mean > median), so drawn
        # lognormal with that median and mean (its sd is 19.7), clipped to OpenHands' iteration
        # limit of 100 (the max in [BP] and [NB]).
        turns=(29.45, 22.46), turns_dist="lognormal", turns_median=24.5, max_turns=100,
        # tool time: not published; the per-tool draws below stand unmapped (no target).
        tool_ms=None,
        # tokens per program [BP]: sum over calls of prompt + output mean 2.36M, sd 4.39M, median
        # 964K (input 2.35M, output 17.4K); three trajectories of 97-100 turns sum 14-20M tokens,
        # i.e. prompts of 140-200K, past Llama-3.1's 131,072 context. Not mapped onto: the
        # per-call draws below (result sizes and outputs of [BP], first prompt as implied by it)
        # give the tokens, and the generator keeps every final context <= 131,072. Seed 0, 500
        # programs: median 779K per program (81% of [BP]'s), mean 1.31M (the context limit cuts
        # [BP]'s tail), final context median 52K.
        tokens=None,
        # system prompt + tool schemas + in-context example: not reported apart in [BP]. Implied
        # by it: per trajectory, total input / turns minus the mean growth that the results and
        # outputs explain gives the first prompt: median 13,348 tokens (sd 38K: noisy, results
        # counted as characters / 4). Chosen 12,400 = that median less the task's 900.
        shared_prefix=12_400,
        # task: the same SWE-bench issue texts as the swebench spec: its (900, 0.5) reused.
        task=(900.0, 0.5),
        # output per call [BP]: total output / iterations per trajectory, median 433, mean 491;
        # lognormal(433, 0.5) has mean 491. The last call (finish) is not reported apart: same.
        output=(433.0, 0.5), last_output=433.0,
        # tool mix and result sizes [BP]: share of the 1,113 calls, median result tokens
        # (characters / 4) and the sd of log result tokens, per kind (editor sub-commands;
        # bash by first word, as the swebench spec's tools; `other_bash` the rest).
        # Durations: not published; each kind reuses the swebench spec's lognormal of the same
        # command (median ms, sigma): python, pytest, grep, find, ls, pip, head as there; editor
        # view as `cat`, editor str_replace / create as `sed` (a file read or write in the
        # sandbox); other_bash as `cd` (swebench's heavy-tailed `cd repo && ...` commands).
        tools={
            "editor_str_replace": (0.260, 6, 0.8, 308, 0.78), "python": (0.202, 900, 1.15, 213, 1.09),
            "editor_view": (0.158, 4, 0.8, 1491, 1.35), "editor_create": (0.104, 6, 0.8, 15, 0.27),
            "other_bash": (0.075, 3, 3.1, 83, 1.54), "grep": (0.074, 25, 1.0, 63, 1.27),
            "find": (0.067, 60, 1.2, 248, 1.30), "ls": (0.042, 4, 0.7, 11_560, 2.61),
            "pytest": (0.011, 4500, 1.05, 301, 0.57), "pip": (0.006, 4000, 1.0, 375, 0.52),
            "head": (0.001, 4, 0.7, 142, 0.5),  # 1 call in [BP]: its sigma is swebench's head's
        },
    ),
}

BUNDLED = ("swebench", "bfcl")  # traces/data/ holds these; openhands is generated on demand
SOURCES = {"openhands": "OpenHands runs: Bouzenia & Pradel arXiv 2506.18824 data (sola-st/llm-agents-study "
                        "e84f66f) and nebius/SWE-rebench-openhands-trajectories card; see traces/generate.py"}


def _lognormal(rng, median, sigma, size=None):
    size = np.broadcast(np.asarray(median), np.asarray(sigma)).shape if size is None else size
    return median * np.exp(sigma * rng.standard_normal(size))


def _power_fit(x: np.ndarray, mean: float, sd: float) -> tuple[np.ndarray, float, float]:
    """c * x**p with sample mean/sd (ddof=1) equal to (mean, sd); returns (y, p, c).

    The CV of x**p rises monotonically with p (log-moments are convex), so bisection
    finds p. With < 2 distinct values only the mean is matched.
    """
    x = np.asarray(x, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return x * (mean / x.mean()), 1.0, mean / x.mean()
    top = np.log(x).max()
    lx = np.log(x) - top  # work in logs: no overflow for large p
    cv = sd / mean
    lo, hi = 1e-3, 50.0
    for _ in range(80):
        p = (lo + hi) / 2
        y = np.exp(p * lx)
        lo, hi = (p, hi) if y.std(ddof=1) / y.mean() < cv else (lo, p)
    y = np.exp(p * lx)
    c = mean / y.mean()
    return y * c, p, c * np.exp(-p * top)  # c in x's units: y = c * x**p


def _check_args(kind, programs, seed, tokens_mode, shared_prefix_tokens) -> None:
    if kind not in SPECS:
        raise InputError(f"unknown trace generator {kind!r}; choose one of {', '.join(SPECS)}")
    if isinstance(programs, bool) or not isinstance(programs, (int, np.integer)) or programs < 1:
        raise InputError(f"programs is {programs!r}; give a whole number >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed is {seed!r}; give a whole number >= 0")
    if tokens_mode not in TOKENS_MODES:
        raise InputError(f"tokens mode {tokens_mode!r} is unknown; choose sum or final")
    if shared_prefix_tokens is not None and (not isinstance(shared_prefix_tokens, (int, np.integer)) or shared_prefix_tokens < 0):
        raise InputError(f"shared prefix is {shared_prefix_tokens!r}; give a whole number of tokens >= 0")
    if shared_prefix_tokens is not None and shared_prefix_tokens > SHARED_PREFIX_MAX:
        raise InputError(f"--shared-prefix {shared_prefix_tokens} does not fit a program's context ({CONTEXT_LIMIT} tokens, "
                         f"{FRONT_LOAD_ROOM} kept for rounding, and a task and an output per turn); give at most {SHARED_PREFIX_MAX}")


def _front_load(inp, out, start, n, limit, shared: int | None) -> None:
    """In place: shrink a program's later turns and put the lost sum into turn 0, so the
    final context drops to `limit` while the sum over calls stays (up to rounding)."""
    a = inp[start:start + n] + out[start:start + n]
    w = n - np.arange(n)
    F, Q1, R1 = a.sum(), a[1:].sum(), (w[1:] * a[1:]).sum()
    gain = Q1 - R1 / n  # final-context drop per unit of (1 - f)
    if gain <= 0 or (F - limit) / gain > 1:
        if shared is None:  # the spec's own targets: a rare long draw
            raise InputError(f"cannot fit a program of {n} turns under {limit} tokens of context; give another --seed "
                             f"or a smaller --shared-prefix")
        raise InputError(f"cannot fit a program under {limit} tokens of context with --shared-prefix {shared} "
                         f"(the rest of its {n} turns does not shrink enough); give a smaller --shared-prefix")
    f = 1 - (F - limit) / gain
    sl = slice(start + 1, start + n)
    inp[sl] = np.floor(inp[sl] * f)
    out[sl] = np.maximum(np.floor(out[sl] * f), 1)
    inp[start] += int(np.ceil((1 - f) * R1 / n))


def generate(kind: str, programs: int = 500, seed: int = 0, tokens_mode: str = "sum",
             shared_prefix_tokens: int | None = None, tasks: int | None = None) -> tuple[pd.DataFrame, dict]:
    """A validated synthetic trace of `programs` programs and its metadata."""
    _check_args(kind, programs, seed, tokens_mode, shared_prefix_tokens)
    if tasks is not None and (isinstance(tasks, bool) or not isinstance(tasks, (int, np.integer)) or tasks < 1):
        raise InputError(f"--tasks {tasks!r} must be a whole number of tasks >= 1")
    spec = SPECS[kind]
    rows = programs * spec.turns[0]
    check_memory(rows * TRACE_ROW_BYTES, f"--programs {programs}: about {rows:,.0f} {kind} calls", "give fewer --programs")
    shared = spec.shared_prefix if shared_prefix_tokens is None else int(shared_prefix_tokens)
    rng = np.random.default_rng(seed)

    # Turns: standardised normals so the sample mean/sd land on the target before rounding.
    z = rng.standard_normal(programs)
    if programs > 1:
        z = (z - z.mean()) / z.std(ddof=1)
    if spec.turns_dist == "lognormal":
        mu = np.log(spec.turns_median)
        sigma = np.sqrt(2 * np.log(spec.turns[0] / spec.turns_median))  # mean = exp(mu + sigma^2 / 2)
        n = np.maximum(np.rint(np.exp(mu + sigma * z)), 1).astype(np.int64)
    else:
        n = np.maximum(np.rint(spec.turns[0] + spec.turns[1] * z), 1).astype(np.int64)
    if spec.max_turns is not None:
        n = np.minimum(n, spec.max_turns)
    rows = int(n.sum())
    start = np.r_[0, np.cumsum(n)[:-1]]
    prog = np.repeat(np.arange(programs), n)
    turn = np.arange(rows) - start[prog]
    last = turn == n[prog] - 1

    # Tools after every turn but the last; per-tool lognormal durations.
    names = list(spec.tools)
    t = np.array([spec.tools[k] for k in names])
    tool_idx = rng.choice(len(names), size=rows, p=t[:, 0] / t[:, 0].sum())
    dur_ms = _lognormal(rng, t[tool_idx, 1], t[tool_idx, 2])
    result_tokens = np.minimum(_lognormal(rng, t[tool_idx, 3], t[tool_idx, 4]), RESULT_CAP)
    tool_p = tool_c = 1.0
    if (~last).any() and spec.tool_ms is not None:
        dur_ms[~last], tool_p, tool_c = _power_fit(dur_ms[~last], *spec.tool_ms)
    dur_s = np.where(last, np.nan, dur_ms / 1000.0)
    tool = np.array(names, dtype=object)[tool_idx]
    tool[last] = None

    # Tokens (shared prefix excluded): turn 0 = task; turn t = result of turn t-1's tool.
    task = _lognormal(rng, *spec.task, programs)
    out = _lognormal(rng, np.where(last, spec.last_output, spec.output[0]), spec.output[1])
    inp = np.where(turn == 0, task[prog], np.r_[0.0, result_tokens[:-1]])

    # Per program: metric = fixed (shared prefix) + variable; map the metric onto the targets.
    w = (n[prog] - turn) if tokens_mode == "sum" else np.ones(rows)  # times a token is counted
    var = np.bincount(prog, w * (inp + out), programs)
    fixed = shared * (n if tokens_mode == "sum" else np.ones(programs))
    if spec.tokens is not None:
        target, tok_p, _ = _power_fit(fixed + var, *spec.tokens)
    else:  # no published per-program target to map onto: the per-call draws stand (rounded)
        target, tok_p = fixed + var, 1.0
    target = np.rint(target)
    scale = np.maximum((target - fixed) / var, 0.01)  # floor: a huge shared prefix can't go negative
    inp = np.where(turn == 0, np.maximum(np.rint(inp * scale[prog]), 1), np.rint(inp * scale[prog]))
    out = np.maximum(np.rint(out * scale[prog]), 1)
    inp[turn == 0] += shared

    def settle():  # rounding residual goes to the last output (counted once in sum and final)
        got = np.bincount(prog, w * (inp + out), programs)
        out[last] = np.maximum(out[last] + target - got, 1)

    settle()
    if tokens_mode == "sum":
        final = np.bincount(prog, inp + out, programs)
        for i in np.flatnonzero(final > CONTEXT_LIMIT):
            _front_load(inp, out, start[i], n[i], CONTEXT_LIMIT - FRONT_LOAD_ROOM, shared_prefix_tokens)
        if spec.tokens is not None:  # no target: front-loading's rounding loss is not put back
            settle()

    width = max(4, len(str(programs - 1)))
    df = pd.DataFrame({
        "program_id": [f"{kind}-{i:0{width}d}" for i in prog],
        "turn": turn,
        "new_input_tokens": inp.astype(np.int64),
        "output_tokens": out.astype(np.int64),
        "tool": tool,
        "tool_duration_s": dur_s,
        "shared_prefix_tokens": np.full(rows, shared, dtype=np.int64),
    })
    if tasks is not None:  # draws above are untouched: the same seed gives the same numbers
        df[segments.COLUMN] = [
            [{"id": f"{kind}-system", "tokens": shared}, {"id": f"{kind}-task-{p % tasks}", "tokens": int(k) - shared}]
            if t == 0 else None for p, t, k in zip(prog, turn, df["new_input_tokens"])]
    meta = {
        "generator": kind, "seed": int(seed), "programs": int(programs), "tokens_mode": tokens_mode,
        "synthetic": True, "source": SOURCES.get(kind, "matches Continuum paper Table 2 statistics"),
        "shared_prefix_tokens": shared, "tasks": tasks,
        "targets": {"turns": spec.turns, "tool_ms": spec.tool_ms, f"tokens_{tokens_mode}": spec.tokens,
                    **({"turns_median": spec.turns_median} if spec.turns_median is not None else {}),
                    **({"max_turns": spec.max_turns} if spec.max_turns is not None else {})},
        "tool_time_power": round(float(tool_p), 6), "tool_time_scale": round(float(tool_c), 6),
        "tokens_power": round(float(tok_p), 6),
    }
    return validate(df), meta


def bundle(data_dir: Path = DATA_DIR) -> list[Path]:
    """Write the bundled traces: seed 0, 500 programs, default options."""
    out = []
    for kind in BUNDLED:
        df, meta = generate(kind)
        out.append(write_trace(df, data_dir / f"{kind}.parquet", meta))
    return out


def _gen_cmd(args) -> int:
    if (args.kind is None) == (args.spec is None):
        raise InputError("give a generator name (" + ", ".join(SPECS) + ") or --spec SPEC (a workload spec "
                         "from `sim trace fit`, or a shipped one), not both or neither")
    if args.spec is not None:
        from traces import fit

        spec = fit.read_spec(args.spec)
        df, meta = fit.generate_from_spec(spec, args.programs, args.seed)
        path = write_trace(df, args.output, meta)
        carry = f", carry {spec.carry.mode} ({spec.carry.basis})" if spec.carry is not None else ""
        print(f"wrote {path}: {meta['programs']} programs of spec {spec.name!r}, {len(df)} calls (seed {args.seed}){carry}")
        return 0
    args.tokens_mode = args.tokens_mode or "sum"  # None: not given (a --spec run refuses it; agentsim/requires.py)
    df, meta = generate(args.kind, args.programs, args.seed, args.tokens_mode, args.shared_prefix, args.tasks)
    path = write_trace(df, args.output, meta)
    print(f"wrote {path}: {meta['programs']} {args.kind} programs, {len(df)} calls (seed {args.seed}, tokens mode {args.tokens_mode})")
    return 0


def register(tsub) -> None:
    p = tsub.add_parser("gen", help="generate a synthetic trace matching the paper's statistics")
    p.add_argument("kind", nargs="?", default=None, metavar="{" + ",".join(SPECS) + "}", help="which workload to imitate")
    p.add_argument("--spec", default=None, metavar="SPEC",
                   help="sample a workload spec instead: a JSON from `sim trace fit`, or a shipped name "
                        "(claude-code, codex, mini-swe-agent; traces/data/specs/)")
    p.add_argument("--programs", type=int_flag(1, COUNT_MAX), default=500, help="number of programs (default 500)")
    p.add_argument("--seed", type=int_flag(0, SEED_MAX), default=0, help="random seed (default 0)")
    p.add_argument("--tokens-mode", default=None, metavar="{sum,final}",
                   help="what 'tokens per program' means: sum over calls (default) or final context")
    p.add_argument("--shared-prefix", type=int_flag(0, COUNT_MAX), default=None, metavar="N",
                   help="system-prompt tokens shared by all programs (default 1000 swebench, 800 bfcl, "
                        "12400 openhands)")
    p.add_argument("--tasks", type=int_flag(1, COUNT_MAX), default=None, metavar="K",
                   help="sharing model: programs work on K tasks and share their first prompt by content "
                        "(writes content segments; default: none)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.parquet", help="where to write the trace")
    p.set_defaults(func=_gen_cmd)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write the bundled synthetic traces.")
    ap.add_argument("--bundle", action="store_true", help="rewrite traces/data/{swebench,bfcl}.parquet")
    if not ap.parse_args().bundle:
        ap.error("nothing to do; pass --bundle")
    for path in bundle():
        print(f"wrote {path}")
    sys.exit(0)
