"""The engine's real limits and model shape, read from a started vLLM engine.

The simulator must run with the numbers the engine actually used (above all the
number of KV blocks it allocated), not the ones asked for or guessed. Paths are for
vLLM 0.32 (v1 engine): `llm.llm_engine.vllm_config` always; the engine core's
scheduler (`llm.llm_engine.engine_core.engine_core.scheduler`) when the core runs
in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), for the KV block pool and page size.
"""
from __future__ import annotations

from pathlib import Path

from agentsim.errors import InputError

# option name on the CLI -> key in the profile's engine section
REQUESTABLE = {"num_gpu_blocks": "num_gpu_blocks", "block_size": "block_size",
               "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
               "max_model_len": "max_model_len"}


def display_name(model: str) -> str:
    """A model inside this repository by its repo-relative path (profiles are committed)."""
    root = Path(__file__).resolve().parent.parent
    try:
        return str(Path(model).resolve().relative_to(root))
    except ValueError:
        return model


def _scheduler(llm):
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    return getattr(core, "scheduler", None)


def read_limits(llm) -> dict:
    """{"model": {...}, "engine": {...}, "kv_bytes_per_block": int} as the profile wants them."""
    import vllm

    vc = llm.llm_engine.vllm_config
    mc, cc, sc, pc = vc.model_config, vc.cache_config, vc.scheduler_config, vc.parallel_config
    dtype_bytes = mc.dtype.itemsize
    kv_dtype_bytes = dtype_bytes if cc.cache_dtype == "auto" else 1
    model = {"name": display_name(str(mc.model)), "architecture": (mc.architectures or ["?"])[0],
             "num_layers": mc.get_num_layers(pc), "hidden_size": mc.get_hidden_size(),
             "num_attention_heads": mc.get_num_attention_heads(pc), "num_kv_heads": mc.get_num_kv_heads(pc),
             "head_dim": mc.get_head_size(), "dtype": str(mc.dtype).replace("torch.", ""),
             "dtype_bytes": kv_dtype_bytes}
    threshold = int(sc.long_prefill_token_threshold or 0)
    engine = {"name": "vllm", "version": vllm.__version__, "block_size": int(cc.block_size),
              "num_gpu_blocks": int(cc.num_gpu_blocks), "max_num_batched_tokens": int(sc.max_num_batched_tokens),
              "max_num_seqs": int(sc.max_num_seqs), "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
              "enable_prefix_caching": bool(cc.enable_prefix_caching), "max_model_len": int(mc.max_model_len),
              "long_prefill_token_threshold": threshold,
              # whole-prompt admission: a prompt is only scheduled when all of it fits the step
              "whole_prompt_admission": not sc.enable_chunked_prefill,
              # admit a waiting request only when its whole prompt's blocks are free
              "scheduler_reserve_full_isl": bool(getattr(sc, "scheduler_reserve_full_isl", False)),
              "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
              "enforce_eager": bool(mc.enforce_eager)}
    kv_per_block = 2 * model["num_layers"] * model["num_kv_heads"] * model["head_dim"] * kv_dtype_bytes * engine["block_size"]
    sched = _scheduler(llm)
    if sched is not None:  # the pool and page sizes the engine core really built
        kvc = sched.kv_cache_config
        engine["num_gpu_blocks"] = int(kvc.num_blocks)
        pool = sched.kv_cache_manager.block_pool
        engine["block_pool_size"] = int(pool.num_gpu_blocks)  # includes vLLM's reserved null block
        kv_per_block = sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in kvc.kv_cache_groups)
    return {"model": model, "engine": engine, "kv_bytes_per_block": int(kv_per_block)}


def check_limits(requested: dict, engine: dict) -> None:
    """InputError when the engine did not honour a limit that was asked for explicitly."""
    for opt, key in REQUESTABLE.items():
        want = requested.get(opt)
        if want is not None and int(engine.get(key, -1)) != int(want):
            flag = "--" + opt.replace("_", "-")
            raise InputError(f"{flag} {want} was asked for but the engine uses {key}={engine.get(key)}; "
                             f"pick a value the engine accepts (e.g. {engine.get(key)})")


def limits_from_args(args) -> dict:
    """The engine limits given on the command line (None = engine default)."""
    return {k: getattr(args, k, None) for k in REQUESTABLE}
