"""One LLM call in the simulated engine (vLLM's Request, nano-vllm's Sequence)."""
from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import Request
from sim.kv.content import ContentKeys


@dataclass(eq=False, slots=True)  # slots: the engine reads its fields on every step
class Call:
    req: Request  # what the policy sees
    prompt_len: int
    max_output: int
    block_size: int = 16
    shared_prefix: int = 0  # leading tokens shared by every program (system prompt)
    content: ContentKeys | None = None  # the program's block keys (sim/kv/content.py); made here if not given
    seq_no: int = 0  # order of arrival at its replica (set as it is delivered): the waiting queue's tie-breaker
    num_output: int = 0  # tokens sampled so far
    num_computed: int = 0  # tokens whose KV is in `blocks`
    blocks: list[int] = field(default_factory=list)
    num_keyed: int = 0  # leading blocks already registered in the prefix cache
    # asynchronous scheduling (vLLM's AsyncScheduler; sim/simpy_replica/engine.py _loop_async): steps
    # scheduled and not yet applied
    in_flight: int = 0  # tokens of this call in steps in flight (vLLM counts them computed)
    placeholders: int = 0  # tokens those steps will sample (vLLM's num_output_placeholders)
    stale: int = 0  # tokens in flight from before a preemption: their output still arrives
    last_step: int = 0  # the last step that scheduled it (Scheduler's step numbers)
    # metrics
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    cached_tokens: int | None = None  # prefix hit at first admission
    computed_prompt_tokens: int = 0  # prompt tokens actually prefilled (recompute included)
    preemptions: int = 0
    # offload and clusters (sim/kv/tiers.py, sim/cluster/cluster.py)
    replica: int = 0  # the replica that served the call
    loaded_tokens: int = 0  # tokens reloaded from an offload tier (all admissions)
    admission_loaded_tokens: int = 0  # of those, tokens reloaded at the latest admission
    reload_s: float = 0.0  # transfer time of those reloads (all admissions)
    saved_chunks: int = 0  # leading chunks LMCache holds or has stored for this call
    # prefill/decode disaggregation (sim/cluster/disagg.py)
    prefilled_on: int | None = None  # the prefill replica that prefilled it (None: prefilled where it decodes)
    received_blocks: int = 0  # leading blocks whose KV it brings to its decode replica (used at admission)
    # per admission (the first, and one after each preemption): [prompt tokens hit in the GPU
    # cache, prompt tokens loaded, computed_prompt_tokens before it] (admission_rows)
    admissions: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.content is None:  # a call on its own (tests): the shared prefix, then its own tokens
            self.content = ContentKeys(self.block_size)
            self.content.append("<shared>", self.shared_prefix)
            self.content.append((self.req.program_id, self.req.turn), self.prompt_len - self.shared_prefix)
            self.content.append_output(self.max_output)

    def admit(self, gpu_hit: int, loaded: int) -> None:
        """An admission (both engines call it): of the prompt, `gpu_hit` tokens present in
        the replica's KV (a prefix hit, or handed over by a prefill replica) and `loaded`
        tokens reloaded from a tier; a readmission's hit may reach past the prompt into its
        outputs, counted here only up to the prompt."""
        cached = min(gpu_hit, self.prompt_len)
        self.admissions.append([cached, min(gpu_hit + loaded, self.prompt_len) - cached, self.computed_prompt_tokens])

    def admission_rows(self) -> list[tuple[int, int, int]]:
        """(cached, loaded, computed) prompt tokens per admission, computed being those it
        prefilled before the next admission (or its end): they add up to the prompt for an
        admission that finished its prefill, less for one preempted before."""
        ends = [a[2] for a in self.admissions[1:]] + [self.computed_prompt_tokens]
        return [(c, ld, end - start) for (c, ld, start), end in zip(self.admissions, ends)]

    @property
    def num_tokens(self) -> int:
        """Tokens known so far: prompt plus sampled output (a preempted call recomputes all)."""
        return self.prompt_len + self.num_output

    @property
    def done(self) -> bool:
        return self.num_output >= self.max_output

    def block_key(self, i: int):
        """Prefix-cache identity of block i (sim/kv/content.py)."""
        return self.content.key(i)
