"""The calibration's repeats rule (median of each probe's repeats) and `sim calibrate --refit`."""
import json
from pathlib import Path

import numpy as np
import pytest

from calibrate.fit import fit_step_model
from calibrate.probes import NOISY_PCT, Probe, repeat_noise, repeat_time
from calibrate.run import refit_profile
from sim.cli import main
from sim.hardware.profile import BUNDLED_DIR, load_profile

CPU_PROFILES = ["cpu-micro-llama", "cpu-tiny-llama"]  # written by `sim calibrate` on an engine: probes carry repeats


def test_a_probe_keeps_the_median_of_its_repeats():
    p = Probe("prefill", 512, samples=[0.30, 0.10, 0.20])
    assert p.seconds == repeat_time(p.samples) == 0.20
    assert p.to_json(4096)["seconds"] == 0.2


@pytest.mark.parametrize("name", CPU_PROFILES)
def test_bundled_cpu_profiles_are_fitted_under_the_current_rule(name):
    raw = json.loads((BUNDLED_DIR / f"{name}.json").read_text())
    for row in raw["probes"]:
        assert row["seconds"] == pytest.approx(np.median(row["samples"]), abs=1e-6), row
    assert refit_profile(raw)["step_time"] == pytest.approx(raw["step_time"], rel=1e-9)



def test_refit_of_a_gpu_calibration_keeps_its_form():
    """A CUDA calibration chose the GPU form over the linear one; a refit under the same rule
    must choose again, not fall back to the linear model."""
    path = Path(__file__).resolve().parents[1] / "benchmarks/gpu/h200-2026-11-27-graph-twins/calibrate-torch-cuda-llama3.1-8b.json"
    raw = json.loads(path.read_text())
    assert raw["fit_error"]["step_model_form"] == "gpu"
    new = refit_profile(raw)
    assert new["fit_error"]["step_model_form"] == "gpu"
    assert new["step_time"] == pytest.approx(raw["step_time"], rel=1e-6)

def test_refit_fits_the_rule_of_the_samples_and_keeps_the_rest():
    raw = json.loads((BUNDLED_DIR / "cpu-micro-llama.json").read_text())
    new = refit_profile(raw, np.min)
    rows = [{**r, "seconds": round(float(np.min(r["samples"])), 6)} for r in raw["probes"]]
    assert new["step_time"] == pytest.approx(fit_step_model(rows)["coef"], rel=1e-12)
    assert all(r["seconds"] == round(min(r["samples"]), 6) for r in new["probes"])
    # the minimum prices every step at most as dear as the median: noise adds time
    assert load_profile_from(new).prefill_time(2000) < load_profile("cpu-micro-llama").prefill_time(2000)
    for key in ("model", "engine", "kv_bytes_per_block", "pcie", "device"):
        assert new[key] == raw[key]
    assert new["provenance"]["date"] == raw["provenance"]["date"]
    assert new["provenance"]["how"]["repeats"].endswith("the median is kept")


def load_profile_from(raw: dict):
    from sim.hardware.profile import parse_profile

    return parse_profile(raw, "refit")


def test_refit_command_writes_the_same_profile_as_the_bundled_one(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["calibrate", "--refit", str(BUNDLED_DIR / "cpu-tiny-llama.json"), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["step_time"] == pytest.approx(load_profile("cpu-tiny-llama").raw["step_time"])
    assert "refitted on the median" in capsys.readouterr().out


def test_a_calibration_records_how_much_its_repeats_differ():
    assert repeat_noise([1.0, 1.1, 0.9, 1.0, 5.0]) == pytest.approx(10.0)  # MAD 0.1 over median 1.0; the outlier barely counts
    raw = json.loads((BUNDLED_DIR / "cpu-tiny-llama.json").read_text())
    fe = refit_profile(raw)["fit_error"]
    assert fe["repeat_noise_pct"] == round(float(np.median([repeat_noise(r["samples"]) for r in raw["probes"]])), 2)
    assert 0 < fe["repeat_noise_pct"] < NOISY_PCT  # calibrated on a quiet machine


def test_a_calibration_beside_other_work_says_so_in_one_line(tmp_path, capsys):
    """Repeats spread as they were at load 11 (31%): the refit warns on stderr, naming the
    spread; a quiet profile's refit prints no warning."""
    raw = json.loads((BUNDLED_DIR / "cpu-tiny-llama.json").read_text())
    rng = np.random.default_rng(0)
    for r in raw["probes"]:
        r["samples"] = [s * f for s, f in zip(r["samples"], rng.uniform(0.5, 2.0, len(r["samples"])))]
    noisy, out = tmp_path / "noisy.json", tmp_path / "p.json"
    noisy.write_text(json.dumps(raw))
    assert main(["calibrate", "--refit", str(noisy), "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip()
    noise = json.loads(out.read_text())["fit_error"]["repeat_noise_pct"]
    assert noise > NOISY_PCT and err.count("\n") == 0
    assert err.startswith("warning: a probe's repeats differ by") and f"{noise:.1f}%" in err, err
    assert main(["calibrate", "--refit", str(BUNDLED_DIR / "cpu-tiny-llama.json"), "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("bad", ["missing", "not json", "no repeats"])
def test_refit_refuses_what_it_cannot_refit_in_one_line(tmp_path, capsys, bad):
    src = tmp_path / "src.json"
    if bad == "not json":
        src.write_text("{")
    elif bad == "no repeats":  # measured elsewhere (kernel timings): nothing to refit
        src.write_text((BUNDLED_DIR / "llama3.1-8b-h100.json").read_text())
    out = tmp_path / "p.json"
    assert main(["calibrate", "--refit", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --refit") and err.count("\n") == 1, err
    assert not out.exists()


def test_refit_run_prices_an_eager_step_at_its_graph_replay(tmp_path):
    """benchmarks/gpu/refit_run.py --rule graph: a row with a graph twin is fitted at the
    twin's time, a row without keeps the median of its repeats; the form is chosen again."""
    from benchmarks.gpu import refit_run

    run = Path(__file__).resolve().parents[1] / "benchmarks/gpu/h200-2026-11-27-graph-twins"
    raw = json.loads((run / "calibrate-torch-cuda-qwen3-8b.json").read_text())
    new = refit_run.refit(raw, "graph")
    twins = [(r, n) for r, n in zip(raw["probes"], new["probes"]) if r.get("graph_seconds")]
    assert len(twins) >= 30 and all(n["seconds"] == r["graph_seconds"] for r, n in twins)
    assert all(n["seconds"] == r["seconds"] for r, n in zip(raw["probes"], new["probes"]) if not r.get("graph_seconds"))
    assert new["fit_error"]["step_model_form"] == "gpu" and new["step_time"] != raw["step_time"]
    assert refit_run.refit(raw, "without-first")["probes"][0]["seconds"] == round(float(np.median(raw["probes"][0]["samples"][1:])), 6)
