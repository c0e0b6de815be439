"""vLLM's sampler a step from GPU measurements: the `sampler` section of a derived profile.

`sim profile roofline` prices a step's device time from kernels (measured or by roofline) that
hold no sampler (`in_steps: none`). vLLM samples a row of logits for every request a step
schedules, and on the native path top-p sorts each row of the vocabulary, which at 128K
logits and 32 requests costs about as much as a tenth of a decode step. Where the GPU's chip
has been measured (sim/hardware/measurements/h200/sampler-torch-cuda.json:
benchmarks/sampler_time.py --device cuda --impl torch at three vocabularies), the profile
carries the section and `--sampling MODE` prices it (sim/hardware/profile.py with_sampling).

- GPUs: the H200 as measured; the H100 taken the same (the same GH100 chip, 132 SMs and
  clocks; only HBM differs, 3.35 against 4.8 TB/s, and a step's sort is not bound by it: at
  64 rows of 128,256 logits its passes move about 1 GB by our count, 0.2 ms of the 1.26 ms
  measured, so an H100 could be up to about a tenth dearer; not measured on an H100).
- Vocabulary: step_s and per_row_s linear in the vocabulary between the measured ones, the
  nearest two's line beyond them (kept >= 0).
- top-p only where the release samples it by sort (sim/hardware/kv_pool.py accounting_for:
  V1 releases before 0.17, as their wheels install; a server whose log says "Using FlashInfer
  for top-p & top-k sampling" does not sort); later releases run a Triton or FlashInfer kernel
  this does not price, so their sections hold greedy and random.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

DATA_FILE = Path(__file__).parent / "measurements" / "h200" / "sampler-torch-cuda.json"
# gpus.json name -> how its chip relates to the measured one
SAME_CHIP = {"H200": "measured on this GPU",
             "H100": "measured on an H200, the same GH100 chip (132 SMs, the same clocks; its HBM is 3.35 against 4.8 TB/s, "
                     "which the sort is not bound by: an H100 may be up to about a tenth dearer)"}
DEFAULT_VERSION = "0.32"


@lru_cache(maxsize=1)
def load() -> dict:
    return json.loads(DATA_FILE.read_text())


def _at(vocab: int, key: str, mode: str) -> float:
    """The measured `key` (step_s or per_row_s) of `mode` at `vocab` logits a row: linear between the
    measured vocabularies, the nearest two's line beyond them, never below 0."""
    by = load()["by_vocab"]
    vs = sorted(int(v) for v in by)
    ys = [by[str(v)]["modes"][mode][key] for v in vs]
    i = int(np.clip(np.searchsorted(vs, vocab), 1, len(vs) - 1))
    (v0, v1), (y0, y1) = vs[i - 1:i + 1], ys[i - 1:i + 1]
    return max(0.0, y0 + (y1 - y0) * (vocab - v0) / (v1 - v0))


def section(gpu: str, vocab: int, vllm_version: str | None = None) -> dict | None:
    """The `sampler` section for a profile of `gpu` (gpus.json name) whose model has `vocab`
    logits a row, served by `vllm_version` (None: 0.32); None where the chip is not measured."""
    from sim.hardware.kv_pool import accounting_for

    how = SAME_CHIP.get(gpu)
    if how is None:
        return None
    version = vllm_version or DEFAULT_VERSION
    sort = accounting_for(version).sampler == "sort"
    modes = ("greedy", "random", "top-p") if sort else ("greedy", "random")
    d = load()
    vs = ", ".join(f"{int(v):,}" for v in sorted(int(v) for v in d["by_vocab"]))
    return {"in_steps": "none", "vocab_size": int(vocab),
            "modes": {m: {k: float(f"{_at(vocab, k, m):.4g}") for k in ("step_s", "per_row_s")} for m in modes},
            "measured": (f"{how}: {DATA_FILE.relative_to(DATA_FILE.parents[4]).as_posix()} ({d['date']}; vocabularies {vs}, "
                         f"linear between them), vLLM's native path re-written in torch. "
                         + ("top-p by sort, as vLLM " + version + " samples it by default" if sort else
                            f"top-p not priced: vLLM {version} samples it with a Triton or FlashInfer kernel, not measured"))}
