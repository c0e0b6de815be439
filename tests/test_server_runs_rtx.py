"""The real vLLM 0.19.0 runs on an RTX 4090 and RTX PRO 6000 cards (casys-kaist/LLMServingSim's validation
examples): their import (benchmarks/server_runs_llmservingsim.py), the prompt prefixes their requests share,
and their judging (benchmarks/server_runs_table.py)."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import server_runs_llmservingsim as ls  # noqa: E402
from benchmarks import server_runs_table as srt  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "server_runs.json"


def _runs():
    d = srt.load_data(DATA)
    return d, {r["id"]: r for r in d["runs"] if r["source"] == ls.SOURCE}


def test_shared_prefixes_are_the_longest_with_any_earlier_prompt():
    of, n = ls.shared_prefixes([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3, 4, 5], [7], [1, 2, 3, 4], [1, 2, 9, 9]])
    assert of == [-1, 0, 0, -1, 0, 1] and n == [0, 2, 4, 0, 4, 3]


def test_prefix_segments_share_ids_exactly_as_far_as_the_prompts_do():
    rows = [[0, 100, 5, -1, 0], [1, 60, 5, 0, 40], [2, 120, 5, 1, 50], [3, 40, 5, 0, 40]]
    segs = srt.prefix_segments("r", rows)
    assert segs[0] == [{"id": "r#0", "tokens": 100}]
    assert segs[1] == [{"id": "r#0", "tokens": 40}, {"id": "r#1", "tokens": 20}]
    assert segs[2] == [{"id": "r#0", "tokens": 40}, {"id": "r#1", "tokens": 10}, {"id": "r#2", "tokens": 70}]
    assert segs[3] == [{"id": "r#0", "tokens": 40}]  # the whole prompt an earlier one's: nothing of its own
    assert [sum(s["tokens"] for s in x) for x in segs] == [r[1] for r in rows]


# LLMServingSim's validation summary as bench/core prints it (metric, statistic, vLLM, Sim, Diff%)
SUMMARY = """Metric                           vLLM         Sim     Diff%
-----------------------------------------------------------
TTFT Mean                      7097.2      6815.7     -4.0%
TTFT Median                    9442.7      8633.9     -8.6%
TTFT P99                      19755.3     19356.6     -2.0%

TPOT Mean                        32.5        32.1     -1.0%

Latency Mean                  28200.7     27694.8     -1.8%
Latency P99                   37638.8     37027.3     -1.6%
"""


def _example(src: Path, folder: str, reqs: list[dict], kv: dict | None, dataset: str) -> None:
    ex = src / "bench" / "examples" / folder / "vllm"
    ex.mkdir(parents=True)
    meta = {"model": "m", "vllm_version": "0.19.0", "dataset_path": f"workloads/{dataset}",
            "engine_kwargs": {"tensor_parallel_size": 2 if "32B" in folder else 1, "max_num_seqs": 128,
                              "max_num_batched_tokens": 2048, "max_model_len": None, "kv_cache_dtype": "auto"}}
    if kv:
        meta["kv_cache"] = kv
        meta["resolved_config"] = {"scheduler_config": {"async_scheduling": True}}
    (ex / "meta.json").write_text(json.dumps(meta))
    (ex / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
    (ex.parent / "validation").mkdir()
    (ex.parent / "validation" / "summary.txt").write_text(SUMMARY)


def _src(root: Path) -> Path:
    """A miniature checkout: the three examples, three requests each (the second arrives at the engine
    first; the third shares 3 prompt tokens with the first), and the datasets' token ids."""
    (root / "workloads").mkdir(parents=True)
    prompts = [[5, 6, 7, 8], [9, 10], [5, 6, 7, 1, 2]]
    (root / "workloads" / "d.jsonl").write_text("".join(json.dumps({"input_toks": len(p), "input_tok_ids": p}) + "\n" for p in prompts))
    stamps = [(10.0, 10.01, 10.2, 11.0), (9.5, 9.5, 9.6, 10.5), (20.0, 20.0, 20.1, 20.5)]  # queued, scheduled, first, last
    reqs = [{"request_id": f"bench-{i}", "input_toks": len(p), "output_toks": 5, "queued_ts": q, "scheduled_ts": s,
             "first_token_ts": f, "last_token_ts": last} for i, (p, (q, s, f, last)) in enumerate(zip(prompts, stamps))]
    for folder in ls.RUNS:
        _example(root, folder, reqs, {"num_gpu_blocks": 2588, "gpu_memory_utilization": 0.9} if "4090" in folder else None, "d.jsonl")
    return root


def test_the_import_takes_the_engines_arrivals_stamps_and_shared_prefixes(tmp_path):
    src = _src(tmp_path / "src")
    run = ls.import_run(src, "RTX4090/Llama-3.1-8B")
    assert run["gpu"] == "RTX-4090" and run["tp"] == 1 and run["model"] == "llama3.1-8b" and run["vllm_version"] == "0.19.0"
    assert run["engine"]["num_gpu_blocks"] == 2588 and run["engine"]["async_scheduling"] and ls.COMMIT in run["url"]
    # by the engine core's arrival (bench-1 first); bench-2 shares bench-0's first 3 tokens, bench-0 now row 1
    assert run["workload"]["requests"] == [[0.0, 2, 5, -1, 0], [0.5, 4, 5, -1, 0], [10.5, 5, 5, 1, 3]]
    e = run["measured"]["engine"]
    assert e["ttft_ms"]["mean"] == pytest.approx(np.mean([200, 100, 100]), abs=1e-3)  # first token - queued
    assert e["e2el_ms"]["mean"] == pytest.approx(np.mean([1000, 1000, 500]), abs=1e-3)
    assert e["wait_ms"]["mean"] == pytest.approx(np.mean([0, 10, 0]), abs=1e-3)
    assert e["alone"]["requests"] == [2]  # the only one nothing overlapped (the first left out)
    assert run["peers"] == [{"stage": -1, "simulator": "llmservingsim", "their_run": "RTX4090/Llama-3.1-8B",
                             "file": f"{ls.BASE.replace('/tree/', '/blob/')}/RTX4090/Llama-3.1-8B/validation/summary.txt",
                             "ttft_mean_pct": -4.0, "ttft_p99_pct": -2.0, "tpot_mean_pct": -1.0, "e2e_mean_pct": -1.8,
                             "e2e_p99_pct": -1.6}]  # its own simulator's Diff%, median left out
    pro = ls.import_run(src, "RTXPRO6000/Qwen3-32B")
    assert pro["tp"] == 2 and pro["engine"]["num_gpu_blocks"] is None  # no kv_cache in its meta.json: derived


def test_the_import_refuses_stamps_missing_or_a_dataset_of_other_prompts(tmp_path):
    src = _src(tmp_path / "src")
    f = src / "bench" / "examples" / "RTXPRO6000" / "Llama-3.1-8B" / "vllm" / "requests.jsonl"
    f.write_text(f.read_text().replace('"first_token_ts": 10.2', '"first_token_ts": null'))
    with pytest.raises(ls.InputError, match="stamps"):
        ls.import_run(src, "RTXPRO6000/Llama-3.1-8B")
    summary = src / "bench" / "examples" / "RTX4090" / "Llama-3.1-8B" / "validation" / "summary.txt"
    summary.write_text(SUMMARY.replace("TPOT Mean", "TPOT Average"))
    with pytest.raises(ls.InputError, match="validation summary"):
        ls.import_run(src, "RTX4090/Llama-3.1-8B")
    summary.unlink()
    with pytest.raises(ls.InputError, match="missing"):
        ls.import_run(src, "RTX4090/Llama-3.1-8B")
    summary.write_text(SUMMARY)
    (src / "workloads" / "d.jsonl").write_text(json.dumps({"input_toks": 3, "input_tok_ids": [1, 2, 3]}) + "\n")
    with pytest.raises(ls.InputError, match="prompt lengths"):
        ls.import_run(src, "RTX4090/Llama-3.1-8B")


def test_the_import_writes_the_runs_and_refuses_a_checkout_without_them(tmp_path):
    data = tmp_path / "runs.json"
    data.write_text(DATA.read_text())
    p = subprocess.run([sys.executable, "benchmarks/server_runs_llmservingsim.py", "--src", str(_src(tmp_path / "src")),
                        "--data", str(data)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(data.read_text())
    got = {r["id"]: r for r in d["runs"] if r["source"] == ls.SOURCE}
    assert set(got) == {rid for rid, _, _ in ls.RUNS.values()} and all(len(r["workload"]["requests"]) == 3 for r in got.values())
    assert len(d["runs"]) == len(json.loads(DATA.read_text())["runs"])  # replaced, not added twice
    assert d["sources"][ls.SOURCE]["licence"].startswith("casys-kaist/LLMServingSim is MIT")
    before = data.read_bytes()
    p = subprocess.run([sys.executable, "benchmarks/server_runs_llmservingsim.py", "--src", str(tmp_path / "nothing"),
                        "--data", str(data)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and "--src" in p.stderr
    assert data.read_bytes() == before


def test_the_bundled_runs_are_the_sources_with_their_settings():
    d, runs = _runs()
    assert set(runs) == {rid for rid, _, _ in ls.RUNS.values()}
    for r in runs.values():
        req = r["workload"]["requests"]
        assert len(req) == r["measured"]["engine"]["requests"] == 300 and r["vllm_version"] == "0.19.0"
        assert req[0][0] == 0 and all(b[0] >= a[0] for a, b in zip(req, req[1:]))
        assert all(x[3] < len(req) and x[4] <= x[1] and (x[3] >= 0) == (x[4] > 0) for x in req)
        assert sum(x[4] for x in req) > 0.05 * sum(x[1] for x in req)  # ShareGPT's later turns repeat earlier prompts
    assert runs["llmss-rtx4090-tp1-llama3.1-8b-sharegpt"]["engine"]["num_gpu_blocks"] == 2588
    # LLMServingSim's own errors on them, as its validation summaries print them
    assert [r["peers"][0]["e2e_mean_pct"] for r in runs.values()] == [0.5, -1.8, 1.0]


def test_a_peers_own_errors_on_its_runs_stand_beside_ours():
    rows = [{"kind": "trace", "run": "r", "view": v, "metric": m, "stat": st, "error_pct": e}
            for v, e in (("engine", -5.0), ("client", -50.0)) for m, st in srt.TRACE_METRICS]
    runs = [{"id": "r", "workload": {"kind": "trace"},
             "peers": [{"simulator": "p", "file": "u", **{srt.peer_key(m, st): 1.5 for m, st in srt.TRACE_METRICS}}]},
            {"id": "other", "workload": {"kind": "trace"}, "peers": []}]
    got = srt.render_trace_peers(rows, runs).splitlines()
    assert len(got) == 3 and got[2] == "| r | " + " / ".join(["-5.0%"] * 5) + " | [p](u) | " + " / ".join(["+1.5%"] * 5) + " |"
    assert srt.render_trace_peers(rows, runs[1:]) == "" and srt.render_trace_peers([], runs) == ""


def test_the_replay_serves_the_shared_prefixes_from_the_cache(tmp_path):
    d, runs = _runs()
    run = runs["llmss-rtxpro6000-tp1-llama3.1-8b-sharegpt"]
    path, which, _ = srt.build_profile(d, run, "engine", tmp_path)
    assert which == "measured"
    t = srt.trace_of(run, 300)
    shared = srt.replay(run, path, "engine", t).turns
    alone = srt.replay(run, path, "engine", t.drop(columns="segments")).turns
    # vLLM hits whole 16-token blocks, and never the prompt's last token
    blocks = sum(min(x[4], x[1] - 1) // 16 * 16 for x in run["workload"]["requests"])
    hit = int(shared["prompt_tokens"].sum() - shared["computed_prompt_tokens"].sum())
    assert 0.8 * blocks <= hit <= blocks and int(shared["cached_tokens"].sum()) == hit
    assert int(alone["cached_tokens"].sum()) == 0


def test_the_rtx_runs_are_judged_with_the_bound_for_their_gpu(tmp_path):
    rid = "llmss-rtx4090-tp1-llama3.1-8b-sharegpt"
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "benchmarks/server_runs_table.py", "--only", rid, "--quick", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())
    assert {r["view"] for r in rows} == {"engine"} and {r["gpu"] for r in rows} == {"RTX-4090"}
    assert all(r["profile"] == "measured" and r["requests"] == 75 for r in rows)  # LLMServingSim's layers (--layers)
    assert "RTX-4090 x1 traces, engine:" in p.stdout and "runs mean E2E within 10%" in p.stdout


def _layers(folder: Path) -> None:
    """Per-layer timings of a miniature decoder block: every dense layer 1 us a token, attention 10 us
    plus 1 us per decode sequence, LM head 100 us and sampler 10 us a sequence."""
    folder.mkdir(parents=True)
    names = ("embedding", "layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn", "down_proj", "final_layernorm")
    (folder / "dense.csv").write_text("layer,tokens,time_us\n" + "".join(f"{x},{n},{n}\n" for x in names for n in (1, 64, 2048)))
    (folder / "per_sequence.csv").write_text("layer,sequences,time_us\n" + "".join(
        f"{x},{n},{u * n}\n" for x, u in (("lm_head", 100), ("sampler", 10)) for n in (1, 256)))
    (folder / "attention.csv").write_text("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n" + "".join(
        f"{c},0,{b},{k},{10 + b}\n" for c in (0, 2048) for b in (0, 1, 64) for k in (0, 1024)))


def test_the_layers_compose_a_step_as_the_model_runs_them(tmp_path):
    from benchmarks import llmservingsim_layers as ll

    _layers(tmp_path / "l")
    lay = ll.Layers(tmp_path / "l")
    # decode 64 x 1024 over 2 layers: 8 block layers x 64 us + attention 74 us, twice; embedding and final norm
    # 64 us each; LM head and sampler 110 us a sequence
    assert lay.step(2, 0, 0, 64, 1024) == pytest.approx((2 * (8 * 64 + 74) + 2 * 64 + 110 * 64) * 1e-6)
    # a 2048-token chunk: 2048 tokens through the dense layers, one sequence sampled
    assert lay.step(1, 2048, 0, 0, 0) == pytest.approx((8 * 2048 + 10 + 2 * 2048 + 110) * 1e-6)
    # a chunk beside 64 decodes (74 us) against the chunk alone (10) and the decodes alone (74)
    assert lay.mixed_ratio(2048, 64, 1024) == pytest.approx(74 / 84)
    with pytest.raises(ll.InputError, match="no row"):
        lay.attention(512, 0, 64, 1024)  # not measured: no nearest point stands in
    p = subprocess.run([sys.executable, "benchmarks/llmservingsim_layers.py", "--src", str(tmp_path / "none")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and "--src" in p.stderr
