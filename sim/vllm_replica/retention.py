"""Soft retention inside vLLM: its BlockPool with sim/kv/retention.py's retained set, as
vLLM's retention API (PR #38514) would put it in the KV cache manager's pool.

`install(pool, clock)` turns a running BlockPool into a RetainingBlockPool (its class
changes, its state stays): the adapter (sim/vllm_replica/scheduler.py) does so the first
time a finished call asks for soft retention, so a run that never retains runs vLLM's
pool unchanged. A retained block has no holder (ref_cnt 0, so vLLM's own checks count it
as evictable, as the simulator's pool does) but sits outside the free queue; the
evictor takes the queue first, then the retained set (sim/kv/retention.py), so the two
engines evict the same blocks in the same order.
"""
from __future__ import annotations

from vllm.v1.core.block_pool import BlockPool

from sim.kv.retention import Retainer
from sim.replica.job_meta import parse_hint


class RetainingBlockPool(BlockPool):
    retainer: Retainer
    clock = None

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks + len(self.retainer.retained)

    def touch(self, blocks) -> None:
        r = self.retainer
        if r.retained:
            rest = []
            for block in blocks:
                if block.ref_cnt == 0 and block.block_id in r.retained:
                    r.take(block.block_id)  # a prefix hit holds it again
                    block.ref_cnt = 1
                else:
                    rest.append(block)
            blocks = rest
        super().touch(blocks)

    def free_blocks(self, ordered_blocks) -> None:
        r = self.retainer
        if not r.spec:
            super().free_blocks(ordered_blocks)
            return
        # those no one else holds whose spec is live, asked as one list as the simulator's pool asks
        now, ordered_blocks = self.clock(), list(ordered_blocks)  # vLLM may pass an iterator (reversed())
        ours = [block for block in ordered_blocks if block.ref_cnt == 1 and block.block_hash is not None
                and not block.is_null and block.pool in (None, self) and block.block_id in r.spec]
        kept = set(r.kept([block.block_id for block in ours], now)) if ours else None
        if not kept:
            super().free_blocks(ordered_blocks)
            return
        held = [block for block in ours if block.block_id in kept]
        for block in held:
            block.ref_cnt = 0
        r.add_many([block.block_id for block in held], now)
        held = set(map(id, held))
        super().free_blocks([block for block in ordered_blocks if id(block) not in held])

    def get_new_blocks(self, num_blocks: int) -> list:
        r, blocks = self.retainer, self.blocks
        if num_blocks and r.next_change() <= (now := self.clock()):
            expired = r.expire(now)
            if expired:  # back to default priority: the free queue's tail, in that order
                self.free_block_queue.append_n([blocks[i] for i in expired])
        queued = self.free_block_queue.num_free_blocks
        if num_blocks <= queued:
            out = super().get_new_blocks(num_blocks)
        else:
            if num_blocks > self.get_num_free_blocks():
                raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
            out = super().get_new_blocks(queued) if queued else []
            for i in r.pick(num_blocks - queued):
                block = blocks[i]
                self._maybe_evict_cached_block(block)
                block.ref_cnt += 1
                out.append(block)
        if r.spec and out:
            r.forget(b.block_id for b in out)
        return out


def install(pool: BlockPool, clock) -> RetainingBlockPool:
    """Give a live BlockPool a retained set (no-op when it has one)."""
    if not isinstance(pool, RetainingBlockPool):
        pool.__class__ = RetainingBlockPool
        pool.retainer = Retainer()
        pool.clock = clock
    return pool


def retain_request(sched, request, retention, now: float) -> None:
    """A finished request's soft retention (Action.RETAIN) in the adapter `sched`: the KV
    cache manager's pool gets a retained set the first time, then the request's blocks
    get the spec; vLLM frees them next."""
    pool = install(sched.kv_cache_manager.block_pool, sched.clock)
    blocks = sched.kv_cache_manager.get_blocks(request.request_id).blocks[0]
    pool.retainer.set([b.block_id for b in blocks if not b.is_null], retention.priority, now + retention.ttl,
                      retention.half_life)


def read_hint(extra_args, warn, request_id: str):
    """The request's retention hint from extra_args (sim/replica/job_meta.py `kv_hints`);
    problems are logged once by `warn(key, message)`, never raised."""
    if not extra_args or "kv_hints" not in extra_args:
        return None
    hint, problems = parse_hint(extra_args["kv_hints"])
    for p in problems:
        warn(p, f"request {request_id}: {p}")
    return hint
