"""Continuum (paper §4-§5) rules, with hand-computed values."""
import math

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.base import FREE, Retention, Request
from policies.continuum import (ContinuumPolicy, Memoryfulness, PySortedSamples, SortedSamples, StaticTTLPolicy,
                                best_ttl, default_ttl)


from conftest import FakeView  # noqa: E402



def req(pid="p", turn=1, arrival=0.0, prog_arrival=0.0, tokens=2200, tool="a", last=False, preempted=False):
    return Request(f"{pid}-{turn}", pid, turn, arrival, prog_arrival, tokens, 0, last, tool, preempted)


def pol_with(samples, K=3, **kw):
    p = ContinuumPolicy(K=K, **kw)
    for tool, t in samples:
        p.record_tool_time(tool, t)
    return p


# --- Eq. 2 -------------------------------------------------------------------------
def test_best_ttl_hand_computed():
    s = np.array([0.5, 1.0, 1.0, 3.0])
    # B=2.2: τ=0 ->0; .5 -> .25*2.2-.5=.05; 1 -> .75*2.2-1=.65; 3 -> 2.2-3=-.8
    assert best_ttl(s, 2.2) == 1.0
    # B=10: .5 -> 2.0; 1 -> 6.5; 3 -> 7.0
    assert best_ttl(s, 10.0) == 3.0
    # small benefit: every τ>0 loses to τ=0 (0.5: .125-.5<0)
    assert best_ttl(s, 0.5) == 0.0
    # negative benefit (η<0, large T) -> τ=0
    assert best_ttl(s, -1.0) == 0.0
    # ties go to the smaller τ: [1, 2], B=2: τ=0 -> 0, 1 -> 0, 2 -> 0
    assert best_ttl(np.array([1.0, 2.0]), 2.0) == 0.0
    # [1, 3], B=4: τ=1 -> .5*4-1 = 1, τ=3 -> 4-3 = 1 -> 1
    assert best_ttl(np.array([1.0, 3.0]), 4.0) == 1.0
    # samples at 0 make τ=0 worth P(0)*B: [0, 0, 5], B=3 -> τ=0 (2, vs 5: -2)
    assert best_ttl(np.array([0.0, 0.0, 5.0]), 3.0) == 0.0


def test_policy_uses_eq2_with_per_tool_cdf():
    p = pol_with([("a", 0.5), ("a", 1.0), ("a", 1.0), ("a", 3.0)], K=3)
    v = FakeView()
    r = req(tokens=2200)  # Prefill-Reload = 2.2 s, T = 0 -> B = 2.2
    assert p.on_finish(r, 10.0, v) == Retention("pin", 1.0)
    assert p.pins["p"].expiry == 11.0 and p.ttls["a"] == [1.0]
    assert p.ttl_source == {"tool": 1}
    r2 = req(pid="q", tokens=500)  # B = 0.5 -> τ* = 0 -> free, no pin
    assert p.on_finish(r2, 10.0, v) == FREE and "q" not in p.pins


def test_default_ttl_closed_form_matches_brute_force():
    taus = np.linspace(0, 20, 400001)
    for mean in (1.0, 2.0):
        for B in (0.3, 1.0, 1.5, 2.2, 7.0, 40.0):
            obj = (1 - np.exp(-taus / mean)) * B - taus
            brute = taus[np.argmax(obj)]
            assert default_ttl(B, mean) == pytest.approx(brute, abs=1e-3)
    assert default_ttl(2.2) == pytest.approx(math.log(2.2))
    assert default_ttl(1.0) == 0.0 and default_ttl(0.5) == 0.0


def test_cold_start_thresholds_K():
    v = FakeView()
    p = pol_with([("a", 1.0)] * 100, K=100)
    # |S| = 100 <= K: T_default with η = 1, B = T + PR = 2.2 -> ln 2.2
    assert p.calc_ttl(req(tool="a"), v) == pytest.approx(math.log(2.2))
    p.record_tool_time("b", 0.1)  # |S| = 101 > K, |S[b]| = 1 <= K -> global CDF
    # global [0.1, 1.0 x100], B=2.2: τ=.1 -> 2.2/101-.1 < 0; τ=1 -> 1.2 -> 1.0
    assert p.calc_ttl(req(tool="b"), v) == 1.0
    for _ in range(99):
        p.record_tool_time("b", 0.1)
    # |S[b]| = 100 <= K still global: [0.1 x100, 1.0 x100]: τ=.1 -> 1.0, τ=1 -> 1.2
    assert p.calc_ttl(req(tool="b"), v) == 1.0
    p.record_tool_time("b", 0.1)  # |S[b]| = 101 -> its own CDF: all 0.1 -> τ=.1
    assert p.calc_ttl(req(tool="b"), v) == pytest.approx(0.1)
    assert p.calc_ttl(req(tool="a"), v) == 1.0  # a: 100 samples -> global (1.2 vs 101/201*2.2-.1)
    assert p.ttl_source == {"default": 1, "global": 3, "tool": 1}


def test_static_ttl_is_the_cold_start_ttl_for_every_tool():
    """Fig. 16's "Static TTL": T_default (η = 1, Exp(1 s)) however many samples a tool has."""
    v = FakeView()
    p = StaticTTLPolicy()
    for _ in range(500):
        p.record_tool_time("a", 30.0)  # Continuum would learn that "a" never returns within B
    assert p.calc_ttl(req(tool="a", tokens=2200), v) == pytest.approx(math.log(2.2))  # B = T + PR = 2.2
    p.on_schedule(req(pid="q", turn=1, arrival=0.0), 7.8)  # T = 7.8 -> B = 10, still η = 1
    assert p.on_finish(req(tool="b", tokens=2200), 20.0, v) == Retention("pin", pytest.approx(math.log(10.0)))
    assert p.ttl_source == {"default": 2}
    learned = pol_with([("a", 30.0)] * 500, K=100)
    assert learned.calc_ttl(req(tool="a", tokens=2200), v) == 0.0


def test_unknown_tool_uses_global_cdf_only():
    p = pol_with([(None, 3.0)] * 3 + [("a", 0.5)] * 2, K=3)
    assert "None" not in p.samples and None not in p.samples and len(p.all_samples) == 5
    # tool None -> global [.5,.5,3,3,3], B=2.2: .5 -> .4*2.2-.5=.38; 3 -> -.8 -> 0.5
    assert p.calc_ttl(req(tool=None), FakeView()) == 0.5


def test_max_ttl_caps():
    p = pol_with([("a", 0.5), ("a", 1.0), ("a", 1.0), ("a", 3.0)], K=3, max_ttl=0.7)
    assert p.calc_ttl(req(), FakeView()) == 0.7


# --- η -----------------------------------------------------------------------------
def test_eta_fixed_length_programs_is_one():
    m = Memoryfulness()
    for _ in range(5):
        m.add(7)
    assert m.eta == pytest.approx(1.0)


def test_eta_matches_numpy_corr():
    Ns = [1, 2, 3, 7, 10, 10, 4]
    m = Memoryfulness()
    for N in Ns:
        m.add(N)
    k = np.array([k for N in Ns for k in range(N)])
    n = np.array([N for N in Ns for _ in range(N)])
    assert m.eta == pytest.approx(-np.corrcoef(k, n - k)[0, 1])


def test_eta_geometric_programs_near_zero():
    rng = np.random.default_rng(0)
    m = Memoryfulness()
    for N in rng.geometric(0.2, size=20000):
        m.add(int(N))
    assert abs(m.eta) < 0.05


def test_eta_undefined_cases_default_to_one():
    m = Memoryfulness()
    assert m.eta == 1.0  # no program
    m.add(5)
    assert m.eta == 1.0  # < 2 programs
    m2 = Memoryfulness()
    for _ in range(4):
        m2.add(1)
    assert m2.eta == 1.0  # zero variance


def test_eta_from_program_end_enters_benefit():
    p = ContinuumPolicy(K=0)
    p.record_tool_time("a", 1.0)
    for N in (1, 2, 3, 4, 50):  # long tail: η < 1
        p.on_program_end(f"x{N}", N, 0.0)
    assert p.eta < 0.9
    p.T_window.append(4.0)
    assert p.benefit(req(tokens=1000), FakeView()) == pytest.approx(4.0 * p.eta + 1.0)


# --- T -----------------------------------------------------------------------------
def test_T_window_only_evicted_requests():
    p = ContinuumPolicy(T_window=2)
    assert p.T == 0.0  # initialised to zero (§4.2)
    p.on_schedule(req(turn=0, arrival=0.0), 5.0)  # first turn: not evicted
    assert p.T == 0.0
    p.pins["p"] = __import__("policies.base", fromlist=["Pin"]).Pin(9.0, 0.0, 1.0, "a")
    p.on_schedule(req(turn=1, arrival=1.0), 4.0)  # served from its pin
    assert p.T == 0.0
    p.on_schedule(req(pid="q", turn=1, arrival=1.0), 3.0)  # evicted: delay 2
    p.on_schedule(req(pid="r", turn=2, arrival=1.0), 5.0)  # evicted: delay 4
    assert p.T == 3.0
    p.on_schedule(req(pid="s", turn=1, arrival=0.0), 8.0)  # window of 2: (4 + 8) / 2
    assert p.T == 6.0


def test_T_raises_ttl():
    p = pol_with([("a", 0.5), ("a", 1.0), ("a", 1.0), ("a", 3.0)], K=3)
    v = FakeView()
    r = req(tokens=200)  # B = 0.2 -> τ* = 0
    assert p.calc_ttl(r, v) == 0.0
    p.on_schedule(req(pid="q", turn=1, arrival=0.0), 9.8)  # T = 9.8, η = 1 -> B = 10
    assert p.calc_ttl(r, v) == 3.0


# --- §4.3 order, §5.2 expiry, deadlock, last step -----------------------------------
def test_waiting_order():
    p = ContinuumPolicy()
    v = FakeView()
    p.on_finish(req(pid="pinned", turn=0, prog_arrival=5.0, tokens=100000), 0.0, v)  # ln(100) s pin
    assert "pinned" in p.pins
    rs = [
        req(pid="old", turn=3, arrival=9.0, prog_arrival=1.0),
        req(pid="new", turn=0, arrival=2.0, prog_arrival=2.0),
        req(pid="pinned", turn=1, arrival=8.0, prog_arrival=5.0),
        req(pid="pre", turn=1, arrival=9.5, prog_arrival=7.0, preempted=True),
    ]
    order = sorted(rs, key=lambda r: p.order_key(r, 10.0, v))
    assert [r.program_id for r in order] == ["pre", "pinned", "old", "new"]


def test_expiry_spares_waiting_program():
    p = ContinuumPolicy()
    v = FakeView()
    for pid in ("a", "b", "c"):
        p.on_finish(req(pid=pid, turn=0, tokens=3000), 0.0, v)  # TTL ln 3 ≈ 1.0986
    assert p.expired_pins(1.0, set()) == []
    assert sorted(p.expired_pins(1.2, {"b"})) == ["a", "c"]
    for pid in ("a", "c"):
        p.pin_released(pid, 1.2, "expired")
    assert list(p.pins) == ["b"] and p.pin_outcomes["expired"] == 2


def test_deadlock_victims_latest_program_arrival_first():
    p = ContinuumPolicy()
    v = FakeView(blocks={"p1": 4, "p2": 4, "p3": 4})
    for i, pid in enumerate(("p1", "p2", "p3")):
        p.on_finish(req(pid=pid, turn=0, prog_arrival=float(i), tokens=5000), 0.0, v)
    assert p.unpin_victims(3, v) == ["p3"]
    assert p.unpin_victims(5, v) == ["p3", "p2"]
    assert p.unpin_victims(5, v, exclude="p3") == ["p2", "p1"]
    assert p.unpin_victims(0, v) == []
    assert p.unpin_victims(100, v) == ["p3", "p2", "p1"]


def test_last_step_never_pinned_and_no_pin_outlives_program():
    p = ContinuumPolicy()
    v = FakeView()
    assert p.on_finish(req(tokens=100000, last=True), 0.0, v) == FREE and not p.pins
    p.on_finish(req(pid="x", turn=0, tokens=100000), 0.0, v)
    p.on_program_end("x", 1, 1.0)  # defensive: a leftover pin is dropped as 'last'
    assert not p.pins and p.pin_outcomes["last"] == 1


def test_hit_counted_and_tool_time_recorded_from_arrivals():
    p = ContinuumPolicy()
    v = FakeView()
    p.on_finish(req(pid="x", turn=0, tokens=5000, tool="ls"), 10.0, v)
    p.on_arrival(req(pid="x", turn=1, arrival=10.4), 10.4)
    assert list(p.all_samples) == [pytest.approx(0.4)] and list(p.samples["ls"]) == [pytest.approx(0.4)]
    p.on_schedule(req(pid="x", turn=1, arrival=10.4), 10.5)
    p.pin_released("x", 10.5, "hit")
    assert p.pin_outcomes["hit"] == 1 and p.T == 0.0


# --- issue 20: incrementally sorted samples, identical to the old per-call computation ---
def _old_best_ttl(samples, benefit):
    """Eq. 2 as it was computed before issue 20 (whole array, every call)."""
    n = len(samples)
    if n == 0:
        return 0.0
    vals = np.arange(1, n + 1) / n * benefit - samples
    i = int(np.argmax(vals))
    return float(samples[i]) if vals[i] > 0.0 else 0.0


class _OldSamples:
    """The TTL inputs as kept before issue 20: np.insert per tool, a list of all samples
    sorted again whenever the global CDF is read after a new sample."""

    def __init__(self, K):
        self.K, self.samples, self.all = K, {}, []

    def record(self, tool, seconds):
        t = max(0.0, float(seconds))
        self.all.append(t)
        if tool is not None:
            s = self.samples.get(tool, np.empty(0))
            self.samples[tool] = np.insert(s, np.searchsorted(s, t), t)

    def ttl(self, tool, benefit):
        if len(self.all) <= self.K:
            return default_ttl(benefit)
        s = self.samples.get(tool) if tool is not None else None
        if s is None or len(s) <= self.K:
            s = np.sort(np.asarray(self.all, dtype=float))
        return _old_best_ttl(s, benefit)


def _durations(rng, n):
    """Exponential tool times with exact repeats, zeros and a long tail (ties matter in Eq. 2)."""
    kind = rng.integers(0, 4, n)
    return np.where(kind == 0, rng.exponential(1.0, n),
                    np.where(kind == 1, rng.choice([0.0, 0.25, 0.5, 1.0, 3.0], n),
                             np.where(kind == 2, rng.exponential(20.0, n), np.round(rng.exponential(2.0, n), 2))))


@pytest.mark.parametrize("seed", range(6))
def test_incremental_ttl_identical_to_the_old_computation(seed):
    rng = np.random.default_rng(seed)
    K = int(rng.choice([0, 3, 20, 100]))
    new, old = ContinuumPolicy(K=K), _OldSamples(K)
    v = FakeView()
    tools = ["ls", "cat", "pytest", None, "x"]
    durs = _durations(rng, 1500)
    checked = 0
    for i, d in enumerate(durs):
        tool = tools[int(rng.integers(0, len(tools)))]
        new.record_tool_time(tool, d)
        old.record(tool, d)
        for _ in range(2):  # two calls between samples: the old code's cached sort was reused
            asked = tools[int(rng.integers(0, len(tools)))]
            tokens = int(rng.choice([0, 1, 100, 2200, 7000, 40000, int(rng.integers(0, 100000))]))
            got = new.calc_ttl(req(tool=asked, tokens=tokens), v)
            assert got == old.ttl(asked, tokens * 0.001), (i, asked, tokens)  # exact, not approx
            checked += 1
    assert checked == 3000 and set(new.ttl_source) >= {"global", "tool"} | ({"default"} if K else set())
    for tool, s in old.samples.items():
        assert np.array_equal(new.samples[tool].values, s)
    assert np.array_equal(new.all_samples, np.sort(old.all))


def test_best_ttl_identical_to_the_old_on_odd_benefits():
    rng = np.random.default_rng(7)
    odd = [0.0, -0.0, -1.0, 1e-300, 5e-324, 1e300, float("inf"), float("-inf"), float("nan")]
    for n in (0, 1, 2, 5, 50, 2000):
        s = np.sort(_durations(rng, n))
        for b in odd + list(rng.choice(s, min(n, 20))) + list(rng.exponential(3.0, 20)):
            assert best_ttl(s, b) == _old_best_ttl(s, b), (n, b)


@pytest.mark.parametrize("cls", [PySortedSamples, SortedSamples], ids=["python", "installed"])
@pytest.mark.parametrize("seed", range(4))
def test_sorted_samples_read_at_any_time_are_the_sorted_adds(seed, cls):
    """Adds are queued and merged on read (one by insertion, several by a sort-merge):
    whatever the read pattern, values are the sorted samples, ties and repeats included."""
    rng = np.random.default_rng(seed)
    s, seen = cls(), []
    for d in _durations(rng, 3000):
        s.add(float(d))
        seen.append(float(d))
        assert len(s) == len(seen)
        if rng.random() < [0.9, 0.3, 0.05, 0.01][seed]:
            assert np.array_equal(s.values, np.sort(seen))
    assert np.array_equal(s.values, np.sort(seen)) and list(s) == sorted(seen)


# --- the compiled SortedSamples (policies/_samples.pyx) -------------------------------
def test_the_install_step_built_the_compiled_samples():
    """`pip install` builds policies/_samples.pyx (setup.py); the policies use it."""
    from policies import _samples
    assert SortedSamples is _samples.SortedSamples is not PySortedSamples


_floats = st.floats(min_value=0.0, max_value=1e6, allow_nan=False) | st.sampled_from([0.0, 0.25, 1.0, 3.0])
_benefits = st.floats(allow_nan=True) | st.sampled_from([0.0, -0.0, 5e-324, 1.0, 3.0, float("inf")])


@given(st.lists(st.lists(_floats, max_size=12), max_size=12), st.lists(_benefits, min_size=1, max_size=4))
def test_compiled_samples_give_the_reference_bit_for_bit(batches, benefits):
    """Any adds, read in batches (insertion and sort-merge): the same sorted values and
    the same Eq. 2 answer as the Python reference to the last bit (FP contraction off)."""
    fast, ref = SortedSamples(), PySortedSamples()
    for batch in batches:
        for t in batch:
            fast.add(t)
            ref.add(t)
        assert len(fast) == len(ref)
        for b in benefits:
            got, want = fast.best_ttl(b), best_ttl(ref.values, b)
            assert got == want and math.copysign(1, got) == math.copysign(1, want), (b, ref.values)
        assert np.array_equal(fast.values, ref.values)


def test_compiled_eq2_where_a_fused_multiply_add_would_differ():
    """s[r-1] = fl(fl(r/n)*b): rounded twice, as numpy does, its value is exactly 0, so
    τ = 0; a fused multiply-add keeps the product's rounding error and sees a tiny
    positive value half the time. The build turns contraction off (setup.py)."""
    rng = np.random.default_rng(11)
    for _ in range(500):
        n, b = int(rng.integers(3, 60)), float(rng.uniform(0.1, 100))
        r = int(rng.integers(1, n + 1))
        t = (float(r) / n) * b
        vals = np.array([t] * r + [2 * b + 1] * (n - r))
        fast = SortedSamples()
        for x in vals:
            fast.add(float(x))
        assert best_ttl(vals, b) == 0.0 and fast.best_ttl(b) == 0.0, (n, r, b)


@pytest.mark.parametrize("cls", [PySortedSamples, SortedSamples], ids=["python", "installed"])
def test_samples_copy_and_pickle_with_pending_adds(cls):
    s = cls()
    for t in (3.0, 1.0, 2.0):
        s.add(t)
    for c in (copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        c.add(0.5)
        assert list(c.values) == [0.5, 1.0, 2.0, 3.0] and list(s.values) == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="NaN"):
        s.add(float("nan"))
