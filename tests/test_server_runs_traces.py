"""The real vLLM 0.11.0 H100 server runs replayed request by request (workload kind trace):
their import (benchmarks/server_runs_ground_truth.py), rebuild and judging (benchmarks/server_runs_table.py)."""
import datetime as dt
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
    """The BLIS H100 trace runs (the RTX-class ones: tests/test_server_runs_rtx.py)."""
    d = srt.load_data(DATA)
    return d, [r for r in d["runs"] if r["workload"]["kind"] == "trace" and r["source"] == gt.SOURCE]


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


@pytest.mark.parametrize("version,gate", [("0.11.0", False), ("0.18.1", False), ("0.19.0", True), (None, True)])
def test_a_release_before_0_19_admits_a_request_on_its_first_chunk(tmp_path, version, gate):
    """vLLM checks that a waiting request's whole prompt fits the KV cache before admitting it from
    0.19.0 (scheduler_reserve_full_isl, in 0.19.0's sdist, not 0.18.1's); a profile made for an
    earlier release's accounting admits on the first chunk, as that release's scheduler does."""
    from sim.hardware.profile import load_profile
    from sim.hardware.roofline import roofline_profile

    prof, _ = roofline_profile("H100", "llama2-7b", max_model_len=4096, vllm_version=version)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    assert load_profile(str(path)).engine.scheduler_reserve_full_isl is gate


def test_the_burst_admits_a_long_prompt_on_its_first_chunk_as_vllm_0_11_did():
    """jan20-codellama-train-1's throughput burst: vLLM 0.11.0 scheduled the 7,014-token request that
    arrived 34th 11.6 s after its arrival and took 9.3 s more to its first token (its span at the
    source's commit: time_in_queue + hand-off 11.82 s, time_in_model_prefill 9.26 s): admitted on its
    first 4,096-token chunk, preempted before its second. Gated on the whole prompt (vLLM 0.19 on) the
    replay held it back 19.3 s and prefilled it in 0.8 s."""
    d, runs = _traced()
    run = next(r for r in runs if r["id"] == "blis-h100-tp1-codellama34b-train")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path, _, _ = srt.build_profile(d, run, "engine", Path(tmp))
        t = srt.replay(run, path, "engine", srt.trace_of(run, 45)).turns.sort_values("program_id").reset_index(drop=True)
    r = t.iloc[33]
    assert r["prompt_tokens"] == 7014 and r["preemptions"] >= 1
    assert r["scheduled"] - r["arrival"] < 14 and r["first_token"] - r["scheduled"] > 6


def test_the_engine_view_is_judged_in_parts():
    """Per trace run: the real wait, prefill and decode (vLLM's stamps) beside the replay's, whose
    means add up to its mean E2E; the requests that ran alone (each with nothing else on the engine,
    in the replay too) judged on their prefill and decode per token."""
    d, runs = _traced()
    run = next(r for r in runs if r["id"] == "blis-h100-tp1-llama2-7b-train")
    parts = []
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rows = srt.rows_of(d, run, False, Path(tmp), parts)
        gap = srt.what_if(d, [run], parts, Path(tmp))
    (p,) = parts
    real = run["measured"]["engine"]
    assert p["alone"] == len(real["alone"]["requests"]) >= 20 and 0 not in real["alone"]["requests"]
    for k, key in srt.PARTS:
        assert p[k][0] == real[key]["mean"]
    assert p["wait"][0] + p["prefill"][0] == pytest.approx(real["ttft_ms"]["mean"], abs=1e-2)
    assert p["wait"][0] + p["prefill"][0] + p["decode"][0] == pytest.approx(real["e2el_ms"]["mean"], rel=1e-3)
    sim_e2e = next(r["sim_ms"] for r in rows if (r["view"], r["metric"], r["stat"]) == ("engine", "e2el", "mean"))
    assert sum(p[k][1] for k, _ in srt.PARTS) == pytest.approx(sim_e2e, rel=1e-9)
    # the alone requests' prefill: priced within 5% (measured kernels, their GEMMs for trained weights)
    assert p["alone prefill"][0] == real["alone"]["prefill_ms"] and 20 < p["alone prefill"][1]
    assert abs(p["alone prefill"][1] / p["alone prefill"][0] - 1) < 0.05
    table = srt.render_parts(parts)
    assert f"| {run['id']} | {p['alone']} | {real['alone']['prefill_ms']:.2f} / " in table
    # the what-if: as replayed it is the table's row; without the host's time (a synchronous engine's) every
    # statistic is lower; the alone requests' miss per token moves TTFT its way
    line = next(x for x in gap.splitlines() if x.startswith(f"| {run['id']} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    ttft = {(r["metric"], r["stat"]): r["error_pct"] for r in rows if r["view"] == "engine"}
    assert cells[3] == f"{ttft[('ttft', 'mean')]:+.1f}% / {ttft[('ttft', 'p99')]:+.1f}% / {ttft[('e2el', 'mean')]:+.1f}%"
    device_only = [float(x.strip().rstrip("%")) for x in cells[2].split("/")]
    assert all(a < b for a, b in zip(device_only, [ttft[("ttft", "mean")], ttft[("ttft", "p99")], ttft[("e2el", "mean")]]))
    miss = float(cells[1])
    assert miss != 0 and (float(cells[4].split("%")[0]) - ttft[("ttft", "mean")]) * miss > 0


def test_both_views_carry_the_engines_host_time_and_only_the_client_the_api_servers(tmp_path):
    """vLLM's engine-core host time per step is part of the steps whatever the view (a synchronous engine adds it,
    its own stamps taken after it); the API server's time per request is what only a client sees."""
    d, runs = _traced()
    run = next(r for r in runs if r["id"] == "blis-h100-tp1-llama2-7b-train")
    engine, client = (json.loads(Path(srt.build_profile(d, run, v, tmp_path)[0]).read_text()) for v in ("engine", "client"))
    assert engine["host"] == client["host"] == json.loads(srt.HOST.read_text())["host"]
    assert "server" not in engine and client["server"] == json.loads(srt.SERVER.read_text())["server"]
    assert engine["step_time"] == client["step_time"]


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
                 {"key": "gen_ai.latency.e2e", "value": {"doubleValue": e2e}},
                 # queued 1 ms after the arrival, 2 ms in the queue, prefill to 1 ms before the first token
                 {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": 0.002}},
                 {"key": "gen_ai.latency.time_in_model_prefill", "value": {"doubleValue": ttft - 0.004}},
                 {"key": "gen_ai.latency.time_in_model_decode", "value": {"doubleValue": e2e - ttft}}]
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
    # the parts: wait = TTFT - prefill; alone: all but the server's first (warm-up), none overlapping another
    assert eng["wait_ms"]["mean"] == pytest.approx(4.0) and eng["decode_ms"]["mean"] == pytest.approx(1000 * (0.4 + 1.0 + 0) / 3)
    assert eng["alone"] == {"requests": [1, 2], "prefill_ms": pytest.approx((196 + 46) / 2), "handoff_ms": pytest.approx(2.0),
                            "decode_per_token_ms": pytest.approx(100.0)}  # the one-token request left out
    assert "top_k_top_p" not in run["engine"]  # the log names no FlashInfer sampler


def test_the_import_records_flashinfers_sampler_where_the_log_names_it(tmp_path):
    folder = _fixture(tmp_path)
    log = folder / "vllm.log"
    log.write_text(log.read_text() + "x INFO topk_topp_sampler.py:55] Using FlashInfer for top-p & top-k sampling.\n")
    assert gt.import_run(folder)[0]["engine"]["top_k_top_p"] == "flashinfer"


def test_the_sampler_is_priced_where_the_model_release_and_log_allow_it():
    d = srt.load_data(srt.DATA)
    runs = {r["id"]: r for r in d["runs"]}
    stage, blis = runs["ip-h100-tp1-llama3.1-8b-general-e16"], runs["blis-h100-tp1-llama2-7b-train"]
    assert stage["sampling"] == blis["sampling"] == "top-p"  # both served models' generation_config
    sort = {"sampler": {"modes": {"greedy": {}, "random": {}, "top-p": {}}}}
    assert srt.sampling_of(stage, sort) == "top-p"
    assert srt.sampling_of(blis, sort) is None  # its vllm.log names FlashInfer's kernel
    assert srt.sampling_of(stage, {"sampler": {"modes": {"greedy": {}, "random": {}}}}) is None  # a release not sorting
    assert srt.sampling_of(stage, {}) is None  # a GPU not measured
    assert runs["ip-h100-tp4-llama2-70b-general"]["sampling"] is None  # its generation_config not recorded


def test_the_import_refuses_spans_without_the_engines_stamps(tmp_path):
    folder = _fixture(tmp_path)
    text = (folder / "traces.json").read_text().replace("gen_ai.latency.time_in_queue", "gen_ai.latency.other")
    (folder / "traces.json").write_text(text)
    with pytest.raises(gt.InputError, match="time_in_queue"):
        gt.import_run(folder)


def test_the_import_refuses_a_folder_without_the_runs(tmp_path):
    before = DATA.read_bytes()
    p = subprocess.run([sys.executable, "benchmarks/server_runs_ground_truth.py", "--src", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and "--src" in p.stderr
    assert DATA.read_bytes() == before


def test_the_log_is_read_on_the_spans_clock_and_the_replay_counted_as_vllm_logs(tmp_path):
    """benchmarks/server_runs_log.py: a vllm.log's stats lines (local time) put on the spans' clock by
    the whole hours that match their Running counts; the replay's running, waiting, KV usage and
    rates at an instant as vLLM's logger counts them."""
    import pandas as pd

    from benchmarks import server_runs_log as srl

    folder = _fixture(tmp_path)
    sp = gt.spans(folder / "traces.json")  # running 1000.004-1000.5, 1000.504-1001.7, 1002.004-1002.05

    def line(utc, running):
        local = dt.datetime.fromtimestamp(utc - 8 * 3600, dt.timezone.utc)
        return (f"{local:%Y-%m-%d %H:%M:%S},{local.microsecond // 1000:03d} INFO vllm.v1.metrics.loggers: Engine 000: Avg "
                f"prompt throughput: 40.0 tokens/s, Avg generation throughput: 1.5 tokens/s, Running: {running} reqs, Waiting: 0 "
                "reqs, GPU KV cache usage: 0.5%, Prefix cache hit rate: 0.0%\n")
    text = line(1000.3, 1) + line(1001.9, 0) + line(1002.02, 1) + line(1003.5, 0)
    local, real = srl.stats_lines("noise\n" + text)
    assert len(local) == 4 and local[0] == pytest.approx(1000.3 - 8 * 3600, abs=1e-3)
    assert real[0].tolist() == [40.0, 1.5, 1, 0, 0.5, 0.0]
    assert srl.clock_offset(local, real[:, 2], sp) == -8
    # a replay of two calls: one waits 1 s, both decode 10 tokens over 2 s; blocks sampled each second
    turns = pd.DataFrame({"arrival": [0.0, 0.0], "scheduled": [0.0, 1.0], "first_token": [0.5, 1.5], "finish": [2.5, 3.5],
                          "output_tokens": [11, 11], "prompt_tokens": [100, 300]})
    kv = pd.DataFrame({"t": [0.0, 1.0, 2.0, 3.0], "used_blocks": [10, 30, 30, 20]})
    at = np.array([0.7, 1.2, 5.0, 20.0])
    got = srl.replay_stats(turns, kv, 100, at + 50, 50.0)
    # (prompt tokens/s: a prompt at its first token; output tokens/s: the first, then the rest evenly; running; waiting; KV %)
    assert got[0, :5].tolist() == pytest.approx([10.0, (1 + 0.1 * 10) / 10, 1, 1, 10.0])
    assert got[1, :5].tolist() == pytest.approx([10.0, (1 + 0.35 * 10) / 10, 2, 0, 30.0])
    assert got[2, :5].tolist() == pytest.approx([40.0, 22 / 10, 0, 0, 20.0])  # the 10 s before: every token
    assert got[3, :5].tolist() == pytest.approx([0.0, 0.0, 0, 0, 20.0])
    p = subprocess.run([sys.executable, "benchmarks/server_runs_log.py", "--src", str(tmp_path / "none")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and "--src" in p.stderr
