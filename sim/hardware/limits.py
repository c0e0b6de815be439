"""Engine limits as vLLM 0.32 (v1 engine, GPU) would compute them, for GPUs where no vLLM runs.

A profile's engine section is normally read from a started engine (calibrate/limits.py).
Where only kernel timings exist (a torch backend, a shared measurement file, a roofline
estimate), this computes the same numbers from the model shape and the GPU's memory, the
way vLLM does at start-up, and marks them as computed.

What vLLM 0.32 does (vllm/engine/arg_utils.py, vllm/v1/worker/gpu_worker.py, as installed):
- EngineArgs.get_batch_defaults: with >= 160 GiB of device memory, max_num_batched_tokens
  16384 / max_num_seqs 1024 for both usage contexts; with >= 70 GiB and not an A100,
  16384 (LLM class) or 8192 (API server) / 1024; otherwise 8192 (LLM class) or 2048 (API
  server) / 256. Chunked prefill and prefix caching default on.
- Worker.determine_available_memory: KV memory = total * gpu_memory_utilization - weights
  - peak activation of a dummy forward of max_num_batched_tokens tokens (and a sampler
  run over max_num_seqs rows) - non-torch memory - the CUDA-graph pool estimate; computed
  term by term in sim/hardware/kv_pool.py.
- num_gpu_blocks = KV memory // page bytes per block (over all layers), the same on every
  tensor-parallel rank; start-up fails if one max_model_len request does not fit.
"""
from __future__ import annotations

from agentsim.errors import InputError

GiB = 1 << 30
REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
            "intermediate_size", "vocab_size", "dtype_bytes", "num_params")


def batch_defaults(gpu_mem_bytes: float, gpu_name: str = "", usage_context: str = "llm") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of EngineArgs.get_batch_defaults (vLLM 0.32)."""
    if usage_context not in ("llm", "serve"):
        raise InputError(f"usage_context {usage_context!r}: use 'llm' (offline LLM class) or 'serve' (API server)")
    llm = usage_context == "llm"
    if gpu_mem_bytes >= 160 * GiB:
        return 16384, 1024
    if gpu_mem_bytes >= 70 * GiB and "a100" not in gpu_name.lower():
        return (16384 if llm else 8192), 1024
    return (8192 if llm else 2048), 256


def gpu_engine_limits(model: dict, gpu_mem_bytes: float, *, tp: int = 1, gpu_memory_utilization: float = 0.9,
                      block_size: int = 16, max_model_len: int | None = None,
                      max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                      gpu_name: str = "", usage_context: str = "llm", num_sms: int | None = None) -> dict:
    """The engine section of a profile as vLLM 0.32 would set it up on this GPU (per replica of tp GPUs).
    num_sms: the device's own count where known (else gpu_name's in gpus.json; kv_pool)."""
    missing = [k for k in REQUIRED if k not in model]
    if missing:
        raise InputError(f"model shape is missing {', '.join(missing)}; give every one of {', '.join(REQUIRED)}")
    if tp < 1 or model["num_attention_heads"] % tp:
        raise InputError(f"tp={tp} must be >= 1 and divide num_attention_heads={model['num_attention_heads']}")
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
    d_tokens, d_seqs = batch_defaults(gpu_mem_bytes, gpu_name, usage_context)
    budget = int(max_num_batched_tokens or d_tokens)
    seqs = int(max_num_seqs or d_seqs)
    max_len = int(max_model_len or model.get("max_position_embeddings") or 0)
    if max_len <= 0:
        raise InputError("max_model_len unknown: give max_model_len or the model's max_position_embeddings")
    from sim.hardware.kv_pool import kv_pool  # the one arithmetic: sim/hardware/kv_pool.py (every term and its source)
    pool = kv_pool(gpu_mem_bytes, model, tp=tp, gpu_memory_utilization=gpu_memory_utilization,
                   max_num_batched_tokens=budget, max_num_seqs=seqs, block_size=block_size, gpu=gpu_name,
                   num_sms=num_sms)
    weights, act, kv_mem, blocks = pool.weights_bytes, pool.activation_bytes, pool.available_bytes, pool.blocks
    if blocks * block_size < max_len:
        raise InputError(f"the model does not fit: {gpu_mem_bytes / GiB:.1f} GiB x {gpu_memory_utilization} per GPU "
                         f"(tp={tp}) leaves {max(kv_mem, 0) / GiB:.2f} GiB for KV = {blocks * block_size} tokens, "
                         f"less than max_model_len={max_len}; use more GPUs, a higher utilization or a shorter max_model_len")
    return {
        "name": "vllm", "version": "0.32 (computed)", "block_size": int(block_size), "num_gpu_blocks": blocks,
        "max_num_batched_tokens": budget, "max_num_seqs": seqs, "max_model_len": max_len,
        "enable_chunked_prefill": True, "enable_prefix_caching": True,
        "computed": (f"computed, not read from an engine: vLLM 0.32's start-up arithmetic (sim/hardware/limits.py) for "
                     f"{gpu_mem_bytes / GiB:.1f} GiB x {gpu_memory_utilization} per GPU, tp={tp}: minus weights "
                     f"{weights / GiB:.2f} GiB, activation peak {act / GiB:.2f} GiB, non-torch {pool.non_torch_bytes / GiB:.2f} GiB, "
                     f"CUDA graphs {pool.cudagraph_bytes / GiB:.2f} GiB (sim/hardware/kv_pool.py; every term in kv_pool); "
                     f"max_num_batched_tokens {budget}, max_num_seqs {seqs}"),
        "kv_pool": {**pool.to_dict(), "per": "GPU"},
    }
