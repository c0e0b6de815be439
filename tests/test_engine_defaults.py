"""The shipped model an engine runs by default, and the bundled profile that goes with it."""
import json

import pytest

from calibrate import engine
from sim.hardware.profile import load_profile


@pytest.mark.parametrize("native_bf16, device, want", [(True, "cpu", "tiny-llama"), (False, "cpu", "micro-llama"),
                                                       (False, "cuda", "tiny-llama")])
def test_default_model_follows_the_cpus_bf16(monkeypatch, native_bf16, device, want):
    monkeypatch.setattr(engine, "cpu_has_native_bf16", lambda: native_bf16)
    assert engine.default_model(device).name == want


@pytest.mark.parametrize("model", [engine.TINY_MODEL, engine.MICRO_MODEL])
def test_each_shipped_model_has_a_bundled_profile_of_its_shape(model):
    prof = load_profile(engine.bundled_profile_name(model))
    cfg = json.loads((model / "config.json").read_text())
    assert prof.model["name"] == f"sim/hardware/models/{model.name}"
    assert (prof.model["num_layers"], prof.model["num_kv_heads"], prof.model["head_dim"]) == (
        cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"])


def test_no_bundled_profile_for_other_models(tmp_path):
    assert engine.bundled_profile_name(tmp_path / "tiny-llama") is None
    assert engine.bundled_profile_name("meta-llama/Llama-3.1-8B-Instruct") is None
