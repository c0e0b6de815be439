"""vLLM's host work per step in a profile (the `host` section, sim/hardware/profile.py): it adds to
a synchronous step and is a floor under an asynchronous one; stretches and the vLLM
engine price it alike; benchmarks/vllm_host_time.py fits and writes it."""
import json

import numpy as np
import pandas as pd
import pytest

from agentsim.errors import InputError
from benchmarks import vllm_host_time
from conftest import make_trace, simulate
from sim.hardware.profile import BUNDLED_DIR, StepModel, load_profile, parse_profile

HOST = {"step_s": 1e-3, "per_seq_s": 2e-5, "per_token_s": 1e-7}


def h100(host=HOST):
    raw = json.loads((BUNDLED_DIR / "llama3.1-8b-h100.json").read_text())
    return parse_profile({**raw, "host": host} if host else raw, "h100-host")


def test_a_synchronous_step_adds_the_host_time_and_an_asynchronous_one_overlaps_it():
    p = h100()
    device = h100(None).step
    for tokens, seqs, sqk, sk, sqc in [(1, 1, 2048.0, 2048.0, 2047.0), (256, 256, 4e5, 4e5, 4e5 - 256), (2048, 1, 2048.0**2, 2048.0, 0.0)]:
        d = device.time(tokens, seqs, sqk, sk, sqc)
        h = 1e-3 + 2e-5 * seqs + 1e-7 * tokens
        assert p.step_time(tokens, seqs, sqk, sk, sqc) == d + h
        assert p.scheduled(True).step_time(tokens, seqs, sqk, sk, sqc) == max(d, h)
        slow_host = StepModel(*device.coefficients, host=1.0, overlap=True)  # a host slower than the device sets the step
        assert slow_host.time(tokens, seqs, sqk, sk, sqc) == 1.0
    assert p.scheduled(True).scheduled(False).step == p.step


@pytest.mark.parametrize("bad, fragment", [({"step_s": -1e-3}, "host.step_s"), ({"per_seq_s": "x"}, "host.per_seq_s"),
                                           ({"per_token": 1e-7}, "per_token")])
def test_a_bad_host_section_is_one_line(bad, fragment):
    with pytest.raises(InputError, match=fragment) as e:
        h100(bad)
    assert "\n" not in str(e.value)


def _trace():
    rng = np.random.default_rng(0)
    progs = [[(int(rng.integers(200, 3000)), int(rng.integers(20, 200)), "ls", float(rng.uniform(0.1, 2)))] * 3
             + [(int(rng.integers(200, 3000)), int(rng.integers(20, 200)), None, None)] for _ in range(12)]
    return make_trace(progs), np.sort(rng.uniform(0, 3, 12))


@pytest.mark.parametrize("async_", [False, True])
def test_stretches_price_the_host_as_step_by_step(async_):
    tr, arr = _trace()
    runs = [simulate(tr, "continuum", h100(), arr, num_gpu_blocks=3000, fast_forward=ff, async_scheduling=async_)
            for ff in (True, False)]
    pd.testing.assert_frame_equal(runs[0].turns, runs[1].turns, check_exact=True)
    assert runs[0].summary == runs[1].summary


def test_the_host_lengthens_synchronous_runs_and_hides_behind_asynchronous_ones():
    tr, arr = _trace()
    jct = {(host is not None, a): simulate(tr, "vllm", h100(host), arr, num_gpu_blocks=3000, async_scheduling=a).summary["mean_jct"]
           for host in (None, HOST) for a in (False, True)}
    assert jct[True, False] > jct[False, False] * 1.02
    # 1 ms + 20 us a sequence is below every H100 step here: asynchronously nothing moves
    assert jct[True, True] == jct[False, True]


@pytest.mark.engine
@pytest.mark.parametrize("async_", [False, True])
def test_the_vllm_engine_prices_the_host_alike(async_):
    tr, arr = _trace()
    res = [simulate(tr, "continuum", h100(), arr, num_gpu_blocks=3000, scheduler=k, async_scheduling=async_).turns
           for k in ("simpy", "vllm")]
    cols = ["program_id", "turn", "scheduled", "first_token", "finish"]
    pd.testing.assert_frame_equal(res[0][cols], res[1][cols], check_exact=True)


def test_fit_host_recovers_a_linear_host_and_writes_a_profile_that_loads(tmp_path):
    rows = [{"B": b, "chunk": c, "core": 1e6 * (8e-4 + 2.1e-5 * (b + (1 if c else 0)) + 3e-7 * (b + c))}
            for b, c in [(1, 0), (16, 0), (64, 0), (256, 0), (64, 2048), (256, 2048)]]
    host = vllm_host_time.fit_host(rows)
    assert host == pytest.approx({"step_s": 8e-4, "per_seq_s": 2.1e-5, "per_token_s": 3e-7}, rel=1e-6)
    out = tmp_path / "h100-host.json"
    vllm_host_time.with_host(load_profile("llama3.1-8b-h100").raw, host, out, "test")
    p = load_profile(str(out))
    assert (p.step.host, p.step.host_seq, p.step.host_token) == pytest.approx((8e-4, 2.1e-5, 3e-7), rel=1e-6)
    assert json.loads(out.read_text())["host"]["measured"] == "test"
    assert [f.name for f in tmp_path.iterdir()] == [out.name]


def test_a_host_that_cannot_load_writes_nothing(tmp_path):
    out = tmp_path / "x.json"
    with pytest.raises(InputError):
        vllm_host_time.with_host(load_profile("llama3.1-8b-h100").raw, {"step_s": -1.0}, out, "test")
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("async_", [False, True])
def test_a_zero_host_section_is_no_host_section(async_):
    tr, arr = _trace()
    none, zero = h100(None), h100({"step_s": 0.0})
    assert none.scheduled(async_) is none and zero.scheduled(async_) is zero  # nothing to add or overlap
    runs = [simulate(tr, "continuum", p, arr, num_gpu_blocks=3000, async_scheduling=async_) for p in (none, zero)]
    pd.testing.assert_frame_equal(runs[0].turns, runs[1].turns, check_exact=True)
    assert runs[0].summary["host_time"] == runs[1].summary["host_time"] == "none"
