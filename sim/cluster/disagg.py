"""Prefill/decode disaggregation (`--disagg xPyD`): x prefill replicas hand the KV of the
prompts they prefill to y decode replicas over a link (sim/cluster/cluster.py runs it).

Why this shape — NVIDIA Dynamo's disaggregated serving with vLLM workers, the KV moved
as vLLM's NixlConnector moves it (docs/disaggregation.md has the sources):
- A call goes to a decode replica first (`--router` picks among the decode replicas;
  in Dynamo a request reaches its decode worker, which decides). Conditional
  disaggregation (Dynamo's disaggregated router): the prefill runs *remotely* when the
  tokens the decode replica would have to compute — prompt minus what it can serve
  without recompute (its GPU prefix hit, or its offload tiers' if longer) — exceed
  `max_local_prefill` (Dynamo's max_local_prefill_length, default 1000) and fewer than
  `max_prefill_queue` calls (max_prefill_queue_size, default 3) wait for a prefill
  replica; otherwise it runs *locally* on the decode replica, as an ordinary call.
  So a program whose context is pinned or cached on its decode replica sends only a
  short prefill there, and its next turn stays local unless its new input is long.
- A remote prefill goes to the least loaded prefill replica (Dynamo's prefill workers
  pull from one global queue: whichever has room takes the next). A prefill replica
  schedules FCFS (`PrefillOnly`; Dynamo's queue is FIFO) and never pins: it runs the
  prompt with one output token (vLLM's P/D proxy sends max_tokens=1) and frees the
  blocks (still in its prefix cache: a program's next remote prefill hits its earlier
  prompt there).
- The handoff: the prompt's full blocks that the decode replica lacks (beyond its GPU
  prefix hit at that moment) cross the link, latency + blocks x kv_bytes_per_block /
  bandwidth, on the call's path and charged to no step (NIXL's transfers are
  non-blocking). Then the decode replica admits the call with those blocks present
  (`Inbox`), computes the prompt's last partial block (1 to block_size tokens; vLLM
  recomputes the last token only), which samples the first token, and decodes as any
  call; its retention policy decides at the finish (pins live on decode replicas).
- Link classes (bandwidth, latency, sources): sim/hardware/specs/gpus.json `kv_transfer`.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

from policies.base import FREE, Policy
from agentsim.errors import InputError
from sim.hardware.spec_tables import SPEC_DIR

SPEC_FILE = SPEC_DIR / "gpus.json"
MAX_LOCAL_PREFILL = 1000  # Dynamo: --max-local-prefill-length default (tokens)
MAX_PREFILL_QUEUE = 3  # Dynamo: --max-prefill-queue-size default (calls)
MAX_SIDE = 1024  # replicas per side: each is a full engine
_HELP = "write e.g. --disagg 1P1D (1 prefill + 1 decode replica) or 2P1D"


@functools.lru_cache(maxsize=1)
def _links() -> dict:
    return json.loads(SPEC_FILE.read_text())["kv_transfer"]


def link_names() -> list[str]:
    return list(_links()["classes"])


DEFAULT_LINK = "rdma-ndr"  # _links()["default"]; a test keeps the two equal


@dataclass(frozen=True)
class Link:
    """A prefill->decode KV link: `time(bytes)` = latency + bytes / bandwidth."""

    name: str
    bandwidth: float  # bytes/s
    latency: float  # s

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


def find_link(name: str | None) -> Link:
    name = DEFAULT_LINK if name is None else str(name).strip().lower()
    c = _links()["classes"].get(name)
    if c is None:
        raise InputError(f"--disagg-link {name!r} is not a link class; choose one of {', '.join(link_names())} "
                         f"(sim/hardware/specs/gpus.json kv_transfer)")
    return Link(name, float(c["bandwidth_GBps"]) * 1e9, float(c["latency_s"]))


def parse_disagg(spec: str | None) -> tuple[int, int] | None:
    """'xPyD' -> (x, y); None / '' / 'off' / 'none' -> None (no disaggregation)."""
    if spec is None or str(spec).strip().lower() in ("", "none", "off"):
        return None
    m = re.fullmatch(r"\s*(\d+)\s*[pP]\s*(\d+)\s*[dD]\s*", str(spec))
    if not m:
        raise InputError(f"--disagg {spec!r} is not xPyD; {_HELP}")
    x, y = int(m.group(1)), int(m.group(2))
    if x < 1 or y < 1:
        raise InputError(f"--disagg {spec!r}: needs at least 1 prefill and 1 decode replica (got {x} and {y}); {_HELP}")
    if x > MAX_SIDE or y > MAX_SIDE:
        raise InputError(f"--disagg {spec!r}: at most {MAX_SIDE} replicas per side (each is a full engine); {_HELP}")
    return x, y


def check_replicas(spec: str, split: tuple[int, int], replicas: int) -> None:
    """`--replicas` left at its default (1) or equal to x + y; anything else contradicts."""
    n = split[0] + split[1]
    if replicas not in (1, n):
        raise InputError(f"--disagg {spec} runs {split[0]} prefill + {split[1]} decode = {n} replicas, but --replicas is "
                         f"{replicas}; drop --replicas or give {n}")


@dataclass(frozen=True)
class Disagg:
    """What a cluster needs to disaggregate: the split, the link, Dynamo's two thresholds."""

    prefill: int
    decode: int
    link: Link
    max_local_prefill: int = MAX_LOCAL_PREFILL
    max_prefill_queue: int = MAX_PREFILL_QUEUE

    @property
    def spec(self) -> str:
        return f"{self.prefill}P{self.decode}D"

    def remote(self, uncached_tokens: int, queued: int) -> bool:
        """Dynamo's conditional disaggregation: prefill remotely when the prefill without
        the decode replica's prefix hit is longer than the threshold and the prefill
        queue is shorter than its limit."""
        return uncached_tokens > self.max_local_prefill and queued < self.max_prefill_queue


def make_disagg(spec: str | None, link: str | None = None, max_local_prefill: int = MAX_LOCAL_PREFILL,
                max_prefill_queue: int = MAX_PREFILL_QUEUE) -> Disagg | None:
    lk = find_link(link)  # a bad link name fails even without --disagg
    split = parse_disagg(spec)
    if split is None:
        return None
    for name, v in (("--disagg-local-prefill", max_local_prefill), ("--disagg-prefill-queue", max_prefill_queue)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"{name} must be an integer >= 0 (got {v!r})")
    return Disagg(split[0], split[1], lk, max_local_prefill, max_prefill_queue)


class PrefillOnly(Policy):
    """A prefill replica's policy: vLLM's FCFS order (Dynamo's prefill queue is FIFO); it
    never pins and learns nothing (the decode replicas' policies do)."""

    name = "prefill"

    def on_arrival(self, req, now: float) -> None:
        pass

    def on_finish(self, req, now: float, view):
        return FREE
