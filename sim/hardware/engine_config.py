"""The limits a replica's engine runs by: vLLM 0.32's scheduler settings and the KV cache
model. A profile's `engine` section parses into one (sim/hardware/profile.py: the limits it was
measured under); a run's is the profile's with the run config's overrides
(sim/run/config.py EngineLimits, resolved by sim/run/simulate.py engine_config)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    num_gpu_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    max_model_len: int = 131072
    # vLLM 0.32's scheduler_reserve_full_isl (default on): a waiting call is admitted
    # only when blocks for its whole prompt are free, not just for its first chunk.
    scheduler_reserve_full_isl: bool = True
    # the replica's KV cache model: "vllm" (vLLM's block pool) or "radix" (SGLang's radix tree)
    cache: str = "vllm"
    # vLLM's asynchronous scheduling (the next step scheduled while one runs; sim/simpy_replica/engine.py _loop_async)
    async_scheduling: bool = False

    def profile_section(self) -> dict:
        """The limits under a profile's `engine` keys (vLLM's names), as sim/hardware/profile.py reads them."""
        return {"block_size": self.block_size, "num_gpu_blocks": self.num_gpu_blocks,
                "max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs,
                "max_model_len": self.max_model_len, "enable_chunked_prefill": self.enable_chunked_prefill,
                "scheduler_reserve_full_isl": self.scheduler_reserve_full_isl}


# The engine limits are spelled as vLLM spells them, and the replica's scheduler is named
# `scheduler`; a file, axis or flag with the names used before is told the new name.
RENAMED_FIELDS = {"num_blocks": "num_gpu_blocks", "chunked_prefill": "enable_chunked_prefill",
                  "reserve_full_prompt": "scheduler_reserve_full_isl", "kind": "scheduler"}  # engine.<old> -> engine.<new>
RENAMED_FLAGS = {"--num-blocks": "--num-gpu-blocks", "--chunked-prefill": "--enable-chunked-prefill",
                 "--no-chunked-prefill": "--no-enable-chunked-prefill",
                 "--reserve-full-prompt": "--scheduler-reserve-full-isl",
                 "--no-reserve-full-prompt": "--no-scheduler-reserve-full-isl", "--engine": "--scheduler"}


def renamed_flag(arg: str) -> str | None:
    """The message for a command-line flag of an old name (`--num-blocks`, `--num-blocks=N`), else None."""
    flag = arg.split("=", 1)[0]
    return f"{flag} is now {RENAMED_FLAGS[flag]}; rename the flag" if flag in RENAMED_FLAGS else None
