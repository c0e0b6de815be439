"""Importers of real agent logs: `sim trace import FORMAT FILES... -o out.parquet`.

Each format module turns its files into `Program`s of `Call`s (common.py); this
module applies the options shared by all formats, makes arrivals relative to the
earliest program, and writes the trace atomically (traces.schema.write_trace).
Python API: `import_trace(fmt, paths, **opts) -> (DataFrame, meta)`.
"""
from __future__ import annotations

import importlib

import pandas as pd

from agentsim.bounds import COUNT_MAX, int_flag
from agentsim.errors import InputError
from traces.importers.common import Notes, estimate_tokens, find_files, placeholder_warning, rows_for, tool_wall_stats
from traces.schema import validate, write_trace

FORMATS = {
    "claude-code": "claude_code",
    "tracelab": "tracelab",
    "llmservingsim": "llmservingsim",
    "mini-swe-agent": "mini_swe_agent",
    "openai-chat": "openai_chat",
    "continuum-timestamps": "continuum_timestamps",
    "mooncake": "mooncake",
    "mooncake-agentic": "mooncake_agentic",
}
DEFAULTS = {"subagents": "drop", "tokenizer": None, "chars_per_token": 4.0, "estimate_tokens": False, "output_tokens": None,
            "block_size": None}


def import_trace(fmt: str, paths, **opts) -> tuple[pd.DataFrame, dict]:
    """Read `paths` (files, or directories searched for the format's files) as
    format `fmt`; returns the validated trace and its metadata."""
    if fmt not in FORMATS:
        raise InputError(f"unknown import format {fmt!r}; choose one of {', '.join(FORMATS)}")
    unknown = set(opts) - set(DEFAULTS)
    if unknown:
        raise InputError(f"unknown import option(s) {', '.join(sorted(unknown))}; known: {', '.join(DEFAULTS)}")
    opts = {**DEFAULTS, **{k: v for k, v in opts.items() if v is not None}}
    if opts["subagents"] not in ("drop", "keep"):
        raise InputError(f"--subagents {opts['subagents']!r} is not one of drop, keep")
    cpt = opts["chars_per_token"]
    if isinstance(cpt, bool) or not isinstance(cpt, (int, float)) or not cpt > 0 or cpt == float("inf"):
        raise InputError(f"--chars-per-token {cpt!r} must be a number > 0; e.g. 4.0")
    if opts["output_tokens"] is not None and not (isinstance(opts["output_tokens"], int) and opts["output_tokens"] >= 1):
        raise InputError(f"--output-tokens {opts['output_tokens']!r} must be a whole number >= 1")
    bs = opts["block_size"]
    if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or not 1 <= bs <= 1 << 20):
        raise InputError(f"--block-size {bs!r} must be a whole number of tokens in [1, 1048576]; e.g. 512")
    mod = importlib.import_module(f"traces.importers.{FORMATS[fmt]}")
    files = find_files([paths] if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__") else paths, mod.PATTERNS, fmt)
    notes = Notes()
    progs = mod.load(files, opts, notes)
    progs = [p for p in progs if p.calls]
    if not progs:
        raise InputError(f"{', '.join(map(str, files))}: no LLM calls found; is this {fmt} data? (check FORMAT)")
    warnings = [w for w in [placeholder_warning(progs, opts["estimate_tokens"])] if w]
    if opts["estimate_tokens"] and not any(c.output_chars is not None for p in progs for c in p.calls):
        warnings.append(f"--estimate-tokens ignored: {fmt} logs no output text")
    if opts["estimate_tokens"]:  # replace logged output counts by the chars-based estimate
        for c in (c for p in progs for c in p.calls if c.output_chars is not None):
            c.output_tokens = estimate_tokens(c.output_chars, opts["chars_per_token"])

    rows = [row for p in progs for row in rows_for(p, notes)]
    df = pd.DataFrame(rows)
    # object dtype keeps unknown tools null: under pandas 3 a str column turns None
    # into the string "nan" in schema.validate's str() mapping.
    df["tool"] = pd.Series([r["tool"] for r in rows], index=df.index, dtype=object)
    arrivals = {p.program_id: p.arrival_abs_s for p in progs}
    if all(a is not None for a in arrivals.values()):
        t0 = min(arrivals.values())
        df["arrival_s"] = df["program_id"].map({k: v - t0 for k, v in arrivals.items()}).astype(float)
    if notes.shrank:
        warnings.append(f"prompt grew by less than the previous output in {notes.shrank} calls (thinking dropped from the history, or compaction); new input clipped to 0 there")
    if notes.gap_fallback:
        warnings.append(f"{notes.gap_fallback} tool durations taken from the gap between calls (no tool timestamps)")
    warnings += notes.extra
    meta = {
        "source_files": [str(f) for f in files], "format": fmt, "options": opts,
        "importer": "agentsim", "synthetic": False, "warnings": warnings,
    }
    walls = tool_wall_stats(progs)
    if walls:
        meta["log_tool_ms"] = walls
    return validate(df), meta


def register(tsub) -> None:
    p = tsub.add_parser("import", help="import real agent logs as a trace",
                        description="Convert real agent logs to a trace parquet (one row per LLM call).")
    p.add_argument("format", metavar="FORMAT", choices=list(FORMATS), help=", ".join(FORMATS))
    p.add_argument("files", metavar="FILES", nargs="+", help="log files, or directories searched for the format's files")
    p.add_argument("-o", "--out", required=True, help="output parquet path")
    p.add_argument("--subagents", choices=["drop", "keep"], default="drop",
                   help="claude-code: drop sub-agent (sidechain) calls (default; their time is inside the Task tool) or keep them as separate programs")
    p.add_argument("--tokenizer", default=None, help="openai-chat/mini-swe-agent: Hugging Face tokenizer name to count tokens (offline cache only)")
    p.add_argument("--chars-per-token", type=float, default=4.0, help="characters per token for estimates (default 4.0)")
    p.add_argument("--estimate-tokens", action="store_true", help="replace logged output token counts by characters / --chars-per-token (for placeholder counts)")
    p.add_argument("--output-tokens", type=int_flag(1, COUNT_MAX), default=None, help="continuum-timestamps: output tokens per call (the recorder does not log them)")
    p.add_argument("--block-size", type=int_flag(1, 1 << 20), default=None,
                   help="mooncake, mooncake-agentic: tokens per hash id (default 512, the FAST'25 traces; Dynamo prints its trace_block_size)")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    df, meta = import_trace(args.format, args.files, subagents=args.subagents, tokenizer=args.tokenizer,
                            chars_per_token=args.chars_per_token, estimate_tokens=args.estimate_tokens,
                            output_tokens=args.output_tokens, block_size=args.block_size)
    write_trace(df, args.out, meta)
    line = f"wrote {args.out}: {df['program_id'].nunique()} programs, {len(df)} calls"
    print(line + "".join(f"; warning: {w}" for w in meta["warnings"]))
    return 0
