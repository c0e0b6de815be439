"""KV offload tiers behind one replica's GPU block pool, shaped like LMCache's CPU
(and local-disk) backend as used with vLLM.

Why this shape:
- LMCache keeps KV in *chunks* of 256 tokens, keyed by a hash of every token up to
  the chunk's end; a lookup is a prefix match (the leading run of chunks present). The
  GPU pool's block keys are chained the same way (sim/kv/content.py), so a chunk is named
  by the key of its last block. A chunk is `chunk_blocks` whole GPU
  blocks (256 tokens when the block size divides 256, else the next multiple of it).
- Write-through, not write-back: on every scheduled *prefill* step the new full
  chunks of the prompt are stored (partial chunks and decode tokens are not, so turn
  k's output reaches the CPU during turn k+1's prefill); the GPU copy stays until the
  prefix cache evicts it. Nothing needs to happen when the GPU pool evicts a block:
  if it was written through, the CPU still has it. This is the one mechanism every
  policy gets; a policy can in addition *offload* (write a finished call's or a
  dropped pin's full chunks, decode tokens included) through `Retention("offload")`
  or `Policy.release_action`.
- Each tier is an LRU of chunks with a capacity in bytes. A store goes to every tier
  (LMCache puts into all configured backends); a lookup touches the chunks it hits.
  Tiers hold copies, never references, so they cannot leak; `check()` verifies the
  counts (stored - evicted = resident, resident <= capacity).
- Timing: a load (reload of the CPU hit beyond the GPU prefix hit) costs
  latency + bytes / bandwidth of the tier each chunk comes from, and is *not*
  overlapped: LMCache's default (non-layerwise) retrieve completes in `start_load_kv`
  before the forward pass, so it lengthens the step that admits the call. Write-
  through stores are not charged (the Continuum paper calls LMCache's CPU offloading
  non-blocking; ours: no contention with loads is modelled); bytes are counted. An explicit offload (swap-out,
  demotion) is a GPU->CPU copy on the replica's PCIe link, queued behind earlier ones
  from the moment it is issued; a step that starts while copies are in flight cannot
  end before them (the blocks must not be reused mid-copy): step time =
  max(compute, copies left) + loads. An idle replica absorbs them for free. Nothing
  outlives the step it is charged to, so the engine only has to skip decode stretches
  in a step that carries transfer time (see sim/simpy_replica/engine.py).
- Bandwidth: the profile's `pcie.bandwidth_GBps` / `latency_s` for the CPU tier, the
  profile's optional `ssd: {bandwidth_GBps, latency_s}` for the SSD tier (default
  3 GB/s and 100 us: an assumed NVMe, not a measurement); `@GBps` in the flag
  overrides either (`cpu:200GiB@25`).
"""
from __future__ import annotations

import math

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable

from agentsim.errors import InputError

CHUNK_TOKENS = 256  # LMCache's default chunk size
SSD_DEFAULT_GBPS = 3.0  # assumed NVMe read bandwidth (not measured)
SSD_DEFAULT_LATENCY = 1e-4

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_HELP = "write e.g. --offload cpu:200GiB or cpu:200GiB,ssd:1TiB (optional @GB/s: cpu:100GiB@25)"


@dataclass(frozen=True)
class TierSpec:
    """One tier as the user asked for it; bandwidth None = from the profile."""

    name: str  # "cpu" | "ssd"
    capacity_bytes: int
    bandwidth_GBps: float | None = None


def parse_size(text: str, where: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"{where}: size {text!r} is not a size like 200GiB, 100GB or 512MiB; {_HELP}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: int) -> str:
    """`n` bytes as parse_size reads them back exactly: the largest unit that divides it."""
    for unit in ("TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB"):
        if n % _UNITS[unit.lower()] == 0:
            return f"{n // _UNITS[unit.lower()]}{unit}"
    return f"{n}B"


def parse_offload(spec: str | None) -> tuple[TierSpec, ...]:
    """`cpu:SIZE[@GBPS][,ssd:SIZE[@GBPS]]` -> tier specs ('' / None / 'none' = no offload)."""
    if spec is None or str(spec).strip().lower() in ("", "none", "off"):
        return ()
    tiers: list[TierSpec] = []
    for part in str(spec).split(","):
        name, sep, rest = part.strip().partition(":")
        name = name.strip().lower()
        where = f"--offload {spec!r}"
        if not sep or name not in ("cpu", "ssd"):
            raise InputError(f"{where}: {part.strip()!r} is not TIER:SIZE with TIER cpu or ssd; {_HELP}")
        size, at, bw = rest.partition("@")
        cap = parse_size(size, where)
        gbps = None
        if at:
            try:
                gbps = float(bw.strip().lower().removesuffix("gbps").removesuffix("gb/s"))
            except ValueError:
                gbps = -1.0
            if not gbps > 0:
                raise InputError(f"{where}: bandwidth {bw!r} is not a positive number of GB/s; {_HELP}")
        if cap <= 0:
            raise InputError(f"{where}: tier {name} needs a size > 0; {_HELP}")
        if any(t.name == name for t in tiers):
            raise InputError(f"{where}: tier {name} given twice; {_HELP}")
        tiers.append(TierSpec(name, cap, gbps))
    if tiers[0].name != "cpu":
        raise InputError(f"--offload {spec!r}: the first tier must be cpu (an SSD tier sits behind it); {_HELP}")
    return tuple(tiers)


class Tier:
    """One LRU level of chunks (LMCache's LocalCPUBackend / LocalDiskBackend)."""

    def __init__(self, name: str, capacity_chunks: int, chunk_bytes: int, bandwidth: float, latency: float) -> None:
        self.name, self.capacity, self.chunk_bytes = name, capacity_chunks, chunk_bytes
        self.bandwidth, self.latency = bandwidth, latency  # bytes/s, s
        self.lru: OrderedDict[Hashable, None] = OrderedDict()
        self.stored = self.evicted = 0  # chunks
        self.bytes_written = self.bytes_read = 0
        self.read_s = 0.0

    def __contains__(self, key: Hashable) -> bool:
        return key in self.lru

    def __len__(self) -> int:
        return len(self.lru)

    def put(self, key: Hashable) -> bool:
        """Store a chunk (no-op if present, as LMCache skips chunks it has); True if new."""
        if key in self.lru or self.capacity <= 0:
            return False
        while len(self.lru) >= self.capacity:
            self.lru.popitem(last=False)
            self.evicted += 1
        self.lru[key] = None
        self.stored += 1
        self.bytes_written += self.chunk_bytes
        return True

    def touch(self, key: Hashable) -> None:
        self.lru.move_to_end(key)

    def transfer_time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth

    def check(self) -> None:
        assert len(self.lru) <= self.capacity, f"tier {self.name}: {len(self.lru)} chunks > capacity {self.capacity}"
        assert self.stored - self.evicted == len(self.lru), f"tier {self.name}: stored {self.stored} - evicted {self.evicted} != {len(self.lru)} resident"


def build_tiers(specs: tuple[TierSpec, ...], profile, block_size: int, chunk_tokens: int = CHUNK_TOKENS) -> list[Tier]:
    """Tiers for one replica: capacities in whole chunks, bandwidths from the profile or the flag."""
    chunk_blocks = max(1, -(-chunk_tokens // block_size))
    chunk_bytes = chunk_blocks * profile.kv_bytes_per_block
    if chunk_bytes <= 0:
        raise InputError(f"profile {profile.name!r}: kv_bytes_per_block is 0; give the model shape or kv_bytes_per_block to use --offload")
    tiers = []
    for t in specs:
        if t.name == "cpu":
            if t.bandwidth_GBps is not None:
                bw, lat = t.bandwidth_GBps * 1e9, profile.pcie_latency
            elif profile.pcie_bandwidth is not None:
                bw, lat = profile.pcie_bandwidth, profile.pcie_latency
            else:
                raise InputError(f"profile {profile.name!r} has no PCIe bandwidth (pcie.bandwidth_GBps is null); "
                                 f"give one in the flag, e.g. --offload cpu:{format_size(t.capacity_bytes)}@25, or in the profile")
        else:
            ssd = profile.raw.get("ssd") if isinstance(profile.raw.get("ssd"), dict) else {}
            gbps = t.bandwidth_GBps or float(ssd.get("bandwidth_GBps") or SSD_DEFAULT_GBPS)
            bw, lat = gbps * 1e9, float(ssd.get("latency_s") or SSD_DEFAULT_LATENCY)
        if t.capacity_bytes < chunk_bytes:  # it would hold nothing: a typo, not a tier
            raise InputError(f"--offload: tier {t.name} of {t.capacity_bytes} bytes is smaller than one chunk of "
                             f"{chunk_tokens} tokens ({chunk_bytes} bytes with profile {profile.name!r}); {_HELP}")
        tiers.append(Tier(t.name, t.capacity_bytes // chunk_bytes, chunk_bytes, bw, lat))
    return tiers




class NoTier:
    """A replica without offload tiers, answering the scheduler's, engine's and router's
    questions as no tier would (nothing loadable or cached, nothing written, no transfer
    time), so that none of them asks whether a tier exists. Stateless: one instance serves all."""

    enabled = False
    tiers = ()

    def loadable(self, call, gpu_hit: int) -> int:
        return 0

    def load(self, call, gpu_hit: int, n_blocks: int) -> float:
        return 0.0

    def admitted(self, call, gpu_hit: int) -> None:
        pass

    def prefix_blocks(self, call) -> int:
        return 0

    def reload_time(self, tokens: int) -> float:
        return math.inf

    def write_through(self, call, computed: int) -> None:
        pass

    def offload(self, keys: list, now: float) -> int:
        return 0

    def price_step(self, compute_s: float, start: float) -> tuple[float, bool]:
        return compute_s, False

    def check(self) -> None:
        pass


NO_TIER = NoTier()


class KVOffload:
    """The offload tiers of one replica and the scheduler's three uses of them:
    `loadable`/`load` at admission, `write_through` after prefill steps, `offload`
    (a retention or a dropped pin, named by content keys, so that either engine's
    scheduler can use it). Keeps the step's transfer time for the engine."""

    enabled = True

    def __init__(self, tiers: list[Tier], block_size: int, chunk_tokens: int = CHUNK_TOKENS) -> None:
        self.tiers, self.block_size = tiers, block_size
        self.chunk_blocks = max(1, -(-chunk_tokens // block_size))
        self.block_bytes = tiers[0].chunk_bytes // self.chunk_blocks
        self.step_load_s = 0.0  # reloads of calls admitted in the step being formed
        self.write_free_at = 0.0  # when the PCIe copies issued so far are done
        # totals
        self.loaded_tokens = self.miss_tokens = 0  # tokens loaded / tokens past the GPU hit at admissions
        self.loads = 0
        self.reload_s = 0.0
        self.offload_bytes = 0  # explicit offloads (swap-out, demotion), PCIe GPU->CPU
        self.offload_write_s = 0.0
        self.writethrough_bytes = 0
        self._pending: tuple | None = None  # (call, gpu_hit, chunk tiers) from the last loadable()

    # --- lookup and load ------------------------------------------------------------------
    def _chunk_tiers(self, call, limit: float) -> list[int]:
        """The tiers holding the call's leading chunks, from chunk 0 while some tier holds
        the next one, at most `limit` chunks (math.inf: no limit). Only full chunks (within
        the call's tokens) are ever stored; a chunk is named by its last block's key."""
        cb = self.chunk_blocks
        full = min(limit, call.num_tokens // (cb * self.block_size))
        if full <= 0:
            return []
        keys = call.content.prefix(full * cb)
        lrus = [t.lru for t in self.tiers]
        out = []
        for last in range(cb - 1, full * cb, cb):
            k = keys[last]
            for i, lru in enumerate(lrus):
                if k in lru:
                    out.append(i)
                    break
            else:
                break
        return out

    def loadable(self, call, gpu_hit: int) -> int:
        """Blocks after the GPU prefix hit that the tiers can supply: LMCache's prefix hit
        (leading chunks present in some tier) minus the GPU hit, at most num_tokens - 1
        tokens in all (vLLM computes at least one token), in whole blocks."""
        self._pending = None
        cb, bs = self.chunk_blocks, self.block_size
        max_blocks = (call.num_tokens - 1) // bs
        if max_blocks <= gpu_hit:
            return 0
        where = self._chunk_tiers(call, -(-max_blocks // cb))
        n = min(len(where) * cb, max_blocks) - gpu_hit
        if n <= 0:
            return 0
        self._pending = (call, gpu_hit, where)
        return n

    def load(self, call, gpu_hit: int, n_blocks: int) -> float:
        """The admitted call loads blocks [gpu_hit, gpu_hit + n_blocks): touch the hit
        chunks, account bytes per tier, add the (serial) transfer time to this step."""
        pend, self._pending = self._pending, None
        assert pend is not None and pend[0] is call and pend[1] == gpu_hit, "load() without a matching loadable()"
        cb, where = self.chunk_blocks, pend[2]
        per_tier = [0] * len(self.tiers)
        for b in range(gpu_hit, gpu_hit + n_blocks):
            per_tier[where[b // cb]] += 1
        for j, w in enumerate(where):
            key = call.block_key((j + 1) * cb - 1)
            if key in self.tiers[w]:  # vLLM loads what its lookup found; an offload between may have evicted it
                self.tiers[w].touch(key)
        t = 0.0
        for tier, nb in zip(self.tiers, per_tier):
            if nb:
                dt = tier.transfer_time(nb * self.block_bytes)
                tier.bytes_read += nb * self.block_bytes
                tier.read_s += dt
                t += dt
        self.step_load_s += t
        self.reload_s += t
        self.loads += 1
        self.loaded_tokens += n_blocks * self.block_size
        call.loaded_tokens += n_blocks * self.block_size
        call.admission_loaded_tokens += n_blocks * self.block_size
        call.reload_s += t
        return t

    def admitted(self, call, gpu_hit: int) -> None:
        """Bookkeeping at every admission: tokens past the GPU hit (CPU hit ratio's
        denominator); LMCache saves from the end of its own prefix hit onwards."""
        call.admission_loaded_tokens = 0  # load() follows, if anything is loaded
        self.miss_tokens += max(0, (call.num_tokens - 1) // self.block_size - gpu_hit) * self.block_size
        call.saved_chunks = len(self._chunk_tiers(call, math.inf))

    def prefix_blocks(self, call) -> int:
        """Blocks of the call's prefix the tiers hold (no side effects; for routers)."""
        cb = self.chunk_blocks
        max_blocks = (call.num_tokens - 1) // self.block_size
        return min(len(self._chunk_tiers(call, -(-max_blocks // cb))) * cb, max_blocks)

    def reload_time(self, tokens: int) -> float:
        """Reloading a context of `tokens` from the CPU tier (Continuum's Prefill-Reload
        with offload on)."""
        return self.tiers[0].transfer_time(-(-tokens // self.block_size) * self.block_bytes)

    # --- stores ----------------------------------------------------------------------------
    def _put(self, key: Hashable) -> bool:
        new = False
        for t in self.tiers:
            new |= t.put(key)
        return new

    def write_through(self, call, computed: int) -> None:
        """After a prefill step that left `computed` tokens of the call computed: store the
        prompt's new full chunks (async, not charged)."""
        cb, bs = self.chunk_blocks, self.block_size
        full = min(computed, call.prompt_len) // (cb * bs)
        for j in range(call.saved_chunks, full):
            if self._put(call.block_key((j + 1) * cb - 1)):
                self.writethrough_bytes += self.tiers[0].chunk_bytes
        call.saved_chunks = max(call.saved_chunks, full)

    def offload(self, keys: list, now: float) -> int:
        """Write the full chunks of a context that the CPU tier lacks; `keys`: the content
        key of each of its blocks in order, None for a block the prefix cache does not
        hold (a partial last one). The copy queues on the PCIe link from `now`."""
        cb = self.chunk_blocks
        n = 0
        for j in range(len(keys) // cb):
            ks = keys[j * cb:(j + 1) * cb]
            if None in ks:
                continue
            c = ks[-1]
            if c not in self.tiers[0] and self._put(c):
                n += 1
        if n:
            nbytes = n * self.tiers[0].chunk_bytes
            dt = self.tiers[0].transfer_time(nbytes)
            self.offload_bytes += nbytes
            self.offload_write_s += dt
            self.write_free_at = max(self.write_free_at, now) + dt
        return n

    # --- engine side -------------------------------------------------------------------------
    def price_step(self, compute_s: float, start: float) -> tuple[float, bool]:
        """The time of the step starting at `start` that computes for `compute_s`, and
        whether transfers set it: copies still in flight bound it, the reloads of the
        calls admitted in it lengthen it (LMCache's synchronous retrieve)."""
        load, self.step_load_s = self.step_load_s, 0.0
        write = max(0.0, self.write_free_at - start)
        if load or write:
            return max(compute_s, write) + load, True
        return compute_s, False

    def check(self) -> None:
        for t in self.tiers:
            t.check()

    def stats(self) -> dict:
        out = {
            "cpu_hit_ratio": self.loaded_tokens / self.miss_tokens if self.miss_tokens else 0.0,
            "loaded_tokens": self.loaded_tokens, "loads": self.loads, "reload_s": self.reload_s,
            "writethrough_bytes": self.writethrough_bytes, "offload_bytes": self.offload_bytes,
            "offload_write_s": self.offload_write_s,
        }
        for t in self.tiers:
            out[t.name] = {"capacity_chunks": t.capacity, "resident_chunks": len(t), "stored_chunks": t.stored,
                           "evicted_chunks": t.evicted, "bytes_written": t.bytes_written, "bytes_read": t.bytes_read,
                           "read_s": t.read_s}
        return out


class Inbox:
    """A decode replica's `Scheduler.tier`: a call a prefill replica handed over is admitted
    with its received blocks present (their transfer already ran on the call's path, so
    the step is not charged); every other question goes to the replica's own tier (its
    offload tiers, or NoTier). Received blocks are used once: a call
    preempted on the decode replica recomputes there, as vLLM does."""

    def __init__(self, inner) -> None:
        self.inner = inner  # the replica's KVOffload or NO_TIER
        self._rx = None  # the received call between loadable() and load()
        self.received_tokens = 0

    def loadable(self, call, gpu_hit: int) -> int:
        self._rx = None
        if call.received_blocks:
            n = call.received_blocks - gpu_hit
            if n <= 0:
                return 0
            self._rx = call
            return n
        return self.inner.loadable(call, gpu_hit)

    def admitted(self, call, gpu_hit: int) -> None:
        if call.received_blocks:
            call.received_blocks = 0
            return
        self.inner.admitted(call, gpu_hit)

    def load(self, call, gpu_hit: int, n_blocks: int) -> float:
        rx, self._rx = self._rx, None
        if rx is call:
            self.received_tokens += n_blocks * call.block_size
            return 0.0
        return self.inner.load(call, gpu_hit, n_blocks)

    def __getattr__(self, name: str):  # anything else a scheduler asks of a tier
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)
