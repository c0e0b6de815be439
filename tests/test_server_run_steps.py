"""benchmarks/server_run_steps.py: the published runs' steps priced by the judge's profile and by aiconfigurator."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import server_run_steps as srs  # noqa: E402
from benchmarks import server_runs_table as srt  # noqa: E402

DATA = json.loads((ROOT / "benchmarks" / "data" / "server_runs.json").read_text())


def _run(gpu: str, tp: int, label: str, c: int) -> dict:
    return next(r for r in DATA["runs"] if (r["gpu"], r["tp"], r["workload"].get("label"), r["workload"]["concurrency"])
                == (gpu, tp, label, c))


def test_the_sequences_in_decode_are_littles_law_on_the_real_figures():
    run = _run("H100", 2, "8k1k", 64)
    m = run["measured"]
    e2e = m["ttft_ms"]["mean"] + m["tpot_ms"]["mean"] * (srs.mean_output(run) - 1)
    assert srs.in_decode(run) == pytest.approx(64 * (e2e - m["ttft_ms"]["mean"]) / e2e)
    # this run is KV-bound: the server kept far fewer than its 64 requests in decode (docs/validation.md)
    assert 20 < srs.in_decode(run) < 40
    assert 3.5 < srs.in_decode(_run("H100", 2, "1k1k", 4)) <= 4


def test_the_steps_are_the_runs_decode_mixed_and_prompt():
    run = _run("H100", 4, "1k1k", 64)
    b = round(srs.in_decode(run))
    dec, mix, pre = srs.shapes(run, budget=8192)
    ctx = round(srt.decode_ctx(run))
    assert (dec.kind, dec.B, dec.ctx) == ("decode", b, ctx)
    assert (mix.kind, mix.B, mix.ctx, mix.n) == ("mixed", b - 1, ctx, srs.mean_input(run))
    assert (pre.kind, pre.n) == ("prefill", srs.mean_input(run))
    # a prompt over the token budget: its first chunk beside the others fills the budget exactly
    assert srs.shapes(run, budget=512)[1].n == 512 - (b - 1) and srs.shapes(run, budget=512)[2].n == 512


def test_the_implied_tpot_mixes_in_one_prompt_per_output_of_each_running_request():
    run = _run("H100", 4, "1k1k", 16)
    b, out = srs.in_decode(run), srs.mean_output(run)
    assert srs.implied_tpot_ms(run, 10.0, 60.0) == pytest.approx(10.0 + b / out * 50.0)
    assert srs.implied_tpot_ms(run, 10.0, 10.0) == 10.0


def test_the_profile_column_is_the_judges_profile_and_the_reference_is_aiconfigurators():
    pytest.importorskip("aiconfigurator_core")
    from sim.hardware import check as pc
    from sim.hardware.profile import load_profile

    run = _run("H100", 4, "1k1k", 16)
    rows = srs.rows(DATA, [run])
    b = round(srs.in_decode(run))
    assert [r["kind"] for r in rows] == ["decode", "mixed", "prefill"]
    with tempfile.TemporaryDirectory() as tmp:  # the profile file the judge itself writes for this run
        path, which, _ = srt.build_profile(DATA, run, "engine", Path(tmp))
        prof = load_profile(path).scheduled(run["engine"]["async_scheduling"])  # as the replay schedules it
    assert which == "measured" and {r["profile"] for r in rows} == {"measured"} and prof.step.overlap
    dec = pc.Probe("decode", B=b, ctx=round(srt.decode_ctx(run)))
    assert rows[0]["profile_ms"] == pytest.approx(prof.step_time(*dec.features()) * 1e3)
    ref, _ = pc.aiconfigurator_points(prof, [dec])
    assert rows[0]["aic_ms"] == pytest.approx(ref[0].seconds[pc.STAT] * 1e3)
    # the prompt's steps as the check prices them (every token's rotary and KV write, as the measured
    # coefficients were fitted; tests/test_token_extras.py)
    steps, _ = pc.aiconfigurator_points(prof, srs.shapes(run, prof.engine.max_num_batched_tokens))
    assert [r["aic_ms"] for r in rows] == pytest.approx([p.seconds[pc.STAT] * 1e3 for p in steps])
    for r in rows:
        assert r["error_pct"] == pytest.approx((r["profile_ms"] - r["aic_ms"]) / r["aic_ms"] * 100)
    # a mixed step costs more than its decodes alone, on both sides
    assert rows[1]["profile_ms"] > rows[0]["profile_ms"] and rows[1]["aic_ms"] > rows[0]["aic_ms"]
    (t,) = srs.tpot_rows(DATA, [run], rows)
    assert t["real_ms"] == run["measured"]["tpot_ms"]["mean"]
    assert t["aic_ms"] == pytest.approx(srs.implied_tpot_ms(run, rows[0]["aic_ms"], rows[1]["aic_ms"]))
    assert t["per_all_reduce_us"] == pytest.approx((t["real_ms"] - t["aic_ms"]) / 160 * 1e3)  # 80 layers, 2 each


def test_an_unknown_gpu_is_refused_in_one_line():
    p = subprocess.run([sys.executable, "benchmarks/server_run_steps.py", "--gpus", "H999"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "--gpus" in p.stderr and "H999" in p.stderr
