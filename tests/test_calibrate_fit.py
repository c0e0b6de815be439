"""Calibration without an engine: fits on synthetic probes, MAPE, profile files, limits."""
import json
import math

import numpy as np
import pytest

from calibrate.fit import FEATURES, fit_quadratic, fit_step_model, mape, nnls_relative
from calibrate.limits import check_limits
from calibrate.pcie import measure_pcie
from calibrate.probes import Probe, features, plan
from calibrate.run import build_profile, write_profile
from sim.cli import main
from sim.hardware.profile import load_profile
from agentsim.errors import InputError

ENGINE = {"name": "vllm", "version": "test", "block_size": 128, "num_gpu_blocks": 1365, "max_num_batched_tokens": 4096,
          "max_num_seqs": 256, "enable_chunked_prefill": True, "enable_prefix_caching": True, "max_model_len": 8192}
MODEL = {"name": "tiny", "num_layers": 6, "num_kv_heads": 4, "head_dim": 64, "dtype_bytes": 2}
TRUE = np.array([0.01, 7e-5, 1.5e-8, 5e-5, 7e-8, 3e-7])  # c0..c5


def synthetic_rows(coef=TRUE, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in plan(ENGINE):
        x = features(p, ENGINE["max_num_batched_tokens"])
        p.samples = [float(np.dot(coef, x) * (1 + noise * rng.standard_normal()))]
        rows.append(p.to_json(ENGINE["max_num_batched_tokens"]))
    return rows


def test_step_fit_recovers_known_coefficients():
    fit = fit_step_model(synthetic_rows())
    got = np.array([fit["coef"][f"c{i}"] for i in range(6)])
    np.testing.assert_allclose(got, TRUE, rtol=1e-3)  # probe times are stored to the microsecond
    assert fit["heldout_mape"] < 0.01 and fit["train_mape"] < 0.01


def test_step_fit_is_nonnegative_and_reports_heldout_error_under_noise():
    fit = fit_step_model(synthetic_rows(noise=0.03, seed=1))
    assert all(v >= 0 for v in fit["coef"].values())
    assert 0 < fit["heldout_mape"] < 10
    assert {"heldout_mape_prefill", "heldout_mape_cached_prefill", "heldout_mape_decode"} <= fit.keys()


def test_quadratic_fit_recovers_paper_form():
    a, b, c = 0.02, 1e-4, 3e-9
    rows = [{"kind": "prefill", "new": n, "heldout": n in (1500, 3000), "seconds": a + b * n + c * n * n}
            for n in (64, 512, 1000, 1500, 2000, 3000, 4000, 8000)]
    fit = fit_quadratic(rows)
    np.testing.assert_allclose([fit["coef"][k] for k in "abc"], [a, b, c], rtol=1e-6)
    assert fit["heldout_mape"] < 1e-6


def test_nnls_clamps_negative_coefficient_to_zero():
    A = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # decreasing: the slope wants to be negative
    x = nnls_relative(A, y)
    assert x[1] == 0 and x[0] > 0
    with pytest.raises(ValueError):
        nnls_relative(A, [1.0, 0.0, 1.0])


def test_mape_arithmetic():
    assert mape([110, 90], [100, 100]) == pytest.approx(10.0)
    assert mape([1.5], [1.0]) == pytest.approx(50.0)
    assert math.isnan(mape([], []))


def test_prefill_features_follow_chunking():
    x = dict(zip(FEATURES, features(Probe("prefill", 5000), 4096)))
    assert x == {"steps": 2, "tokens": 5000, "sum_qk": 4096 * 4096 + 904 * 5000, "seqs": 2, "sum_k": 4096 + 5000,
                 "sum_q_cached": 904 * 4096}  # the second chunk attends to the first
    x = dict(zip(FEATURES, features(Probe("cached_prefill", 1000, prefix=1024), 4096)))
    assert x == {"steps": 1, "tokens": 1000, "sum_qk": 1000 * 2024, "seqs": 1, "sum_k": 2024, "sum_q_cached": 1000 * 1024}


def test_decode_features_are_per_step_means():
    x = dict(zip(FEATURES, features(Probe("decode", 4, prefix=256, batch=2), 4096)))
    mean_k = 256 + 16 + 2.5  # k = prefix + 16 suffix tokens + j, j = 1..4
    assert x == {"steps": 1, "tokens": 2, "sum_qk": 2 * mean_k, "seqs": 2, "sum_k": 2 * mean_k, "sum_q_cached": 2 * (mean_k - 1)}


def test_plan_respects_engine_limits():
    small = dict(ENGINE, max_model_len=2048, max_num_seqs=4, num_gpu_blocks=64)
    probes = plan(small, quick=True)
    assert all(p.prefix + p.new < 2048 for p in probes if p.kind != "decode")
    assert all(p.batch <= 4 and p.batch * (p.prefix + 16 + p.new) <= 64 * 128 for p in probes if p.kind == "decode")
    assert {p.kind for p in probes} == {"prefill", "cached_prefill", "decode"} and any(p.heldout for p in probes)


def _profile():
    lim = {"model": dict(MODEL), "engine": dict(ENGINE), "kv_bytes_per_block": 2 * 6 * 4 * 64 * 2 * 128}
    meta = {"quick": True, "repeats": 1, "seed": 0, "engine_start_s": 0.0}
    return build_profile(lim, synthetic_rows(), measure_pcie("cpu"), "test CPU", meta)


def test_profile_written_atomically_loads_in_the_simulator(tmp_path):
    out = write_profile(_profile(), tmp_path / "p.json")
    assert [f.name for f in tmp_path.iterdir()] == ["p.json"]  # no temp file left
    prof = load_profile(str(out))
    np.testing.assert_allclose(prof.step.coefficients, TRUE, rtol=1e-3)
    assert prof.engine.num_gpu_blocks == 1365 and prof.block_size == 128
    assert prof.pcie_bandwidth is None  # CPU: not measured
    raw = json.loads(out.read_text())
    assert raw["pcie"] == {**raw["pcie"], "measured": False, "bandwidth_GBps": None}
    assert {"prefill_quadratic_mape", "step_model_mape"} <= raw["fit_error"].keys()
    assert set(raw["prefill_quadratic"]) == {"a", "b", "c"} and raw["probes"]
    assert raw["provenance"]["how"]["decode"]


def test_invalid_profile_is_not_written(tmp_path):
    bad = _profile()
    bad["step_time"]["c1"] = -1.0
    with pytest.raises(InputError):
        write_profile(bad, tmp_path / "p.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mutate, words", [
    (lambda p: p.pop("engine"), "missing section 'engine'"),
    (lambda p: p["engine"].pop("num_gpu_blocks"), "engine.num_gpu_blocks"),
    (lambda p: p["step_time"].update(c2="fast"), "step_time.c2"),
    (lambda p: p["engine"].update(block_size=[16]), "engine.block_size"),
])
def test_malformed_profile_gives_one_line_error(tmp_path, mutate, words):
    raw = _profile()
    mutate(raw)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(InputError) as e:
        load_profile(str(path))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_non_json_profile_gives_one_line_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"model": {,}')
    with pytest.raises(InputError, match="not valid JSON") as e:
        load_profile(str(path))
    assert "\n" not in str(e.value)


def test_limit_mismatch_names_the_flag():
    check_limits({"num_gpu_blocks": 1365, "block_size": None}, ENGINE)  # matches: no error
    with pytest.raises(InputError, match="--num-gpu-blocks 500 .*num_gpu_blocks=1365"):
        check_limits({"num_gpu_blocks": 500}, ENGINE)
    with pytest.raises(InputError, match="--max-model-len"):
        check_limits({"max_model_len": 4096}, ENGINE)


@pytest.mark.parametrize("argv, words", [
    (["calibrate", "--out", "profile.txt"], "must end in .json"),
    (["calibrate", "--out", "p.json", "--model", "/no/such/model"], "does not exist"),
    (["calibrate", "--out", "p.json", "--num-gpu-blocks", "0"], "argument --num-gpu-blocks: 0 is below 1"),
])
def test_cli_bad_input_is_one_line(capsys, tmp_path, argv, words):
    argv = [a if a != "p.json" else str(tmp_path / a) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err
    assert not (tmp_path / "p.json").exists()


# --- engine limits computed as vLLM 0.32 would (sim/hardware/limits.py) ----------------
LLAMA8B = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8, "head_dim": 128,
           "intermediate_size": 14336, "vocab_size": 128256, "dtype_bytes": 2, "num_params": 8.03e9,
           "max_position_embeddings": 131072}


def test_gpu_engine_limits_follow_vllm_defaults_and_memory_arithmetic():
    from sim.hardware.kv_pool import kv_pool
    from sim.hardware.limits import GiB, gpu_engine_limits

    h100 = gpu_engine_limits(LLAMA8B, 85.0e9, gpu_name="NVIDIA H100 80GB HBM3")
    assert (h100["max_num_batched_tokens"], h100["max_num_seqs"], h100["max_model_len"]) == (16384, 1024, 131072)
    assert h100["enable_chunked_prefill"] and h100["enable_prefix_caching"] and "computed" in h100["computed"]
    p = kv_pool(85.0e9, LLAMA8B, max_num_batched_tokens=16384, max_num_seqs=1024)  # the arithmetic: tests/test_kv_pool.py
    kv = math.ceil(85.0e9 * 0.9) - 16.06e9 - p.load_overhead_bytes - p.activation_bytes - p.non_torch_bytes - p.cudagraph_bytes
    assert h100["num_gpu_blocks"] == p.blocks == int(kv // (2 * 32 * 8 * 128 * 2 * 16))
    # an A100 keeps the smaller defaults (vLLM PR #17885); so does the API server on an H100
    assert gpu_engine_limits(LLAMA8B, 85.0e9, gpu_name="A100-SXM4-80GB")["max_num_batched_tokens"] == 8192
    assert gpu_engine_limits(LLAMA8B, 85.0e9, usage_context="serve")["max_num_batched_tokens"] == 8192
    assert gpu_engine_limits(LLAMA8B, 48 * GiB)["max_num_seqs"] == 256
    assert gpu_engine_limits(LLAMA8B, 192 * GiB)["max_num_batched_tokens"] == 16384
    # tp=2: half the weights and KV heads per GPU -> more than twice the blocks of one GPU
    tp2 = gpu_engine_limits(LLAMA8B, 85.0e9, tp=2)
    assert tp2["num_gpu_blocks"] > 2 * h100["num_gpu_blocks"]
    explicit = gpu_engine_limits(LLAMA8B, 85.0e9, max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=8192, block_size=32)
    assert (explicit["max_num_batched_tokens"], explicit["max_num_seqs"], explicit["max_model_len"], explicit["block_size"]) == (2048, 64, 8192, 32)


def test_gpu_engine_limits_bad_input_is_one_line():
    from sim.hardware.limits import gpu_engine_limits

    for kwargs, needle in [({"gpu_mem_bytes": 24e9}, "does not fit"), ({"gpu_mem_bytes": 85e9, "tp": 3}, "tp=3"),
                           ({"gpu_mem_bytes": 85e9, "gpu_memory_utilization": 1.5}, "gpu_memory_utilization")]:
        with pytest.raises(InputError, match=needle) as e:
            gpu_engine_limits(LLAMA8B, **kwargs)
        assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="vocab_size"):
        gpu_engine_limits({k: v for k, v in LLAMA8B.items() if k != "vocab_size"}, 85e9)


# --- the GPU step model (calibrate/fit.py fit_gpu_step_model) -----------------------------
def test_gpu_step_fit_balanced_by_kind_gives_a_rare_kind_its_share():
    # the torch plan on a GPU is mostly decode and mixed probes; weighted by kind, the few
    # prefill rows are not traded away when the model cannot fit every row
    from calibrate.fit import fit_gpu_step_model, gpu_step_time
    from calibrate.probes import step_row

    true = {"c0": 2e-4, "c1": 2.4e-5, "c2": 4e-10, "c3": 5e-6, "c4": 4e-8, "c5": 5e-10, "w": 0.0065, "launch": 0.0125, "p": 5.0}
    shapes = [("prefill", [(n, n)]) for n in (256, 1000, 4000, 16000)]
    shapes += [("cached_prefill", [(n, n + k)]) for n, k in ((512, 4000), (2000, 8000), (1000, 30000))]
    shapes += [("decode", [(1, c)] * b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) for c in (512, 2048, 8192)]

    def rows(slow_kind, extra):  # `extra` seconds on every row of one kind: no term of the model is that
        out = []
        for kind, seqs in shapes:
            x = step_row(seqs)
            out.append({"kind": kind, "heldout": False, "features": dict(zip(FEATURES, map(float, x))),
                        "seconds": float(gpu_step_time(true, [x])[0]) + (extra if kind == slow_kind else 0.0)})
        return out

    r = rows("cached_prefill", 0.01)
    plain, balanced = fit_gpu_step_model(r), fit_gpu_step_model(r, balance_kinds=True)
    assert balanced["train_mape_cached_prefill"] < plain["train_mape_cached_prefill"] - 0.5, (plain, balanced)
    assert balanced["train_mape_decode"] > plain["train_mape_decode"]  # the price: the many decode rows
    # here the weighted Gauss-Newton polish diverged (an SVD that did not converge): the
    # optimiser's point is kept
    assert math.isfinite(fit_gpu_step_model(rows("prefill", 0.005), balance_kinds=True)["train_mape"])
    # as many rows of each kind: the same fit either way
    even = [x for k in ("prefill", "cached_prefill", "decode") for x in [y for y in r if y["kind"] == k][:3]]
    assert fit_gpu_step_model(even, balance_kinds=True)["coef"] == pytest.approx(fit_gpu_step_model(even)["coef"], rel=1e-6)


def test_gpu_step_fit_recovers_known_coefficients_and_needs_one_step_rows():
    from calibrate.fit import fit_gpu_step_model, gpu_step_time
    from calibrate.probes import step_row

    true = {"c0": 2e-4, "c1": 2.4e-5, "c2": 4e-10, "c3": 5e-6, "c4": 4e-8, "c5": 5e-10, "w": 0.0065, "launch": 0.0125, "p": 5.0}
    shapes = [("prefill", [(n, n)]) for n in (128, 256, 512, 1000, 2000, 4000, 8000, 16000, 32000)]
    shapes += [("cached_prefill", [(n, n + k)]) for n, k in ((512, 4000), (512, 16000), (2000, 8000), (4000, 12000), (1000, 60000), (8000, 24000))]
    shapes += [("decode", [(1, c)] * b) for b in (1, 4, 16, 64, 256) for c in (512, 2048, 8192)]
    seen, rows = {}, []
    for kind, seqs in shapes:
        x = step_row(seqs)
        i = seen[kind] = seen.get(kind, -1) + 1
        rows.append({"kind": kind, "heldout": i % 3 == 2, "seconds": float(gpu_step_time(true, [x])[0]),
                     "features": dict(zip(FEATURES, map(float, x)))})
    fit = fit_gpu_step_model(rows)
    for k, v in true.items():
        assert fit["coef"][k] == pytest.approx(v, rel=1e-5), k
    assert fit["heldout_mape"] < 1e-4
    chunked = [dict(rows[0], features=dict(rows[0]["features"], steps=2.0))] + rows[1:]
    with pytest.raises(ValueError, match="one-step rows"):
        fit_gpu_step_model(chunked)


def test_decode_probes_of_one_context_reuse_the_smaller_batches_own_prefixes(monkeypatch):
    """Runner.decode_seconds: every sequence of a batch has its own prefix (distinct KV), and a larger
    batch over the same length starts from the smaller one's prefixes, which the prefix cache may still
    hold; the plan orders decode probes by context, then batch, so that it does."""
    from types import SimpleNamespace

    from calibrate import probes

    sent = []

    def fake_generate(llm, prompts, max_tokens):
        sent.append([list(p) for p in prompts])
        return [SimpleNamespace(metrics=SimpleNamespace(first_token_ts=1.0, last_token_ts=1.0 + 0.01 * max_tokens))
                for _ in prompts]

    monkeypatch.setattr(probes, "generate", fake_generate)
    runner = probes.Runner(None, 32000, 4096, seed=0)
    for batch in (1, 4, 16):
        runner.decode_seconds(batch, 256, 8)
    heads = [sent[i] for i in (0, 2, 4)]  # each probe: its prefixes, then prefix + suffix timed
    assert [len(h) for h in heads] == [1, 4, 16] and all(len(p) == 256 for h in heads for p in h)
    assert heads[1][:1] == heads[0] and heads[2][:4] == heads[1]
    assert len({tuple(p) for p in heads[2]}) == 16  # distinct within a batch
    for i in (1, 3, 5):  # the timed prompts: own prefix + 16 suffix tokens
        assert [p[:256] for p in sent[i]] == heads[i // 2] and all(len(p) == 256 + probes.DECODE_SUFFIX for p in sent[i])
    runner.decode_seconds(2, 512, 8)
    assert not {tuple(p[:256]) for p in sent[-2]} & {tuple(p) for p in heads[2]}  # another length: new prefixes
    # the plan: decode probes by context, then batch
    eng = {"max_model_len": 8192, "max_num_batched_tokens": 4096, "block_size": 128, "enable_chunked_prefill": True,
           "max_num_seqs": 256, "num_gpu_blocks": 1024}
    grid = [(p.prefix, p.batch) for p in plan(eng, quick=True) if p.kind == "decode" and not p.heldout]
    assert grid == sorted(grid) and [b for c, b in grid if c == grid[-1][0]] == [1, 4, 16]
