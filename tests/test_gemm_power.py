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


def test_fp8_weights_are_a_per_tensor_checkpoint_and_the_layer_computes_x_w_t():
    # on the CPU (torch._scaled_mm runs there too): the codes of a trained layer span e4m3's range,
    # and the FP8 layer gives x w^T within FP8's rounding
    torch.manual_seed(0)
    (w, scale), = gp.weights("randn_x0.02", 256, 64, "fp8", "cpu")[:1]
    assert w.dtype == gp.FP8 and w.shape == (64, 256)
    assert w.float().abs().max().item() == gp.FP8_MAX and 0.02 * 3 < scale.item() * gp.FP8_MAX < 0.02 * 8
    x = gp.activations(32, 256, "fp8", "cpu")
    want = x.float() @ (w.float() * scale).t()
    got = gp.linear(x, (w, scale)).float()
    assert got.dtype == torch.float32 and torch.allclose(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())
    zeros = gp.weights("zeros", 256, 64, "fp8", "cpu")
    assert len(zeros) == gp.LAYERS and all(z.dtype == gp.FP8 and not z.float().any() and s.item() == 1 for z, s in zeros)
    bf = gp.weights("randn", 256, 64, "bf16", "cpu")[0]
    assert bf[0].dtype == torch.bfloat16 and torch.equal(gp.linear(x.float().bfloat16(), bf), torch.nn.functional.linear(x.float().bfloat16(), bf[0]))


def test_an_unknown_dtype_is_refused_with_one_line(capsys):
    assert gp.main(["--dtype", "int4"]) == 2
    assert capsys.readouterr().err.strip() == "error: --dtype int4: choose from bf16,fp8"
