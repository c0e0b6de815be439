"""benchmarks/gpu/gemm_power.py runs on a GPU machine only; here: its refusals and the clock summary."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu import gemm_power as gp  # noqa: E402


def test_bad_input_is_refused_with_one_line(capsys):
    assert gp.main(["--gemms", "qkv,nope"]) == 2
    assert gp.main(["--seconds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --gemms nope: choose from qkv,o,gate_up,down",
                   "error: --seconds 0.0: give a positive number of seconds"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so(capsys):
    assert gp.main([]) == 2
    assert capsys.readouterr().err.strip() == "error: needs a CUDA GPU"


def test_the_clock_summary_takes_medians_and_extremes():
    s = gp.Sampler()
    assert s.summary() is None  # nothing sampled (no nvidia-smi)
    s.rows = [(1980.0, 400.0), (1755.0, 690.0), (1830.0, 700.0)]
    assert s.summary() == {"sm_clock_mhz_median": 1830.0, "sm_clock_mhz_min": 1755.0,
                           "power_w_median": 690.0, "power_w_max": 700.0, "samples": 3}
