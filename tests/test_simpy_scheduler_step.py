"""One scheduler step at a time: budget, chunking, head-of-line blocking, preemption."""
from policies.base import Request
from policies.registry import make_policy
from sim.replica.call import Call
from sim.hardware.engine_config import EngineConfig
from sim.simpy_replica.scheduler import Scheduler



def call(pid, prompt, out, seq, arrival=0.0):
    req = Request(req_id=f"{pid}#0", program_id=pid, turn=0, arrival=arrival, program_arrival=arrival, prompt_tokens=prompt)
    return Call(req=req, seq_no=seq, prompt_len=prompt, max_output=out, block_size=16)


def sched(**kw):
    cfg = EngineConfig(**{"num_gpu_blocks": 100, "block_size": 16, **kw})
    return Scheduler(cfg, make_policy("vllm"))


def test_token_budget_and_chunked_prefill():
    s = sched(max_num_batched_tokens=64)
    a, b = call("a", 100, 3, 0), call("b", 10, 3, 1)
    s.waiting += [a, b]
    step = s.schedule(0.0)
    assert [(c.req.program_id, n) for c, n in step] == [("a", 64)]  # budget spent on a's first chunk
    assert len(a.blocks) == 4
    s.complete(step, 1.0)
    assert a.num_computed == 64 and a.num_output == 0  # no token sampled mid-prefill
    step = s.schedule(1.0)
    assert [(c.req.program_id, n) for c, n in step] == [("a", 36), ("b", 10)]  # running first, then waiting
    s.complete(step, 2.0)
    assert a.num_output == 1 and b.num_output == 1 and a.first_token_at == 2.0


def test_whole_prompt_admission_without_chunking():
    s = sched(max_num_batched_tokens=64, enable_chunked_prefill=False)
    s.waiting.append(call("a", 100, 3, 0))
    assert s.schedule(0.0) == []


def test_admission_needs_the_whole_prompt_to_fit():
    # vLLM 0.32 scheduler_reserve_full_isl: a 100-token prompt needs 7 blocks even
    # though its first 64-token chunk needs only 4; 6 usable blocks -> it waits
    s = sched(num_gpu_blocks=7, max_num_batched_tokens=64)
    s.waiting.append(call("a", 100, 3, 0))
    assert s.schedule(0.0) == []
    s = sched(num_gpu_blocks=7, max_num_batched_tokens=64, scheduler_reserve_full_isl=False)
    s.waiting.append(call("a", 100, 3, 0))
    assert [(c.req.program_id, n) for c, n in s.schedule(0.0)] == [("a", 64)]


def test_head_of_line_blocking():
    s = sched(num_gpu_blocks=10)
    big, huge, small = call("a", 100, 50, 0), call("b", 100, 5, 1), call("c", 10, 5, 2)
    s.waiting += [big, huge, small]
    step = s.schedule(0.0)  # a takes 7 blocks; b needs 7 of the 3 left and blocks c although c fits
    assert [c.req.program_id for c, _ in step] == ["a"]
    assert [c.req.program_id for c in s.waiting] == ["b", "c"]


def test_max_num_seqs():
    s = sched(max_num_seqs=1)
    s.waiting += [call("a", 10, 5, 0), call("b", 10, 5, 1)]
    assert [c.req.program_id for c, _ in s.schedule(0.0)] == ["a"]


def test_preemption_by_recompute_of_newest():
    s = sched(num_gpu_blocks=5)  # 4 usable: vLLM keeps one as its null block
    a, b = call("a", 32, 40, 0), call("b", 31, 40, 1)
    s.waiting += [a, b]
    s.complete(s.schedule(0.0), 1.0)  # a: 2 blocks (32 tokens), b: 2 blocks (31 tokens) -> pool full
    assert s.pool.num_free == 0
    # next step: a's decode needs a 3rd block -> the newest running call (b) is preempted
    step = s.schedule(1.0)
    assert [c.req.program_id for c, _ in step] == ["a"]
    assert b.req.preempted and b.num_computed == 0 and b.blocks == [] and b in s.waiting
    assert s.preemptions == 1 and b.preemptions == 1
    s.complete(step, 2.0)
    # a preempted call is first in line again and recomputes prompt + sampled output
    assert b.num_tokens == 32
    s.pool.check()
