"""`sim calibrate`: fit a hardware profile on a real vLLM engine.

    sim calibrate --out sim/hardware/profiles/cpu-tiny-llama.json            # CPU, shipped tiny model (bf16 CPUs)
    sim calibrate --model sim/hardware/models/micro-llama --out sim/hardware/profiles/cpu-micro-llama.json
    sim calibrate --model meta-llama/Llama-3.1-8B-Instruct --device cuda --out my-gpu.json
    sim calibrate --refit sim/hardware/profiles/cpu-micro-llama.json --out sim/hardware/profiles/cpu-micro-llama.json
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from agentsim.bounds import COUNT_MAX, SEED_MAX, int_flag
from agentsim.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="profile a real vLLM engine and write a simulator profile JSON",
                       description="Time prefill (fresh and cached-prefix) and decode probes on an in-process vLLM "
                                   "engine, fit the step-time model and the paper's prefill quadratic, and write "
                                   "a profile for `sim run --profile`.")
    p.add_argument("--model", default=None,
                   help="model dir or hub name (default: the shipped sim/hardware/models/tiny-llama, or micro-llama on a CPU "
                        "without native bf16; "
                        "weights are never loaded, load_format=dummy)")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="profile file to write (atomically)")
    p.add_argument("--num-gpu-blocks", type=int_flag(1, COUNT_MAX), default=None, help="KV blocks (vLLM num_gpu_blocks_override)")
    p.add_argument("--block-size", type=int_flag(1, COUNT_MAX), default=None, help="tokens per KV block (engine default if unset)")
    p.add_argument("--max-num-batched-tokens", type=int_flag(1, COUNT_MAX), default=None, help="token budget per step")
    p.add_argument("--max-num-seqs", type=int_flag(1, COUNT_MAX), default=None, help="sequences per step")
    p.add_argument("--max-model-len", type=int_flag(1, COUNT_MAX), default=None, help="max context (default: the model's; 8192 for the tiny one)")
    p.add_argument("--quick", action="store_true", help="fewer probes (about half the time; used by the engine tests)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="engine device (default: cuda if present)")
    p.add_argument("--seed", type=int_flag(0, SEED_MAX), default=0, help="seed of the random prompt token ids")
    p.add_argument("--from-probes", default=None, metavar="FILE",
                   help="fit a kernel-timing file instead of running an engine (calibrate/measured.py), e.g. "
                        "sim/hardware/measurements/h100/llama3.1-8b-shape-torch-probes.json")
    p.add_argument("--refit", default=None, metavar="PROFILE.json",
                   help="re-derive a profile written by `sim calibrate` from its stored probe repeats under the "
                        "current rule (median of repeats), without an engine; --out may be the same file")
    p.add_argument("--backend", default="vllm", choices=("vllm", "torch"),
                   help="vllm: time a real vLLM engine (default); torch: time the same steps on a pure-torch "
                        "Llama-family forward pass with random weights (calibrate/torch_backend.py; no vLLM needed, "
                        "engine limits computed as vLLM 0.32 would)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="fraction of GPU memory for weights + KV cache (CUDA only; default 0.9, vLLM's)")
    p.set_defaults(func=_run)

    v = sub.add_parser("validate", help="replay a trace on a real vLLM and in the simulator, and compare JCT",
                       description="Run each policy inside a real vLLM (sim/vllm_replica/scheduler.py through "
                                   "scheduler_cls) and in the simulator on the same trace, arrivals and engine "
                                   "limits; print mean/p90 JCT, per-program JCT MAPE, cache hit ratios and whether "
                                   "the policies rank the same; write report.{md,json} and a plot to --out.")
    v.add_argument("--shape", default=None, metavar="NAME[,NAME]",
                   help="run the built-in workload shapes (calibrate/validate.py SHAPES: swebench, bfcl) instead of "
                        "--trace and its cut options; writes DIR/<shape>/ and a report over all shapes")
    v.add_argument("--server-run", default=None, metavar="RESULT.json",
                   help="judge --profile on your own vLLM server run instead: a `vllm bench serve --save-result "
                        "--save-detailed` result; its requests are replayed with their arrivals and token counts and the "
                        "simulator's TTFT/TPOT/ITL/E2EL errors printed (calibrate/server_run.py); no engine is started")
    v.add_argument("--json", default=None, metavar="FILE", help="with --server-run: also write the comparison as JSON")
    v.add_argument("--trace", default=None, help="bundled trace name or parquet path (default swebench)")
    v.add_argument("--policy", default="vllm,continuum",
                   help="comma-separated policies, or 'all' (every policy that runs inside vLLM); default vllm,continuum")
    v.add_argument("--repeats", type=int_flag(1, COUNT_MAX), default=1, help="real runs per policy, for the run-to-run spread (default 1)")
    v.add_argument("--merge", action="store_true",
                   help="with --shape: run only --policy and keep the other policies' rows of DIR/<shape>/report.json "
                        "(rankings recomputed over all; give the --profile those rows were judged on)")
    v.add_argument("--policy-arg", action="append", default=[], metavar="K=V",
                   help="policy parameter (repeatable), given to each listed policy that has it, on both sides")
    v.add_argument("--profile", default=None, help="profile name or JSON (a CPU profile's engine runs the dtype it was measured "
                                                   "in); default: calibrate the engine first (quick)")
    v.add_argument("--out", default=None, metavar="DIR",
                   help="report folder (report.md, report.json, plot, profile); required unless --server-run")
    v.add_argument("--jps", type=float, default=2.0, help="program arrivals per second, seeded Poisson (default 2.0)")
    v.add_argument("--seed", type=int_flag(0, SEED_MAX), default=0, help="seed of arrivals and prompt token ids")
    v.add_argument("--programs", type=int_flag(1, COUNT_MAX), default=16, help="first N programs of the trace (default 16)")
    v.add_argument("--max-turns", type=int_flag(1, COUNT_MAX), default=5, help="turns kept per program (default 5)")
    v.add_argument("--max-context", type=int_flag(1, COUNT_MAX), default=3000,
                   help="scale each program's new input so its final context fits (default 3000 tokens)")
    v.add_argument("--max-output", type=int_flag(1, COUNT_MAX), default=24, help="cap on output tokens per call (default 24)")
    v.add_argument("--max-tool-s", type=float, default=2.0, help="cap on tool time, s (default 2.0)")
    v.add_argument("--num-gpu-blocks", type=int_flag(1, COUNT_MAX), default=48,
                   help="KV blocks of the engine: small, so that memory pressure is real (default 48)")
    v.add_argument("--max-model-len", type=int_flag(1, COUNT_MAX), default=4096, help="max context of the engine (default 4096)")
    v.add_argument("--model", default=None, help="model dir (default: the shipped tiny Llama config)")
    v.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="engine device (default cpu)")
    v.add_argument("--sampling", default=None, choices=("greedy", "random", "top-p"),
                   help="how every call samples, on the engine (temperature 0.6, top-p 0.9) and in the simulator (the "
                        "profile's `sampler` section; a calibration measures one); default greedy")
    v.set_defaults(func=_validate)  # with --server-run, the flags that drive an engine are refused (agentsim/requires.py)


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
        f"prefill quadratic {fe['prefill_quadratic_mape']:.1f}%"
        + (f"; repeats differ by {fe['repeat_noise_pct']:.1f}% (median)" if "repeat_noise_pct" in fe else ""),
        f"pcie: {'%s GB/s' % profile['pcie']['bandwidth_GBps'] if profile['pcie']['measured'] else 'not measured (no CUDA)'}",
    ])


def _warn_if_noisy(profile: dict) -> None:
    from calibrate.probes import noise_warning

    line = noise_warning(profile["fit_error"])
    if line:
        print(line, file=sys.stderr)


def _run(args) -> int:
    out = Path(args.out)
    if out.suffix != ".json":
        raise InputError(f"--out {args.out!r} must end in .json")
    if out.exists() and out.is_dir():
        raise InputError(f"--out {args.out!r} is a directory; give a file name ending in .json")
    if args.from_probes:
        return _from_probes(args, out)
    if args.refit:
        return _refit(args, out)
    from calibrate.run import run_calibration

    t0 = time.perf_counter()
    limits = {k: getattr(args, k) for k in ("num_gpu_blocks", "block_size", "max_num_batched_tokens",
                                            "max_num_seqs", "max_model_len")}
    if args.backend == "torch":
        from calibrate.torch_backend import calibrate_torch

        profile = calibrate_torch(args.model, out, args.device, args.quick, seed=args.seed,
                                  gpu_memory_utilization=args.gpu_memory_utilization or 0.9, **limits)
    else:
        if args.gpu_memory_utilization is not None:
            limits["gpu_memory_utilization"] = args.gpu_memory_utilization
        profile = run_calibration(args.model, out, args.device, args.quick, seed=args.seed, **limits)
    print(_summary(profile))
    _warn_if_noisy(profile)
    if "heldout_mape_mixed" in profile["fit_error"]:
        print(f"held-out MAPE of mixed prefill + decode steps: {profile['fit_error']['heldout_mape_mixed']:.1f}%")
    if "eager_steps" in profile["provenance"]:
        print("eager steps: " + ", ".join(f"{k} {v}" for k, v in profile["provenance"]["eager_steps"].items()))
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s total "
          f"(engine start {profile['provenance']['engine_start_s']:.1f} s)")
    return 0


def _from_probes(args, out: Path) -> int:
    from calibrate.measured import build_measured_profile
    from calibrate.run import write_profile

    profile = build_measured_profile(args.from_probes,
                                     gpu_memory_utilization=getattr(args, "gpu_memory_utilization", None) or 0.9)
    write_profile(profile, out)
    print(_summary(profile))
    lin = profile["fit_error"]["linear_step_model"]
    print(f"linear model c0..c5 on the same probes, held-out MAPE: prefill {lin['heldout_mape_prefill']:.1f}%, "
          f"cached {lin['heldout_mape_cached_prefill']:.1f}%, decode {lin['heldout_mape_decode']:.1f}%")
    print(f"wrote {out} from {args.from_probes} ({profile['provenance']['source']})")
    return 0


def _refit(args, out: Path) -> int:
    import json

    from calibrate.run import refit_profile, write_profile

    try:
        raw = json.loads(Path(args.refit).read_text())
        probes = raw["probes"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"--refit {args.refit}: not a readable profile JSON with probes ({type(err).__name__}: {err})") from None
    if not probes or not all(isinstance(r, dict) and len(r.get("samples") or ()) >= 1 for r in probes):
        raise InputError(f"--refit {args.refit}: its probes carry no repeats ('samples'); only profiles written by "
                         "`sim calibrate` on an engine can be refitted")
    try:
        profile = refit_profile(raw)
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"--refit {args.refit}: malformed profile ({type(err).__name__}: {err})") from None
    write_profile(profile, out)
    print(_summary(profile))
    _warn_if_noisy(profile)
    print(f"wrote {out}: {args.refit} refitted on the median of each probe's repeats")
    return 0


def _validate(args) -> int:
    from calibrate.validate import RUNNABLE, fit_trace, render_markdown, run_matrix, run_validation
    from policies.base import PolicyError
    from policies.registry import policy_params
    from sim.commands.run import parse_kv
    from sim.run.simulate import arrivals_for
    from traces.schema import read_trace

    if args.server_run:
        return _server_run(args)
    if args.out is None:
        raise InputError("sim validate needs --out DIR (the report folder), or --server-run RESULT.json")
    if args.trace is None:
        args.trace = "swebench"
    policies = list(RUNNABLE) if args.policy.strip() == "all" else [p.strip() for p in args.policy.split(",") if p.strip()]
    if args.shape:
        run_matrix([s.strip() for s in args.shape.split(",")], policies, args.repeats, args.out, args.profile,
                   args.seed, args.model, args.device, merge=args.merge, sampling=args.sampling)
        print((Path(args.out) / "report.md").read_text())
        print(f"report: {Path(args.out) / 'report.md'} (+ report.json, mean_jct_sim_vs_real.png, one folder per shape)")
        return 0
    trace, _ = read_trace(args.trace)
    trace = fit_trace(trace, args.programs, args.max_turns, args.max_context, args.max_output, args.max_tool_s)
    given = parse_kv(args.policy_arg)
    per_policy = {p: {k: v for k, v in given.items() if k in policy_params(p)} for p in policies}
    unused = set(given) - {k for a in per_policy.values() for k in a}
    if unused:
        raise PolicyError(f"--policy-arg {', '.join(sorted(unused))}: none of {', '.join(policies)} has that parameter")
    rep = run_validation(trace, policies, arrivals_for(trace, args.jps, args.seed), args.profile, args.out, args.seed,
                         args.model, args.device, policy_args=per_policy, repeats=args.repeats,
                         num_gpu_blocks=args.num_gpu_blocks, max_model_len=args.max_model_len, sampling=args.sampling)
    print(render_markdown(rep))
    print(f"report: {Path(args.out) / 'report.md'} (+ report.json, jct_sim_vs_real.png)")
    return 0


def _server_run(args) -> int:
    import json

    from calibrate.server_run import render, validate_server_run
    from agentsim.files import atomic_write

    rep = validate_server_run(args.server_run, args.profile)
    print(render(rep["rows"], f"{rep['requests']} requests of {rep['model_id']} ({rep['failed_left_out']} failed, left out) "
                              f"over {rep['span_s']:.1f} s, replayed on profile {rep['profile']}; error = (sim - real) / "
                              f"real, unscaled; the simulator's metrics at the {rep['view']}"))
    if args.json:
        atomic_write(Path(args.json), lambda p: Path(p).write_text(json.dumps(rep, indent=2) + "\n"))
        print(f"wrote {args.json}")
    return 0
