"""continuum-static: what the open-source vllm-continuum fork ships (see
reference/vllm-continuum-implementation-analysis.md §5.3, §7, §8).

Per-tool running mean of observed tool times; after a call, pin for a fixed
`pin_seconds` if the mean of its tool is <= `threshold` (a tool never seen has mean
0, so it pins), free if the mean is larger or no tool was parsed (tool None).
Waiting order: programs holding a pin first, then program-level FCFS.
"""
from __future__ import annotations

from collections import defaultdict

from policies.base import FREE, Action, EngineView, Policy, Request, Retention


class ContinuumStaticPolicy(Policy):
    name = "continuum-static"

    def __init__(
        self,
        threshold: float = 2.0,  # fork: FIXED_THRESHOLD_CONTINUUM = 2.0 s
        pin_seconds: float = 2.0,  # fork: the pin length is the same constant
        # fork: a waiting request that cannot be allocated unpins only when nothing runs
        # (`if len(self.running) == 0 and self.pinned_requests`); True: also while calls
        # run if that lets the head in (the simulator's rule for other policies)
        unpin_while_running: bool = False,
    ) -> None:
        super().__init__()
        self.unpin_while_running = bool(unpin_while_running)
        self.threshold, self.pin_seconds = float(threshold), float(pin_seconds)
        self.total: dict[str | None, float] = defaultdict(float)
        self.count: dict[str | None, int] = defaultdict(int)

    def record_tool_time(self, tool: str | None, seconds: float) -> None:
        self.total[tool] += seconds  # fork: samples appended, mean recomputed
        self.count[tool] += 1

    def mean(self, tool: str | None) -> float:
        return self.total[tool] / self.count[tool] if self.count.get(tool) else 0.0

    def retention(self, req: Request, now: float, view: EngineView) -> Retention:
        if req.tool is None or self.mean(req.tool) > self.threshold:
            return FREE
        return Retention(Action.PIN, self.pin_seconds)

    def order_key(self, req: Request, now: float, view: EngineView) -> tuple:
        # fork's ContinuumRequestQueue.peek_request: pinned job first, then the job's
        # first entry time; it does not rank preempted requests separately.
        return (0 if req.program_id in self.pins else 1, req.program_arrival, req.turn, req.arrival, req.req_id)

    def unpin_victims(self, need_blocks: int, view: EngineView, exclude: str | None = None) -> list[str]:
        """fork: when allocation fails with nothing running, it unpins the pin with the
        latest end time (one a step, retrying; here until the head fits)."""
        victims, freed = [], 0
        for pid in sorted(self.pins, key=lambda p: self.pins[p].expiry, reverse=True):
            if freed >= need_blocks:
                break
            if pid != exclude:
                victims.append(pid)
                freed += view.blocks_of(pid)
        return victims

    def preemption_victim(self, running: list[Request], view: EngineView) -> Request:
        """fork: the running non-last-step call with the latest job entry, else the latest."""
        pool = [r for r in running if not r.is_last_step] or running
        return max(pool, key=lambda r: r.program_arrival)

    def preemption_order(self, running: list[Request], view: EngineView) -> list[Request]:
        """preemption_victim's picks in one stable sort: non-last steps first, latest job
        entry first, ties in list order (max keeps the first of equals)."""
        return sorted(running, key=lambda r: (r.is_last_step, -r.program_arrival))
