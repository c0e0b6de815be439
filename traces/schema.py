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
  reasoning_tokens      int    optional; the leading part of output_tokens that is
                               reasoning, 0 <= reasoning_tokens <= output_tokens
  carry                 str    optional; how the next prompt carries this turn's output
                               (CARRY_MODES; null = cached):
                               cached             as generated: its KV is reused
                               rerendered         re-rendered by the chat template: the
                                                  same length, other tokens, so the prefix
                                                  cache hits up to this turn's prompt only
                               reasoning-dropped  without its reasoning_tokens: the rest
                                                  is recomputed where the reasoning began
                                                  (with 0 reasoning tokens: as cached)

  kv_priority           int    optional; the client's retention hint for this call's KV
                               (vLLM's KvHintsEnvelope, Dynamo's cache_control): a
                               priority 0-100; null: no hint (unless kv_ttl_s is given:
                               then 50)
  kv_ttl_s              float  optional; the hint's TTL, s >= 0; null: until evicted
  kv_session            str    optional; the hint's session (carried to the engine)

Parquet key-value metadata (`agentsim` key, JSON) records generator, seed, source.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Json, TypeAdapter

from agentsim.errors import InputError
from traces import segments
from agentsim.files import atomic_write
from traces.validation import validated

REQUIRED = ["program_id", "turn", "new_input_tokens", "output_tokens", "tool", "tool_duration_s"]
HINT_COLUMNS = ("kv_priority", "kv_ttl_s", "kv_session")  # a client's retention hint per call
OPTIONAL = ["arrival_s", "shared_prefix_tokens", segments.COLUMN, "reasoning_tokens", "carry", *HINT_COLUMNS]
CARRY_MODES = ("cached", "rerendered", "reasoning-dropped")
META_KEY = b"agentsim"
DATA_DIR = Path(__file__).parent / "data"
_META = TypeAdapter(Json[dict])  # the metadata must be a JSON object


class Columns:
    """A checked trace as columns (name -> numpy array; rows sorted by program and turn),
    what `check` returns. The simulator reads it as is: a run needs no pandas (~0.4 s to
    import). Read like a DataFrame: `t[col]`, `col in t`, iterating gives the column names,
    len() the rows; `frame()` is the DataFrame for code that wants one."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns = columns

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def __iter__(self):
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns["program_id"])

    def take(self, rows) -> Columns:
        return Columns({c: v[rows] for c, v in self.columns.items()})

    def frame(self):
        import pandas as pd

        # object dtype with real None: pandas 3's string dtype would turn None into NaN/"nan"
        return pd.DataFrame({c: pd.Series(v, dtype=object) if c in ("tool", "carry", "kv_session", segments.COLUMN) else v
                             for c, v in self.columns.items()})


def _raw(df) -> dict[str, np.ndarray]:
    """A DataFrame's columns as numpy arrays as pyarrow gives them: numeric ones as they
    are, any other as objects with None where missing."""
    return {c: s.to_numpy() if isinstance(s.dtype, np.dtype) and s.dtype.kind in "iufb" else s.to_numpy(dtype=object, na_value=None)
            for c, s in df.items()}


def _numpy(col: pa.ChunkedArray) -> np.ndarray:
    """A parquet column as numpy, as pandas reads it: numbers (NaN for a null; booleans
    with a null as objects), anything else as objects (None for a null). Built from
    Python values: pyarrow's own to_numpy imports pandas."""
    values = col.to_pylist()
    if col.null_count == 0 and (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type)):
        return np.array(values)
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        return np.array([math.nan if v is None else v for v in values], dtype=np.float64)
    return segments.objects(values)


def _missing(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.isnan(a)
    if a.dtype.kind != "O":
        return np.zeros(len(a), dtype=bool)
    return np.array([is_nan(x) for x in a], dtype=bool)


def _numbers(a: np.ndarray) -> np.ndarray:
    """pandas.to_numeric(errors="coerce") of one column: whole numbers stay int64, anything
    that is not a number (or numeric text) becomes NaN."""
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    if a.dtype.kind == "f":
        return a.astype(np.float64)
    out = []
    for x in a:
        if isinstance(x, str):
            for kind in (int, float):
                try:
                    x = kind(x)
                    break
                except ValueError:
                    pass
        out.append(x if isinstance(x, (int, float, np.integer, np.floating)) else math.nan)
    if all(isinstance(x, (int, np.integer)) for x in out):
        try:
            return np.array(out, dtype=np.int64)
        except OverflowError:
            pass
    return np.array(out, dtype=np.float64)


# Bounds checked before any cast (a float past int64 casts to garbage with a numpy
# warning): no context holds 10^9 tokens (importers refuse larger counts too), and past
# 10^10 s (year 2286 as epoch seconds) a float time's resolution (2 us) nears a step's.
INT_MAX = 10**9
SECONDS_MAX = 1e10


def _show(x) -> str:
    """A value as the user wrote it: numpy scalars as Python's (1e+20, not np.float64(1e+20))."""
    return repr(x.item() if isinstance(x, np.generic) else x)


def _whole_numbers(cols: dict, col: str) -> np.ndarray:
    """One integer column as int64, each value checked before the cast: missing, not a
    number, fractional, infinite or beyond INT_MAX is one line naming program, turn and field."""
    raw = cols[col]
    vals = _numbers(raw)
    if vals.dtype.kind == "f":
        nan = np.isnan(vals)
        if nan.any():
            i = int(np.flatnonzero(nan)[0])
            _fail(cols, i, col, "is missing" if _missing(raw[i:i + 1])[0] else f"is {_show(raw[i])}, not a number",
                  "write a whole number")
        frac = np.isfinite(vals) & (vals != np.floor(vals))
        if frac.any():
            i = int(np.flatnonzero(frac)[0])
            _fail(cols, i, col, f"is {_show(raw[i])}, not a whole number", "write a whole number")
    big = ~(np.abs(vals.astype(np.float64)) <= INT_MAX)  # infinities too
    if big.any():
        i = int(np.flatnonzero(big)[0])
        _fail(cols, i, col, f"is {_show(raw[i])}, outside 0..{INT_MAX:.0e} (a corrupt or mis-scaled value)",
              "write the count itself" if col != "turn" else "number a program's turns 0..n-1")
    return vals.astype(np.int64)


def _fail(cols: dict, i: int, field: str, problem: str, fix: str) -> None:
    raise InputError(
        f"trace program {cols['program_id'][i]!r} turn {cols['turn'][i]}: field '{field}' {problem}; {fix}"
    )


def check(cols: dict[str, np.ndarray]) -> Columns:
    """Check a trace's columns and return them normalised (dtypes, sorted by program and turn).

    Raises InputError naming the program, turn and field of the first problem found.
    """
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise InputError(
            f"trace is missing column(s) {', '.join(missing)}; a trace needs {', '.join(REQUIRED)}"
        )
    if len(cols["program_id"]) == 0:
        raise InputError("trace has no rows; give at least one program with one turn")
    cols = dict(cols)
    pid_missing = _missing(cols["program_id"])
    if pid_missing.any():  # str() would merge them into one program "None"
        i = int(np.flatnonzero(pid_missing)[0])
        raise InputError(f"trace row {i} (turn {cols['turn'][i]}): field 'program_id' is missing; give every row its program's id")
    cols["program_id"] = np.array([str(p) for p in cols["program_id"]], dtype=object)
    for col in ("turn", "new_input_tokens", "output_tokens") + tuple(
        c for c in ("shared_prefix_tokens", "reasoning_tokens") if c in cols
    ):
        cols[col] = _whole_numbers(cols, col)
    if "carry" in cols:
        cols["carry"] = np.array(["cached" if is_nan(c) else c for c in cols["carry"]], dtype=object)
    for col in ("tool_duration_s",) + (("arrival_s",) if "arrival_s" in cols else ()):
        vals = _numbers(cols[col]).astype(np.float64)
        bad = np.isnan(vals) & ~_missing(cols[col])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            _fail(cols, i, col, f"is {_show(cols[col][i])}, not a number", "write seconds as a number")
        big = np.isfinite(vals) & (np.abs(vals) > SECONDS_MAX)
        if big.any():
            i = int(np.flatnonzero(big)[0])
            _fail(cols, i, col, f"is {_show(cols[col][i])} s, beyond {SECONDS_MAX:.0e} s in size (a corrupt or mis-scaled value)",
                  "write seconds (not ms or ns)")
        cols[col] = vals
    cols["tool"] = np.array([None if is_nan(t) else str(t) for t in cols["tool"]], dtype=object)
    _hint_columns(cols)

    order = np.lexsort((cols["turn"], cols["program_id"].astype(str)))  # stable
    cols = {c: v[order] for c, v in cols.items()}
    pid, turn = cols["program_id"], cols["turn"]
    same = pid[1:] == pid[:-1]
    dup = np.r_[False, same & (turn[1:] == turn[:-1])]
    if dup.any():
        _fail(cols, int(np.flatnonzero(dup)[0]), "turn", "appears twice", "give each turn of a program once")

    first, last = np.r_[True, ~same], np.r_[~same, True]
    # Turns must be 0..n-1: the first row of a program is turn 0 and each next row +1.
    expected = np.where(first, 0, np.r_[0, turn[:-1]] + 1)
    bad = turn != expected
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _fail(cols, i, "turn", f"should be {expected[i]} (turns are 0-based and contiguous)", "renumber the program's turns 0..n-1")

    new, dur = cols["new_input_tokens"], cols["tool_duration_s"]
    checks = [
        ("new_input_tokens", first & (new < 1), "must be >= 1 on turn 0", "give the first prompt's length"),
        ("new_input_tokens", new < 0, "is negative", "give the tokens the turn adds (>= 0)"),
        ("output_tokens", cols["output_tokens"] < 1, "must be >= 1", "give the generated length"),
        ("tool_duration_s", ~last & np.isnan(dur), "is missing before the last turn", "give the tool's wall time in seconds"),
        ("tool_duration_s", dur < 0, "is negative", "give a duration >= 0"),
        ("tool_duration_s", np.isinf(dur), "is not finite", "give a finite duration"),
    ]
    if "arrival_s" in cols:
        arr = cols["arrival_s"]
        starts = np.flatnonzero(first)
        per_prog = np.repeat(arr[starts], np.diff(np.r_[starts, len(arr)]))  # a NaN fails the check before
        checks += [
            ("arrival_s", ~np.isfinite(arr) | (arr < 0), "must be a finite number >= 0", "give the program's arrival in seconds"),
            ("arrival_s", arr != per_prog, "differs between turns of one program", "give the program's arrival on every row"),
        ]
    if "shared_prefix_tokens" in cols:
        sp = cols["shared_prefix_tokens"]
        checks += [
            ("shared_prefix_tokens", sp < 0, "is negative", "give 0 or more"),
            ("shared_prefix_tokens", first & (sp > new), "exceeds turn 0's new_input_tokens", "the shared prefix is part of the first prompt"),
        ]
    if "reasoning_tokens" in cols:
        rt = cols["reasoning_tokens"]
        checks += [
            ("reasoning_tokens", rt < 0, "is negative", "give 0 or more"),
            ("reasoning_tokens", rt > cols["output_tokens"], "exceeds output_tokens", "reasoning is part of the output"),
        ]
    if "carry" in cols:
        known = np.array([c in CARRY_MODES for c in cols["carry"]])
        if not known.all():
            i = int(np.flatnonzero(~known)[0])
            _fail(cols, i, "carry", f"is {_show(cols['carry'][i])}", f"give one of {', '.join(CARRY_MODES)} (or null: cached)")
        if "reasoning_tokens" not in cols and (cols["carry"] == "reasoning-dropped").any():
            i = int(np.flatnonzero(cols["carry"] == "reasoning-dropped")[0])
            _fail(cols, i, "carry", "is reasoning-dropped but the trace has no reasoning_tokens column",
                  "give each row's reasoning_tokens (`sim trace carry --reasoning-share`)")
    for field, bad, problem, fix in checks:
        if bad.any():
            _fail(cols, int(np.flatnonzero(bad)[0]), field, problem, fix)
    if segments.COLUMN in cols:
        cols[segments.COLUMN] = segments.normalise(cols[segments.COLUMN], new,
                                                   lambda i, field, problem, fix: _fail(cols, i, field, problem, fix))
    # The last turn has no tool call after it.
    dur[last] = np.nan
    cols["tool"][last] = None
    return Columns(cols)


def _hint_columns(cols: dict) -> None:
    """The retention hint columns, normalised in place: numbers with NaN for no hint,
    sessions as text or None; a value out of range is one line naming the row."""
    if "kv_session" in cols:
        cols["kv_session"] = np.array([None if is_nan(t) else str(t) for t in cols["kv_session"]], dtype=object)
    for col, lo, hi, whole in (("kv_priority", 0, 100, True), ("kv_ttl_s", 0, SECONDS_MAX, False)):
        if col not in cols:
            continue
        vals = _numbers(cols[col]).astype(np.float64)
        bad = np.isnan(vals) & ~_missing(cols[col])
        bad |= ~np.isnan(vals) & ~((vals >= lo) & (vals <= hi) & ((vals == np.floor(vals)) | (not whole)))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            _fail(cols, i, col, f"is {_show(cols[col][i])}",
                  "give a whole number 0-100 (or null: no hint)" if whole else "give seconds >= 0 (or null: until evicted)")
        cols[col] = vals


def columns(df) -> Columns:
    """A DataFrame checked (`check`) into columns."""
    return check(_raw(df))


def validate(df):
    """Check a DataFrame trace and return it normalised (dtypes, sorted by program and turn)."""
    return columns(df).frame()


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


def read_columns(name_or_path: str) -> tuple[Columns, dict]:
    """Load and check a trace, read columnar by pyarrow; returns (columns, metadata dict)."""
    path = resolve(name_or_path)
    try:
        table = pq.ParquetFile(path).read()  # pq.read_table goes through pyarrow.dataset, which imports pandas
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise InputError(f"trace {str(path)!r} is not a readable parquet file ({type(e).__name__}); write it with `sim trace gen` or an importer") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    meta = validated(_META, raw or b"{}", f"trace {str(path)!r}: parquet metadata '{META_KEY.decode()}'",
                     "rewrite it as a JSON object (or drop the key)")
    return check({c: _numpy(table.column(c)) for c in table.column_names}), meta


def read_trace(name_or_path: str):
    """Load and check a trace; returns (DataFrame, metadata dict)."""
    cols, meta = read_columns(name_or_path)
    return cols.frame(), meta


def write_trace(df, path: str | os.PathLike, meta: dict) -> Path:
    """Validate and write atomically (temp file + rename): never a half-written trace. A
    path the system refuses is the user's input: one line (InputError)."""
    df = validate(df)
    cols = REQUIRED + [c for c in OPTIONAL if c in df.columns]
    table = pa.Table.from_pandas(df[cols], preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta, sort_keys=True).encode()})
    try:
        return atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    except OSError as e:
        raise InputError(f"cannot write {str(path)!r} ({e.strerror}); give a writable .parquet path") from None


def programs(df):
    """Yield (program_id, rows as a list of dicts) in trace order; used by sim and replay."""
    for pid, g in df.groupby("program_id", sort=False):
        yield pid, g.to_dict("records")


def is_nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))
