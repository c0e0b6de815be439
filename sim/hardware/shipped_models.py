"""The tiny models shipped in sim/hardware/models (HF config.json, no weights: vLLM loads them with
dummy weights): what the CPU engine runs by default, what `--scheduler vllm` builds its
scheduler's config from, and the bundled profile each one was calibrated into."""
from __future__ import annotations

from pathlib import Path

MODELS = Path(__file__).parent / "models"
TINY_MODEL = MODELS / "tiny-llama"
MICRO_MODEL = MODELS / "micro-llama"


def bundled_profile_name(model: str | Path) -> str | None:
    """`cpu-tiny-llama` for the shipped tiny-llama, ...; None for any other model."""
    p = Path(model).expanduser()
    return f"cpu-{p.name}" if p.resolve().parent == MODELS.resolve() else None
