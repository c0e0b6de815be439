"""What sim/cluster.py, the routers and sim/simulate.py read of a replica, whichever
engine schedules it (sim/engine.py's SimPy replica, sim/vllm_engine.py's vLLM one)."""
from __future__ import annotations


class Replica:
    """The limits and the step accounting both engines keep the same way."""

    def _start_accounting(self) -> None:
        self.steps = 0
        self.busy_time = 0.0
        self.kv_samples: list[tuple[float, int, int]] = []  # (t, used, pinned) at step starts
        self._used_area = 0.0  # integral of used blocks over simulated time
        self.peak_used = 0

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def num_blocks(self) -> int:
        return self.cfg.num_gpu_blocks - 1  # usable: vLLM keeps one as its null block

    def mean_used_blocks(self, horizon: float) -> float:
        return self._used_area / horizon if horizon > 0 else 0.0
