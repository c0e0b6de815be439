"""Trace schema: one row per LLM call of an agent program.

A program is a sequence of turns 0..n-1. Turn t's prompt is turn t-1's prompt plus
turn t-1's output plus `new_input_tokens` (context is append-only), so a trace only
stores what each turn *adds*. After every turn but the last, the agent runs `tool`
for `tool_duration_s` seconds before sending the next turn.

Columns (required unless marked optional):
  program_id            str    program identity
  turn                  int    0-based, contiguous within a program
  new_input_tokens      int    >= 1 on turn 0, >= 0 after (tool result / user text)
  output_tokens         int    >= 1
  tool                  str    tool called after this turn; null on the last turn
                               (and allowed null elsewhere: tool unknown)
  tool_duration_s       float  >= 0; null (NaN) on the last turn, required before it
  arrival_s             float  optional; program arrival, same on every row of a program
  shared_prefix_tokens  int    optional; leading tokens of turn 0 shared by all programs
                               (system prompt), <= turn 0's new_input_tokens
  segments              list   optional; the new input's content as [{id, tokens}, ...]
                               (traces/segments.py): programs share KV blocks by content

Parquet key-value metadata (`agentsim` key, JSON) records generator, seed, source.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Json, TypeAdapter

from agentsim.errors import InputError
from traces import segments
from agentsim.files import atomic_write
from traces.validation import validated

REQUIRED = ["program_id", "turn", "new_input_tokens", "output_tokens", "tool", "tool_duration_s"]
OPTIONAL = ["arrival_s", "shared_prefix_tokens", segments.COLUMN]
META_KEY = b"agentsim"
DATA_DIR = Path(__file__).parent / "data"
_META = TypeAdapter(Json[dict])  # the metadata must be a JSON object


def _fail(df: pd.DataFrame, i: int, field: str, problem: str, fix: str) -> None:
    row = df.iloc[i]
    raise InputError(
        f"trace program {row['program_id']!r} turn {row['turn']}: field '{field}' {problem}; {fix}"
    )


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check a trace and return it normalised (dtypes, sorted by program and turn).

    Raises InputError naming the program, turn and field of the first problem found.
    """
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(
            f"trace is missing column(s) {', '.join(missing)}; a trace needs {', '.join(REQUIRED)}"
        )
    if len(df) == 0:
        raise InputError("trace has no rows; give at least one program with one turn")
    df = df.copy()
    pid_missing = df["program_id"].isna().to_numpy()
    if pid_missing.any():  # astype(str) would merge them into one program "None" (or drop them)
        i = int(np.flatnonzero(pid_missing)[0])
        raise InputError(f"trace row {i} (turn {df['turn'].iloc[i]}): field 'program_id' is missing; give every row its program's id")
    df["program_id"] = df["program_id"].astype(str)
    for col in ("turn", "new_input_tokens", "output_tokens") + (
        ("shared_prefix_tokens",) if "shared_prefix_tokens" in df.columns else ()
    ):
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = vals.isna() | (vals != np.floor(vals.fillna(0)))
        if bad.any():
            _fail(df, int(np.flatnonzero(bad.to_numpy())[0]), col, f"is {df[col].iloc[int(np.flatnonzero(bad.to_numpy())[0])]!r}, not an integer", "write a whole number")
        df[col] = vals.astype(np.int64)
    for col in ("tool_duration_s",) + (("arrival_s",) if "arrival_s" in df.columns else ()):
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = vals.isna() & df[col].notna()
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            _fail(df, i, col, f"is {df[col].iloc[i]!r}, not a number", "write seconds as a number")
        df[col] = vals.astype(np.float64)
    # object dtype with real None: pandas 3's string dtype would turn None into NaN/"nan"
    df["tool"] = pd.Series([None if pd.isna(t) else str(t) for t in df["tool"]], index=df.index, dtype=object)

    df = df.sort_values(["program_id", "turn"], kind="stable").reset_index(drop=True)
    dup = df.duplicated(["program_id", "turn"]).to_numpy()
    if dup.any():
        _fail(df, int(np.flatnonzero(dup)[0]), "turn", "appears twice", "give each turn of a program once")

    first = ~df.duplicated("program_id").to_numpy()
    last = ~df.duplicated("program_id", keep="last").to_numpy()
    turn = df["turn"].to_numpy()
    # Turns must be 0..n-1: the first row of a program is turn 0 and each next row +1.
    expected = np.where(first, 0, np.r_[0, turn[:-1]] + 1)
    bad = turn != expected
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _fail(df, i, "turn", f"should be {expected[i]} (turns are 0-based and contiguous)", "renumber the program's turns 0..n-1")

    checks = [
        ("new_input_tokens", first & (df["new_input_tokens"].to_numpy() < 1), "must be >= 1 on turn 0", "give the first prompt's length"),
        ("new_input_tokens", df["new_input_tokens"].to_numpy() < 0, "is negative", "give the tokens the turn adds (>= 0)"),
        ("output_tokens", df["output_tokens"].to_numpy() < 1, "must be >= 1", "give the generated length"),
        ("tool_duration_s", ~last & df["tool_duration_s"].isna().to_numpy(), "is missing before the last turn", "give the tool's wall time in seconds"),
        ("tool_duration_s", df["tool_duration_s"].to_numpy() < 0, "is negative", "give a duration >= 0"),
        ("tool_duration_s", ~np.isfinite(df["tool_duration_s"].fillna(0).to_numpy()), "is not finite", "give a finite duration"),
    ]
    if "arrival_s" in df.columns:
        arr = df["arrival_s"].to_numpy()
        per_prog = df.groupby("program_id", sort=False)["arrival_s"].transform("first").to_numpy()
        checks += [
            ("arrival_s", ~np.isfinite(arr) | (arr < 0), "must be a finite number >= 0", "give the program's arrival in seconds"),
            ("arrival_s", arr != per_prog, "differs between turns of one program", "give the program's arrival on every row"),
        ]
    if "shared_prefix_tokens" in df.columns:
        sp = df["shared_prefix_tokens"].to_numpy()
        checks += [
            ("shared_prefix_tokens", sp < 0, "is negative", "give 0 or more"),
            ("shared_prefix_tokens", first & (sp > df["new_input_tokens"].to_numpy()), "exceeds turn 0's new_input_tokens", "the shared prefix is part of the first prompt"),
        ]
    for field, bad, problem, fix in checks:
        if bad.any():
            _fail(df, int(np.flatnonzero(bad)[0]), field, problem, fix)
    if segments.COLUMN in df.columns:
        segments.normalise(df, lambda i, field, problem, fix: _fail(df, i, field, problem, fix))
    # The last turn has no tool call after it.
    df.loc[last, "tool_duration_s"] = np.nan
    df.loc[last, "tool"] = None
    return df


def resolve(name_or_path: str) -> Path:
    """A bundled trace name (`swebench`, `swebench.parquet`) or a file path."""
    p = Path(name_or_path)
    if p.exists():
        return p
    stem = p.name[: -len(".parquet")] if p.name.endswith(".parquet") else p.name
    bundled = DATA_DIR / f"{stem}.parquet"
    if p.parent == Path(".") and bundled.exists():
        return bundled
    names = ", ".join(sorted(q.stem for q in DATA_DIR.glob("*.parquet"))) or "none"
    raise InputError(f"trace {name_or_path!r} not found; give a parquet path or a bundled name ({names})")


def read_trace(name_or_path: str) -> tuple[pd.DataFrame, dict]:
    """Load and validate a trace; returns (rows, metadata dict)."""
    path = resolve(name_or_path)
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise InputError(f"trace {str(path)!r} is not a readable parquet file ({type(e).__name__}); write it with `sim trace gen` or an importer") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    meta = validated(_META, raw or b"{}", f"trace {str(path)!r}: parquet metadata '{META_KEY.decode()}'",
                     "rewrite it as a JSON object (or drop the key)")
    return validate(table.to_pandas()), meta


def write_trace(df: pd.DataFrame, path: str | os.PathLike, meta: dict) -> Path:
    """Validate and write atomically (temp file + rename): never a half-written trace."""
    df = validate(df)
    cols = REQUIRED + [c for c in OPTIONAL if c in df.columns]
    table = pa.Table.from_pandas(df[cols], preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta, sort_keys=True).encode()})
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def programs(df: pd.DataFrame):
    """Yield (program_id, rows as a list of dicts) in trace order; used by sim and replay."""
    for pid, g in df.groupby("program_id", sort=False):
        yield pid, g.to_dict("records")


def is_nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))
