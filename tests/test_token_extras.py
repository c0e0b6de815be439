"""aiconfigurator prices a prefill step's rotary embedding and KV-cache write from one token's bytes
(its ContextAttentionOp extras); sim/hardware/check.py aic_token_extras_s prices the other tokens by
its own byte counts, and aiconfigurator_points always adds them, so `sim profile check --aiconfigurator`,
the docs' tables and benchmarks/measured_kernels.py --derive price its steps one way."""
import json

import pytest

from agentsim.errors import InputError
from sim.hardware import check as pc
from sim.hardware import roofline as R
from sim.hardware.profile import parse_profile

BW = 3.35e12 * 0.8  # H100's mem_bw x mem_bw_empirical_scaling_factor in aiconfigurator's system file


def _shape(model: str) -> dict:
    return {k: R.find_model(model)[1][k] for k in pc.SHAPE_KEYS}


def _aic_installed() -> bool:
    try:
        pc._aic()
    except InputError:
        return False
    return True


needs_aic = pytest.mark.skipif(not _aic_installed(), reason="needs the optional extra aiconfigurator-core")


def test_the_extras_grow_with_the_tokens_and_the_heads_each_gpu_holds():
    s8 = _shape("llama3.1-8b")  # 32 q heads, 8 KV heads of 128, 32 layers
    assert pc.aic_token_extras_s(s8, 1, 1, BW) == 0.0  # the one token aiconfigurator already prices
    one = pc.aic_token_extras_s(s8, 1, 2, BW)
    # rotary: q (4096) and k (1024) bf16 values read and written; the write: k and v (1024 each) bf16
    assert one == pytest.approx(1.1 * 32 * (2 * 2 * (4096 + 1024) + 2 * 2 * 1024) / BW)
    assert pc.aic_token_extras_s(s8, 1, 8001, BW) == pytest.approx(8000 * one)
    assert pc.aic_token_extras_s(s8, 2, 8001, BW) == pytest.approx(8000 * one / 2)  # heads split over 2 GPUs
    # 8 KV heads over 16 GPUs: one KV head each (replicated), q still split
    q16 = 1.1 * 32 * (2 * 2 * (256 + 128) + 2 * 2 * 128) / BW
    assert pc.aic_token_extras_s(s8, 16, 2, BW) == pytest.approx(q16)
    # multi-head attention (Llama-2-7B: 32 KV heads) writes four times the KV of the 8B's
    assert pc.aic_token_extras_s(_shape("llama2-7b"), 1, 2, BW) > 1.5 * one


@needs_aic
def test_aiconfigurator_prices_the_extras_for_one_token_whatever_the_step():
    """The premise: its context attention minus its measured attention row is the same at 1K and 8K
    tokens, and equals its memory-op formula on one token's bytes (x 1.1, every layer). Fails when a
    release scales them by the tokens; then aiconfigurator_points would count them twice."""
    import os

    import aiconfigurator_core
    import pandas as pd
    from aiconfigurator_core.sdk import engine, perf_database, utils

    prof = parse_profile(R.roofline_profile("H100", "llama3.1-8b", 1)[0], "x")
    v = perf_database.get_latest_database_version("h100_sxm", "vllm")
    h = engine.EngineHandle.compile(pc.aic_model(prof.model, utils), "h100_sxm", "vllm", backend_version=v, tp_size=1,
                                    moe_tp_size=1, kvcache_quant_mode="bfloat16", fmha_quant_mode="bfloat16")
    table = pd.read_parquet(os.path.join(os.path.dirname(aiconfigurator_core.__file__), "systems", "data", "h100_sxm",
                                         "attention", "vllm", v, "context_attention_perf.parquet"))
    rows = table[(table.num_heads == 32) & (table.num_key_value_heads == 8) & (table.head_dim == 128)
                 & (table.batch_size == 1) & (table.window_size == 0) & (table.kv_cache_dtype == "bfloat16")]
    mem = lambda b: b / BW * 1e3 + 0.003  # noqa: E731  its mem-op formula, ms (3 us constant)
    one_token = 1.1 * (2 * mem(2 * (4096 + 1024)) + 2 * mem(2 * 1024))
    for n in (1024, 8192):
        attn = dict((name, ms) for name, ms, *_ in h.run_static_per_op(batch_size=1, isl=n, osl=2)[0])["context_attention"]
        measured = rows[rows.isl == n].latency.min()
        assert attn / 32 - measured == pytest.approx(one_token, rel=0.02), n


@needs_aic
def test_every_step_with_prompt_tokens_pays_the_other_tokens_extras_once(monkeypatch):
    prof = parse_profile(R.roofline_profile("H100", "llama3.1-8b", 1)[0], "x")
    pts = [pc.Probe("prefill", n=2000), pc.Probe("prefill", n=512, k=4000), pc.Probe("decode", B=64, ctx=2048),
           pc.Probe("mixed", n=512, B=64, ctx=2048)]
    more, used = pc.aiconfigurator_points(prof, pts)
    assert "token_extras" not in used  # one way to price: nothing to record or ask for
    with pytest.raises(TypeError):
        pc.aiconfigurator_points(prof, pts, token_extras=False)
    bw = pc.aic_mem_bw("h100_sxm")
    assert bw == pytest.approx(BW)
    shape = pc.model_shape(prof.model)
    want = [pc.aic_token_extras_s(shape, 1, t, bw) for t in (2000, 512, 1, 512 + 64)]
    monkeypatch.setattr(pc, "aic_token_extras_s", lambda *a: 0.0)  # aiconfigurator's own sums
    base, _ = pc.aiconfigurator_points(prof, pts)
    added = [m.seconds[pc.STAT] - b.seconds[pc.STAT] for b, m in zip(base, more)]
    assert added == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert added[2] == 0.0 and added[0] > 0.01 * base[0].seconds[pc.STAT]  # 1%+ of a 2K-token prefill


def test_every_derive_takes_the_checks_steps_as_priced_and_the_flag_is_gone(monkeypatch, capsys):
    """The derive fits on aiconfigurator_points' seconds as they come (the extras are in them once):
    it asks for the same steps the check prices and adds nothing of its own."""
    from benchmarks import measured_kernels as bm

    asked, priced = [], [pc.Probe("prefill", n=2000, seconds={pc.STAT: 0.1})]

    def points(prof, pts, **kw):
        asked.append(kw)
        return priced, {}

    def rows(pts):
        assert pts is priced
        raise InputError("stop")

    monkeypatch.setattr(pc, "aiconfigurator_points", points)
    monkeypatch.setattr(bm, "_rows", rows)
    for kv in ("auto", "fp8"):
        with pytest.raises(InputError, match="stop"):
            bm.fit_combo("H100", "llama3.1-8b", 1, kv)
    assert asked == [{}] * 2
    with pytest.raises(SystemExit) as e:  # the old opt-in is refused, not ignored
        bm.main(["--derive", "--token-extras"])
    assert e.value.code == 2 and "--token-extras" in capsys.readouterr().err


@needs_aic
def test_the_prefill_terms_table_adds_up_to_aiconfigurators_step(capsys):
    """benchmarks/prefill_terms.py: its op groups sum to aiconfigurator's prefill step, its left-out
    rotary and KV write is aic_token_extras_s, and the H100 probe rows come from the shipped file."""
    from benchmarks import prefill_terms as bt

    rows = bt.terms("H100", "llama3.1-8b", 1, [2000, 8000])
    probes = {p["n"]: p["median_s"] for p in json.loads(
        (bt.ROOT / "sim/hardware/measurements/h100/llama3.1-8b-shape-torch-probes.json").read_text())["probes"]
        if p["kind"] == "prefill" and not p["k"]}
    shape = pc.model_shape(parse_profile(R.roofline_profile("H100", "llama3.1-8b", 1)[0], "x").model)
    for r in rows:
        assert sum(r["groups"].values()) == pytest.approx(r["aic_s"], rel=1e-4)
        assert r["extras_s"] == pc.aic_token_extras_s(shape, 1, r["n"], BW)
        assert r["probe_s"] == probes[r["n"]] and r["probe_attention_s"] > 0
        assert 0 < r["final_norm_s"] < 0.001 * r["aic_s"]  # the last norm is negligible
        # qkv 4096 -> 4096 + 2 x 1024, o, gate-up 2 x 14336, down: 218.1 M multiply-adds a token and layer
        assert r["gemm_flops"] == 2 * r["n"] * 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)
    assert bt.gemm_flops(shape, 2, 1000) == rows[0]["gemm_flops"] / 2000 * 1000 / 2  # heads and MLP split over 2
    assert bt.terms("H100", "qwen3-30b-a3b", 1, [1000])[0]["gemm_flops"] is None  # experts: not this count
    assert bt.main(["--n", "2000"]) == 0
    out = capsys.readouterr().out
    assert "GEMM TFLOPS: aiconfigurator / the probe's" in out
    assert bt.main(["--n", "2000,x"]) == 2 and bt.main(["--n", "0"]) == 2 and bt.main(["--gpu", "Z"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("error: ") for e in err)


def test_every_gpu_says_its_prefill_pays_every_tokens_extras():
    from sim.hardware import measured_kernels as mk

    shipped = mk.load()
    assert not any("token_extras" in d for d in shipped["gpus"].values())  # no per-GPU record: one way for all
    for g, d in shipped["gpus"].items():
        if "source" in d:  # steps composed from vLLM's own layers, each run at the step's token count
            assert "layers" in mk.source_text(g), g
            continue
        assert mk.source_text(g).endswith(", rotary and KV write of every token)"), g
