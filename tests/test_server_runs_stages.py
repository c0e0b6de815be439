"""The real vLLM 0.15.1 H100 runs of inference-sim/training (workload kind stages): their import
(benchmarks/server_runs_inference_perf.py), the requests synthesized from the stated spec and the
judging per stage and beside the peers (benchmarks/server_runs_table.py)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import server_runs_inference_perf as ip  # noqa: E402
from benchmarks import server_runs_table as srt  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "server_runs.json"


def _staged():
    """The default_args runs (the campaign's other runs: tests/test_server_runs_campaign.py)."""
    d = srt.load_data(DATA)
    return d, [r for r in d["runs"] if r["workload"]["kind"] == "stages" and r["source"] == ip.SOURCE]


def test_the_runs_are_the_sources_active_ones_with_their_stated_settings():
    d, runs = _staged()
    assert len(runs) == 13
    assert {(r["model"], r["tp"]) for r in runs} == {("llama2-7b", 1), ("llama2-70b", 4), ("mixtral-8x7b", 2), ("codellama-34b", 2)}
    for r in runs:
        assert ip.COMMIT in r["url"] and r["vllm_version"] == "0.15.1"
        e = r["engine"]
        assert (e["max_num_batched_tokens"], e["max_num_seqs"], e["max_model_len"]) == (2048, 128, 4096)
        assert e["num_gpu_blocks"] is None and e["prefix_caching"] and e["enable_chunked_prefill"] and e["async_scheduling"]
        for st, m in zip(r["workload"]["stages"], r["measured"]["stages"]):
            assert m["failures"] <= ip.OVERLOAD * (m["requests"] + m["failures"])
            assert m["requests"] + m["failures"] == int(st["rate"] * st["duration"])
            c = m["client"]
            assert 0 < c["ttft_ms"]["mean"] < c["ttft_ms"]["p99"] and 0 < c["e2el_ms"]["mean"] < c["e2el_ms"]["p99"]
    left = next(x for x in d["not_judged"] if "inference-sim/training" in x["url"])
    assert all(f"-{p}-reasoning" in left["what"] for p in ("llama-2-7b-tp1", "llama-2-70b-hf-tp4", "mixtral-8x7b-v0-1-tp2"))


def test_the_zoo_prices_llama2_70b_from_measured_kernels_and_mixtral_by_roofline(tmp_path):
    d, runs = _staged()
    which = {r["model"]: srt.build_profile(d, r, "client", tmp_path)[1] for r in runs}
    assert which == {"llama2-7b": "measured", "llama2-70b": "measured", "codellama-34b": "measured", "mixtral-8x7b": "roofline"}
    from sim.hardware.model_shape import param_counts
    from sim.hardware.roofline import find_model

    for name, billions in (("llama2-70b", 68.98), ("mixtral-8x7b", 46.70)):
        spec = find_model(name)[1]
        assert spec["num_params"] == param_counts(spec)["total"] and round(spec["num_params"] / 1e9, 2) == billions


def test_a_stage_is_synthesized_as_inference_perf_sends_it():
    _, runs = _staged()
    run = next(r for r in runs if r["id"] == "ip-h100-tp1-llama2-7b-codegen")
    w, st = run["workload"], run["workload"]["stages"][1]
    t = srt.stage_trace(run, 1)
    pd_ = pytest.importorskip("pandas")
    pd_.testing.assert_frame_equal(t, srt.stage_trace(run, 1))  # seeded
    assert not t["new_input_tokens"].equals(srt.stage_trace(run, 0, len(t))["new_input_tokens"])  # each stage its own draw
    n = int(st["rate"] * st["duration"])
    a = t["arrival_s"].to_numpy()
    assert len(t) == n and np.all(np.diff(a) >= 0) and a[-1] == pytest.approx(st["duration"])  # gaps rescaled to the duration
    gaps = np.diff(a)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)  # exponential gaps, not evenly spaced
    count = w["num_groups"] * w["num_prompts_per_group"]
    segs = [tuple((s["id"], s["tokens"]) for s in x) for x in t["segments"]]
    assert len(set(segs)) == count and all(segs[i] == segs[i + count] for i in range(n - count))  # prompts cycle
    assert {s[0] for s in segs} == {(f"sys{g}", w["system_prompt_len"]) for g in range(w["num_groups"])}
    p = t["new_input_tokens"].to_numpy()
    assert all(sum(x for _, x in s) == k for s, k in zip(segs, p))
    assert st["prompt_len"]["min"] <= p.min() and p.max() <= st["prompt_len"]["max"]
    assert p.mean() == pytest.approx(st["prompt_len"]["mean"], rel=0.01)
    assert set(t["output_tokens"]) == {w["output_len"]}
    assert len(srt.stage_trace(run, 1, 50)) == 50


def test_a_quick_stage_run_is_judged_per_stage_against_the_clients_statistics(tmp_path):
    _, runs = _staged()
    run = next(r for r in runs if r["id"] == "ip-h100-tp1-llama2-7b-codegen")
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "benchmarks/server_runs_table.py", "--only", run["id"], "--quick", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())
    assert {(r["stage"], r["metric"], r["stat"]) for r in rows} == {(i, m, s) for i in (0, 1) for m, s in srt.STAGE_METRICS}
    by = {(r["stage"], r["metric"], r["stat"]): r for r in rows}
    for i, m in enumerate(run["measured"]["stages"]):
        c = m["client"]
        assert by[(i, "ttft", "p99")]["real_ms"] == c["ttft_ms"]["p99"] and by[(i, "e2el", "mean")]["real_ms"] == c["e2el_ms"]["mean"]
        tpot = by[(i, "tpot", "mean")]
        assert tpot["real_ms"] == pytest.approx((c["e2el_ms"]["mean"] - c["ttft_ms"]["mean"]) / (run["workload"]["output_len"] - 1))
        assert tpot["sim_ms"] == pytest.approx((by[(i, "e2el", "mean")]["sim_ms"] - by[(i, "ttft", "mean")]["sim_ms"])
                                               / (run["workload"]["output_len"] - 1))
        assert by[(i, "ttft", "mean")]["requests"] == int(run["workload"]["stages"][i]["rate"] * run["workload"]["stages"][i]["duration"]) // 4
    for r in rows:
        assert r["view"] == "client" and r["profile"] == "measured" and np.isfinite(r["error_pct"])
        assert r["error_pct"] == pytest.approx((r["sim_ms"] - r["real_ms"]) / r["real_ms"] * 100)
        assert r["hit_ratio"] > 0.8 and 0 < r["peak_kv_usage"] < 1  # recurring prompts hit whole; the pool is far from full
    assert "inference-perf stages" in p.stdout and f"| {run['id']} |" in p.stdout


def _rows(rid, stages):
    """Synthetic judged rows: stage -> (real requests, {metric: (real, sim)})."""
    return [{"kind": "stages", "run": rid, "stage": i, "metric": m, "stat": "mean", "real_ms": real, "sim_ms": sim,
             "error_pct": (sim - real) / real * 100, "real_requests": n}
            for i, (n, d) in stages.items() for m, (real, sim) in d.items()]


def test_the_whole_run_weighs_its_stages_by_their_requests_and_sits_beside_the_peers():
    rows = _rows("x", {0: (100, {"e2el": (1000.0, 1100.0), "ttft": (50.0, 40.0)}), 1: (300, {"e2el": (2000.0, 2000.0), "ttft": (60.0, 60.0)})})
    whole = srt.whole_run(rows, [{"id": "x"}])["x"][-1]
    assert whole["e2el"] == pytest.approx(100 * (100 * 100) / (100 * 1000 + 300 * 2000))
    assert whole["ttft"] == pytest.approx(100 * (-10 * 100) / (100 * 50 + 300 * 60))
    peers = [{"stage": -1, "simulator": "vidur", "e2e_mean_pct": -2.4, "ttft_mean_pct": -13.6},
             {"stage": 0, "simulator": "blis-evolved", "e2e_mean_pct": 25.6, "ttft_mean_pct": None}]
    text = srt.render_peers(rows, [{"id": "x", "peers": peers}])
    line = next(x for x in text.splitlines() if x.startswith("| x | whole run |"))
    assert f"{whole['e2el']:+.1f}% / {whole['ttft']:+.1f}%" in line and "-2.4% / -13.6%" in line
    assert "| x | 0 | +10.0% / -20.0% | - | +25.6% / - |" in text
    assert srt.render_peers(rows, [{"id": "x", "peers": []}]).count("\n") == 2  # header, rule, the mean row only


def test_the_stored_peer_errors_name_their_file_at_a_commit():
    _, runs = _staged()
    peered = [r for r in runs if r.get("peers")]
    assert len(peered) >= 8
    for r in peered:
        for p in r["peers"]:
            assert p["simulator"] in srt.PEER_NAMES and p["stage"] in (-1, *range(len(r["measured"]["stages"])))
            assert any(p["file"] == f"{ip.PEER_REPO}/{c}/{f}" for c, f in ip.PEER_FILES)
            assert np.isfinite(p["e2e_mean_pct"])


def _fixture(tmp_path: Path, failed: int = 0) -> Path:
    """A checkout with one run: exp-config, resolved config and one stage's metrics."""
    run = tmp_path / "default_args" / "20260101-000000-llama-2-7b-tp1-codegen"
    (run / "results").mkdir(parents=True)
    (run / "exp-config.yaml").write_text("model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\nmax_model_len: 4096\n"
                                         "max_num_batched_tokens: 2048\nmax_num_seqs: 128\n")
    (run / "results" / "config.yaml").write_text(
        "data:\n  type: shared_prefix\n  shared_prefix:\n    num_groups: 2\n    num_prompts_per_group: 3\n    system_prompt_len: 10\n"
        "    question_len: 20\n    output_len: 7\nload:\n  type: constant\n  stages:\n  - rate: 2.0\n    duration: 5\n")
    stat = lambda v: {k: v for k in ip.PROMPT_STATS}  # noqa: E731
    lat = lambda v: {"mean": v, "p99": 2 * v}  # noqa: E731
    m = {"load_summary": {"achieved_rate": 2.0},
         "successes": {"count": 10 - failed, "latency": {"time_to_first_token": lat(0.02), "request_latency": lat(0.5),
                                                         "time_per_output_token": lat(0.04), "inter_token_latency": lat(0.04)},
                       "prompt_len": stat(31.0), "output_len": {"mean": 6.0, "median": 7.0, "min": 0.0}},
         "failures": {"count": failed}}
    (run / "results" / "stage_0_lifecycle_metrics.json").write_text(json.dumps(m))
    (run / "results" / "summary_lifecycle_metrics.json").write_text(json.dumps(m))
    return tmp_path


def test_the_import_takes_the_resolved_spec_and_the_stage_statistics(tmp_path):
    src = ip.Source(_fixture(tmp_path))
    (name,) = src.runs()
    run, why = ip.import_run(src, name)
    assert why == "" and run["id"] == "ip-h100-tp1-llama2-7b-codegen" and run["model"] == "llama2-7b"
    w = run["workload"]
    assert (w["kind"], w["num_groups"], w["num_prompts_per_group"], w["system_prompt_len"], w["output_len"]) == ("stages", 2, 3, 10, 7)
    assert w["stages"] == [{"rate": 2.0, "duration": 5.0, "prompt_len": {k: 31.0 for k in ip.PROMPT_STATS}}]
    c = run["measured"]["stages"][0]["client"]
    assert c["ttft_ms"] == {"mean": 20.0, "p99": 40.0} and c["e2el_ms"] == {"mean": 500.0, "p99": 1000.0}
    t = srt.stage_trace(run, 0)
    assert len(t) == 10 and set(t["new_input_tokens"]) == {31}


def test_an_overloaded_run_is_left_out_and_a_bad_source_refused(tmp_path):
    src = ip.Source(_fixture(tmp_path / "a", failed=2))
    run, why = ip.import_run(src, src.runs()[0])
    assert run is None and "2 of 10 requests failed" in why
    p = subprocess.run([sys.executable, "benchmarks/server_runs_inference_perf.py", "--src", str(tmp_path / "none"),
                        "--data", str(tmp_path / "x.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--src" in p.stderr and not (tmp_path / "x.json").exists()


def test_the_stage_runs_dense_models_have_h100_fits_at_their_tp_and_mixtral_says_why_not():
    from sim.hardware import measured_kernels as mk

    _, runs = _staged()
    for model, tp in {(r["model"], r["tp"]) for r in runs if r["model"] != "mixtral-8x7b"}:
        fit = mk.step_fit("H100", model, tp)
        assert fit is not None and all(v["mape_pct"] <= 10 for v in fit["heldout"].values()), (model, tp)
    missing = json.loads((ROOT / "sim" / "hardware" / "specs" / "measured_kernels.json").read_text())["gpus"]["H100"]["missing"]
    assert "aiconfigurator" in missing["mixtral-8x7b"]


def test_a_runs_file_that_cannot_be_read_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "runs.json"
    bad.write_text("{not json")
    p = subprocess.run([sys.executable, "benchmarks/server_runs_inference_perf.py", "--src", str(_fixture(tmp_path)),
                        "--data", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--data" in p.stderr and bad.read_text() == "{not json"


def test_repeats_of_one_experiment_are_grouped_and_their_spread_stated():
    d = srt.load_data(srt.DATA)
    groups = [sorted(r["id"] for r in g) for g in srt.repeats(d["runs"])]
    # the campaign's e29 repeats the default_args Mixtral run exactly; runs differing in one setting are not repeats
    assert ["ip-h100-tp2-mixtral-8x7b-general", "ip-h100-tp2-mixtral-8x7b-general-e29"] in groups
    assert not any("ip-h100-tp1-llama3.1-8b-general-e22" in g for g in groups)  # budget 1024, not e16's 2048
    a, b = (next(r for r in d["runs"] if r["id"] == i) for i in ("ip-h100-tp2-mixtral-8x7b-general",
                                                                  "ip-h100-tp2-mixtral-8x7b-general-e29"))
    rows = [{"kind": "stages", "run": r["id"], "stage": 0, "metric": "ttft", "stat": "p99", "real_ms": real, "sim_ms": 70.0,
             "profile": "roofline"} for r, real in ((a, 100.0), (b, 250.0))]
    note = srt.repeats_note(rows, [a, b])
    assert "stage 0 ttft p99 100.0-250.0 ms (+150%; sim 70.0)" in note and "under 22%" in note
    assert srt.repeats_note(rows, [a]) == ""  # one run repeats nothing


def test_the_first_stages_tail_is_counted_against_the_seconds():
    d = srt.load_data(srt.DATA)
    runs = [r for r in d["runs"] if r["workload"]["kind"] == "stages"]
    note = srt.warmup_note(runs)
    pairs = [r for r in runs if len(r["measured"]["stages"]) > 1]
    heavier = sum(r["measured"]["stages"][0]["client"]["ttft_ms"]["p99"] > r["measured"]["stages"][1]["client"]["ttft_ms"]["p99"]
                  for r in pairs)
    assert f"in {heavier} of {len(pairs)} runs" in note and heavier > len(pairs) / 2  # more than half: not load
    one = json.loads(json.dumps(pairs[0]))
    one["measured"]["stages"][0]["client"]["ttft_ms"]["p99"] = one["measured"]["stages"][1]["client"]["ttft_ms"]["p99"] + 1
    assert "in 1 of 1 runs" in srt.warmup_note([one]) and srt.warmup_note([]) == ""


def test_a_stage_whose_simulated_ttft_has_a_tail_is_rerun_on_other_draws_and_with_the_cap_lifted(monkeypatch, tmp_path):
    """tail_note picks the stages whose simulated p99 TTFT is over twice the mean, and simulates each again on two
    other arrival draws and with max_num_seqs lifted, the real p99 beside them."""
    d, runs = _staged()
    run = next(r for r in runs if r["id"] == "ip-h100-tp2-mixtral-8x7b-general")
    rows = [{"kind": "stages", "run": run["id"], "stage": i, "metric": "ttft", "stat": st, "sim_ms": v, "real_ms": 100.0 + i}
            for i, (mean, p99) in enumerate(((60.0, 110.0), (70.0, 300.0))) for st, v in (("mean", mean), ("p99", p99))]
    seen = []

    def fake_simulate(r, path, view, trace):
        seen.append((r["workload"]["seed"], r["engine"]["max_num_seqs"], len(trace)))
        return {"p99_ttft_ms": 10.0 * len(seen)}

    monkeypatch.setattr(srt, "simulate", fake_simulate)
    note = srt.tail_note(d, [run], rows, tmp_path)
    seed, stage1 = run["workload"]["seed"], len(srt.stage_trace(run, 1))
    assert seen == [(seed + 1, 128, stage1), (seed + 2, 128, stage1), (seed, srt.TAIL_SEQS, stage1)]  # stage 0 is no tail
    assert f"{run['id']} stage 1 (max_num_seqs 128): real 101, sim 300 (other draws 10, 20; cap lifted 30)" in note
    assert "stage 0" not in note and run["workload"]["seed"] == seed and run["engine"]["max_num_seqs"] == 128  # run untouched


def test_mixtrals_simulated_ttft_tail_at_twenty_requests_a_second_is_its_cap_on_sequences(tmp_path):
    """The Mixtral TP2 second stage (20 req/s, max_num_seqs 128): the simulated p99 TTFT is several times its mean with
    the cap, and close to the mean with it lifted, where three of the five real repeats lie (75-78 ms)."""
    d, runs = _staged()
    run = next(r for r in runs if r["id"] == "ip-h100-tp2-mixtral-8x7b-general")
    trace = srt.stage_trace(run, 1)
    got = {}
    for seqs in (128, srt.TAIL_SEQS):
        r = json.loads(json.dumps(run))
        r["engine"]["max_num_seqs"] = seqs
        got[seqs] = srt.simulate(r, srt.build_profile(d, r, "client", tmp_path)[0], "client", trace)
    assert got[128]["p99_ttft_ms"] > 3 * got[128]["mean_ttft_ms"]
    assert got[srt.TAIL_SEQS]["p99_ttft_ms"] < 1.5 * got[srt.TAIL_SEQS]["mean_ttft_ms"]
    assert got[srt.TAIL_SEQS]["p99_ttft_ms"] == pytest.approx(77, rel=0.1)
