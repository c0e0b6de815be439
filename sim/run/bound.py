"""A run given a bound (`p95_jct<=60`) that stops as soon as the bound is known to fail.

The planner asks of each point only whether its SLO metric stays within a limit. Most
points it tries fail by far (one replica at a load three need), and a run can know that
long before its last program finishes: at simulated time t a program that arrived at a
and has not finished has a JCT above t - a, whatever happens next. So a bounded run keeps,
at each finished call, a lower bound of every program's JCT (the exact JCT of a finished
program, t - arrival of one that arrived and is not done, 0 of one not yet arrived), and
stops once the metric of those lower bounds is above the limit: the metric of the full
run can only be higher (percentiles and the mean grow with every value).

For a percentile q of N programs (numpy's linear interpolation between sorted values v_i
at h = (N - 1) q / 100) the metric exceeds the limit once v_floor(h) does, i.e. once at
least N - floor(h) programs are known to exceed it (for p95 of 500 programs: 26, just
over 5%); max_jct once one does. The count is kept incrementally; when it is reached, the
lower bound is computed over all programs and the run stops only if that is above the
limit. mean_jct: the sum of the lower bounds above N x limit.

A run that is not stopped is the same run as without a bound, to the last digit (the bound
only watches). A stopped run's summary has `stopped_early: true`, `stop_reason` (one
line), `stopped_at_s` (simulated time), the metric set to its lower bound (so it fails the
same SLO) and the counts of programs and calls finished; it has no other metrics.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import numpy as np

from agentsim.errors import InputError

# run-summary metric -> percentile (100 = max), None for the mean
BOUNDABLE = {"mean_jct": None, "p50_jct": 50, "p90_jct": 90, "p95_jct": 95, "p99_jct": 99, "max_jct": 100}


@dataclass(frozen=True)
class Bound:
    metric: str
    limit: float

    def __str__(self) -> str:
        short = f"{self.limit:g}"
        return f"{self.metric}<={short if float(short) == self.limit else repr(self.limit)}"  # exact, short where it can be

    def scaled(self, factor: float) -> Bound:
        """The same metric at limit x factor (a planner bound per seed over `factor` seeds:
        one seed's metric above n x limit puts the mean of n non-negative ones above limit)."""
        return Bound(self.metric, self.limit * factor)

    def watcher(self) -> Watcher:
        return Watcher(self)


def parse_limit(text: str, metrics, flag: str) -> tuple[str, float]:
    """'p95_jct<=60' -> ('p95_jct', 60.0), the metric one of `metrics`; InputError (one line,
    naming `flag`) for anything else. The form of `--bound` and of the planner's `--slo`."""
    metric, sep, limit = str(text).partition("<=")
    metric = metric.strip()
    try:
        value = float(limit)
    except ValueError:
        value = math.nan
    if not sep or metric not in metrics or not (math.isfinite(value) and value > 0):
        raise InputError(f"{flag} {text!r} is not METRIC<=SECONDS with METRIC one of {', '.join(metrics)} "
                         f"and SECONDS > 0; write e.g. {flag} 'p95_jct<=60'")
    return metric, value


def parse_bound(text: str, flag: str = "--bound") -> Bound:
    """'p95_jct<=60' -> Bound('p95_jct', 60.0)."""
    return Bound(*parse_limit(text, BOUNDABLE, flag))


def step_floor(profile) -> float:
    """No engine step is shorter than this: the profile's step time at one token of one
    sequence, every coefficient being >= 0 (so the time grows with every argument); 0
    (no floor) for a profile with a negative coefficient, or none."""
    st = getattr(profile, "step", None)
    if st is None:
        return 0.0
    terms = (*st.coefficients, st.w, st.launch, st.collective_shift, st.collective_shift_token)
    if not all(math.isfinite(x) and x >= 0 for x in terms):
        return 0.0
    # a one-token step's `single` is no floor: a step of two tokens does without it
    return max(0.0, float(replace(st, single=0.0).time(1, 1, 0.0, 0.0, 0.0)))


class Stopped(Exception):
    """Raised out of the event loop when the bound is known to fail (sim/run/simulate.py)."""


class Watcher:
    """One run's watch on a bound: `start` with the run's programs, then `finished` at
    every finished call; True once the bound is known to fail (then `summary`).

    A program's JCT lower bound: its JCT once finished; else, with c of its calls done
    (the last at f), S(i) the tool time of its turns from i on (the trace's
    `tool_duration_s`, which the workload waits out in full) and O(i) the least time the
    calls from i on take (each output token is a step of its own, and no step is shorter
    than the profile's shortest, step_floor): max(f - a + S(c - 1) + O(c),
    t - a + S(c) + O(c + 1)) at time t after its arrival a, and S(0) + O(0) before it. A
    program is counted as known to exceed the limit once that bound does (with a margin
    of 1e-9 of the limit against rounding)."""

    def __init__(self, bound: Bound):
        self.bound = bound
        self.q = BOUNDABLE[bound.metric]
        self.limit = bound.limit + 1e-9 * max(1.0, bound.limit)  # "above the limit", with a margin

    def start(self, programs: list, profile=None) -> None:
        """`programs`: (program id, its trace rows (dicts with `tool_duration_s` and
        `output_tokens`), arrival; inf where not known ahead, as in a closed loop), as
        sim.run.workload.Workload keeps them; `profile`: the run's (its shortest step, below)."""
        self.n = n = len(programs)
        fl = step_floor(profile)
        self.pos = {str(pid): k for k, (pid, _, _) in enumerate(programs)}
        self.after: list[list[float]] = []  # per program, i calls done: S(i - 1) + floor x O(i) (i >= 1)
        self.ahead: list[list[float]] = []  # per program, i calls done: S(i) + floor x O(i + 1)
        first = []
        for _, rows, _ in programs:
            tool = [0.0 if math.isnan(x) else x for x in (float(r["tool_duration_s"]) for r in rows[:-1])] + [0.0]
            out = [fl * float(r["output_tokens"]) for r in rows]
            S, O = [0.0] * (len(rows) + 1), [0.0] * (len(rows) + 1)
            for i in range(len(rows) - 1, -1, -1):
                S[i], O[i] = S[i + 1] + tool[i], O[i + 1] + out[i]
            self.after.append([0.0] + [S[i - 1] + O[i] for i in range(1, len(rows))])
            self.ahead.append([S[i] + O[i + 1] for i in range(len(rows))])
            first.append(S[0] + O[0])
        self.a = np.array([float(arr) for _, _, arr in programs])
        self.done = np.zeros(n, dtype=int)  # calls finished per program
        self.stat = np.array(first)                        # the bound's part that no longer grows with t
        self.rem = np.array([x[0] for x in self.ahead])   # what the call in flight and the rest still need
        self.jct = np.full(n, np.nan)                     # exact, once finished
        self.known: set[int] = set()  # unfinished programs known to exceed the limit
        self.over = 0                 # finished programs above the limit
        self.calls = 0
        self.heap: list[tuple[float, int, int]] = []  # (time after which t - a + rem > limit, program, calls done)
        for k in range(n):
            self._place(k)
        if self.q is None:
            self.need = None
        else:  # programs that must exceed the limit for the percentile to (numpy, linear)
            h = (n - 1) * (self.q / 100) if n else 0.0
            self.need = n - math.floor(h)

    def _place(self, k: int) -> None:
        if self.stat[k] > self.limit:
            self.known.add(k)
        elif self.a[k] < math.inf:
            heapq.heappush(self.heap, (self.a[k] + self.limit - self.rem[k], k, int(self.done[k])))

    def finished(self, call, now: float) -> bool:
        self.calls += 1
        req = call.req
        k = self.pos[req.program_id]
        if not self.a[k] < math.inf:  # a closed loop's program: its start is known now
            self.a[k] = req.program_arrival
        if req.is_last_step:
            j = now - req.program_arrival
            self.jct[k] = j
            self.known.discard(k)
            if j > self.bound.limit:
                self.over += 1
        else:
            c = self.done[k] = self.done[k] + 1
            self.stat[k] = now - self.a[k] + self.after[k][c]
            self.rem[k] = self.ahead[k][c]
            if k not in self.known:
                self._place(k)
        heap = self.heap
        while heap and heap[0][0] < now:
            _, j, c = heapq.heappop(heap)
            if c == self.done[j] and np.isnan(self.jct[j]):
                self.known.add(j)
        if self.q is None:
            if self.calls % 16:  # the mean: the whole vector, every 16 calls
                return False
        elif self.over + len(self.known) < self.need:
            return False
        lb = self.lower_bound(now)
        if not lb > self.limit:  # the count said so; the metric of the lower bounds agrees before stopping
            return False
        self.now, self.value = now, lb
        return True

    def lower_bounds(self, now: float) -> np.ndarray:
        """Every program's JCT, or a lower bound of it at `now`."""
        with np.errstate(invalid="ignore"):
            running = np.maximum(self.stat, now - self.a + self.rem)  # -inf before a closed loop's start
        return np.where(np.isnan(self.jct), running, self.jct)

    def lower_bound(self, now: float) -> float:
        lb = self.lower_bounds(now)
        if self.q is None:
            return float(lb.mean())
        return float(lb.max()) if self.q == 100 else float(np.percentile(lb, self.q))

    def summary(self) -> dict:
        b, m = self.bound, self.bound.metric
        finished = int((~np.isnan(self.jct)).sum())
        why = (f"{m} > {b.limit:g} s known at simulated t={self.now:.1f} s: the JCTs of {self.over + len(self.known)} of "
               f"{self.n} programs exceed {b.limit:g} s (finished, or already waiting or due to wait on tools that long)"
               if self.q is not None else
               f"mean_jct > {b.limit:g} s known at simulated t={self.now:.1f} s from lower bounds of the programs' JCTs")
        return {"programs": self.n, "calls": self.calls, "finished_programs": finished, m: self.value,
                "bound": str(b), "stopped_early": True, "stopped_at_s": self.now,
                "stop_reason": f"{why}; {m} >= {self.value:.2f} s"}
