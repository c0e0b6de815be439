"""The loops that run once per simulated step of a decode stretch (sim/simpy_replica/engine.py
`_stretch`, `_account`, each call's execution time): 347K steps in the bundled 1x500
run against 16K event-loop iterations, so in Python they were about a fifth of the
event loop (issue 20).

`decode_stretch`, `account_steps` and `add_in_order` are the compiled loops
(sim/hardware/_steps.pyx, built by the install step with FP contraction off, so every + and *
rounds as Python's: the same bits); the `py_` functions here are their reference
(tests compare them) and what runs where the extension is not built.
"""
from __future__ import annotations


def py_decode_stretch(head: float, c2: float, c3s: float, c4: float, c5: float, seqs: float,
                      sqk: float, sk: float, sqc: float, t: float, nxt: float, reader: float, room: int,
                      host: float = 0.0, overlap: bool = False) -> list[float]:
    """Step times of a decode batch (sim/hardware/profile.py StepModel.decode_stretch): each step's
    `head + c2*sum_qk + c3*seqs + c4*sum_k + c5*sum_qc`, the sums growing by `seqs` a step,
    with the host's time per step added (or, `overlap`, as a floor), while fewer than
    `room` steps are taken, the step starts before `nxt` (t, the previous step's end) and
    ends before `reader`."""
    out = []
    while room > 0 and t < nxt:
        d = head + c2 * sqk + c3s + c4 * sk + c5 * sqc
        if host != 0.0:
            if overlap:
                if d < host:
                    d = host
            else:
                d = d + host
        if t + d >= reader:
            break
        out.append(d)
        t += d
        room -= 1
        sqk += seqs
        sk += seqs
        sqc += seqs
    return out


def py_account_steps(dts: list[float], grow: list[int], used: int, area: float, busy: float, t: float,
                     last: float, samples: list, pinned: int) -> tuple[int, float, float, float]:
    """KV use and busy time over consecutive steps starting at `t` (sim/simpy_replica/engine.py
    `_account`): step j holds `grow[j]` more blocks than the one before; a KV sample
    (t, used, pinned) whenever a second has passed since the last one. Returns used, the
    used-block area, busy time and the end of the last step."""
    for d, g in zip(dts, grow):
        used += g
        area += used * d
        busy += d
        if t - last >= 1.0:
            samples.append((t, used, pinned))
            last = t
        t += d
    return used, area, busy, t


def py_add_in_order(x: float, dts: list[float]) -> float:
    """x + dts[0] + dts[1] + ..., added one by one: a call's execution time after a
    stretch, the float step-by-step reaches (every running call, every stretch)."""
    for d in dts:
        x += d
    return x


try:
    from sim.hardware._steps import account_steps, add_in_order, decode_stretch
except ImportError:  # a source checkout that was never installed: the reference runs
    decode_stretch, account_steps, add_in_order = py_decode_stretch, py_account_steps, py_add_in_order
