"""The `sampler` section derived profiles carry from the H200 sampler measurements."""
import pytest

from agentsim.errors import InputError
from sim.hardware import measured_sampler as ms
from sim.hardware.profile import parse_profile
from sim.hardware.roofline import roofline_profile

MEASURED = ms.load()["by_vocab"]


def _measured(vocab: int, mode: str, key: str) -> float:
    return MEASURED[str(vocab)]["modes"][mode][key]


@pytest.mark.parametrize("vocab", [int(v) for v in MEASURED])
def test_a_measured_vocabulary_is_its_measurement(vocab):
    s = ms.section("H200", vocab, "0.15.1")
    assert s["in_steps"] == "none" and s["vocab_size"] == vocab
    for mode in ("greedy", "random", "top-p"):
        for key in ("step_s", "per_row_s"):
            assert s["modes"][mode][key] == pytest.approx(_measured(vocab, mode, key), rel=1e-3)


def test_between_and_beyond_the_measured_vocabularies():
    lo, hi, top = sorted(int(v) for v in MEASURED)
    mid = ms.section("H100", (lo + hi) // 2, "0.15.1")["modes"]["top-p"]["per_row_s"]
    assert mid == pytest.approx((_measured(lo, "top-p", "per_row_s") + _measured(hi, "top-p", "per_row_s")) / 2, rel=1e-3)
    # beyond the largest: the line through the two largest
    v = 2 * top - hi
    slope_point = 2 * _measured(top, "top-p", "per_row_s") - _measured(hi, "top-p", "per_row_s")
    assert ms.section("H100", v, "0.15.1")["modes"]["top-p"]["per_row_s"] == pytest.approx(slope_point, rel=1e-3)
    # never below zero, however small the vocabulary
    assert all(x >= 0 for m in ms.section("H100", 10, "0.15.1")["modes"].values() for x in m.values())


def test_top_p_only_where_the_release_sorts():
    assert "top-p" in ms.section("H100", 32000, "0.15.1")["modes"]
    for version in ("0.17", "0.32", None):
        s = ms.section("H100", 32000, version)
        assert set(s["modes"]) == {"greedy", "random"} and "top-p not priced" in s["measured"]
    assert ms.section("A100-80GB", 32000, "0.15.1") is None and ms.section("B200", 32000) is None


def test_a_derived_profile_prices_its_runs_sampling():
    raw, _ = roofline_profile("H100", "llama3.1-8b", measured=True, vllm_version="0.15.1")
    assert "H200" in raw["sampler"]["measured"] and raw["sampler"]["vocab_size"] == 128256
    prof = parse_profile(raw, "h100")
    top = prof.with_sampling("top-p")
    want = raw["sampler"]["modes"]["top-p"]
    assert top.step.c0 == pytest.approx(prof.step.c0 + want["step_s"])
    assert top.step.c3 == pytest.approx(prof.step.c3 + want["per_row_s"])
    # a decode step of 32 sequences grows by the sampler's 32 rows
    t = lambda p: p.step.time(32, 32, 32 * 2048, 32 * 2048)  # noqa: E731
    assert t(top) - t(prof) == pytest.approx(want["step_s"] + 32 * want["per_row_s"], rel=1e-6)
    later = parse_profile(roofline_profile("H100", "llama3.1-8b", measured=True)[0], "h100-0.32")
    with pytest.raises(InputError, match="--sampling top-p: .*without 'top-p'"):
        later.with_sampling("top-p")
    assert later.with_sampling("random").step.c0 > later.step.c0
