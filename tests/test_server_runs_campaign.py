"""The campaign's runs that inference-sim/training default_args has no folder for (workload kind stages, source
inference-sim-campaign): their import from the study's CSV (benchmarks/server_runs_inference_perf.py --campaign),
the spec by workload name, and their judging with issue 50's bounds per GPU (benchmarks/server_runs_table.py)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402
from benchmarks import server_runs_inference_perf as ip  # noqa: E402
from benchmarks import server_runs_table as srt  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "server_runs.json"


def _data():
    d = srt.load_data(DATA)
    return d, [r for r in d["runs"] if r["source"] == ip.CAMPAIGN], [r for r in d["runs"] if r["source"] == ip.SOURCE]


def test_the_campaign_runs_cover_llama31_8b_at_tp1_and_tp2_and_the_a100_and_l40s_with_their_stated_settings():
    d, runs, _ = _data()
    have = {(r["gpu"], r["tp"], r["model"]) for r in runs}
    assert {("H100", 1, "llama3.1-8b"), ("H100", 2, "llama3.1-8b"), ("A100-80GB", 1, "llama3.1-8b"), ("L40S", 1, "llama3.1-8b"),
            ("A100-80GB", 2, "codellama-34b"), ("A100-80GB", 4, "llama2-70b")} <= have
    by = {r["id"].rsplit("-e", 1)[1]: r for r in runs}
    settings = {k: (by[k]["engine"]["max_num_batched_tokens"], by[k]["engine"]["gpu_memory_utilization"], bool(by[k]["engine"]["cpu_offload"]))
                for k in ("16", "22", "23", "24", "25")}
    assert settings == {"16": (2048, 0.9, False), "22": (1024, 0.9, False), "23": (8192, 0.9, False), "24": (2048, 0.9, True),
                        "25": (2048, 0.95, False)}
    assert by["26"]["tp"] == 2 and by["55"]["gpu"] == "L40S" and by["38"]["gpu"] == "A100-80GB"
    for r in runs:
        (sys_len, q_len, out_len), stages = ip.SPECS[r["workload"]["label"]]
        w = r["workload"]
        assert (w["system_prompt_len"], w["question_len"], w["output_len"]) == (sys_len, q_len, out_len)
        assert [(s["rate"], s["duration"]) for s in w["stages"]] == list(stages)
        assert r["url"] == d["sources"][ip.CAMPAIGN]["actuals_url"] and r["vllm_version"] == "0.15.1"
        assert (r["engine"]["max_num_seqs"], r["engine"]["max_model_len"], r["engine"]["num_gpu_blocks"]) == (128, 4096, None)
        for st, m in zip(w["stages"], r["measured"]["stages"]):
            assert m["requests"] == int(st["rate"] * st["duration"])
            for key in ("ttft_ms", "e2el_ms"):
                c = m["client"][key]
                assert 0 < c["mean"] <= c["p99"] and 0 < c["p90"] <= c["p99"]
    assert by["38"]["workload"]["stages"][1]["rate"] == 6.0  # general-lite: general's data at 2.5 then 6 req/s
    # the runs default_args also holds were checked equal, and what the zoo lacks is listed, not judged
    assert "7 runs default_args also holds" in d["sources"][ip.CAMPAIGN]["checked"]
    assert not [x for x in d["not_judged"] if x["url"] == d["sources"][ip.CAMPAIGN]["actuals_url"]]  # the zoo has every model
    assert {r["model"] for r in runs if r["tp"] == 8} == {"mixtral-8x22b"}
    assert by["53"]["workload"]["label"] == "reasoning-lite" and by["53"]["workload"]["output_len"] == 1448
    assert {r["model"] for r in runs if r["gpu"] in ("L40S", "A100-80GB")} >= {"qwen3-14b", "llama3.1-8b"}


def test_prompt_lengths_come_from_a_same_model_run_else_the_specs_token_counts():
    _, runs, ours = _data()
    twin = next(r for r in ours if r["id"] == "ip-h100-tp2-codellama-34b-general")
    a100 = next(r for r in runs if r["gpu"] == "A100-80GB" and r["model"] == "codellama-34b")
    assert all(s["prompt_len"] == twin["workload"]["stages"][0]["prompt_len"] for s in a100["workload"]["stages"])
    assert twin["id"] in a100["workload"]["prompt_len_from"]
    llama = next(r for r in runs if r["model"] == "llama3.1-8b" and r["workload"]["label"] == "general")
    t = srt.stage_trace(llama, 0, 300)
    assert set(t["new_input_tokens"]) == {100 + 447} and "spec's token counts" in llama["workload"]["prompt_len_from"]


def _csv(name, model, workload, stages, hw="H100", **cols):
    """The study's rows for one run: stage -> {metric: actual}."""
    base = {"simulator": "blis-roofline", "experiment_folder": f"/x/ground_truth/{name}", "model": model, "workload": workload,
            "exp_id": name.split("-")[0] + ".0", "hardware": hw, "tp": "1.0", "gpu_mem_util": "0.9", "max_num_batched_tokens": "2048.0",
            "cpu_offload": "False", **cols}
    return [{**base, "stage_index": str(i), "metric_name": m, "actual": str(v)} for i, d in stages.items() for m, v in d.items()]


def _stats(e2e, ttft):
    return {"e2e_mean": e2e, "e2e_p90": e2e * 1.1, "e2e_p99": e2e * 1.2, "ttft_mean": ttft, "ttft_p90": ttft * 1.1,
            "ttft_p99": ttft * 1.5, "itl_mean": (e2e - ttft) / 247}


def _ours(e2e0):
    return {"id": "mine", "model": "llama2-7b", "workload": {"label": "general", "stages": [{"prompt_len": {k: 575.0 for k in ip.PROMPT_STATS}}]},
            "measured": {"stages": [{"client": {"e2el_ms": {"mean": e2e0, "p99": e2e0 * 1.2}, "ttft_ms": {"mean": 20.0, "p99": 30.0}}}]}}


def test_the_csv_import_takes_the_spec_by_name_and_checks_the_runs_both_hold():
    lite = _csv("38-llama-3-1-8b-tp1-general-lite-1-1", "meta-llama/Llama-3.1-8B-Instruct", "general-lite",
                {-1: _stats(3400, 44), 0: _stats(3000, 42), 1: _stats(3600, 46)}, hw="L40S", max_num_batched_tokens="1024.0",
                cpu_offload="True")
    same = _csv("9-llama-2-7b-tp1-general", "meta-llama/Llama-2-7b-hf", "general", {0: {**_stats(2000, 20), "e2e_p99": 2400.0, "ttft_p99": 30.0}})
    big = _csv("49-falcon-180b-tp8-general-8", "tiiuae/falcon-180B", "general",
               {-1: _stats(4000, 50), 0: _stats(3300, 41), 1: _stats(4300, 54)})
    runs, left, matched = ip.campaign_runs(lite + same + big, [_ours(2000.0)])
    assert matched == {"9-llama-2-7b-tp1-general": {"run": "mine", "max_abs_diff_ms": pytest.approx(0, abs=1e-9)}}
    assert left == ["49-falcon-180b-tp8-general-8: tiiuae/falcon-180B is not in the model zoo"]
    (r,) = runs
    assert r["id"] == "ip-l40s-tp1-llama3.1-8b-general-lite-e38" and (r["gpu"], r["model"]) == ("L40S", "llama3.1-8b")
    assert r["engine"]["max_num_batched_tokens"] == 1024 and r["engine"]["cpu_offload"]
    assert [(s["rate"], s["duration"]) for s in r["workload"]["stages"]] == [(2.5, 600.0), (6.0, 600.0)]
    assert r["workload"]["stages"][0]["prompt_len"]["mean"] == 547.0  # no same-model run: the spec's counts
    assert r["measured"]["stages"][1]["client"]["e2el_ms"] == {"mean": 3600.0, "p90": 3960.0, "p99": 4320.0}
    assert r["measured"]["stages"][1]["requests"] == 3600 and r["measured_whole_run"]["e2el_ms"]["mean"] == 3400.0
    # a run both hold whose statistics differ is refused
    bad = _csv("9-llama-2-7b-tp1-general", "meta-llama/Llama-2-7b-hf", "general", {0: {**_stats(2000, 20), "e2e_p99": 2500.0, "ttft_p99": 30.0}})
    with pytest.raises(InputError, match="differ"):
        ip.campaign_runs(bad, [_ours(2000.0)])
    # a run of the same model and data lends its reported prompt lengths
    twin = _csv("57-llama-2-7b-tp1-general-lite-1", "meta-llama/Llama-2-7b-hf", "general-lite",
                {-1: _stats(1900, 20), 0: _stats(1800, 20), 1: _stats(1950, 21)})
    (r,), _, _ = ip.campaign_runs(twin, [_ours(2000.0)])
    assert r["workload"]["stages"][1]["prompt_len"]["mean"] == 575.0 and "mine" in r["workload"]["prompt_len_from"]


def test_default_args_profiles_must_equal_the_campaigns_spec(tmp_path):
    run = tmp_path / "default_args" / "20260101-000000-llama-2-7b-tp1-codegen"
    run.mkdir(parents=True)
    prof = {"data": {"shared_prefix": {"system_prompt_len": 100, "question_len": 466, "output_len": 247}},
            "load": {"stages": [{"rate": 5, "duration": 600}, {"rate": 10, "duration": 600}]}}
    (run / "profile.yaml").write_text(json.dumps(prof))
    src = ip.Source(tmp_path)
    assert ip.check_profiles(src, [run.name]) == ["codegen"]
    prof["load"]["stages"][1]["rate"] = 12
    (run / "profile.yaml").write_text(json.dumps(prof))
    with pytest.raises(InputError, match="codegen spec"):
        ip.check_profiles(src, [run.name])


def test_campaign_without_the_studys_git_directory_is_refused(tmp_path):
    p = subprocess.run([sys.executable, "benchmarks/server_runs_inference_perf.py", "--src", str(tmp_path), "--campaign",
                        "--data", str(tmp_path / "x.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--campaign" in p.stderr and "--peers" in p.stderr
    assert not (tmp_path / "x.json").exists()


def test_the_bounds_are_issue_50s_per_gpu():
    errs = {("ttft", "mean"): -12.0, ("ttft", "p99"): -20.0, ("tpot", "mean"): -8.0, ("e2el", "mean"): -8.0, ("e2el", "p99"): -9.0}
    assert srt.within_bounds("A100-80GB", errs) and not srt.within_bounds("H100", errs)
    assert not srt.within_bounds("L40S", {**errs, ("e2el", "mean"): 10.5})
    ok = {("ttft", "mean"): 9.0, ("ttft", "p99"): -9.0, ("tpot", "mean"): 2.0, ("e2el", "mean"): 2.9, ("e2el", "p99"): 9.9}
    assert srt.within_bounds("H100", ok) and not srt.within_bounds("H100", {**ok, ("e2el", "mean"): 3.1})
    rows = []
    for rid, gpu, e in (("a", "A100-80GB", errs), ("h", "H100", errs), ("h2", "H100", ok)):
        rows += [{"kind": "stages", "run": rid, "stage": 0, "gpu": gpu, "tp": 1, "metric": m, "stat": st,
                  "real_ms": 1000.0 if m == "e2el" else 10.0, "sim_ms": 0.0, "error_pct": x} for (m, st), x in e.items()]
    text = srt.stages_summary(rows)
    assert "A100-80GB x1 inference-perf stages (1 runs)" in text and "1 of 1 stages mean E2E within 10%" in text
    assert "H100 x1 inference-perf stages (2 runs)" in text and "1 of 2 stages mean E2E within 3%" in text


def test_a_quick_campaign_run_is_judged_against_the_studys_actuals(tmp_path):
    _, runs, _ = _data()
    run = next(r for r in runs if r["gpu"] == "L40S" and r["model"] == "llama3.1-8b")
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "benchmarks/server_runs_table.py", "--only", run["id"], "--quick", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())
    by = {(r["stage"], r["metric"], r["stat"]): r for r in rows}
    for i, m in enumerate(run["measured"]["stages"]):
        c = m["client"]
        assert by[(i, "e2el", "mean")]["real_ms"] == c["e2el_ms"]["mean"] and by[(i, "ttft", "p99")]["real_ms"] == c["ttft_ms"]["p99"]
    for r in rows:
        assert r["profile"] == "measured" and r["settings"] == "budget 2048, util 0.9" and np.isfinite(r["error_pct"])
        assert r["source"] == ip.CAMPAIGN and not r["cpu_offload"]
    assert f"| {run['id']} | L40S x1 | llama3.1-8b | budget 2048, util 0.9 | 0: 2.5 |" in p.stdout
    assert "L40S x1 inference-perf stages (1 runs)" in p.stdout and "stages mean E2E within 10%" in p.stdout


def test_the_kv_offload_note_speaks_of_the_runs_that_enabled_it():
    rows = [{"kind": "stages", "run": "on", "stage": 0, "peak_kv_usage": 0.3, "hit_ratio": 0.9, "cpu_offload": True},
            {"kind": "stages", "run": "off", "stage": 0, "peak_kv_usage": 0.8, "hit_ratio": 0.9, "cpu_offload": False}]
    assert "at most 30%" in srt.kv_note(rows) and "(on stage 0)" in srt.kv_note(rows)
    assert srt.kv_note(rows[1:]) == ""


def test_every_campaign_run_but_mixtrals_is_priced_from_measured_kernels_of_its_gpu(tmp_path):
    from sim.hardware import measured_kernels as mk

    d, runs, _ = _data()
    for r in runs:
        which = srt.build_profile(d, r, "client", tmp_path)[1]
        if r["model"] in ("mixtral-8x7b", "mixtral-8x22b"):  # aiconfigurator 0.12.0 lists no Mixtral
            assert which == "roofline"
            continue
        fit = mk.step_fit(r["gpu"], r["model"], r["tp"])
        assert which == "measured" and fit is not None, r["id"]
        assert all(v["mape_pct"] <= 10 for v in fit["heldout"].values()), r["id"]


def test_an_h100_tp1_stage_is_judged_on_the_table_profile_once_per_metric(tmp_path):
    d, runs, _ = _data()
    run = next(r for r in runs if (r["gpu"], r["tp"], r["model"]) == ("H100", 1, "llama3.1-8b") and r["engine"]["max_num_batched_tokens"] == 1024)
    rows = srt.stage_rows(d, {**run, "measured": {"stages": run["measured"]["stages"][:1]}}, True, tmp_path)
    assert {r["profile"] for r in rows} == {"measured"} and len(rows) == len(srt.STAGE_METRICS)
    whole = srt.whole_run(rows, [run])[run["id"]][0]["e2el"]  # the peers' comparison uses the table's profile
    assert whole == next(r["error_pct"] for r in rows if (r["metric"], r["stat"]) == ("e2el", "mean"))
    assert srt.stages_summary(rows).startswith("H100 x1 inference-perf stages (1 runs): mean |error| ttft mean")


def test_runs_in_two_processes_give_the_same_rows_and_a_bad_job_count_is_refused(tmp_path):
    d, runs, _ = _data()
    pick = [r for r in d["runs"] if r["id"] == "blis-h100-tp1-llama2-7b-train"] + [r for r in runs if r["gpu"] == "L40S"]
    one, two = srt.run_all(d, pick, True, tmp_path, 1), srt.run_all(d, pick, True, tmp_path, 2)
    assert one == two and [x[0][0]["run"] for x in two] == [r["id"] for r in pick] and one[0][1]  # order kept, trace parts back
    p = subprocess.run([sys.executable, "benchmarks/server_runs_table.py", "--jobs", "0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1 and "--jobs" in p.stderr
