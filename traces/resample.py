"""`sim trace resample SRC... -o OUT.parquet`: a trace of N programs drawn from real
sessions imported with `sim trace import` (SRC are those parquet files).

- Whole sessions: a program is a copy of one session (its tool sequence, tool
  durations and token growth), under a new program id `r<draw>:<source>:<session>`.
- Draws are with replacement and balanced: every session is used floor(N/S) or
  ceil(N/S) times (the N mod S extra copies go to sessions drawn without
  replacement), in seeded random order. With few sessions (16 AgentCgroup logs),
  independent draws would over-weight some sessions by chance and the trace's
  tool-time quantiles would drift from the source's by 20% (seen at 400 draws);
  balanced draws keep the source's mix. `sim run --programs k` then takes a random k.
- `--max-context T`: a session whose final context exceeds T gets every call's new
  input tokens multiplied by one factor (floored; turn 0 keeps >= 1 and its shared
  prefix), chosen so the final context is <= T; output tokens and tool times are
  kept, so the context keeps its shape. T must hold each session's first prompt
  and its outputs, else the session is named in the error.
- `--jitter` (`--jitter-width W`, default 0.05): each tool duration is replaced by a
  neighbour in the same source's logged durations of that tool: the call's quantile
  u there (ties split at random) moves by U(-W, W), reflected at 0 and 1, and the
  logged duration at the new quantile is taken. u stays uniform, so the tool's distribution is the source's
  (no new values, no widening), while copies of a session differ and a long call
  stays long. A tool logged once keeps its one duration.
  Content segments (traces/segments.py) are scaled by the same factor, so equal
  segments stay equal.
- Content segments: ids that occur in two or more source sessions (a system prompt,
  a task text) are kept; a session's own content gets an id per copy, since two runs
  of an agent get different tool results. Copies therefore share what real sessions
  share, not each other's whole conversation.
- No arrivals: `sim run --jps` gives them.
- Metadata: seed, options, and per source its import metadata and the provenance
  (repo, commit, licence) found in a PROVENANCE.md above the logs. The trace is
  derived from the logs and under their licences (AgentCgroup: GPL-2.0): build it
  where it is needed, never commit it.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from traces import segments
from agentsim.errors import InputError
from traces.schema import read_trace, validate, write_trace
from agentsim.bounds import COUNT_MAX, SEED_MAX, int_flag
from agentsim.resources import RESAMPLED_ROW_BYTES, check_memory

JITTER_WIDTH = 0.05  # default --jitter: +-5 quantile points


def load_source(path) -> tuple[pd.DataFrame, dict]:
    """An imported trace; anything else is refused with one line."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"source {p}: no such file; give a parquet written by `sim trace import`")
    try:
        pq.read_schema(p)
    except Exception:  # pyarrow raises several types for a non-parquet file
        raise InputError(f"source {p} is not a trace parquet; import the logs first "
                         f"(sim trace import FORMAT FILES -o trace.parquet) and give that file") from None
    try:
        df, meta = read_trace(str(p))
    except InputError as e:
        raise InputError(f"source {p}: {e}") from None
    if meta.get("importer") != "agentsim" or meta.get("synthetic"):
        kind = "a synthetic trace" if meta.get("synthetic") else "not written by `sim trace import`"
        raise InputError(f"source {p} is {kind}; resample draws real sessions: give a parquet written by `sim trace import`")
    return df, meta


def resample(sources: list[tuple[str, pd.DataFrame, dict]], programs: int, seed: int = 0,
             max_context: int | None = None, jitter: float | None = None) -> tuple[pd.DataFrame, dict]:
    """sources: (label, trace, import metadata). Returns the resampled trace and its metadata."""
    if isinstance(programs, bool) or not isinstance(programs, (int, np.integer)) or programs < 1:
        raise InputError(f"--programs {programs!r} must be a whole number >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"--seed {seed!r} must be a whole number >= 0")
    if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, (int, np.integer))):
        raise InputError(f"--max-context {max_context!r} must be a whole number of tokens")
    if jitter is not None and not (0 < jitter <= 0.5):
        raise InputError(f"--jitter-width {jitter!r} must be a quantile width in (0, 0.5]; e.g. {JITTER_WIDTH}")
    if not sources:
        raise InputError("no sources; give one or more parquet files written by `sim trace import`")
    per_session = sum(len(df) for _, df, _ in sources) / max(1, sum(df["program_id"].nunique() for _, df, _ in sources))
    check_memory(programs * per_session * RESAMPLED_ROW_BYTES, f"--programs {programs}: about "
                 f"{programs * per_session:,.0f} calls ({per_session:.1f} per session of the sources)", "give fewer --programs")
    has_shared = any("shared_prefix_tokens" in df.columns for _, df, _ in sources)
    has_segments = any(segments.COLUMN in df.columns for _, df, _ in sources)
    sessions, names, src_of = [], [], []
    for k, (label, df, _) in enumerate(sources):
        df = df.drop(columns=["arrival_s"], errors="ignore")
        if has_shared and "shared_prefix_tokens" not in df.columns:
            df = df.assign(shared_prefix_tokens=0)
        if has_segments and segments.COLUMN not in df.columns:
            df = df.assign(**{segments.COLUMN: None})
        for pid, g in df.groupby("program_id", sort=False):
            sessions.append(g.reset_index(drop=True))
            names.append(f"{label}:{pid}")
            src_of.append(k)
    scaled = 0
    if max_context is not None:
        # name the session that needs the largest window, so one retry is enough
        need = [_min_context(g) for g in sessions]
        i = max(range(len(sessions)), key=lambda i: need[i][0])
        if need[i][0] > max_context:
            raise InputError(f"--max-context {max_context} is below session {names[i]}'s {need[i][1]}; "
                             f"give at least {need[i][0]} (sessions are scaled, not cut)")
        for i, g in enumerate(sessions):
            sessions[i], did = _fit(g, max_context)
            scaled += did

    rng = np.random.default_rng(seed)
    S = len(sessions)
    idx = np.r_[np.repeat(np.arange(S), programs // S), rng.choice(S, programs % S, replace=False)]
    idx = rng.permutation(idx)
    width = len(str(programs - 1))
    common = _common_segments(sessions) if has_segments else set()
    parts = []
    for i, s in enumerate(idx):
        g = sessions[s].copy()
        g["program_id"] = f"r{i:0{width}d}:{names[s]}"
        if has_segments:
            g[segments.COLUMN] = [_own_copy(segs, common, i) for segs in g[segments.COLUMN].tolist()]
        g["_src"] = src_of[s]
        parts.append(g)
    out = pd.concat(parts, ignore_index=True)
    if jitter is not None:
        _jitter(out, pd.concat([g.assign(_src=src_of[i]) for i, g in enumerate(sessions)], ignore_index=True), jitter, rng)
    out = out.drop(columns="_src")

    meta = {
        "generator": "resample", "synthetic": False, "resampled": True, "seed": int(seed), "programs": int(programs),
        "options": {"max_context": max_context, "jitter": jitter},
        "draws": "whole sessions, balanced: each used floor(N/S) or ceil(N/S) times, seeded order",
        "sessions": S, "sessions_scaled": scaled, "arrivals": "none; sim run --jps gives them",
        "sources": [{"label": label, "programs": int(df["program_id"].nunique()), "calls": len(df),
                     "import": meta, "provenance": provenance(meta.get("source_files", []))}
                    for label, df, meta in sources],
        "notice": "derived from real agent logs under their licences (sources[].provenance); build it where needed, do not commit it",
    }
    return validate(out), meta


def _common_segments(sessions: list[pd.DataFrame]) -> set[str]:
    """Segment ids that occur in more than one source session (a system prompt, a task
    text): what a fleet shares. Everything else is one session's own content."""
    seen: dict[str, int] = {}
    for k, g in enumerate(sessions):
        for sid in {s["id"] for segs in g[segments.COLUMN].tolist() if not segments.is_unknown(segs) for s in segs}:
            seen[sid] = seen.get(sid, -1) + 1
    return {sid for sid, more in seen.items() if more > 0}


def _own_copy(segs, common: set[str], copy: int):
    """A copy's segments: shared ones kept, a session's own content made unique to the
    copy (two copies of a session are two runs of an agent, whose tool results differ)."""
    if segments.is_unknown(segs):
        return None
    return [s if s["id"] in common else {"id": f"{s['id']}@r{copy}", "tokens": s["tokens"]} for s in segs]


def _min_context(g: pd.DataFrame) -> tuple[int, str]:
    """The smallest T a session can be scaled into, and why: its first prompt (a window
    that could not hold it could not have run the session), or its outputs (kept)."""
    first = int(g["new_input_tokens"].iloc[0])
    shared = int(g["shared_prefix_tokens"].iloc[0]) if "shared_prefix_tokens" in g.columns else 0
    outs = int(g["output_tokens"].sum())
    if first >= outs + shared + 1:
        return first, f"first prompt ({first} tokens)"
    return outs + shared + 1, f"output tokens ({outs}, kept unscaled, + 1 input token)"


def _fit(g: pd.DataFrame, T: int) -> tuple[pd.DataFrame, bool]:
    """Scale one session's new input by one factor so its final context is <= T."""
    new, out = g["new_input_tokens"].to_numpy(), g["output_tokens"].to_numpy()
    shared = int(g["shared_prefix_tokens"].iloc[0]) if "shared_prefix_tokens" in g.columns else 0
    if new.sum() + out.sum() <= T:
        return g, False
    own = new.copy()
    own[0] -= shared
    factor = (T - shared - out.sum()) / own.sum()
    own = np.floor(own * factor).astype(np.int64)
    own[0] = max(1, own[0]) + shared
    return segments.rescale(g, own, factor), True


def _jitter(out: pd.DataFrame, pool: pd.DataFrame, w: float, rng: np.random.Generator) -> None:
    """Move each duration to a random neighbour in its (source, tool) distribution, in place."""
    have = out["tool_duration_s"].notna()
    key = out["_src"].astype(str) + "\0" + out["tool"].fillna("\0none")
    pkey = pool["_src"].astype(str) + "\0" + pool["tool"].fillna("\0none")
    pdur = pool["tool_duration_s"]
    for k, rows in out[have].groupby(key[have]).groups.items():
        s = np.sort(pdur[(pkey == k) & pdur.notna()].to_numpy())
        d = out.loc[rows, "tool_duration_s"].to_numpy()
        lo, hi = np.searchsorted(s, d, "left"), np.searchsorted(s, d, "right")
        u = (lo + rng.random(len(d)) * (hi - lo)) / len(s) + rng.uniform(-w, w, len(d))
        u = 1 - np.abs(1 - np.abs(u))  # reflect into [0, 1]: keeps u uniform
        out.loc[rows, "tool_duration_s"] = s[np.minimum((u * len(s)).astype(np.int64), len(s) - 1)]


def provenance(files) -> list[dict]:
    """Repo, commit and licence rows of the PROVENANCE.md section that covers the files."""
    found: dict[tuple, dict] = {}
    for f in map(Path, files):
        f = f.resolve()
        for d in f.parents:
            note = d / "PROVENANCE.md"
            if note.is_file():
                for sub, rows in _sections(note).items():
                    if f.is_relative_to(d / sub):
                        found[(str(note), sub)] = {"note": str(note), "section": sub, **rows}
                break
    return list(found.values())


def _sections(note: Path) -> dict[str, dict]:
    """`## N. \\`dir/\\` ...` headings → {repo, commit, license} cells of their table."""
    out, cur = {}, None
    for line in note.read_text(encoding="utf-8", errors="replace").splitlines():
        m = re.match(r"##\s+\d+\.\s+`([^`]+)`", line)
        if m:
            cur = out.setdefault(m.group(1).rstrip("/"), {})
            continue
        m = re.match(r"\|\s*(repo|commit|license)\s*\|(.*)\|\s*$", line)
        if cur is not None and m:
            cur[m.group(1)] = m.group(2).strip().replace("**", "")
    return out


def register(tsub) -> None:
    p = tsub.add_parser("resample", help="draw N programs from imported real sessions",
                        description="Draw N programs as whole sessions (tools, durations, token growth) from traces "
                                    "written by `sim trace import`, with replacement and balanced over sessions. "
                                    "No arrivals (sim run --jps gives them). The output is derived from the logs and "
                                    "under their licences: build it where needed, do not commit it.")
    p.add_argument("sources", metavar="SRC", nargs="+", help="parquet traces written by `sim trace import`")
    p.add_argument("--programs", type=int_flag(1, COUNT_MAX), default=500, help="programs to draw (default 500)")
    p.add_argument("--seed", type=int_flag(0, SEED_MAX), default=0, help="random seed (default 0)")
    p.add_argument("--max-context", type=int_flag(1, COUNT_MAX), default=None, metavar="T",
                   help="scale each session whose final context exceeds T: every call's new input tokens times one "
                        "factor per session (outputs and tool times kept), so the final context is <= T")
    # a flag, not `--jitter [W]`: an optional value would swallow a following SRC
    p.add_argument("--jitter", action="store_true",
                   help="replace each tool duration by a neighbour in the source's logged durations of that tool: "
                        "its quantile moved by U(-W, W); keeps each tool's distribution")
    p.add_argument("--jitter-width", type=float, default=None, metavar="W",
                   help=f"W of --jitter, a quantile width in (0, 0.5] (default {JITTER_WIDTH})")
    p.add_argument("-o", "--output", required=True, metavar="OUT.parquet", help="where to write the trace")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    srcs = list(dict.fromkeys(Path(s).resolve() for s in args.sources))  # a file named twice counts once
    stems = [p.stem for p in srcs]
    labels = [s if stems.count(s) == 1 else f"{s}#{i}" for i, s in enumerate(stems)]
    sources = [(label, *load_source(p)) for label, p in zip(labels, srcs)]
    jitter = (JITTER_WIDTH if args.jitter_width is None else args.jitter_width) if args.jitter else None
    df, meta = resample(sources, args.programs, args.seed, args.max_context, jitter)
    for src, p in zip(meta["sources"], srcs):
        src["path"] = str(p)
    path = write_trace(df, args.output, meta)
    extra = (f"; {meta['sessions_scaled']} sessions scaled to {args.max_context} tokens" if args.max_context else "") + \
            (f"; jitter {jitter}" if jitter else "")
    print(f"wrote {path}: {args.programs} programs from {meta['sessions']} sessions in {len(sources)} sources, "
          f"{len(df)} calls (seed {args.seed}{extra}); no arrivals: give sim run --jps")
    return 0
