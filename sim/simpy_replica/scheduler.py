"""One replica's scheduler, step by step as vLLM v1 does it.

`schedule(now)` decides one step: running calls first (decode, or the rest of a chunked
prefill) within the token budget, preempting by recompute when a running call cannot
grow; then, if nothing was preempted, waiting calls in policy order until the budget,
`max_num_seqs` or memory stops it — a head that cannot be allocated blocks the queue
(head-of-line). Before that, expired pins are dropped; when the head does not fit, the
policy may unpin victims (Continuum's no-deadlock rule). `complete(...)` applies a
step's results. Timing lives in the engine, not here.

With asynchronous scheduling (`cfg.async_scheduling`, vLLM's AsyncScheduler) a step is
scheduled while the one before it runs: a call's tokens in flight count as computed
(`Call.in_flight`) and the tokens they will sample as placeholders, a call preempted with
output in flight gets that output still (`Call.stale`) and waits for it before it is
admitted again, and `complete_async` applies one step. With a KV connector (offload
tiers, a disaggregated decode replica's handoffs: `connector`) vLLM instead drops a
preempted call's output in flight, and does not preempt a call whose blocks a step in
flight may still write (their free would wait for that step): it stops scheduling the
running calls for the step there.
"""
from __future__ import annotations

from policies.base import Action, Policy, Release, Retention
from sim.kv.block_pool import BlockPool
from sim.kv.radix_cache import RadixCache
from sim.kv.retention import RetainingPool, refuse_radix, retain
from sim.replica.call import Call
from sim.replica.policy_host import PolicyHost
from sim.hardware.engine_config import EngineConfig
from sim.hardware.profile import Profile
from sim.kv.tiers import NO_TIER


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Programs:
    """The programs of some calls, as a container that is only asked (the policy host's
    waiting_programs): the set is built at the first question, and most steps ask none
    (expire_pins asks only about a pin whose TTL ran out)."""

    __slots__ = ("_calls", "_set")

    def __init__(self, calls: list[Call]) -> None:
        self._calls, self._set = calls, None

    def __contains__(self, program_id) -> bool:
        if self._set is None:
            self._set = {c.req.program_id for c in self._calls}
        return program_id in self._set


class Scheduler(PolicyHost):
    """One replica's scheduler; as the PolicyHost (sim/replica/policy_host.py) it is also
    the policy's EngineView and holds the pins."""

    def __init__(self, cfg: EngineConfig, policy: Policy, profile: Profile | None = None) -> None:
        self.cfg = cfg
        self.profile = profile  # prices contexts for the policy's view (the engine's)
        self.block_size = cfg.block_size
        self.num_blocks = cfg.num_gpu_blocks - 1
        # the GPU KV cache (the sim/kv/protocol.py protocol): vLLM's block pool or SGLang's radix
        # tree; vLLM's BlockPool keeps one of num_gpu_blocks as its null block (never allocated)
        self.pool = (RadixCache if cfg.cache == "radix" else BlockPool)(cfg.num_gpu_blocks - 1, cfg.block_size)
        if policy.retains and cfg.cache == "radix":
            refuse_radix()
        self.waiting: list[Call] = []
        self.running: list[Call] = []
        self.preemptions = 0
        self.tier = NO_TIER  # KVOffload (sim/kv/tiers.py) when an offload tier is configured
        self.init_host(policy)
        self.order_moved = False  # this step's victim ordering moved a running call (SimpyReplica._steady)
        self.preempted_now = False  # the last step preempted (it admitted nothing then)
        self._tier_hit = 0  # the offload tier's answer to the last admission's lookup (_admit)
        # vLLM's allocate_slots caches the full blocks of the tokens it schedules at once, so
        # a call admitted later in the same step hits a prefix another call is computing in
        # it (kv_cache_manager.py: cache_blocks(request, computed + new)); the radix model
        # keeps SGLang's insert at the chunk's end (complete)
        self._key_at_schedule = cfg.cache != "radix"
        self.async_ = cfg.async_scheduling
        self.rows: list[tuple[int, bool]] = []  # async: per call of the last schedule(), (tokens computed after it, samples)
        # async with a KV connector (the engine sets it): vLLM drops stale output and will not
        # preempt a call whose blocks a step in flight may still write (its defer_block_free)
        self.connector = False
        self._scheduled_steps = self._applied_steps = 0  # non-empty steps scheduled, applied

    @property
    def retaining(self) -> bool:
        """The pool has soft retention's retained set (sim/kv/retention.py: from the first
        call that asked for it on)."""
        return type(self.pool) is RetainingPool

    # --- the block operations of the policy host (sim/replica/policy_host.py HostedEngine) ---
    def count_free(self) -> int:
        return self.pool.num_free

    def running_blocks(self, program_id: str) -> int:
        return sum(len(c.blocks) for c in self.running if c.req.program_id == program_id)

    def running_rows(self) -> list[tuple[int, int]]:
        return [(c.num_tokens - c.num_computed - c.in_flight, len(c.blocks)) for c in self.running]

    def running_requests(self) -> list:
        return [c.req for c in self.running]

    def waiting_programs(self) -> _Programs:
        return _Programs(self.waiting)

    def count_sole(self, blocks: list[int]) -> int:
        return self.pool.count_ref(blocks, 1)

    def block_keys(self, program_id: str, blocks: list[int]) -> list:
        """The content key each block caches (None: not a full cached block), as an
        offload tier names a context's chunks."""
        key = self.pool.key
        return [key[b] for b in blocks]

    def free_pinned(self, blocks: list[int], now: float) -> None:
        if self.retaining:  # soft retention's evictor reads the time of the free
            self.pool.now = now
        self.pool.free(blocks)

    def pins_changed(self, program_id: str, now: float) -> None:
        """Nothing to do: the waiting queue is sorted at each step."""

    # --- allocation ---------------------------------------------------------------------
    def _try_allocate(self, call: Call, num_new: int, hit: list[int] | tuple = (), evictable_hits: int = 0) -> bool:
        """vLLM's allocate_slots: take the prefix-hit blocks and enough new ones, or nothing.
        `evictable_hits`: how many hit blocks sit in the free queue (pool.evictable(hit))."""
        start = call.num_computed + call.in_flight + len(hit) * self.cfg.block_size
        need = cdiv(start + num_new, self.cfg.block_size) - len(call.blocks) - len(hit)
        # Hit blocks sitting in the free queue stop being allocatable once touched.
        if need > self.pool.num_free - evictable_hits:
            return False
        if hit:
            self.pool.touch(hit)
            call.blocks.extend(hit)
        if need > 0:  # a running call's step mostly needs no new block
            call.blocks.extend(self.pool.allocate(need))
        return True

    def prefix_hit(self, call: Call) -> list[int]:
        # At least one prompt token must be computed, as in vLLM (max hit = num_tokens - 1).
        n = (call.num_tokens - 1) // self.cfg.block_size
        return self.pool.lookup(call.content.prefix(n), call.content)

    def _key_blocks(self, call: Call, upto: int) -> None:
        """Register the call's full blocks up to token `upto` (a scheduled chunk's end, so
        at most num_tokens) in the prefix cache."""
        full = upto // self.cfg.block_size
        if full > call.num_keyed:
            call.block_key(full - 1)  # computes the program's keys up to there
            parent = call.content.keys[call.num_keyed - 1] if call.num_keyed else None
            self.pool.cache_many(call.blocks[call.num_keyed:full], call.content.keys[call.num_keyed:full], parent)
            call.num_keyed = full

    def _free_call(self, call: Call) -> None:
        self.pool.free(call.blocks)
        call.blocks = []
        call.num_keyed = 0

    def _frees_later(self, call: Call) -> bool:
        """Async with a KV connector: a step in flight may still write the call's blocks, so
        vLLM would free them only once the steps now in flight have ended (defer_block_free)."""
        return self.async_ and self.connector and call.last_step > self._applied_steps

    def _preempt(self, victim: Call, now: float) -> None:
        self.running.remove(victim)
        self._free_call(victim)
        victim.num_computed = 0
        if self.async_:  # its steps in flight still deliver their tokens (vLLM: stale output)
            victim.stale += victim.in_flight
            victim.in_flight = victim.placeholders = 0
        victim.req.preempted = True
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.append(victim)
        # the adapter places a preempted call by its order key at once (_place), and a key
        # may keep state (Autellix promotes a call it finds starving then); with steps in
        # flight the call's service grows before the next pass asks again (the twin check)
        self.policy.order_key(victim.req, now, self)

    # --- one step ---------------------------------------------------------------------
    def schedule(self, now: float) -> list[tuple[Call, int]]:
        cfg, policy = self.cfg, self.policy
        if self.retaining:  # soft retention's evictor reads the schedule time (a stretch's allocations too)
            self.pool.now = now
        self.expire_pins(now)
        self.pins_hold = True  # until the no-deadlock rule says otherwise in this step (drop_pins_for)

        if self._custom_victim and len(self.running) > 1:
            # vLLM preempts the tail of its running list; with the policy adapter the list is
            # put in the policy's victim order before every step (last victim first), which
            # also decides which running call gets the step's budget and blocks first
            # (sim/vllm_replica/scheduler.py _order_running_for_victims; the twin check)
            new = self.victim_ordered()
            self.order_moved = new != self.running  # ties flip every step (victim_ordered)
            self.running = new
        else:
            self.order_moved = False
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Call, int]] = []
        preempted = self.preempted_now = False
        i = 0
        async_, bs, key_at = self.async_, self.block_size, self._key_at_schedule
        running = self.running  # preemption removes from this list; nothing replaces it below
        while i < len(running) and budget > 0:
            call = running[i]
            start = call.num_computed + call.in_flight
            if async_:
                if call.placeholders and start + 2 - call.placeholders >= call.prompt_len + call.max_output:
                    i += 1  # its steps in flight reach its last token: no further step (vLLM)
                    continue
                num_new = min(call.prompt_len + call.num_output + call.placeholders - start, budget)
            else:
                num_new = min(call.prompt_len + call.num_output - call.num_computed, budget)
            # a step that fills no new block (most decode steps) needs nothing of the pool:
            # _try_allocate would succeed without touching it
            if -(-(start + num_new) // bs) > len(call.blocks):
                ok = self._try_allocate(call, num_new)
                while not ok:
                    # vLLM pops the tail of its running list (never a call scheduled before this
                    # one), which a policy with its own victims had put in its victim order at
                    # the step's start (victim_ordered). Asking preemption_victim of what is left
                    # would break its ties the other way (the twin fuzz found it).
                    victim = running[-1]
                    if self._frees_later(victim):
                        break  # vLLM: a deferred free will not help now; no more running calls this step
                    self._preempt(victim, now)
                    preempted = self.preempted_now = True
                    if victim is call:
                        break
                    ok = self._try_allocate(call, num_new)
                if not ok:
                    if call in running:
                        break  # not scheduled and not preempted (vLLM stops at it)
                    continue
            scheduled.append((call, num_new))
            if key_at:  # known tokens only (async: not the placeholders)
                upto = min(start + num_new, call.prompt_len + call.num_output)
                if upto // bs > call.num_keyed:
                    self._key_blocks(call, upto)
            budget -= num_new
            i += 1

        # vLLM admits no waiting call in a step that preempted. When every running call
        # was preempted that step is empty and vLLM's engine core schedules again at the
        # same instant (the engine's loop does: a policy that reviews pins reviews them
        # again there, now with nothing running; the twin check).
        if not preempted and self.waiting:
            self.waiting.sort(key=lambda c: (policy.order_key(c.req, now, self), c.seq_no))
            hits = []  # programs whose pin the admitted call consumes: released after the loop
            j = 0  # async: calls before j wait for their stale output (vLLM skips them)
            while j < len(self.waiting) and budget > 0 and len(self.running) < cfg.max_num_seqs:
                call = self.waiting[j]
                if call.stale and not self.connector:
                    j += 1
                    continue
                num_new, short = self._admit(call, budget)
                if num_new is None and short > 0 and self._unpin_for(call, short, now):
                    # vLLM retries the allocation with the lookups it made before dropping
                    # the pins (sim/vllm_replica/scheduler.py allocate_slots): the offload tier's
                    # answer stands, though a dropped pin's offload may have changed the tier
                    num_new, short = self._admit(call, budget, self._tier_hit)
                    # the dropped pins' programs wait further back now (an order key may read
                    # the pins): the adapter re-places their calls at once (pins_changed),
                    # within this step's admissions (the twin check)
                    rest = self.waiting[j + 1:]
                    rest.sort(key=lambda c: (policy.order_key(c.req, now, self), c.seq_no))
                    self.waiting[j + 1:] = rest
                if num_new is None:
                    break  # head-of-line blocking
                self.waiting.pop(j)
                call.admit(call.num_computed - call.admission_loaded_tokens, call.admission_loaded_tokens)
                if call.scheduled_at is None:
                    call.scheduled_at = now
                    call.cached_tokens = call.admissions[0][0]  # GPU hit only
                    policy.on_schedule(call.req, now)
                hits.append(call.req.program_id)
                self.running.append(call)
                scheduled.append((call, num_new))
                if self._key_at_schedule:
                    self._key_blocks(call, call.num_computed + num_new)
                budget -= num_new
            # vLLM with the policy adapter releases a consumed pin once its scheduler has
            # built the step (sim/vllm_replica/scheduler.py schedule): blocks the pin held
            # beyond the hit (its partial last block) are not free to later admissions of
            # the same step (the twin check, benchmarks/twin_check.py)
            for pid in hits:
                self.release_pin(pid, now, Release.HIT)
        if async_:
            self._after_schedule_async(scheduled)
        return scheduled

    def _after_schedule_async(self, scheduled: list[tuple[Call, int]]) -> None:
        """vLLM's AsyncScheduler._update_after_schedule: the scheduled tokens count as
        computed at once; a step that reaches past the known tokens samples one (a
        placeholder until its output arrives). Prompt tokens are counted as computed here,
        as the GPU computes them even for a call preempted before the step's end."""
        rows = self.rows = []
        if scheduled:
            self._scheduled_steps += 1
        for call, q in scheduled:
            ahead = call.num_computed + call.in_flight
            if ahead < call.prompt_len:
                call.computed_prompt_tokens += min(ahead + q, call.prompt_len) - ahead
            call.in_flight += q
            call.last_step = self._scheduled_steps
            sample = ahead + q >= call.num_tokens + call.placeholders
            if sample:
                call.placeholders += 1
            rows.append((ahead + q, sample))

    def _admit(self, call: Call, budget: int, tier_hit: int | None = None) -> tuple[int | None, int]:
        """Try to start a waiting call: (tokens scheduled, 0) or (None, blocks short);
        `tier_hit`: the offload tier's answer of the last try, kept on a retry."""
        bs = self.cfg.block_size
        hit = self.prefix_hit(call)
        # blocks past the GPU hit that an offload tier can reload instead of recomputing
        load = self._tier_hit = self.tier.loadable(call, len(hit)) if tier_hit is None else tier_hit
        start = (len(hit) + load) * bs
        num_new = call.num_tokens - start
        if not self.cfg.enable_chunked_prefill and num_new > budget:
            return None, 0  # whole-prompt admission: wait for a step with room
        num_new = min(num_new, budget)
        evictable_hits = self.pool.evictable(hit)
        if self.cfg.scheduler_reserve_full_isl:
            short = cdiv(call.num_tokens, bs) - len(hit) - (self.pool.num_free - evictable_hits)
            if short > 0:
                return None, short
        if self._try_allocate(call, load * bs + num_new, hit, evictable_hits):
            call.num_computed = start
            call.num_keyed = len(hit)
            self.tier.admitted(call, len(hit))
            if load:
                self.tier.load(call, len(hit), load)
            return num_new, 0
        need = cdiv(start + num_new, bs) - len(hit)
        return None, need - (self.pool.num_free - evictable_hits)

    def _unpin_for(self, call: Call, short: int, now: float) -> bool:
        """Continuum's no-deadlock rule for the blocked head (PolicyHost.drop_pins_for)."""
        return self.drop_pins_for(call.req.program_id, short, now)

    # --- stretches of identical decode steps ---------------------------------------------
    def stretch_base(self, call: Call) -> int:
        """The token position the first step of a decode stretch writes, once that step is
        scheduled; step j writes base + j. Asynchronously the step ahead of it (in flight)
        and it itself already count as in flight."""
        return call.num_computed + call.in_flight - 1 if self.async_ else call.num_computed

    def _extra_blocks(self, rows: list[tuple[int, int]], n: int) -> int:
        """Blocks the decode calls need for steps 1..n-1 beyond what step 0 allocated;
        `rows`: per call, (stretch_base, blocks held)."""
        bs, need = self.block_size, 0
        for base, held in rows:  # a loop, not a generator: this runs before every stretch
            more = -(-(base + n) // bs) - held
            if more > 0:
                need += more
        return need

    def decode_stretch_limit(self, scheduled: list[tuple[Call, int]], max_steps: int) -> int:
        """Most steps (<= max_steps) the decode batch can run before a block allocation
        would fail, i.e. before the step-by-step engine would preempt; in the radix cache,
        through the first step whose filled block the tree holds already (_alias_free_steps)."""
        if self.cfg.cache == "radix":
            max_steps = self._alias_free_steps(scheduled, max_steps)
        free = self.pool.num_free
        rows = [(self.stretch_base(c), len(c.blocks)) for c, _ in scheduled]
        if self._extra_blocks(rows, max_steps) <= free:
            return max_steps
        lo, hi = 1, max_steps  # lo always fits (step 0 is allocated)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._extra_blocks(rows, mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _alias_free_steps(self, scheduled: list[tuple[Call, int]], max_steps: int) -> int:
        """The radix cache inserts a block when it fills (complete), and a block whose
        content the tree holds already becomes an alias that locks the tree's copy (an
        evictable block stops being free mid-stretch). Identical prompts decode identical
        outputs, so this happens; a stretch inserts only at its end, so it ends with the
        first step that fills such a block, or a block another call of the batch also
        fills (which of the two the tree keeps depends on the order of the fills)."""
        bs, cached = self.cfg.block_size, self.pool.cached
        first: dict = {}  # key -> (first step that fills it, calls filling it)
        limit = max_steps
        for call, _ in scheduled:
            nc = call.num_computed
            for j in range(-(nc + 1) % bs, min(max_steps, limit), bs):  # step j computes position nc + j
                key = call.block_key((nc + j + 1) // bs - 1)
                if key in cached:
                    limit = min(limit, j + 1)
                    break
                step, calls = first.get(key, (j, 0))
                first[key] = (min(step, j), calls + 1)
        shared = [step for step, calls in first.values() if calls > 1]
        return min([limit] + [step + 1 for step in shared])

    def _allocate_stretch(self, scheduled: list[tuple[Call, int]], n: int) -> None:
        """Allocate steps 1..n-1's blocks in the order step-by-step would: by step, then
        by running order — so the free queue ends identical."""
        bs = self.cfg.block_size
        # step j writes token position base + j, so a call starts a new block at a first
        # step f in 1..bs and every bs steps after it: ordered by step, the crossings go
        # round by round (bs steps each), in each by (f, running order)
        firsts = sorted((-self.stretch_base(c) % bs or bs, idx) for idx, (c, _) in enumerate(scheduled))
        order = [idx for start in range(0, n, bs) for f, idx in firsts if start + f < n]
        for idx, b in zip(order, self.pool.allocate(len(order))):  # one pop of them all, same order
            scheduled[idx][0].blocks.append(b)

    def complete(self, scheduled: list[tuple[Call, int]], now: float, steps: int = 1) -> list[Call]:
        """Apply `steps` steps that ended at `now` (steps > 1 only for an all-decode batch):
        KV computed, full blocks cached, tokens sampled; returns the finished calls."""
        bs, pool, tier = self.block_size, self.pool, self.tier
        if steps > 1:
            self._allocate_stretch(scheduled, steps)
        finished = []
        for call, num_new in scheduled:
            if steps > 1:
                num_new = steps  # n decode steps of one token each
            computed, prompt = call.num_computed, call.prompt_len
            prefill = computed < prompt
            if prefill:
                call.computed_prompt_tokens += min(computed + num_new, prompt) - computed
            computed += num_new
            call.num_computed = computed
            full = computed // bs
            if full > call.num_keyed:
                call.block_key(full - 1)  # computes the program's keys up to there
                keys = call.content.keys
                parent = keys[call.num_keyed - 1] if call.num_keyed else None  # the radix tree's edge
                pool.cache_many(call.blocks[call.num_keyed:full], keys[call.num_keyed:full], parent)
                call.num_keyed = full
            if prefill:
                tier.write_through(call, computed)  # LMCache stores new full chunks on prefill steps
            if computed == prompt + call.num_output or steps > 1:  # all known tokens computed: one sampled
                call.num_output += 1 if steps == 1 else steps
                if call.first_token_at is None:
                    call.first_token_at = now
                if call.num_output >= call.max_output:  # Call.done
                    call.finished_at = now
                    finished.append(call)
        if finished:
            done = set(map(id, finished))
            self.running = [c for c in self.running if id(c) not in done]
        return finished

    def complete_async(self, scheduled: list[tuple[Call, int]], rows: list[tuple[int, bool]], now: float) -> list[Call]:
        """Apply one step scheduled asynchronously that ended at `now` (vLLM's
        update_from_output; `rows`: schedule()'s, that step's): prefill chunks written
        through, KV computed, full blocks cached, the tokens
        it sampled appended; a call preempted since it was scheduled gets only its token
        (stale output, and it may finish in the waiting queue; with a connector, nothing).
        Returns the finished calls."""
        bs = self.cfg.block_size
        if self.tier.enabled:  # the GPU computed these chunks, preempted since or not (as sim/vllm_replica/engine.py)
            for (call, q), (after, _) in zip(scheduled, rows):
                if after - q < call.prompt_len:
                    self.tier.write_through(call, after)
        self._applied_steps += 1
        finished, from_waiting = [], []
        for (call, q), (_, sample) in zip(scheduled, rows):
            if call.finished_at is not None:
                continue  # finished in an earlier step (vLLM drops the output)
            if call.stale:
                call.stale -= q
                if self.connector:
                    continue  # dropped: vLLM's drop_stale_output with a connector that must deliver KV
                running = False
            else:
                call.in_flight -= q
                call.num_computed += q
                running = True
            if not sample:
                continue
            if running:
                call.placeholders -= 1
            call.num_output += 1
            if running:  # vLLM caches a running call's blocks as its tokens arrive
                full = call.num_computed // bs
                if full > call.num_keyed:
                    call.block_key(full - 1)
                    parent = call.content.keys[call.num_keyed - 1] if call.num_keyed else None
                    self.pool.cache_many(call.blocks[call.num_keyed:full], call.content.keys[call.num_keyed:full], parent)
                    call.num_keyed = full
            if call.first_token_at is None:
                call.first_token_at = now
            if call.done:
                call.finished_at = now
                finished.append(call)
                if not running:
                    from_waiting.append(call)
        if finished:
            done = set(map(id, finished))
            self.running = [c for c in self.running if id(c) not in done]
            if from_waiting:
                self.waiting = [c for c in self.waiting if id(c) not in done]
        return finished

    def complete_async_stretch(self, scheduled: list[tuple[Call, int]], n: int) -> list[tuple[int, bool]]:
        """An asynchronous decode stretch of n steps lands (sim/simpy_replica/engine.py _land_stretch,
        after the step in flight ahead of it was applied): its steps 1..n-1 scheduled and
        steps 0..n-2 applied, as n - 1 passes of step-by-step would leave them (each applies
        the oldest step in flight and schedules the next: blocks allocated in step order,
        full blocks cached, one token sampled). No call finishes in them. Returns the rows
        of step n - 1, which stays in flight."""
        self._allocate_stretch(scheduled, n)
        self._scheduled_steps += n - 1
        self._applied_steps += n - 1
        rows = []
        for call, _ in scheduled:
            call.num_computed += n - 1
            call.num_output += n - 1
            call.last_step = self._scheduled_steps
            self._key_blocks(call, call.num_computed)
            rows.append((call.num_computed + call.in_flight, True))
        return rows

    def retire(self, call: Call, retention: Retention, now: float) -> None:
        """A finished call's KV: pinned blocks stay referenced, otherwise freed (still cached)."""
        if retention.action == Action.PIN:
            self.hold_pin(call.req.program_id, call.blocks, now)
            call.blocks = []
        else:
            if retention.action == Action.RETAIN:
                retain(self, call.blocks, retention, now)
            if self.retaining:
                self.pool.now = now
            if retention.action == Action.OFFLOAD:
                self.offload_finished(call.req.program_id, call.blocks, now)
            self._free_call(call)
