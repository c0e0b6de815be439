"""The real vLLM 0.11.0 H100 server runs replayed request by request (workload kind trace):
their import (benchmarks/server_runs_ground_truth.py), rebuild and judging (benchmarks/server_runs_table.py)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import server_runs_ground_truth as gt  # noqa: E402
from benchmarks import server_runs_table as srt  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "server_runs.json"


def _traced():
    d = srt.load_data(DATA)
    return d, [r for r in d["runs"] if r["workload"]["kind"] == "trace"]


def test_the_trace_runs_are_the_sources_and_their_settings_the_logs(tmp_path):
    d, runs = _traced()
    assert {r["id"] for r in runs} == {rid for rid, _ in gt.RUNS.values()}
    logged = {"blis-h100-tp1-codellama34b-prefill-b64": (64, 32, 8192, 2790),
              "blis-h100-tp1-codellama34b-prefill-b4096": (4096, 256, 4096, 2537),
              "blis-h100-tp1-codellama34b-train": (4096, 256, 8192, 2537),
              "blis-h100-tp1-llama2-7b-train": (4096, 256, 4096, 7438)}
    for r in runs:
        e = r["engine"]
        assert (e["max_num_batched_tokens"], e["max_num_seqs"], e["max_model_len"], e["num_gpu_blocks"]) == logged[r["id"]]
        assert r["gpu"] == "H100" and r["tp"] == 1 and r["vllm_version"] == "0.11.0" and e["prefix_caching"]
        assert gt.COMMIT in r["url"] and gt.COMMIT in e["settings_from"]
        # the profile the table builds: measured kernels of the zoo model, the logged block count and limits
        path, which, unknown = srt.build_profile(d, r, "engine", tmp_path)
        prof = json.loads(Path(path).read_text())
        assert which == "measured" and unknown == []
        assert prof["engine"]["num_gpu_blocks"] == e["num_gpu_blocks"]
        assert prof["engine"]["max_num_batched_tokens"] == e["max_num_batched_tokens"]
        assert prof["engine"]["max_num_seqs"] == e["max_num_seqs"] and prof["engine"]["max_model_len"] == e["max_model_len"]


def test_a_trace_run_is_rebuilt_request_by_request():
    _, runs = _traced()
    for r in runs:
        req = np.array(r["workload"]["requests"], dtype=float)
        t = srt.trace_of(r, len(req))
        assert len(t) == len(req) == r["measured"]["engine"]["requests"]
        assert t["arrival_s"].iloc[0] == 0 and (np.diff(t["arrival_s"]) >= 0).all()
        assert (t["arrival_s"].to_numpy() == req[:, 0] - req[0, 0]).all()
        assert (t["new_input_tokens"].to_numpy() == req[:, 1]).all() and (t["output_tokens"].to_numpy() == req[:, 2]).all()
        assert (t["shared_prefix_tokens"] == r["workload"]["shared_prefix_tokens"]).all()
        assert (t["new_input_tokens"] + t["output_tokens"] <= r["engine"]["max_model_len"]).all()
        assert len(srt.trace_of(r, 10)) == 10  # --quick's prefix


def test_the_shared_prefix_is_served_from_the_cache():
    """The prefill-heavy sweep shares a 1,024-token prefix: replayed without it, TTFT is dearer."""
    d, runs = _traced()
    run = next(r for r in runs if r["id"] == "blis-h100-tp1-codellama34b-prefill-b4096")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path, _, _ = srt.build_profile(d, run, "engine", Path(tmp))
        t = srt.trace_of(run, 40)
        with_prefix = srt.simulate(run, path, "engine", t)["mean_ttft_ms"]
        without = srt.simulate(run, path, "engine", t.assign(shared_prefix_tokens=0))["mean_ttft_ms"]
    assert with_prefix < 0.9 * without


@pytest.mark.parametrize("rid,views", [("blis-h100-tp1-llama2-7b-train", {"engine"}),
                                       ("blis-h100-tp1-codellama34b-prefill-b4096", {"engine", "client"})])
def test_quick_trace_run_judges_each_view_against_its_own_measurement(tmp_path, rid, views):
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "benchmarks/server_runs_table.py", "--only", rid, "--quick", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "| TTFT mean real / sim (ms) | error |" in p.stdout and f"| {rid} |" in p.stdout
    rows = json.loads(out.read_text())
    run = next(r for r in _traced()[1] if r["id"] == rid)
    assert {r["view"] for r in rows} == views
    assert {(r["metric"], r["stat"]) for r in rows} == set(srt.TRACE_METRICS)
    for r in rows:
        assert r["requests"] == len(run["workload"]["requests"]) // 4
        assert r["real_ms"] == run["measured"][r["view"]][f"{r['metric']}_ms"][r["stat"]]
        assert r["sim_ms"] > 0 and r["error_pct"] == pytest.approx((r["sim_ms"] - r["real_ms"]) / r["real_ms"] * 100)
    by = {(r["view"], r["metric"], r["stat"]): r["sim_ms"] for r in rows}
    if "client" in views:  # the API server's time on top of the same steps
        assert by[("client", "ttft", "mean")] > by[("engine", "ttft", "mean")]


def _fixture(root: Path) -> Path:
    """A miniature of a source run folder: two start-ups in the log (the last one counts), three spans, a
    guidellm result of two of them."""
    run = root / "jan21-llama7b-train-1"
    run.mkdir(parents=True)
    head = "2026-01-21 10:49:03,749 INFO vllm.entrypoints.openai.api_server: vLLM API server version 0.11.0\n"
    args = ("2026-01-21 10:49:03,751 INFO vllm.entrypoints.utils: non-default args: {'model': 'm', 'max_model_len': %d, "
            "'served_model_name': ['meta-llama/Llama-2-7b-hf'], 'max_num_batched_tokens': 4096, 'max_num_seqs': 256}\n")
    tail = ("x INFO vllm.v1.worker.gpu_model_runner: Model loading took 12.5524 GiB and 12.3 seconds\n"
            "x INFO vllm.v1.worker.gpu_worker: Available KV cache memory: 58.12 GiB\n"
            "x INFO vllm.v1.core.kv_cache_utils: GPU KV cache size: 119,008 tokens\n"
            "x INFO vllm.v1.metrics.loggers: Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 7438\n")
    (run / "vllm.log").write_text(head + args % 8192 + head + args % 4096 + tail)
    (run / "profile.yaml").write_text("data:\n  prefix_tokens: 0\n  prompt_tokens: 100\n")

    def span(i, t, prompt, out, ttft, e2e):
        attrs = [{"key": "gen_ai.request.id", "value": {"stringValue": f"cmpl-{i}-0"}},
                 {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": str(prompt)}},
                 {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": str(out)}},
                 {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": ttft}},
                 {"key": "gen_ai.latency.e2e", "value": {"doubleValue": e2e}}]
        sp = {"name": "llm_request", "startTimeUnixNano": str(int(t * 1e9)), "endTimeUnixNano": "0", "attributes": attrs}
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [sp]}]}]})

    (run / "traces.json").write_text("\n".join([span(2, 1000.5, 300, 11, 0.2, 1.2), span(1, 1000.0, 100, 5, 0.1, 0.5),
                                                span(3, 1002.0, 50, 1, 0.05, 0.05)]) + "\n")
    req = [{"response_id": "cmpl-1", "time_to_first_token_ms": 110.0, "request_latency": 0.52},
           {"response_id": "cmpl-2", "time_to_first_token_ms": 215.0, "request_latency": 1.23}]
    (run / "guidellm-results.json").write_text(json.dumps({"benchmarks": [{"requests": {"successful": req}}]}))
    return run


def test_the_import_reads_the_last_start_up_the_spans_and_the_clients_results(tmp_path):
    run, pool = gt.import_run(_fixture(tmp_path))
    assert run["id"] == "blis-h100-tp1-llama2-7b-train" and run["model"] == "llama2-7b"
    assert run["engine"]["max_model_len"] == 4096 and run["engine"]["num_gpu_blocks"] == 7438  # the last start-up's
    assert run["engine"]["gpu_memory_utilization"] == 0.9 and not run["engine"]["async_scheduling"]
    assert run["workload"]["requests"] == [[0.0, 100, 5], [0.5, 300, 11], [2.0, 50, 1]]  # by arrival, from the first
    eng = run["measured"]["engine"]
    assert eng["ttft_ms"]["mean"] == pytest.approx(1000 * (0.1 + 0.2 + 0.05) / 3, abs=1e-3)
    assert eng["tpot_ms"]["mean"] == pytest.approx(1000 * ((0.5 - 0.1) / 4 + (1.2 - 0.2) / 10) / 2, abs=1e-3)  # one-token request left out
    cl = run["measured"]["client"]
    assert cl["requests"] == 2 and cl["e2el_ms"]["mean"] == pytest.approx(875.0)
    assert cl["tpot_ms"]["mean"] == pytest.approx(1000 * ((0.52 - 0.11) / 4 + (1.23 - 0.215) / 10) / 2, abs=1e-3)  # the engine's counts
    assert pool == {**pool, "kv_tokens": 119008, "num_gpu_blocks": 7438, "available_gib": 58.12, "weights_gib": 12.5524}


def test_the_import_refuses_a_folder_without_the_runs(tmp_path):
    before = DATA.read_bytes()
    p = subprocess.run([sys.executable, "benchmarks/server_runs_ground_truth.py", "--src", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and "--src" in p.stderr
    assert DATA.read_bytes() == before
