"""What sim/cluster/cluster.py, the routers and sim/run/simulate.py read of a replica, whichever
engine schedules it (sim/simpy_replica/engine.py's SimPy replica, sim/vllm_replica/engine.py's vLLM one)."""
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

    # --- what a router reads (sim/cluster/router.py): what a load balancer in front of vLLM
    # servers could learn of each; nothing else of a replica ---
    def waiting_calls(self) -> int:
        return len(self.sched.waiting)

    def running_calls(self) -> int:
        return len(self.sched.running)

    def load(self) -> tuple[int, int]:
        """(calls waiting or running, used KV blocks): the least-loaded order."""
        return len(self.sched.waiting) + len(self.sched.running), self.used_blocks()

    def cached_prefix_blocks(self, call) -> tuple[int, int]:
        """(blocks of the program's own context this replica can serve without recompute,
        GPU part). Blocks of the prefix shared by every program do not count: every warm
        replica has them, and counting them sends every new program to one replica."""
        shared = call.shared_prefix // self.cfg.block_size
        gpu = max(0, len(self.sched.prefix_hit(call)) - shared)
        return max(gpu, self.tier.prefix_blocks(call) - shared), gpu
