"""benchmarks/server_run_steps.py: the published runs' steps priced by the judge's profile and by aiconfigurator."""
import json
import subprocess
import sys
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


def test_the_steps_are_the_runs_decode_mixed_and_prompt():
    run = _run("H100", 2, "8k1k", 64)
    dec, mix, pre = srs.shapes(run, budget=8192)
    ctx = round(srt.decode_ctx(run))
    assert (dec.kind, dec.B, dec.ctx) == ("decode", 64, ctx)
    # the prompt's first chunk beside the other 63 fills the token budget exactly
    assert (mix.kind, mix.B, mix.ctx, mix.n + mix.B) == ("mixed", 63, ctx, min(srs.mean_input(run) + 63, 8192))
    assert (pre.kind, pre.n) == ("prefill", min(srs.mean_input(run), 8192))
    assert srs.shapes(run, budget=2048)[1].n == 2048 - 63


def test_the_profile_column_is_the_judges_profile_and_the_reference_is_aiconfigurators():
    pytest.importorskip("aiconfigurator_core")
    from sim.hardware import check as pc

    run = _run("H100", 4, "1k1k", 16)
    rows = srs.rows(DATA, [run])
    assert [r["kind"] for r in rows] == ["decode", "mixed", "prefill"]
    e = run["engine"]
    prof, src = srt._profile("H100", run["model"], 4, True, None, gpu_memory_utilization=e["gpu_memory_utilization"],
                             max_num_batched_tokens=e["max_num_batched_tokens"], max_num_seqs=e["max_num_seqs"])
    assert src.startswith("measured") and {r["profile"] for r in rows} == {"measured"}
    dec = pc.Probe("decode", B=16, ctx=round(srt.decode_ctx(run)))
    assert rows[0]["profile_ms"] == pytest.approx(prof.step_time(*dec.features()) * 1e3)
    ref, _ = pc.aiconfigurator_points(prof, [dec])
    assert rows[0]["aic_ms"] == pytest.approx(ref[0].seconds[pc.STAT] * 1e3)
    for r in rows:
        assert r["error_pct"] == pytest.approx((r["profile_ms"] - r["aic_ms"]) / r["aic_ms"] * 100)
    # a mixed step costs more than its decodes alone, on both sides
    assert rows[1]["profile_ms"] > rows[0]["profile_ms"] and rows[1]["aic_ms"] > rows[0]["aic_ms"]


def test_an_unknown_gpu_is_refused_in_one_line():
    p = subprocess.run([sys.executable, "benchmarks/server_run_steps.py", "--gpus", "H999"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "--gpus" in p.stderr and "H999" in p.stderr
