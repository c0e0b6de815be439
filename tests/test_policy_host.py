"""The policy host both engines are (sim/replica/policy_host.py), through the SimPy
replica's scheduler: the view it answers, pins held, replaced, refused and released, a
program's end, the victim order. The vLLM adapter runs the same code (tests/test_twin_engine.py)."""
import pytest

from conftest import linear_profile
from policies.base import Policy, Request, Retention
from policies.registry import make_policy
from sim.hardware.engine_config import EngineConfig
from sim.replica.call import Call
from sim.simpy_replica.scheduler import Scheduler


def call(pid, prompt, out, seq, turn=0, arrival=0.0, last=False):
    req = Request(req_id=f"{pid}#{turn}", program_id=pid, turn=turn, arrival=arrival, program_arrival=0.0,
                  prompt_tokens=prompt, is_last_step=last)
    return Call(req=req, seq_no=seq, prompt_len=prompt, max_output=out, block_size=16)


class PinFor5(Policy):
    """Pins every turn for 5 s; records the programs it saw end."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[tuple[str, int]] = []

    def retention(self, req, now, view):
        return Retention("pin", 5.0)

    def on_program_end(self, program_id, num_turns, now):
        super().on_program_end(program_id, num_turns, now)
        self.ended.append((program_id, num_turns))


def test_the_view_answers_from_the_engine_blocks_and_profile():
    prof = linear_profile(c0=0.01, c1=0.001)
    s = Scheduler(EngineConfig(num_gpu_blocks=41, block_size=16), make_policy("vllm"), prof)
    a, b = call("a", 40, 5, 0), call("b", 20, 5, 1)
    s.waiting += [a, b]
    s.complete(s.schedule(0.0), 0.1)
    s.schedule(0.1)  # a and b decode: one token each, computed at the step's end
    assert (s.block_size, s.num_blocks, s.free_blocks()) == (16, 40, 40 - 3 - 2)
    assert s.blocks_of("a") == 3 and s.blocks_of("b") == 2 and s.blocks_of("z") == 0
    assert s.running_tokens() == (2, (3 + 2) * 16)
    assert s.prefill_reload_time(1000) == prof.prefill_time(1000) and not s.offload_enabled()
    assert s.linear_step() == prof.linear_step()
    assert s.queue_delay() == 0.0 and s.avg_request_blocks() == 1.0  # nothing finished yet
    pinned = s.pool.allocate(4)
    s.hold_pin("p", pinned, 1.0)
    assert s.blocks_of("p") == 4 and s.free_blocks() == 40 - 3 - 2 - 4 and s.pinned_blocks == 4


def test_a_finished_call_is_counted_then_the_policy_decides():
    pol = PinFor5()
    s = Scheduler(EngineConfig(num_gpu_blocks=41, block_size=16), pol)
    c = call("a", 40, 1, 0, turn=1, arrival=2.0)
    s.waiting.append(c)
    s.complete(s.schedule(3.0), 3.5)  # scheduled 1 s after its arrival
    ret = s.call_finished(c.req, c.num_output, 3.5, c.scheduled_at, len(c.blocks))
    assert ret == Retention("pin", 5.0) and c.req.output_tokens == 1
    assert s.queue_delay() == pytest.approx(1.0) and s.avg_request_blocks() == 3.0
    s.retire(c, ret, 3.5)
    assert s.blocks_of("a") == 3 and "a" in pol.pins and not c.blocks


def test_a_second_pin_replaces_the_first_as_expired_and_a_refused_one_is_a_victim():
    pol = PinFor5()
    s = Scheduler(EngineConfig(num_gpu_blocks=21, block_size=16), pol)
    pol.on_finish(call("p", 30, 1, 0).req, 0.0, s)
    s.hold_pin("p", s.pool.allocate(3), 0.0)
    s.hold_pin("p", s.pool.allocate(2), 1.0)  # never two pins for one program
    assert s.blocks_of("p") == 2 and s.free_blocks() == 20 - 2
    assert dict(pol.pin_outcomes) == {"expired": 1}
    pol.on_finish(call("q", 30, 1, 0).req, 2.0, s)
    s.hold_pin("q", None, 2.0)  # the engine cannot hold it
    assert "q" not in s.pins and dict(pol.pin_outcomes) == {"expired": 1, "victim": 1}


def test_expiry_keeps_a_pin_whose_next_call_waits_and_the_end_drops_the_rest():
    pol = PinFor5()
    s = Scheduler(EngineConfig(num_gpu_blocks=21, block_size=16), pol)
    for pid in ("a", "b"):
        pol.on_finish(call(pid, 30, 1, 0).req, 0.0, s)  # pinned until t=5
        s.hold_pin(pid, s.pool.allocate(2), 0.0)
    s.waiting.append(call("a", 40, 1, 1, turn=1))  # a's next call waits: its pin stays
    s.expire_pins(4.5)
    assert set(s.pins) == {"a", "b"}
    s.expire_pins(5.0)
    assert set(s.pins) == {"a"} and dict(pol.pin_outcomes) == {"expired": 1}
    s.end_program(call("a", 40, 1, 1, turn=1, last=True).req, 6.0)
    assert not s.pins and dict(pol.pin_outcomes) == {"expired": 1, "last": 1} and pol.ended == [("a", 2)]
    assert s.free_blocks() == 20 and s.pinned_block_seconds == pytest.approx(4 * 5.0 + 2 * 1.0)


def test_the_running_list_comes_back_in_victim_order_last_victim_first():
    pol = make_policy("continuum-static")  # victims: latest program arrival first
    s = Scheduler(EngineConfig(num_gpu_blocks=101, block_size=16), pol)
    calls = [call(p, 20, 5, i) for i, p in enumerate("abc")]
    for c, arrived in zip(calls, (2.0, 0.0, 1.0)):
        c.req.program_arrival = arrived
    s.running = list(calls)
    order = pol.preemption_order([c.req for c in calls], s)
    assert [c.req.program_id for c in s.victim_ordered()] == [r.program_id for r in reversed(order)] == ["b", "c", "a"]


def test_releasable_blocks_reach_the_shortfall_exactly_when_the_full_count_does():
    """The no-deadlock rule asks only whether dropping every other pin frees `short` blocks:
    releasable counts sole blocks (shared ones free nothing) until it gets there."""
    pol = PinFor5()
    s = Scheduler(EngineConfig(num_gpu_blocks=41, block_size=16), pol)
    shared = s.pool.allocate(2)
    for pid, own in (("a", 3), ("b", 4), ("c", 5)):
        pol.on_finish(call(pid, 30, 1, 0).req, 0.0, s)
        s.pool.touch(shared)  # every pin also holds the two shared blocks
        s.hold_pin(pid, shared + s.pool.allocate(own), 0.0)
    s.pool.free(shared)  # the allocation's own reference
    full = {h: sum(s.count_sole(b) for p, b in s.pins.items() if p != h) for h in ("a", "b", "c", None)}
    assert full == {"a": 9, "b": 8, "c": 7, None: 12}
    for head, n in full.items():
        for short in range(1, 20):
            got = s.releasable(head, short)
            assert (got < short) == (n < short)
    assert s.pinned_blocks == 14 and s.releasable(None, 15) == 14  # fewer pinned blocks than short: no pin counted
