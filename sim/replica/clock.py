"""The step clock both engines share: a step's end as a SimPy event at an exact time, in
an order that does not depend on decode stretches."""
from __future__ import annotations

import heapq

import simpy


def step_end(env: simpy.Environment, at: float, replica: int) -> simpy.Event:
    """The event that ends a replica's step (or stretch) at exactly `at`. A stretch ends
    where step-by-step gets by adding its step times one by one; SimPy's timeouts land on
    now + delay, and no delay may give that float (when the sum rounds to even across a
    power of two), so the event goes on SimPy's queue directly, as Environment.schedule
    does. Ties: SimPy orders the events of one instant by creation, and a stretch creates
    its end earlier than step-by-step creates its last step's, so step ends take a priority
    after SimPy's NORMAL, in replica order: an instant's other events (arrivals, tool
    returns, what an earlier replica's step end set off) come first, and the order cannot
    depend on stretches. When it fires it records its place (`slot_passed`)."""
    ev = env.event()
    ev._ok, ev._value = True, None
    ev.callbacks.append(lambda _: setattr(env, "step_slot", (env.now, replica)))  # before the process resumes
    heapq.heappush(env._queue, (at, simpy.core.NORMAL + 1 + replica, next(env._eid), ev))
    return ev


def slot_passed(env: simpy.Environment, replica: int) -> bool:
    """Whether this instant's step ends have reached `replica`'s place: what runs now
    comes after a step end of `replica` or a later replica (step_end), so step-by-step,
    a step of `replica` that begins now would have begun."""
    slot = getattr(env, "step_slot", None)
    return slot is not None and slot[0] == env.now and slot[1] >= replica
