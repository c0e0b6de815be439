"""vLLM's sampler a step, per sampling mode, timed on this machine: the `sampler` section of a
profile (sim/hardware/profile.py). `sim calibrate` measures it beside its step probes (greedy);
benchmarks/sampler_time.py measures it on its own and beside the CPU engine's decode step.

Each mode is timed over fp32 logits of the vocabulary's width at several row counts (one row a
request a step schedules) and fitted as step_s + per_row_s * rows:
- impl "vllm": vLLM's own Sampler (the installed release) on a SamplingMetadata of that mode;
- impl "torch" (a GPU without vLLM): the native path re-written in torch: fp32 copy, argmax;
  temperature, softmax, exponential draw, argmax; top-p as sort, softmax, cumsum, mask, scatter
  back, then the draw. It stands for vLLM up to 0.16 (and later releases' native fallback), not
  the Triton or FlashInfer kernels later releases run on CUDA.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

# sim/hardware/profile.py's (not imported: a GPU machine measuring this may lack pydantic)
SAMPLING_MODES = ("greedy", "random", "top-p")
TEMPERATURE, TOP_P = 0.6, 0.9  # Llama-3.1-8B-Instruct's generation_config.json
# each mode as vLLM's SamplingParams (the real-engine replays and the engine check)
PARAMS = {"greedy": {"temperature": 0.0}, "random": {"temperature": TEMPERATURE},
          "top-p": {"temperature": TEMPERATURE, "top_p": TOP_P}}


def _torch_sampler(mode: str):
    """The native path in torch (see the module docstring): logits (rows, vocab), bf16 -> token ids."""
    import torch

    def draw(logits):
        probs = logits.softmax(dim=-1)
        q = torch.empty_like(probs).exponential_()
        return probs.div_(q).argmax(dim=-1)

    def greedy(logits):
        return logits.float().argmax(dim=-1)

    def random(logits):
        return draw(logits.float().div_(TEMPERATURE))

    def top_p(logits):
        x = logits.float().div_(TEMPERATURE)
        srt, idx = x.sort(dim=-1)
        cum = srt.softmax(dim=-1).cumsum_(dim=-1)
        drop = cum <= 1 - TOP_P
        drop[:, -1] = False
        srt.masked_fill_(drop, -float("inf"))
        return draw(x.scatter_(-1, idx, srt))

    return {"greedy": greedy, "random": random, "top-p": top_p}[mode]


def _vllm_sampler(mode: str, rows: int, device: str):
    """vLLM's own Sampler and a SamplingMetadata of `rows` requests in `mode`."""
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    zeros = torch.zeros(rows, device=device)
    meta = SamplingMetadata(
        temperature=None if mode == "greedy" else torch.full((rows,), TEMPERATURE, device=device),
        all_greedy=mode == "greedy", all_random=mode != "greedy",
        top_p=torch.full((rows,), TOP_P, device=device) if mode == "top-p" else None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=zeros,
        presence_penalties=zeros, repetition_penalties=torch.ones(rows, device=device), output_token_ids=[[] for _ in range(rows)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    sampler = Sampler()
    return lambda logits: sampler(logits, meta).sampled_token_ids


def time_mode(mode: str, rows: int, vocab: int, device: str, impl: str, repeats: int) -> float:
    """Median seconds of one sampler call over `rows` x `vocab` logits (fresh logits each call)."""
    import torch

    fn = _vllm_sampler(mode, rows, device) if impl == "vllm" else _torch_sampler(mode)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    src = torch.randn(rows, vocab, device=device, dtype=dtype) * 3
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ts = []
    for i in range(repeats + 3):
        x = src.clone()
        sync()
        t0 = time.perf_counter()
        fn(x)
        sync()
        if i >= 3:
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def fit(points: list[tuple[int, float]]) -> dict:
    """step_s + per_row_s * rows, least squares (both kept >= 0)."""
    r = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    a, b = np.linalg.lstsq(np.c_[np.ones_like(r), r], t, rcond=None)[0]
    if b < 0:
        a, b = float(t.mean()), 0.0
    if a < 0:
        a, b = 0.0, float((r @ t) / (r @ r))
    return {"step_s": float(f"{a:.4g}"), "per_row_s": float(f"{b:.4g}"),
            "points": [[int(n), float(f"{s:.4g}")] for n, s in points]}


def measure(vocab: int, rows: list[int], device: str, impl: str, repeats: int) -> dict:
    """{mode: fit} over `rows`; vLLM's on CPU in one torch thread, as the CPU engine serves."""
    import torch

    threads = torch.get_num_threads()
    if device == "cpu" and impl == "vllm":
        torch.set_num_threads(1)
    try:
        return {m: fit([(n, time_mode(m, n, vocab, device, impl, repeats)) for n in rows]) for m in SAMPLING_MODES}
    finally:
        torch.set_num_threads(threads)


def rows_for(max_seqs: int, device: str, quick: bool) -> list[int]:
    """The row counts a calibration times: up to max_seqs, more of them on a GPU."""
    grid = (1, 8, 32) if quick else (1, 8, 16, 32, 64) if device == "cpu" else (1, 8, 16, 32, 64, 128, 256)
    rows = sorted({min(n, max_seqs) for n in grid})
    return rows if len(rows) > 1 else [1, max(2, max_seqs)]


def section(modes: dict, vocab: int, device: str, machine: str, impl: str, rows: list[int], repeats: int,
            how: str = "benchmarks/sampler_time.py") -> dict:
    """The profile's `sampler` section: the steps of a profile measured on vLLM hold greedy
    sampling (its probes run greedy), the torch re-write stands for step times without one."""
    if impl == "vllm":
        import vllm

        what = path = f"vLLM {vllm.__version__}'s own Sampler"
    else:
        what, path = "the native path re-written in torch", "sort (vLLM's native path: CUDA up to 0.16, the CPU engine)"
    return {"in_steps": "greedy" if impl == "vllm" else "none", "vocab_size": vocab,
            "modes": modes, "top_p_path": path, "device": machine,
            "measured": (f"{how} --device {device} --impl {impl} --rows {','.join(map(str, rows))} "
                         f"--repeats {repeats}: {what}, temperature {TEMPERATURE}, top-p {TOP_P}, "
                         f"{time.strftime('%Y-%m-%d')}")}
