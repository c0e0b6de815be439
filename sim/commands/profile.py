"""`sim profile`: hardware profiles without a run on the hardware.

  sim profile roofline --gpu H100 --model llama3.1-8b [--tp N | --ep N] [--gpu-memory-utilization U]
      [--max-num-batched-tokens T] [--max-num-seqs S] [--enforce-eager] [--vllm-version V] [--roofline] [--out FILE]
  sim profile fit-roofline [--measurements FILE]   (refits sim/hardware/specs/roofline_fit.json)
  sim profile check PROFILE [--probes FILE ...] [--aiconfigurator] [--json FILE]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from sim.hardware import roofline
from agentsim.bounds import COUNT_MAX, int_flag
from agentsim.files import atomic_write


def register(sub) -> None:
    p = sub.add_parser("profile", help="hardware profiles from public specs (roofline estimates)",
                       description="Profiles for GPUs and models nobody measured here, labelled as estimates.")
    ps = p.add_subparsers(dest="profile_command", required=True)
    gpus = ", ".join(roofline.spec_table("gpus.json")["gpus"])
    models = ", ".join(roofline.spec_table("models.json")["models"])
    r = ps.add_parser("roofline", help="a profile for a GPU and a model: measured kernels where shipped, else a roofline",
                      description=f"GPUs: {gpus}. Models: {models}. Step times from measured kernels (aiconfigurator's "
                                  "vLLM database, sim/hardware/specs/measured_kernels.json) where they cover the GPU, model and "
                                  "tp, else a roofline whose efficiency constants are fitted on the H100 probes; "
                                  "provenance.source says which.")
    r.add_argument("--gpu", required=True, help=f"one of {gpus}")
    r.add_argument("--model", required=True, help=f"one of {models}")
    r.add_argument("--tp", type=int_flag(1, 8), default=1, help="tensor-parallel GPUs (1-8, dividing the attention heads)")
    r.add_argument("--ep", type=int_flag(1, 8), default=1,
                   help="MoE models: expert-parallel GPUs (1-8, dividing the experts; attention data-parallel), instead of --tp")
    r.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's, in (0, 1] (default 0.9)")
    r.add_argument("--max-num-batched-tokens", type=int_flag(1, COUNT_MAX), default=None,
                   help="vLLM's token budget; sizes the profile run's activation peak (default: vLLM's for the GPU)")
    r.add_argument("--max-num-seqs", type=int_flag(1, COUNT_MAX), default=None, help="vLLM's; sizes the sampler's dummy run (default: vLLM's)")
    r.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs: vLLM then reserves no graph pool")
    r.add_argument("--kv-cache-dtype", choices=roofline.KV_CACHE_DTYPES, default="auto",
                   help="vLLM's: auto (the model's) or fp8 (1 B a KV element: twice the pool, half the KV a step reads; "
                        "measured kernels of an FP8 KV cache where shipped, else the roofline)")
    r.add_argument("--max-model-len", type=int_flag(1, COUNT_MAX), default=None,
                   help="default: the model's, capped to what the KV cache holds")
    r.add_argument("--vllm-version", type=vllm_release, default=None, metavar="MAJOR.MINOR[.PATCH]",
                   help="the engine's release (default 0.32): its start-up accounting sizes the KV pool, and its own "
                        "measured all-reduce, where aiconfigurator measured that release, prices tensor-parallel steps")
    r.add_argument("--roofline", action="store_true",
                   help="price steps by the roofline even where measured kernels exist (sim/hardware/specs/measured_kernels.json)")
    r.add_argument("--out", default=None, help="write the profile JSON here (default: print it)")
    r.add_argument("--measurements", default=str(roofline.DEFAULT_MEASUREMENTS),
                   help="H100 probe file to print the error on (default: the shipped sim/hardware/measurements/h100/...)")
    r.set_defaults(func=run_roofline)
    f = ps.add_parser("fit-roofline", help="refit the roofline efficiency constants on the H100 probes",
                      description=f"Writes {roofline.FIT_FILE.relative_to(roofline.REPO_ROOT)} (commit it).")
    f.add_argument("--measurements", default=str(roofline.DEFAULT_MEASUREMENTS))
    f.add_argument("--out", default=str(roofline.FIT_FILE))
    f.set_defaults(func=run_fit)
    c = ps.add_parser("check", help="a profile's step-time error against independent references",
                      description="Per kind (fresh prefill, cached-prefix prefill, decode by batch size, mixed): "
                                  "MAPE, signed mean error and worst point of the profile's step times (sim/hardware/profile.py) "
                                  "against probe files of its GPU and model (judged on median_s) and/or NVIDIA "
                                  "aiconfigurator's vLLM kernel database (optional extra `aiconfigurator`). "
                                  "+ means the profile prices a step slower than the reference.")
    c.add_argument("profile", help="a bundled profile name or a profile JSON path")
    c.add_argument("--probes", nargs="+", action="extend", default=[], metavar="FILE",
                   help="probe files in the shared format (sim/hardware/check.py), e.g. "
                        "sim/hardware/measurements/h100/llama3.1-8b-shape-torch-probes.json")
    c.add_argument("--aiconfigurator", action="store_true",
                   help="also against aiconfigurator's estimates for the profile's GPU and model (offline)")
    c.add_argument("--json", default=None, metavar="FILE", help="also write every point and summary here")
    c.set_defaults(func=run_check)


def _fmt(m: dict) -> str:
    names = {"fresh_prefill": "fresh prefill", "cached_prefill": "cached prefill", "decode": "decode", "all": "all"}
    return ", ".join(f"{names[k]} {m[k]:.1f}%" for k in names if k in m)


def _source(path: str) -> str:
    p = Path(path).resolve()
    try:
        return str(Path("..") / p.relative_to(roofline.REPO_ROOT.parent))
    except ValueError:
        return str(p)


def vllm_release(text: str) -> str:
    """--vllm-version: a release whose start-up accounting sim/hardware/kv_pool.py models."""
    from agentsim.errors import InputError
    from sim.hardware.kv_pool import accounting_for

    try:
        accounting_for(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e).replace("vllm_version ", "", 1)) from None
    return text


def run_roofline(args) -> int:
    profile, notes = roofline.roofline_profile(args.gpu, args.model, args.tp, args.gpu_memory_utilization, args.max_model_len,
                                             ep=args.ep, max_num_batched_tokens=args.max_num_batched_tokens,
                                             max_num_seqs=args.max_num_seqs, enforce_eager=args.enforce_eager,
                                             measured=not args.roofline, kv_cache_dtype=args.kv_cache_dtype,
                                             vllm_version=args.vllm_version)
    text = json.dumps(profile, indent=1) + "\n"
    report = sys.stdout if args.out else sys.stderr  # keep stdout pure JSON when it carries the profile
    if args.out:
        atomic_write(args.out, lambda p: Path(p).write_text(text))
        print(f"wrote {args.out}: {profile['device']}, {profile['model']['name']}", file=report)
    else:
        sys.stdout.write(text)
    for n in notes:
        print(f"note: {n}", file=report)
    src = profile["provenance"]["source"]
    check = (f"independent check: sim profile check {args.out or 'FILE'} --aiconfigurator (vLLM's kernels measured on the "
             "GPU, where its database has them; docs/profiles.md)")
    if src != "roofline":
        fe = profile["fit_error"]
        print(f"step times of {profile['device'].split(' (')[0]}: {src}; held-out MAPE against those kernels: " + ", ".join(
            f"{k.removeprefix('heldout_').replace('_', ' ')} {v:.1f}%" for k, v in fe.items() if k != "anchor"), file=report)
        if "gemm_values" in profile["provenance"]:  # then priced above those kernels on purpose
            print(f"then {profile['provenance']['gemm_values'].split(':')[0]} for trained weights (provenance.gemm_values)",
                  file=report)
        print(check, file=report)
        return 0
    own = profile["model"]["name"].startswith("meta-llama/Llama-3.1-8B") and profile["device"].startswith("NVIDIA H100") \
        and args.tp == 1 and args.ep == 1
    if not Path(args.measurements).exists():
        fit = roofline.load_fit()
        print(f"H100 measurement not available ({args.measurements}); the committed fit of {fit['date']} "
              f"had MAPE {_fmt(fit['fit_mape'])}", file=report)
        return 0
    err = roofline.h100_errors(roofline.read_measurements(args.measurements), profile["step_time"] if own else None)
    if own:
        print(f"MAPE of this profile on the H100 probes: {_fmt(err['profile'])}", file=report)
    else:
        print(f"MAPE of the same constants on the H100 probes (H100, Llama-3.1-8B shape, tp=1): {_fmt(err['constants'])}; "
              f"the only probes at hand (aiconfigurator below)", file=report)
    print(f"  for comparison, a naive roofline (weights + 2 ms, 60% MFU) on the H100 specs: {_fmt(err['handmade'])}", file=report)
    print(check, file=report)
    return 0


def run_fit(args) -> int:
    meas = roofline.read_measurements(args.measurements)
    rep = roofline.fit_report(meas, _source(args.measurements), _dt.date.today().isoformat())
    atomic_write(args.out, lambda p: Path(p).write_text(json.dumps(rep, indent=1) + "\n"))
    print(f"wrote {args.out}: " + ", ".join(f"{k}={v:.4g}" for k, v in rep["constants"].items()))
    print(f"fit MAPE {_fmt(rep['fit_mape'])}; held-out (every third probe) {_fmt(rep['heldout_mape'])}")
    if rep["at_bound"]:
        print(f"at a bound: {', '.join(rep['at_bound'])}")
    print(f"a naive roofline (weights + 2 ms, 60% MFU) on the H100 specs: {_fmt(rep['handmade_a100_method_on_h100_mape'])}")
    return 0


def run_check(args) -> int:
    from sim.hardware.profile import load_profile
    from sim.hardware.check import check, format_table

    prof = load_profile(args.profile)
    refs = check(prof, args.probes, args.aiconfigurator)
    print(f"profile {prof.name}: {prof.raw.get('device', '?')}, {prof.model.get('name', '?')}; error = "
          "(profile - reference) / reference, one step per point, unchunked")
    for ref in refs:
        print()
        print(format_table(prof, ref))
    if args.json:
        out = {"profile": prof.name, "device": prof.raw.get("device"), "model": prof.model.get("name"), "references": refs}
        atomic_write(args.json, lambda p: Path(p).write_text(json.dumps(out, indent=1) + "\n"))
        print(f"\nwrote {args.json}")
    return 0
