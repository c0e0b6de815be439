"""Step times of a GPU aiconfigurator has no data of, from LLMServingSim's per-layer vLLM measurements
(benchmarks/measured_kernels.py --layers; the RTX 4090): the grid, the composition, the fit, the shipped
entry and what a profile says of it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import measured_kernels as bmk  # noqa: E402
from sim.hardware import measured_kernels as mk  # noqa: E402
from sim.hardware import roofline as R  # noqa: E402

NAMES = ("embedding", "layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn", "down_proj", "final_layernorm")


def _profiler(src: Path, excess: float = 0.0) -> Path:
    """A miniature LLMServingSim profiler checkout (every folder of bmk.LAYERS), priced as the GPU step model can say:
    each dense layer 1 us + 0.01 us a token, LM head and sampler 50 us + 1 us a sequence each, attention 5 us + 1e-6 us
    per (query, key) pair + 1e-5 us per key, and `excess` us per decode context token beside a chunk (c6's kind)."""
    tokens = sorted({1, *range(16, 2049, 16)})
    rows = []
    for c in (0, 16, 32, 64, 128, 256, 512, 1024, 2048):
        for kp in (0, 1024, 4096, 8192, 16384):
            for nd in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256):
                for kd in (0, 256, 512, 1024, 2048, 4096, 8192, 16384):
                    qk, keys = c * (c + kp) + nd * kd, (c + kp if c else 0) + nd * kd
                    t = 5 * (c > 0) + 5 * (nd > 0) + 1e-6 * qk + 1e-5 * keys + (excess * nd * kd if c else 0)
                    rows.append(f"{c},{kp},{nd},{kd},{t}\n")
    for spec in bmk.LAYERS.values():
        for repo, tps in spec["models"].values():
            base = src / "profiler" / "perf" / spec["folder"] / repo / "bf16"
            base.mkdir(parents=True)
            (base / "meta.yaml").write_text("vllm_version: 0.19.0\n")
            for tp in tps:
                (base / f"tp{tp}").mkdir()
                (base / f"tp{tp}" / "dense.csv").write_text("layer,tokens,time_us\n" + "".join(
                    f"{x},{n},{1 + 0.01 * n}\n" for x in NAMES for n in tokens))
                (base / f"tp{tp}" / "per_sequence.csv").write_text("layer,sequences,time_us\n" + "".join(
                    f"{x},{n},{50 + n}\n" for x in ("lm_head", "sampler") for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)))
                (base / f"tp{tp}" / "attention.csv").write_text("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n"
                                                                + "".join(rows))
    return src


def test_the_layer_grid_is_what_the_card_can_run_and_the_profiler_measured():
    pts = bmk.layer_grid(65536)
    assert {p.group for p in pts} == {"fresh_prefill", "cached_prefill", "decode", "mixed"}
    for p in pts:
        tokens, seqs, _, sum_k, _, _ = p.features()
        assert tokens <= 2048 and sum_k <= 65536 and (p.kind != "mixed" or p.B < 256)
    assert len(bmk.layer_grid(1 << 20)) > len(pts)
    held = [p for p in pts if bmk.held_out(p, bmk.LAYER_HELD)]
    for group in ("fresh_prefill", "cached_prefill", "decode", "mixed"):
        assert 0 < sum(p.group == group for p in held) < sum(p.group == group for p in pts)
    assert {b for b in (p.B for p in held if p.group == "decode")} & {32, 64} and any(p.B > 64 for p in held if p.group == "decode")


def test_a_step_model_priced_profiler_is_fitted_back_and_the_rest_of_the_file_kept(tmp_path):
    out = tmp_path / "mk.json"
    out.write_text(mk.DATA_FILE.read_text())
    before = json.loads(out.read_text())
    data = bmk.derive_layers(_profiler(tmp_path / "src"), out)
    assert json.loads(out.read_text()) == data
    mine = ("RTX-4090", "RTX-PRO-6000")
    assert {g: d for g, d in data["gpus"].items() if g not in mine} == {g: d for g, d in before["gpus"].items() if g not in mine}
    g = data["gpus"]["RTX-4090"]
    assert g["vllm"] == "0.19.0" and g["source"].startswith("LLMServingSim profiler, vLLM 0.19.0 layers") and "5daddb2" in g["source"]
    assert g["collectives"] == {} and "65536" in g["grid"] and g["held_out"] == bmk.LAYER_HELD_RULE
    fit = g["models"]["llama3.1-8b"]["1"]
    assert fit["heldout"]["all"]["mape_pct"] < 3.0  # the composed steps: the step model's form but a mixed step's 2 constants
    c = fit["coef"]
    # 32 blocks of 8 dense layers at 0.01 us a token, and the embedding and final norm: 2.58 us a token
    assert c["c1"] == pytest.approx((32 * 8 + 2) * 0.01e-6, rel=0.1)
    assert c["c6"] == 0.0  # additive attention: a decode beside a chunk costs what it costs alone
    # the RTX PRO 6000's aiconfigurator fits keep every coefficient and gain c6 (0 here) with its source
    pro = data["gpus"]["RTX-PRO-6000"]["models"]["llama3.1-8b"]["1"]
    was = before["gpus"]["RTX-PRO-6000"]["models"]["llama3.1-8b"]["1"]
    assert pro["coef"] == {**was["coef"], "c6": 0.0} and "LLMServingSim" in pro["c6"]["source"] and pro["heldout"] == was["heldout"]
    # and the layers' own release gets its fits, beside aiconfigurator's (vLLM 0.24.0)
    rel = data["gpus"]["RTX-PRO-6000"]["by_vllm"]["0.19.0"]
    assert rel["vllm"] == "0.19.0" and rel["source"] == g["source"] and "collectives" not in rel
    assert set(rel["models"]) == {"llama3.1-8b", "qwen3-32b"} and set(rel["models"]["qwen3-32b"]) == {"1", "2"}
    assert rel["models"]["llama3.1-8b"]["1"]["coef"]["c1"] == pytest.approx(c["c1"], rel=0.02)  # the same layers


def test_a_decode_beside_a_chunk_dearer_than_alone_is_priced_by_c6(tmp_path):
    out = tmp_path / "mk.json"
    out.write_text(mk.DATA_FILE.read_text())
    data = bmk.derive_layers(_profiler(tmp_path / "src", excess=2e-4), out)
    fit = data["gpus"]["RTX-4090"]["models"]["llama3.1-8b"]["1"]
    # 2e-4 us a decode context token beside a chunk, in each of 32 layers; exactly linear: held out to 0.1%
    assert fit["coef"]["c6"] == pytest.approx(32 * 2e-10, rel=1e-3) and fit["c6"]["heldout_mape_pct"] < 0.1
    assert fit["heldout"]["mixed"]["mape_pct"] < 3.0
    qwen = data["gpus"]["RTX-PRO-6000"]["models"]["qwen3-32b"]["2"]["coef"]
    assert qwen["c6"] == pytest.approx(64 * 2e-10, rel=1e-3)  # Qwen3-32B: 64 layers


def test_c6_prices_the_decodes_of_a_mixed_step_only():
    from conftest import linear_profile
    from sim.hardware.profile import step_features

    base, p = linear_profile(c4=1e-7), linear_profile(c4=1e-7, c6=3e-7)
    mixed, decode = [(512, 1024), (1, 300), (1, 700)], [(1, 300), (1, 700)]
    assert step_features(mixed)[5] == 1000 and step_features(decode)[5] == 0 and step_features([(512, 512)])[5] == 0
    assert p.step_time(*step_features(mixed)) - base.step_time(*step_features(mixed)) == pytest.approx(3e-7 * 1000)
    assert p.step_time(*step_features(decode)) == base.step_time(*step_features(decode))
    assert p.step.scaled(2.0).c6 == 6e-7
    assert base.step_time(*step_features(mixed)[:5]) == base.step_time(*step_features(mixed))  # c6 0: the same bits


def test_the_twin_is_exact_with_mixed_decodes_priced():
    import numpy as np
    from conftest import linear_profile, random_trace, simulate

    prof = linear_profile(c2=1e-7, c4=1e-6, c6=5e-5, blocks=400, budget=512)
    trace = random_trace(np.random.default_rng(5), 24)
    arrivals = np.cumsum(np.random.default_rng(6).exponential(0.3, 24))
    rows = {e: simulate(trace, "vllm", prof, arrivals, scheduler=e).turns[["program_id", "turn", "scheduled", "first_token",
                                                                           "finish", "preemptions"]] for e in ("simpy", "vllm")}
    assert rows["simpy"].equals(rows["vllm"])
    plain = simulate(trace, "vllm", linear_profile(c2=1e-7, c4=1e-6, blocks=400, budget=512), arrivals).turns
    assert rows["simpy"]["finish"].sum() > plain["finish"].sum()  # the mixed steps' decodes cost more


def test_the_cli_refuses_a_checkout_without_the_profiler_and_a_mix_of_modes(tmp_path):
    out = tmp_path / "mk.json"
    out.write_text(mk.DATA_FILE.read_text())
    before = out.read_bytes()
    for argv, word in ((["--layers", str(tmp_path / "none")], "--layers"), (["--layers", str(tmp_path), "--derive"], "--derive")):
        p = subprocess.run([sys.executable, "benchmarks/measured_kernels.py", *argv, "--out", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and word in p.stderr
    assert out.read_bytes() == before


def test_the_shipped_rtx_4090_entry_is_held_out_by_shape_per_kind():
    """Every kind within 10% held out but fresh prefill (10.9%: the layers' steps jump from 25.5 ms at 256 tokens to
    48.3 at 512, a knee the smooth step model rounds; tabled in docs/reference/profiles.md)."""
    fit = mk.load()["gpus"]["RTX-4090"]["models"]["llama3.1-8b"]["1"]
    kinds = {k: v["mape_pct"] for k, v in fit["heldout"].items()}
    assert set(kinds) >= {"fresh prefill", "cached prefill", "decode B=1", "decode B=2-16", "decode B=17-64", "decode B=65-256",
                          "mixed", "all"}
    assert kinds["fresh prefill"] <= 12 and all(v <= 10 for k, v in kinds.items() if k != "fresh prefill")
    assert fit["coef"]["c6"] > fit["coef"]["c4"]  # a decode beside a chunk: dearer a token than its decode-only KV read


def test_the_rtx_pro_6000_fits_carry_c6_from_the_layers_and_say_so():
    fits = mk.load()["gpus"]["RTX-PRO-6000"]["models"]
    for m, tps in (("llama3.1-8b", ("1", "2")), ("qwen3-32b", ("1", "2"))):
        for tp in tps:
            assert fits[m][tp]["coef"]["c6"] > 0 and fits[m][tp]["c6"]["source"].startswith("LLMServingSim profiler"), (m, tp)
    assert "c6" not in fits["qwen3-8b"]["1"]["coef"]  # no layers of it: not priced
    prof, _ = R.roofline_profile("RTX-PRO-6000", "llama3.1-8b", measured=True)
    assert prof["step_time"]["c6"] == fits["llama3.1-8b"]["1"]["coef"]["c6"]
    assert any("LLMServingSim" in n and "c6" in n for n in prof["provenance"]["notes"])


def test_an_rtx_4090_profile_says_which_measurements_priced_it():
    meas, _ = R.roofline_profile("RTX-4090", "llama3.1-8b", measured=True)
    roof, _ = R.roofline_profile("RTX-4090", "llama3.1-8b")
    prov = meas["provenance"]
    assert prov["source"] == "measured-kernels (LLMServingSim profiler, vLLM 0.19.0 layers)"
    assert "LLMServingSim" in prov["method"] and "aiconfigurator" not in prov["method"]
    assert "at most 65536 tokens of context" in prov["step_time"] and "ctx in {512, 4096}" in prov["step_time"]
    assert "LLMServingSim profiler" in meas["fit_error"]["anchor"] and "measured kernels" in meas["device"]
    assert roof["provenance"]["source"] == "roofline" and meas["step_time"] != roof["step_time"]
    assert meas["engine"] == roof["engine"]


def test_a_run_of_the_layers_release_takes_their_fits_with_its_all_reduce_added():
    """RTX PRO 6000: aiconfigurator's fits are vLLM 0.24.0 kernels, LLMServingSim's layers vLLM 0.19.0 modules.
    A profile for a release takes the fits measured nearest it (that release, else the latest before it, else
    the earliest): 0.19-0.23 and older the layers', 0.24 on and none aiconfigurator's. The layers are one rank's
    and hold no all-reduce: at tp 2 the release's measured one is added whole."""
    for v, layers in (("0.19.0", True), ("0.23.1", True), ("0.15.1", True), ("0.24.0", False), ("0.32", False), (None, False)):
        prof, _ = R.roofline_profile("RTX-PRO-6000", "qwen3-32b", tp=2, measured=True, vllm_version=v)
        assert ("LLMServingSim" in prof["provenance"]["source"]) == layers, v
        fit = mk.step_fit("RTX-PRO-6000", "qwen3-32b", 2, vllm_version=v)
        assert all(prof["step_time"][k] == fit["coef"][k] for k in fit["coef"]), v
    prof, _ = R.roofline_profile("RTX-PRO-6000", "qwen3-32b", tp=2, measured=True, vllm_version="0.19.0")
    _, m = R.find_model("qwen3-32b")
    ar = mk.collective("RTX-PRO-6000", "all_reduce", 2, "0.19.0")
    per = 2 * m["num_layers"]
    assert prof["step_time"]["collective_shift"] == pytest.approx(per * ar["latency_s"], rel=1e-4)
    assert prof["step_time"]["collective_shift_token"] == pytest.approx(per * m["hidden_size"] * 2 / (ar["GBps"] * 1e9), rel=1e-4)
    assert "hold none" in prof["provenance"]["collectives"] and "collectives inside" not in prof["provenance"]["step_time"]
    one, _ = R.roofline_profile("RTX-PRO-6000", "llama3.1-8b", measured=True, vllm_version="0.19.0")
    assert "collective_shift" not in one["step_time"] and "LLMServingSim" in one["fit_error"]["anchor"]
    # a model or tp the layers did not measure keeps aiconfigurator's fit; the 4090 has only the layers
    other, _ = R.roofline_profile("RTX-PRO-6000", "qwen3-8b", measured=True, vllm_version="0.19.0")
    assert other["provenance"]["source"].startswith("measured-kernels (aiconfigurator")
    assert other["step_time"] == mk.load()["gpus"]["RTX-PRO-6000"]["models"]["qwen3-8b"]["1"]["coef"]
    assert mk.release_entry("RTX-4090", "0.30") is mk.load()["gpus"]["RTX-4090"]


def test_a_real_runs_decode_seconds_are_read_only_where_every_step_is_a_decode_of_all(tmp_path):
    """benchmarks/llmservingsim_layers.py decode_seconds: a second counts when it and the one before hold no
    prompt tokens, the running count holds and the request stamps agree with it; its step = running / tokens."""
    from benchmarks.llmservingsim_layers import decode_seconds

    (tmp_path / "timeseries.csv").write_text(
        "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
        "1.0,900.0,10.0,8,0,0.0\n"      # prompt tokens
        "2.0,0.0,400.0,8,0,0.0\n"       # the second before had prompt tokens
        "3.0,0.0,400.0,8,0,0.0\n"       # counted: 8 / 400 = 20 ms
        "4.0,0.0,380.0,9,0,0.0\n"       # the running count changed
        "5.0,0.0,360.0,9,0,0.0\n")      # stamps say 8 are decoding, not 9
    reqs = [{"queued_ts": 0.0, "input_toks": 100 * (i + 1), "output_toks": 1000, "first_token_ts": 0.5, "last_token_ts": 10.5}
            for i in range(8)]
    (tmp_path / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in reqs) + "\n")
    got = decode_seconds(tmp_path, lambda n, k: n * k * 1e-6)
    # mid-second 2.5: each request 20% through its 1,000 outputs; inputs 100..800, mean 450
    assert got == [(8, pytest.approx(0.02), pytest.approx(8 * 650 * 1e-6))]


def test_skewed_decode_batches_are_read_per_regime_against_their_uniform_twin(tmp_path):
    """benchmarks/llmservingsim_layers.py skewed_decodes: per regime of skew.csv, how many batches and the mean and
    90th percentile of t_skew / t_mean; nothing where the profiler measured no skew."""
    from benchmarks.llmservingsim_layers import skewed_decodes

    assert skewed_decodes(tmp_path) == {}
    rows = [("pure", 100.0, 110.0), ("pure", 100.0, 100.0), ("mixed", 50.0, 60.0)] + [("pure", 10.0, 10.0)] * 7
    (tmp_path / "skew.csv").write_text("regime,n,t_mean_us,t_max_us,t_skew_us\n"
                                       + "".join(f"{r},8,{m},{3 * m},{s}\n" for r, m, s in rows))
    got = skewed_decodes(tmp_path)
    assert got["mixed"] == (1, pytest.approx(1.2), pytest.approx(1.2))
    n, mean, p90 = got["pure"]
    assert n == 9 and mean == pytest.approx(1 + 0.1 / 9) and 1.0 <= p90 < 1.1
