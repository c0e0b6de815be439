"""benchmarks/server_runs_table.py: held-out published server runs judged, quick mode; the data file's provenance."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import server_runs_table as srt  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "server_runs.json"


def test_every_run_names_a_source_url_and_licence():
    d = json.loads(DATA.read_text())
    assert d["runs"]
    for r in d["runs"]:
        src = d["sources"][r["source"]]
        assert src["licence"].strip() and src["what"].strip(), r["id"]
        assert re.match(r"https://github\.com/[^/]+/[^/]+/(blob|tree)/[0-9a-f]{40}/", r["url"]), r["id"]  # pinned to a commit
        assert r["gpu"] and r["tp"] >= 1 and r["model"]
        assert r["measured"], r["id"]
        # a trace run's statistics are per view (engine, client); a closed run's are the client's
        views = r["measured"].values() if r["workload"]["kind"] == "trace" else [r["measured"]]
        for view in views:
            for stats in (v for k, v in view.items() if isinstance(v, dict) and k != "alone"):
                assert all(v > 0 for v in stats.values()), r["id"]
            if "alone" in view:  # which requests ran alone (indices by arrival) and their means
                a = view["alone"]
                assert a["requests"] == sorted(set(a["requests"])) and 0 < a["requests"][0], r["id"]
                assert all(a[k] > 0 for k in ("prefill_ms", "decode_per_token_ms", "handoff_ms")), r["id"]
    ids = [r["id"] for r in d["runs"]]
    assert len(ids) == len(set(ids))


def test_quick_run_prints_the_table_with_its_columns(tmp_path):
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "benchmarks/server_runs_table.py", "--quick", "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    header = p.stdout.splitlines()[0]
    for col in ("GPU x tp", "workload", "concurrency", "profile", "view", "TTFT real / sim (ms)", "TTFT error",
                "TPOT real / sim (ms)", "TPOT error", "mean E2E (derived) error"):
        assert f"| {col} |" in header
    rows = json.loads(out.read_text())
    d = json.loads(DATA.read_text())
    first = d["runs"][:2]
    assert {r["run"] for r in rows} == {r["id"] for r in first}
    # the first runs are the FP8 Llama-3.1-70B on 2 H100s: priced from measured kernels
    assert {r["view"] for r in rows} == {"engine", "client"} and {r["profile"] for r in rows} == {"measured"}
    for r in rows:
        assert r["sim_ms"] > 0 and np.isfinite(r["error_pct"])
        assert r["error_pct"] == pytest.approx((r["sim_ms"] - r["real_ms"]) / r["real_ms"] * 100)  # unscaled
    # the real figures are the data file's, not the simulator's
    by = {(r["run"], r["metric"], r["view"]): r for r in rows}
    for run in first:
        assert by[(run["id"], "ttft", "engine")]["real_ms"] == run["measured"]["ttft_ms"]["mean"]
        assert by[(run["id"], "tpot", "client")]["real_ms"] == run["measured"]["tpot_ms"]["mean"]
        # the client view adds the API server's time to every request: TTFT is later there
        assert by[(run["id"], "ttft", "client")]["sim_ms"] > by[(run["id"], "ttft", "engine")]["sim_ms"]


def test_the_workload_is_the_clients_draw():
    run = {"workload": {"input_tokens": 1000, "output_tokens": 500, "length_spread": {"kind": "uniform_int", "low_ratio": 0.8}}}
    t = srt.trace_of(run, 2000)
    assert t["new_input_tokens"].between(800, 1000).all() and t["output_tokens"].between(400, 500).all()
    assert t["new_input_tokens"].mean() == pytest.approx(900, rel=0.01)
    run["workload"]["length_spread"] = None
    assert (srt.trace_of(run, 5)["output_tokens"] == 500).all()


def test_a_run_without_a_licence_is_refused(tmp_path):
    d = json.loads(DATA.read_text())
    d["sources"][d["runs"][0]["source"]]["licence"] = ""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    p = subprocess.run([sys.executable, "benchmarks/server_runs_table.py", "--data", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "licence" in p.stderr


def test_write_docs_is_the_full_table_only(tmp_path):
    p = subprocess.run([sys.executable, "benchmarks/server_runs_table.py", "--quick", "--write-docs", str(tmp_path / "x.md")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.md").exists()


def test_the_explain_lines_price_the_deployment_as_the_table_does():
    """The KV pool of the profile the table builds; Little's law on the rows' means; the decode
    step of the real number in decode, priced by the table's (measured) profile."""
    d = srt.load_data(DATA)
    run = d["runs"][0]
    prof, src = srt._profile(run["gpu"], run["model"], run["tp"], True, **srt.engine_args(run))
    assert src.startswith("measured-kernels")
    real = {"ttft": 100.0, "tpot": 10.0, "e2el": 400.0}
    rows = [{"run": run["id"], "view": "client", "metric": m, "real_ms": v, "sim_ms": v / 2} for m, v in real.items()]
    text = srt.explain(d, [run], rows)
    assert f"KV pool {prof.engine.num_gpu_blocks * prof.block_size:,} tokens" in text
    c = run["workload"]["concurrency"]
    n = c * (400 - 100) / 400
    b, ctx = round(n), srt.decode_ctx(run)
    row = next(x for x in text.splitlines() if x.startswith(f"| {run['gpu']} x{run['tp']} |"))
    assert f"| {n:.1f} / {n:.1f} | 10.00 | 5.00 | {prof.step_time(b, b, b * ctx, b * ctx) * 1e3:.2f} / " in row
    # the client drew lengths uniformly in [0.8 L, L]: the mean decode context is 0.9 x input + 0.45 x output
    assert ctx == pytest.approx(0.9 * run["workload"]["input_tokens"] + 0.45 * run["workload"]["output_tokens"])


def test_a_ceiling_of_sequences_in_decode_is_named_only_where_the_real_ones_stop_growing():
    """The real sequences in decode flat from one concurrency to the next while the simulated go on: reported with the
    KV they hold against the derived pool; growing with the concurrency, or flat on both sides: nothing."""
    key = ("H100", 2, "llama3.1-70b-fp8", "8k1k")
    run = {"engine": {"kv_cache_dtype": "fp8"}}
    flat = [(16, 15.4, 15.3, 8000.0, 456000, run), (64, 28.7, 55.7, 8000.0, 456000, run), (32, 28.2, 30.7, 8000.0, 456000, run)]
    text = srt._ceiling(key, flat)
    assert "kept 28.2 and 28.7 sequences in decode at concurrency 32 and 64 (simulated 30.7 and 55.7)" in text
    assert "229,600 tokens of KV" in text and "0.50x the 456,000 tokens of the pool derived here" in text
    assert "default KV dtype" not in text
    assert srt._ceiling(key, flat, lambda r: 228000) == \
        text + " (the run's fp8 KV cache; with vLLM's default KV dtype the pool would be 228,000 tokens)"
    assert srt._ceiling(key, [(32, 28.2, 30.7, 8000.0, 456000, run), (64, 57.1, 61.4, 8000.0, 456000, run)]) == ""
    assert srt._ceiling(key, [(32, 28.2, 28.0, 8000.0, 456000, run), (64, 28.7, 29.0, 8000.0, 456000, run)]) == ""
    assert srt._ceiling(key, flat[:1]) == ""


def test_the_default_kv_pool_of_an_fp8_kv_run_is_twice_smaller():
    """_auto_kv_pool sizes the same deployment with vLLM's default KV dtype: about half the FP8 pool's tokens; none
    for a run on the default dtype."""
    d = srt.load_data(DATA)
    run = next(r for r in d["runs"] if (r["engine"].get("kv_cache_dtype") or "auto") == "fp8")
    prof, _ = srt._profile(run["gpu"], run["model"], run["tp"], True, srt.model_spec(d, run["model"]), **srt.engine_args(run))
    fp8 = prof.engine.num_gpu_blocks * prof.block_size
    assert srt._auto_kv_pool(d, run) == pytest.approx(fp8 / 2, rel=0.01)
    assert srt._auto_kv_pool(d, {**run, "engine": {**run["engine"], "kv_cache_dtype": None}}) is None


def test_roofline_takes_a_model_shape_outside_the_zoo():
    from sim.hardware.roofline import find_model, roofline_profile

    _, base = find_model("llama3.1-70b")
    fp8 = {**base, "dtype_bytes": 1}
    a, _ = roofline_profile("B200", "llama3.1-70b", tp=2, measured=False)
    b, _ = roofline_profile("B200", "llama3.1-70b-fp8", tp=2, measured=True, model_spec=fp8)
    assert b["provenance"]["source"] == "roofline"  # measured kernels are the zoo's: not used for a shape of its own
    assert b["kv_pool"]["weights_bytes"] < 0.6 * a["kv_pool"]["weights_bytes"]
    assert b["step_time"]["c0"] < a["step_time"]["c0"] and b["engine"]["num_gpu_blocks"] > a["engine"]["num_gpu_blocks"]


def test_each_run_is_built_with_its_documented_kv_cache_and_release():
    """The publisher's launch scripts (pinned to a commit) state an FP8 KV cache and vLLM 0.10.2's image:
    every run says so, and the profile the table builds has a 1-byte KV pool sized by 0.10.2's
    accounting, twice the blocks of the same deployment with vLLM's default KV dtype."""
    d = srt.load_data(DATA)
    for r in (r for r in d["runs"] if r["source"] == "inferencex-dump"):
        e = r["engine"]
        assert re.match(r"https://github\.com/SemiAnalysisAI/InferenceX/blob/[0-9a-f]{40}/benchmarks/70b_fp8_", e["settings_from"])
        assert e["kv_cache_dtype"] == "fp8" and r["vllm_version"] == "0.10.2"
    run = next(r for r in d["runs"] if r["gpu"] == "B200" and r["tp"] == 1)
    assert run["engine"]["max_num_seqs"] == 512  # the B200 script's, not the client's concurrency
    from sim.hardware.roofline import roofline_profile

    args = srt.engine_args(run)
    prof, _ = roofline_profile(run["gpu"], run["model"], tp=run["tp"], measured=True, **args)
    pool = prof["kv_pool"]["inputs"]
    assert pool["kv_dtype_bytes"] == 1 and pool["vllm_version"] == "0.10.2" and pool["max_num_seqs"] == 512
    auto, _ = roofline_profile(run["gpu"], run["model"], tp=run["tp"], measured=True, **{**args, "kv_cache_dtype": "auto"})
    assert abs(prof["engine"]["num_gpu_blocks"] - 2 * auto["engine"]["num_gpu_blocks"]) <= 1
    assert prof["engine"]["max_model_len"] == run["engine"]["max_model_len"]
