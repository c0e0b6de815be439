"""`sim calibrate`: fit a hardware profile on a real vLLM engine.

    sim calibrate --out sim/profiles/cpu-tiny-llama.json            # CPU, shipped tiny model
    sim calibrate --model meta-llama/Llama-3.1-8B-Instruct --device cuda --out my-gpu.json
"""
from __future__ import annotations

import time
from pathlib import Path

from traces.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="profile a real vLLM engine and write a simulator profile JSON",
                       description="Time prefill (fresh and cached-prefix) and decode probes on an in-process vLLM "
                                   "engine, fit the step-time model and the paper's prefill quadratic, and write "
                                   "a profile for `sim run --profile`.")
    p.add_argument("--model", default=None,
                   help="model dir or hub name (default: the shipped tiny config calibrate/models/tiny-llama; "
                        "weights are never loaded, load_format=dummy)")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="profile file to write (atomically)")
    p.add_argument("--num-gpu-blocks", type=int, default=None, help="KV blocks (vLLM num_gpu_blocks_override)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block (engine default if unset)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step")
    p.add_argument("--max-num-seqs", type=int, default=None, help="sequences per step")
    p.add_argument("--max-model-len", type=int, default=None, help="max context (default: the model's; 8192 for the tiny one)")
    p.add_argument("--quick", action="store_true", help="fewer probes (about half the time; used by the engine tests)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="engine device (default: cuda if present)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt token ids")
    p.set_defaults(func=_run)


def _summary(profile: dict) -> str:
    st, q, fe, eng = profile["step_time"], profile["prefill_quadratic"], profile["fit_error"], profile["engine"]
    coefs = ", ".join(f"{k}={v:.4g}" for k, v in st.items())
    return "\n".join([
        f"engine: {eng['num_gpu_blocks']} KV blocks x {eng['block_size']} tokens, max_num_batched_tokens="
        f"{eng['max_num_batched_tokens']}, max_num_seqs={eng['max_num_seqs']}, max_model_len={eng['max_model_len']}, "
        f"chunked prefill={eng['enable_chunked_prefill']}",
        f"step model: {coefs}",
        f"prefill quadratic: a={q['a']:.4g} s, b={q['b']:.4g} s/token, c={q['c']:.4g} s/token^2",
        f"held-out MAPE: step model {fe['step_model_mape']:.1f}% (prefill {fe.get('heldout_mape_prefill', float('nan')):.1f}%, "
        f"cached {fe.get('heldout_mape_cached_prefill', float('nan')):.1f}%, decode {fe.get('heldout_mape_decode', float('nan')):.1f}%), "
        f"prefill quadratic {fe['prefill_quadratic_mape']:.1f}%",
        f"pcie: {'%s GB/s' % profile['pcie']['bandwidth_GBps'] if profile['pcie']['measured'] else 'not measured (no CUDA)'}",
    ])


def _run(args) -> int:
    out = Path(args.out)
    if out.suffix != ".json":
        raise InputError(f"--out {args.out!r} must end in .json")
    if out.exists() and out.is_dir():
        raise InputError(f"--out {args.out!r} is a directory; give a file name ending in .json")
    from calibrate.run import run_calibration

    t0 = time.perf_counter()
    limits = {k: getattr(args, k) for k in ("num_gpu_blocks", "block_size", "max_num_batched_tokens",
                                            "max_num_seqs", "max_model_len")}
    profile = run_calibration(args.model, out, args.device, args.quick, seed=args.seed, **limits)
    print(_summary(profile))
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s total "
          f"(engine start {profile['provenance']['engine_start_s']:.1f} s)")
    return 0
