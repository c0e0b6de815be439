"""A real server's periodic stats lines beside the replay of the same run, instant by instant.

    python benchmarks/server_runs_log.py --src DIR [--only ID[,ID]] [--lines]

DIR holds the run folders as benchmarks/server_runs_ground_truth.py reads them (eval/ground_truth
of inference-sim/inference-sim at the commit the runs' URLs name). For each trace run of
benchmarks/data/server_runs.json: every stats line of its vllm.log ("Avg prompt throughput ...,
Running, Waiting, GPU KV cache usage, Prefix cache hit rate", every 10 s while the engine is busy)
beside the replay's numbers at the same instant (the engine view, the table's profile: benchmarks/
server_runs_table.py): calls running (first scheduled, not finished) and waiting (arrived, not yet
scheduled), KV blocks in use (the replay's last sample, taken at most 1 s apart), prompt tokens a
second over the 10 s before (a request's prompt counted at its first token, as vLLM 0.11 counts
it) and output tokens a second (a request's first token at its time, the rest spread evenly to its
last). The log's clock is local time: it is put on the spans' clock by the whole-hour offset whose
Running counts best match the spans' (scheduled = arrival + TTFT - prefill, until arrival + E2E).
Printed per run: how close the counts and rates are over the busy lines, their peaks, and the
prefix cache's hit rate (vLLM 0.11's counts every lookup, a waiting request's repeated ones
included; the replay's: cached prompt tokens of every admission over prompt tokens); --lines: each
line.
"""
from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402

STATS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.](\d+) INFO vllm\.v1\.metrics\.loggers: Engine 000: "
                   r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
                   r"Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: ([\d.]+)%, "
                   r"Prefix cache hit rate: ([\d.]+)%", re.M)
FIELDS = ("prompt_tps", "gen_tps", "running", "waiting", "kv_pct", "hit_pct")
WINDOW_S = 10.0  # vLLM's LoggingStatLogger interval


def stats_lines(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(the lines' local times as if UTC, s; their FIELDS) of a vllm.log."""
    m = STATS.findall(text)
    t = np.array([dt.datetime.strptime(x[0], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
                  + float("0." + x[1]) for x in m])
    return t, np.array([[float(v) for v in x[2:]] for x in m]).reshape(len(m), len(FIELDS))


def real_running(sp: list[dict], at: np.ndarray) -> np.ndarray:
    t = np.array([s["t"] for s in sp])
    sched = t + np.array([s["ttft"] - s["model_prefill"] for s in sp])
    fin = t + np.array([s["e2e"] for s in sp])
    return np.array([int(((sched <= x) & (fin > x)).sum()) for x in at])


def clock_offset(local: np.ndarray, running: np.ndarray, sp: list[dict]) -> int:
    """The whole hours to subtract from the log's local times to put them on the spans' clock."""
    return min(range(-14, 15), key=lambda h: (np.abs(real_running(sp, local - h * 3600) - running).sum(), abs(h)))


def replay_stats(turns, kv, blocks: int, at: np.ndarray, t0: float) -> np.ndarray:
    """The replay's FIELDS (hit rate: NaN) at the instants `at` (the spans' clock; the replay's 0 is t0)."""
    a, sc, ft, fn = (turns[c].to_numpy() + t0 for c in ("arrival", "scheduled", "first_token", "finish"))
    out, prompt = turns["output_tokens"].to_numpy(), turns["prompt_tokens"].to_numpy()
    kvt, kvu = kv["t"].to_numpy() + t0, kv["used_blocks"].to_numpy() / blocks * 100
    rows = []
    for x in at:
        first = (ft > x - WINDOW_S) & (ft <= x)
        lo, hi = np.maximum(ft, x - WINDOW_S), np.minimum(fn, x)
        rest = np.where(fn > ft, np.clip(hi - lo, 0, None) / np.maximum(fn - ft, 1e-12), 0.0) * np.maximum(out - 1, 0)
        k = np.searchsorted(kvt, x, side="right") - 1
        rows.append([prompt[first].sum() / WINDOW_S, (rest.sum() + first.sum()) / WINDOW_S, ((sc <= x) & (fn > x)).sum(),
                     ((a <= x) & (sc > x)).sum(), kvu[k] if k >= 0 else 0.0, np.nan])
    return np.array(rows, dtype=float).reshape(len(rows), len(FIELDS))


def compare(data: dict, run: dict, folder: Path, tmp: Path, lines: bool = False) -> str:
    from benchmarks import server_runs_ground_truth as gt
    from benchmarks import server_runs_table as srt

    text = (folder / "vllm.log").read_text(errors="replace")
    local, real = stats_lines(text)
    if not len(local):
        raise InputError(f"--src: {folder / 'vllm.log'} has no 'Engine 000: Avg prompt throughput' lines")
    sp = gt.spans(folder / "traces.json")
    if any("model_prefill" not in s for s in sp):
        raise InputError(f"--src: {folder / 'traces.json'}: spans without time_in_model_prefill")
    h = clock_offset(local, real[:, 2], sp)
    at = local - h * 3600
    path, _, _ = srt.build_profile(data, run, "engine", tmp)
    res = srt.replay(run, path, "engine", srt.trace_of(run, len(run["workload"]["requests"])))
    turns = res.turns.sort_values("program_id")
    sim = replay_stats(turns, res.kv_usage, res.summary["num_gpu_blocks"], at, sp[0]["t"])
    busy = (real[:, 0] + real[:, 1] + real[:, 2] + real[:, 3] > 0) & (at >= sp[0]["t"])
    r, s = real[busy], sim[busy]
    hit = float(turns["cached_tokens_total"].sum() / turns["prompt_tokens"].sum() * 100)
    out = [f"{run['id']} ({folder.name}; log clock UTC{h:+d} h): {int(busy.sum())} busy stats lines; running real / sim: "
           f"mean {r[:, 2].mean():.2f} / {s[:, 2].mean():.2f}, peak {r[:, 2].max():.0f} / {s[:, 2].max():.0f}, mean |diff| "
           f"{np.abs(r[:, 2] - s[:, 2]).mean():.2f}; waiting: mean {r[:, 3].mean():.2f} / {s[:, 3].mean():.2f}, peak "
           f"{r[:, 3].max():.0f} / {s[:, 3].max():.0f}, mean |diff| {np.abs(r[:, 3] - s[:, 3]).mean():.2f}; KV usage peak "
           f"{r[:, 4].max():.1f}% / {s[:, 4].max():.1f}%; prompt tokens/s mean {r[:, 0].mean():.0f} / {s[:, 0].mean():.0f}; "
           f"output tokens/s mean {r[:, 1].mean():.1f} / {s[:, 1].mean():.1f}; prefix cache hit rate at the end {real[-1, 5]:.1f}% "
           f"(vLLM's, every lookup) / {hit:.1f}% (cached prompt tokens)"]
    if lines:
        out.append("| t (s) | running real / sim | waiting real / sim | KV usage % real / sim | prompt tok/s real / sim | "
                   "output tok/s real / sim |")
        out.append("|---:|---|---|---|---|---|")
        for x, a, b in zip(at[busy] - sp[0]["t"], r, s):
            out.append(f"| {x:.1f} | {a[2]:.0f} / {b[2]:.0f} | {a[3]:.0f} / {b[3]:.0f} | {a[4]:.1f} / {b[4]:.1f} | "
                       f"{a[0]:.0f} / {b[0]:.0f} | {a[1]:.1f} / {b[1]:.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    from benchmarks import server_runs_ground_truth as gt
    from benchmarks import server_runs_table as srt

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="the folder holding the run folders (eval/ground_truth)")
    ap.add_argument("--only", help="comma-separated run ids")
    ap.add_argument("--lines", action="store_true", help="also print every busy stats line beside the replay's")
    args = ap.parse_args(argv)
    try:
        data = srt.load_data(srt.DATA)
        folders = {rid: name for name, (rid, _) in gt.RUNS.items()}
        runs = [r for r in data["runs"] if r["id"] in folders]
        if args.only:
            want = args.only.split(",")
            bad = [x for x in want if x not in folders]
            if bad:
                raise InputError(f"--only: {bad[0]!r} is not a trace run ({', '.join(folders)})")
            runs = [r for r in runs if r["id"] in want]
        missing = [folders[r["id"]] for r in runs if not (Path(args.src) / folders[r["id"]] / "vllm.log").is_file()]
        if missing:
            raise InputError(f"--src {args.src}: no {missing[0]}/vllm.log; give eval/ground_truth of the source")
        with tempfile.TemporaryDirectory() as tmp:
            out = [compare(data, r, Path(args.src) / folders[r["id"]], Path(tmp), args.lines) for r in runs]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
