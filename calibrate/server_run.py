"""`sim validate --server-run RESULT.json`: judge a profile on a user's own vLLM server run.

The input is the result file `vllm bench serve --save-result --save-detailed` writes
(vllm/benchmarks/serve.py, vLLM 0.32; older `benchmarks/benchmark_serving.py` wrote the
same per-request lists without `latencies`/`start_times`). Fields read, per request:
`input_lens`, `output_lens` (tokens), `ttfts` (s), `itls` (list of s), `latencies` (s;
else ttft + sum(itls)), `start_times` (s, the client's clock when the request was sent;
without them only a `request_rate` of "inf", all sent at once, has known arrivals),
`errors` (a failed request, output length 0, is left out on both sides, as vLLM's
metrics leave it out); and `model_id`.

The same requests are replayed in the simulator: one program of one turn per request,
with its prompt and output lengths, arriving at its start time (relative to the first).
A benchmark's requests are independent, so no agent trace is involved (`--trace` is
refused with `--server-run`); a random dataset's prompts share no prefix, and the
simulator's prompts share none either. The metrics are vLLM's (`vllm bench serve`'s
names and definitions: ttft, tpot, itl, e2el; mean, median, p99; ms), computed the same
way on both sides, and the error of the simulator is (sim - real) / real, unscaled. A
profile with a `server` section is read as a client sees it (`--metrics-at client`: the
API server's time added), one without as the engine sees it (the client's extra time
then counts as the simulator's error).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentsim.errors import InputError
from sim.run.metrics import ms_stats

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p99")


@dataclass
class ServerRun:
    """The successful requests of a `vllm bench serve` result, in send order."""

    model_id: str
    arrivals: np.ndarray  # s from the first request sent
    input_lens: np.ndarray
    output_lens: np.ndarray
    ttfts: np.ndarray  # s
    itls: list[list[float]]  # s, per request
    latencies: np.ndarray  # s
    failed: int


def _bad(path, what: str) -> InputError:
    return InputError(f"--server-run {path}: {what}")


def read_result(path: str | Path) -> ServerRun:
    """A `vllm bench serve` result file, checked; every problem one InputError line."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise _bad(path, f"cannot read it ({e.strerror}); give the JSON `vllm bench serve --save-result` wrote") from None
    except ValueError as e:
        raise _bad(path, f"not JSON ({e}); give the file `vllm bench serve --save-result --save-detailed` wrote") from None
    if not isinstance(raw, dict):
        raise _bad(path, f"a JSON {type(raw).__name__}, not a `vllm bench serve` result object")
    if "model_id" not in raw:
        raise _bad(path, "no 'model_id': not a `vllm bench serve` result file")
    need = ("input_lens", "output_lens", "ttfts", "itls")
    if any(k not in raw for k in need):
        raise _bad(path, "no per-request data (input_lens, output_lens, ttfts, itls); rerun `vllm bench serve` "
                         "with --save-result --save-detailed")
    n = len(raw["ttfts"]) if isinstance(raw["ttfts"], list) else -1
    for k in need + tuple(k for k in ("latencies", "start_times", "errors") if k in raw):
        if not isinstance(raw[k], list) or len(raw[k]) != n:
            raise _bad(path, f"'{k}' is not a list of {n} per-request values like 'ttfts'; the file is malformed")
    if n == 0:
        raise _bad(path, "holds no requests")
    try:
        inp = np.array(raw["input_lens"], dtype=float)
        out = np.array(raw["output_lens"], dtype=float)
        ttft = np.array(raw["ttfts"], dtype=float)
        itls = [[float(x) for x in r] for r in raw["itls"]]
        lat = (np.array(raw["latencies"], dtype=float) if "latencies" in raw
               else np.array([t + sum(r) for t, r in zip(ttft, itls)]))
        start = np.array(raw["start_times"], dtype=float) if "start_times" in raw else None
    except (TypeError, ValueError) as e:
        raise _bad(path, f"a per-request value is not a number ({e}); the file is malformed") from None
    errors = raw.get("errors") or [""] * n
    ok = np.array([not e for e in errors]) & (out > 0)
    if not ok.any():
        raise _bad(path, f"none of its {n} requests succeeded; nothing to compare")
    cols = [inp, out, ttft, lat] + ([start] if start is not None else [])
    if not all(np.isfinite(c[ok]).all() and (c[ok] >= 0).all() for c in cols) or \
            not all(math.isfinite(x) and x >= 0 for i in np.flatnonzero(ok) for x in itls[i]):
        raise _bad(path, "a per-request time or length is negative or not finite; the file is malformed")
    if (inp[ok] < 1).any() or (inp[ok] != np.round(inp[ok])).any() or (out[ok] != np.round(out[ok])).any():
        raise _bad(path, "input_lens/output_lens are not whole token counts >= 1; the file is malformed")
    if start is None:
        if str(raw.get("request_rate")) != "inf":
            raise _bad(path, f"no 'start_times' (a bench older than vLLM 0.11?) and request_rate {raw.get('request_rate')!r} "
                             "is not 'inf': the arrivals are unknown; rerun with a newer `vllm bench serve`")
        start = np.zeros(n)
    idx = np.flatnonzero(ok)
    idx = idx[np.argsort(start[idx], kind="stable")]
    return ServerRun(model_id=str(raw["model_id"]), arrivals=start[idx] - start[idx].min(),
                     input_lens=inp[idx].astype(int), output_lens=out[idx].astype(int), ttfts=ttft[idx],
                     itls=[itls[i] for i in idx], latencies=lat[idx], failed=int(n - ok.sum()))


def _model_key(name: str) -> str:
    return name.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1].lower()


def check_model(run: ServerRun, profile, path) -> None:
    """The result's model must be the profile's (compared by last path component, case-blind)."""
    mine = str(profile.model.get("name", ""))
    if _model_key(run.model_id) != _model_key(mine):
        raise _bad(path, f"a run of model {run.model_id!r}, but profile {profile.name!r} is of {mine!r}; "
                         "give --profile of the served model")


def real_metrics(run: ServerRun) -> dict[str, dict[str, float]]:
    """vLLM's request metrics of the run (ms), as `vllm bench serve` computes them."""
    multi = run.output_lens > 1
    itl = np.array([x for r in run.itls for x in r], dtype=float)
    return sim_metrics({**ms_stats("ttft", run.ttfts), **ms_stats("itl", itl), **ms_stats("e2el", run.latencies),
                        **ms_stats("tpot", (run.latencies[multi] - run.ttfts[multi]) / (run.output_lens[multi] - 1))})


def sim_metrics(summary: dict) -> dict[str, dict[str, float | None]]:
    """The metrics of a summary (sim/run/metrics.request_metrics's keys) by metric and
    statistic. The simulator keeps no per-token times: its ITL has a mean only."""
    return {m: {s: summary.get(f"{s}_{m}_ms") for s in STATS} for m in METRICS}


def trace_of(run: ServerRun):
    """One program of one turn per request, in send order."""
    import pandas as pd

    n = len(run.arrivals)
    return pd.DataFrame({"program_id": [f"r{i:06d}" for i in range(n)], "turn": np.zeros(n, dtype=np.int64),
                         "new_input_tokens": run.input_lens.astype(np.int64),
                         "output_tokens": run.output_lens.astype(np.int64), "tool": [None] * n,
                         "tool_duration_s": np.full(n, np.nan), "arrival_s": run.arrivals})


def simulate_run(run: ServerRun, profile_name: str | None, path, engine: str = "simpy") -> tuple[dict, object]:
    """Replay the run's requests on the profile; (summary, profile)."""
    from sim.hardware.profile import load_profile
    from sim.run.config import EngineLimits, SimConfig, build_run, execute

    profile = load_profile(profile_name)
    check_model(run, profile, path)
    too_long = int(np.max(run.input_lens + run.output_lens))
    if too_long > profile.engine.max_model_len:
        raise _bad(path, f"a request of {too_long} tokens (prompt + output) exceeds max_model_len "
                         f"{profile.engine.max_model_len} of profile {profile.name!r}")
    view = "client" if profile.server is not None else "engine"
    cfg = SimConfig(engine=EngineLimits(profile=profile_name, scheduler=engine, metrics_at=view))
    built = build_run(cfg, trace=trace_of(run), arrivals=run.arrivals)
    return execute(built).summary, profile


def compare(real: dict, sim: dict) -> list[dict]:
    """Rows metric, stat, real_ms, sim_ms, error_pct ((sim - real) / real; None where either lacks it)."""
    rows = []
    for m in METRICS:
        for s in STATS:
            r, x = real[m][s], sim[m][s]
            err = (x - r) / r * 100 if r and x is not None else None
            rows.append({"metric": m, "stat": s, "real_ms": r, "sim_ms": x, "error_pct": err})
    return rows


def render(rows: list[dict], header: str) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    lines = [header, "", "| metric | stat | real (ms) | sim (ms) | error |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['metric']} | {r['stat']} | {f(r['real_ms'], '.2f')} | {f(r['sim_ms'], '.2f')} | "
              f"{f(r['error_pct'], '+.1f')}{'' if r['error_pct'] is None else '%'} |" for r in rows]
    return "\n".join(lines)


def validate_server_run(path, profile_name: str | None, engine: str = "simpy") -> dict:
    """The whole comparison as a JSON-able report."""
    run = read_result(path)
    summary, profile = simulate_run(run, profile_name, path, engine)
    rows = compare(real_metrics(run), sim_metrics(summary))
    return {"result": str(path), "model_id": run.model_id, "profile": profile.name, "requests": len(run.arrivals),
            "failed_left_out": run.failed, "span_s": float(run.arrivals.max()), "scheduler": engine,
            "view": summary.get("metrics_at", "engine"), "rows": rows}
