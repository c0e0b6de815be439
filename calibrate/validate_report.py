"""The report of a validation run (calibrate/validate.py): the clock scale of a repeat
from its clock probes, what each simulated figure is compared with, the ranking on each
side, and the Markdown table."""
from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from sim.hardware.profile import Profile

CLOCK_BAND = 0.02


CLOCKS = 9


def clock_band(before: float, after: float) -> np.ndarray:
    """The clock scales one repeat is simulated on (symmetric: the middle one is the mean
    of the two probe scales)."""
    mid = (before + after) / 2
    return np.linspace(min(before, after, mid * (1 - CLOCK_BAND)), max(before, after, mid * (1 + CLOCK_BAND)), CLOCKS)


def _predicted(row: dict, profile: Profile) -> float:
    return profile.step_time(*(row["features"][f] for f in ("tokens", "seqs", "sum_qk", "sum_k", "sum_q_cached")))


def clock_scale(rows: list[dict], profile: Profile) -> float:
    """Measured clock probes over the profile's prediction of them (each probe is one step:
    a prefill within the token budget, or a decode probe's mean step)."""
    return sum(r["seconds"] for r in rows) / sum(_predicted(r, profile) for r in rows)


def probe_ratios(rows: list[dict], profile: Profile) -> dict[str, float]:
    """Each clock probe's measured over predicted time, by probe: what a scale is made of
    (CHANGELOG.md, "Prefill steps slower in replays than in probes")."""
    return {f"{r['kind']} {r['new']}+{r['prefix']} x{r['batch']}": round(r["seconds"] / _predicted(r, profile), 4)
            for r in rows}


def late_arrivals(turns: pd.DataFrame, arrived: dict[str, float], t0: float, steps: pd.DataFrame) -> pd.DataFrame:
    """Per call: when it reached the scheduler after its due time (tool end or program
    arrival), and how much of that the step in progress explains (vLLM takes requests
    between steps; the simulator models that) -- the rest is client and input latency."""
    arrived = {k.rsplit("-", 1)[0]: v for k, v in arrived.items()}  # vLLM appends "-<8 random chars>" to ids
    rid = turns["program_id"].astype(str) + "#" + turns["turn"].astype(str)
    reached = rid.map(arrived).to_numpy(float) - t0
    due = turns["arrival"].to_numpy(float)
    starts = steps["start"].to_numpy(float) - t0
    ends = starts + steps["seconds"].to_numpy(float)
    i = np.searchsorted(starts, due, side="right") - 1  # the last step that started before the call was due
    in_step = np.where((i >= 0) & (ends[np.clip(i, 0, None)] > due), ends[np.clip(i, 0, None)] - due, 0.0)
    return turns.assign(reached=reached, late_s=reached - due, late_step_s=in_step,
                        late_rest_s=reached - due - in_step)


def step_check(steps: pd.DataFrame, profile: Profile) -> dict:
    """The profile's step model on the real engine's own steps: where the time went."""
    # a step log saved before mixed_k was logged (real_steps_*.parquet) counts no mixed decodes
    cols = steps.reindex(columns=["tokens", "seqs", "sum_qk", "sum_k", "sum_qc", "mixed_k"], fill_value=0.0)
    pred = np.array([profile.step_time(*row) for row in cols.itertuples(index=False)])
    real = steps["seconds"].to_numpy()
    return {"steps": int(len(steps)), "busy_s": float(real.sum()), "model_busy_s": float(pred.sum()),
            "step_model_error": float(pred.sum() / real.sum() - 1) if len(real) else float("nan")}


def _hit_ratio(turns: pd.DataFrame) -> float:
    return float(turns["cached_tokens"].sum() / turns["prompt_tokens"].sum())


PIN_KEYS = ("pins", "pins_hit", "pins_expired", "pins_victim", "pins_discarded")


def _mean(xs) -> float:
    return float(np.mean(list(xs)))


def compare_policy(runs: list, bands: list, unscaled: list, profile: Profile) -> dict:
    """runs[i] = (turns, progs, info) of repeat i on the real engine; bands[i] its
    simulations on the band of probe-scaled clocks (clock_band); unscaled[i] on the band
    around the profile as calibrated. Simulated figures are means over every clock."""
    real_jct = [float(p["jct"].mean()) for _, p, _ in runs]
    sims = [s for band in bands for s in band]
    sim_jct = [s.summary["mean_jct"] for s in sims]
    mean_real, mean_sim = _mean(real_jct), _mean(sim_jct)
    mapes = []
    for (_, rp, _), band in zip(runs, bands):
        for s in band:
            both = rp.merge(s.programs[["program_id", "jct"]], on="program_id", suffixes=("_real", "_sim"))
            mapes.append(float(np.mean(np.abs(both["jct_sim"] - both["jct_real"]) / both["jct_real"])))
    unscaled = [s for band in unscaled for s in band]
    late = pd.concat([t for t, _, _ in runs])
    return {
        "real": {"mean_jct": mean_real, "p90_jct": _mean(np.percentile(p["jct"], 90) for _, p, _ in runs),
                 "mean_jct_runs": real_jct, "spread": (max(real_jct) - min(real_jct)) / mean_real,
                 "cache_hit_ratio": _mean(_hit_ratio(t) for t, _, _ in runs),
                 "peak_kv_usage": _mean(i["peak_kv_usage"] for _, _, i in runs),
                 "mean_kv_usage": _mean(i["mean_kv_usage_per_step"] for _, _, i in runs),
                 "preemptions": _mean(i["preemptions"] for _, _, i in runs),
                 **{k: _mean(i.get(k, 0) for _, _, i in runs) for k in PIN_KEYS},
                 "wall_s": _mean(i["wall_s"] for _, _, i in runs)},
        "sim": {"mean_jct": mean_sim, "mean_jct_clocks": [min(sim_jct), max(sim_jct)],  # over the band: its sensitivity
                "p90_jct": _mean(s.summary["p90_jct"] for s in sims),
                "cache_hit_ratio": _mean(s.summary["cache_hit_ratio"] for s in sims),
                "peak_kv_usage": _mean(s.summary["peak_kv_usage"] for s in sims),
                "mean_kv_usage": _mean(s.summary["mean_kv_usage"] for s in sims),
                "preemptions": _mean(s.summary["preemptions"] for s in sims),
                **{k: _mean(s.summary.get(k, 0) for s in sims) for k in PIN_KEYS}},
        "mean_jct_error": (mean_sim - mean_real) / mean_real,
        "p90_jct_error": None,  # filled below
        "program_jct_mape": _mean(mapes),
        "sim_unscaled_mean_jct": _mean(s.summary["mean_jct"] for s in unscaled),
        "unscaled_error": (_mean(s.summary["mean_jct"] for s in unscaled) - mean_real) / mean_real,
        "time_scale": _mean(i["time_scale"] for _, _, i in runs),
        "time_scale_runs": [[round(i["scale_before"], 4), round(i["scale_after"], 4)] for _, _, i in runs],
        "clock_probe_runs": [{"before": probe_ratios(i["clock_before"], profile), "after": probe_ratios(i["clock_after"], profile)}
                             for _, _, i in runs],
        # the replay's own steps against the unscaled step model: reported, never used
        "replay_step_model_error": _mean(step_check(i["steps"], profile)["step_model_error"] for _, _, i in runs),
        "late_arrival_ms": {"median": 1e3 * float(late["late_s"].median()), "p90": 1e3 * float(late["late_s"].quantile(0.9)),
                            "step_in_progress_median": 1e3 * float(late["late_step_s"].median()),
                            "rest_median": 1e3 * float(late["late_rest_s"].median()),
                            "rest_p90": 1e3 * float(late["late_rest_s"].quantile(0.9))},
    }


def rank(rows: dict, noise: dict | None = None) -> dict:
    """Rankings by mean JCT on each side; Kendall's tau over the pairs whose real gap
    exceeds twice the real noise: the larger run-to-run spread of the two, in seconds, and
    never less than CLOCK_BAND of the larger mean, the placement of the simulated side's
    clock (two repeats can agree by chance; a 2.5% gap was then ordered by clock draw)."""
    real = sorted(rows, key=lambda p: rows[p]["real"]["mean_jct"])
    sim = sorted(rows, key=lambda p: rows[p]["sim"]["mean_jct"])
    pairs, concordant = [], 0
    for a, b in combinations(rows, 2):
        ra, rb = rows[a]["real"], rows[b]["real"]
        noise_s = max(ra["spread"] * ra["mean_jct"], rb["spread"] * rb["mean_jct"],
                      CLOCK_BAND * max(ra["mean_jct"], rb["mean_jct"]))
        gap = ra["mean_jct"] - rb["mean_jct"]
        if abs(gap) > 2 * noise_s:
            same = np.sign(gap) == np.sign(rows[a]["sim"]["mean_jct"] - rows[b]["sim"]["mean_jct"])
            concordant += bool(same)
            pairs.append({"pair": [a, b], "real_gap_s": gap, "noise_s": noise_s, "sim_agrees": bool(same)})
    n = len(pairs)
    return {"ranking_real": real, "ranking_sim": sim, "ranking_agrees": real == sim, "separable_pairs": pairs,
            "kendall_tau": (2 * concordant - n) / n if n else None}


def render_markdown(rep: dict) -> str:
    """One shape's table (rep from run_validation)."""
    lines = ["| policy | real mean JCT (s) | spread | sim mean JCT (s) | error | sim unscaled (s) | unscaled error | "
             "real p90 | sim p90 | per-program MAPE | hit ratio real / sim | pins hit/expired/dropped real | sim | "
             "KV peak real / sim | preemptions real / sim | late arrival ms (median, rest) |",
             "|" + "---|" * 16]
    for pol, r in rep["policies"].items():
        R, S = r["real"], r["sim"]

        def pins(d):
            return f"{d['pins_hit']:.0f}/{d['pins_expired']:.0f}/{d['pins_victim'] + d['pins_discarded']:.0f}"

        la = r["late_arrival_ms"]
        lines.append(
            f"| {pol} | {R['mean_jct']:.2f} | {100 * R['spread']:.1f}% | {S['mean_jct']:.2f} | {100 * r['mean_jct_error']:+.1f}% | "
            f"{r['sim_unscaled_mean_jct']:.2f} | {100 * r['unscaled_error']:+.1f}% | {R['p90_jct']:.2f} | {S['p90_jct']:.2f} | "
            f"{100 * r['program_jct_mape']:.1f}% | {R['cache_hit_ratio']:.3f} / {S['cache_hit_ratio']:.3f} | "
            f"{pins(R)} | {pins(S)} | {100 * R['peak_kv_usage']:.0f}% / {100 * S['peak_kv_usage']:.0f}% | "
            f"{R['preemptions']:.0f} / {S['preemptions']:.0f} | {la['median']:.1f}, {la['rest_median']:.1f} |")
    lines.append("")
    tau = rep["kendall_tau"]
    lines.append(f"ranking by mean JCT: real {' < '.join(rep['ranking_real'])}; sim {' < '.join(rep['ranking_sim'])} "
                 f"({'agrees' if rep['ranking_agrees'] else 'differs'}); Kendall's tau over the "
                 f"{len(rep['separable_pairs'])} pairs the real engine separates beyond twice its noise: "
                 f"{'n/a' if tau is None else f'{tau:.2f}'}")
    wrong = [p["pair"] for p in rep["separable_pairs"] if not p["sim_agrees"]]
    if wrong:
        lines.append("pairs the simulator orders differently: " + ", ".join(f"{a} vs {b}" for a, b in wrong))
    return "\n".join(lines)
