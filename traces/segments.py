"""Content segments: what a trace says about *which* tokens a call adds, so that
programs share KV-cache blocks by content, as vLLM does.

Optional trace column `segments`: per row, a list of {"id": str, "tokens": int}
covering the row's `new_input_tokens` in order (their tokens sum to it). Two rows
whose segments have the same id add the same token ids (the first `tokens` of them:
a shorter segment is a prefix of a longer one with the same id). A null entry means
"content unknown": unique to that program and turn. A trace without the column keys
blocks by (program, index) as before; `shared_prefix_tokens` still says how much of
turn 0 every program shares (the routers use it).

Outputs need no ids: decoding is greedy in the real-engine replay, so a call's
output is a function of its prompt, and the simulator names it by the prompt's
content (sim/kv/content.py).

Where segments come from: importers hash the log's text (`text_id`); the synthetic
generators draw them from a sharing model (traces/generate.py `--tasks`); resampling
keeps what sessions share and makes the rest unique per copy (traces/resample.py).
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from agentsim.errors import InputError

COLUMN = "segments"


def text_id(text: str, namespace: str = "") -> str:
    """A stable id for a segment's text (the same text always gets the same id)."""
    return hashlib.blake2b(f"{namespace}\0{text}".encode(), digest_size=8).hexdigest()


def seed_of(segment_id: str) -> int:
    """A stable RNG seed for a segment id: the replay draws its token ids from it."""
    return int.from_bytes(hashlib.blake2b(segment_id.encode(), digest_size=8).digest(), "little")


def is_unknown(segs) -> bool:
    """A null entry (None, or NaN as pandas may write it)."""
    return segs is None or (isinstance(segs, float) and math.isnan(segs))


def objects(values: list) -> np.ndarray:
    """One object per row (np.array would make equal-length lists a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def normalise(column: np.ndarray, new_input: np.ndarray, fail) -> np.ndarray:
    """Check the column row by row and return it as plain lists of {"id", "tokens"} dicts
    (None: content unknown). `fail(i, field, problem, fix)` raises the trace's one-line error."""
    out = []
    for i, segs in enumerate(column):
        if is_unknown(segs):
            out.append(None)
            continue
        if isinstance(segs, (str, bytes, dict)) or not hasattr(segs, "__iter__"):
            fail(i, COLUMN, f"is {type(segs).__name__}, not a list of segments", 'give a list of {"id": str, "tokens": int}, or null')
        row, total = [], 0
        for j, s in enumerate(segs):
            sid = s.get("id") if isinstance(s, dict) else None
            tok = s.get("tokens") if isinstance(s, dict) else None
            if not isinstance(sid, str) or not sid:
                fail(i, f"{COLUMN}[{j}].id", f"is {sid!r}", "give each segment a non-empty string id")
            if isinstance(tok, (bool, np.bool_)) or not isinstance(tok, (int, np.integer)) or tok < 0:
                fail(i, f"{COLUMN}[{j}].tokens", f"is {tok!r}", "give each segment a whole number of tokens >= 0")
            row.append({"id": sid, "tokens": int(tok)})
            total += int(tok)
        if total != int(new_input[i]):
            fail(i, COLUMN, f"covers {total} tokens, not the row's new_input_tokens {int(new_input[i])}",
                 "make the segments' tokens sum to new_input_tokens")
        out.append(row)
    return objects(out)


def scaled(segs, factor: float, target: int) -> list[dict] | None:
    """Segments multiplied by `factor` (floored, so equal segments stay equal), the
    last one taking the rounding so the row still sums to `target`."""
    if is_unknown(segs):
        return None
    out = [{"id": s["id"], "tokens": int(math.floor(s["tokens"] * factor))} for s in segs]
    short = target - sum(s["tokens"] for s in out)
    if out:
        out[-1]["tokens"] += short
        if out[-1]["tokens"] < 0:  # cannot happen with factor <= 1 and target >= the floors' sum
            raise InputError(f"cannot scale segments {segs!r} to {target} tokens")
    elif target:
        return None  # nothing to scale from: unknown content
    return out


def rescale(df, new_input, factor):
    """Set `new_input_tokens` to scaled counts and scale the rows' segments alike
    (`factor`: one number, or one per row); a trace without segments just gets the
    counts. Equal segments scaled by equal factors stay equal, so sharing survives."""
    df = df.assign(new_input_tokens=np.asarray(new_input, dtype=np.int64))
    if COLUMN in df.columns:
        f = np.broadcast_to(np.asarray(factor, dtype=float), (len(df),))
        df[COLUMN] = objects([scaled(s, x, int(n)) for s, x, n in zip(df[COLUMN].tolist(), f, df["new_input_tokens"])])
    return df
