"""A policy is a pure function of its call sequence: record the calls a scripted
scenario makes, replay them into a fresh object, get identical decisions. And the
policy modules import no engine (simpy, vllm, pandas)."""
import copy
import random
import subprocess
import sys

import pytest

from policies.base import Request
from policies.registry import POLICIES, make_policy

PER_TOKEN = 0.0005  # Prefill-Reload: 0.5 ms per context token
BLOCK = 16


from conftest import FakeView  # noqa: E402


def SnapView(free, blocks):
    """EngineView from a snapshot (what the policy could read at that moment)."""
    return FakeView(blocks, free, per_token=PER_TOKEN, num_blocks=400, avg_blocks=20.0)



class Recorder:
    """Forwards calls to a policy, logging (method, copied args, result)."""

    def __init__(self, policy):
        self.policy, self.log = policy, []

    def __getattr__(self, name):
        fn = getattr(self.policy, name)
        if not callable(fn):
            return fn  # state (pins) is read, not logged

        def call(*args, **kw):
            saved = tuple(SnapView(a.free, a.blocks) if isinstance(a, FakeView) else copy.copy(a) for a in args)
            res = fn(*args, **kw)
            self.log.append((name, saved, dict(kw), copy.deepcopy(res)))
            return res

        return call


def scenario(pol, seed=0, n_programs=40):
    """A tiny deterministic engine: max 3 running, 400 blocks, fixed step 0.1 s."""
    rng = random.Random(seed)
    tools = {"ls": 0.3, "grep": 1.0, "pytest": 6.0}
    progs = {}
    for i in range(n_programs):
        turns = rng.randint(2, 7)
        calls = [(rng.choice(list(tools)), rng.randint(50, 400)) for _ in range(turns)]
        progs[f"p{i}"] = dict(arrival=round(i * 0.7, 1), calls=calls, prompt=rng.randint(500, 3000))
    durations = {pid: [rng.expovariate(1 / tools[t]) for t, _ in pr["calls"]] for pid, pr in progs.items()}
    arrivals = [(pr["arrival"], pid, 0) for pid, pr in progs.items()]
    waiting, running, held = [], [], {}  # held: pid -> blocks (running or pinned)
    ctx = {pid: pr["prompt"] for pid, pr in progs.items()}
    t, done = 0.0, 0

    def view():
        return SnapView(400 - sum(held.values()), held)

    while done < len(progs) and t < 400:
        t = round(t + 0.1, 1)
        for a in sorted(x for x in arrivals if x[0] <= t):
            arrivals.remove(a)
            _, pid, turn = a
            tool, _ = progs[pid]["calls"][turn]
            r = Request(f"{pid}-{turn}", pid, turn, a[0], progs[pid]["arrival"], ctx[pid],
                        is_last_step=turn == len(progs[pid]["calls"]) - 1, tool=tool)
            r.true_tool_duration = durations[pid][turn]
            pol.on_arrival(r, t)
            waiting.append(r)
        for pid in pol.expired_pins(t, {r.program_id for r in waiting}):
            held.pop(pid, None)
            pol.pin_released(pid, t, "expired")
        for item in [x for x in running if x[2] <= t]:
            running.remove(item)
            r, start, end = item
            r.output_tokens = progs[r.program_id]["calls"][r.turn][1]
            r.exec_time = round(end - start, 3)
            ctx[r.program_id] = r.context_tokens
            ret = pol.on_finish(r, t, view())
            if r.is_last_step:
                held.pop(r.program_id, None)
                pol.on_program_end(r.program_id, r.turn + 1, t)
                done += 1
                continue
            if ret.action != "pin":
                held.pop(r.program_id, None)
            arrivals.append((round(t + durations[r.program_id][r.turn], 1), r.program_id, r.turn + 1))
        waiting.sort(key=lambda r: pol.order_key(r, t, view()))
        while waiting and len(running) < 3:
            r = waiting[0]
            need = -(-r.prompt_tokens // BLOCK) + 30 - held.get(r.program_id, 0)
            free = 400 - sum(held.values())
            if need > free:
                for pid in pol.unpin_victims(need - free, view(), r.program_id):
                    held.pop(pid, None)
                    pol.pin_released(pid, t, "victim")
                if need > 400 - sum(held.values()):
                    break
            waiting.pop(0)
            pol.on_schedule(r, t)
            if r.program_id in pol.pins:
                pol.pin_released(r.program_id, t, "hit")
            held[r.program_id] = held.get(r.program_id, 0) + need
            running.append((r, t, round(t + 0.2 + r.prompt_tokens * 1e-4, 3)))
    return done


def replay(name, log, params):
    fresh = make_policy(name, **params)
    for method, args, kw, res in log:
        got = getattr(fresh, method)(*args, **kw)
        assert got == res, (method, args, got, res)
    return fresh


PARAMS = {"continuum": {"K": 10}, "oracle": {"K": 10}}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_replay_gives_identical_decisions(name):
    rec = Recorder(make_policy(name, **PARAMS.get(name, {})))
    assert scenario(rec) == 40
    fresh = replay(name, rec.log, PARAMS.get(name, {}))
    orig = rec.policy
    assert fresh.pins == orig.pins and dict(fresh.ttls) == dict(orig.ttls)
    assert dict(fresh.pin_outcomes) == dict(orig.pin_outcomes)
    methods = {m for m, *_ in rec.log}
    assert {"on_arrival", "on_schedule", "on_finish", "order_key", "expired_pins", "on_program_end"} <= methods
    if name in ("continuum", "oracle", "continuum-static"):
        assert orig.pin_outcomes["hit"] > 0 and sum(map(len, orig.ttls.values())) > 0
    if name == "continuum":
        assert set(orig.ttl_source) == {"default", "global", "tool"}


def test_replay_detects_a_different_policy():
    rec = Recorder(make_policy("continuum", K=10))
    scenario(rec)
    with pytest.raises(AssertionError):
        replay("continuum", rec.log, {"K": 1000})


def test_policy_modules_import_no_engine():
    code = (
        "import sys, policies.base, policies.registry, policies.continuum, policies.static, "
        "policies.program_fcfs, policies.autellix, policies.oracle\n"
        "bad = [m for m in ('simpy', 'vllm', 'pandas', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
