"""The KV pool sim/hardware/kv_pool.py derives against vLLM's own start-up figures from public logs
(benchmarks/data/vllm_kv_pool_cases.json: each case's source, version, GPU, settings).

    python benchmarks/kv_pool_table.py [--cases FILE] [--write-docs [PAGE]]

--write-docs puts the table into docs/reference/profiles.md (or PAGE) in place of its block
`<!-- kv_pool_table: --cases ./benchmarks/data/vllm_kv_pool_cases.json -->` ...
`<!-- end kv_pool_table -->` (benchmarks/docs_tables.py redoes it by its marker).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402

from agentsim.errors import InputError  # noqa: E402
from sim.hardware import roofline  # noqa: E402
from sim.hardware.kv_pool import GiB, accounting_for, kv_pool  # noqa: E402

CASES = Path(__file__).resolve().parent / "data" / "vllm_kv_pool_cases.json"
KEY = "--cases ./benchmarks/data/vllm_kv_pool_cases.json"
TOLERANCE = 0.03  # the target: within 3% of vLLM's figure


def load(path: str | Path = CASES) -> dict:
    return json.loads(Path(path).read_text())


def model_of(data: dict, name: str) -> dict:
    return data["models"][name] if name in data.get("models", {}) else roofline.find_model(name)[1]


def version_of(case: dict) -> str:
    """MAJOR.MINOR[.PATCH] of the case ("about 0.9.2-0.10.0 (V1)" -> the lower bound)."""
    words = case["vllm_version"].split()
    return (words[1] if words[0] == "about" else words[0]).split("-")[0]


def ours(data: dict, case: dict):
    """(our figure in the case's unit, the KVPool); (None, None) for a version whose
    accounting is not modelled (V0 releases outside V0_RULES, 0.9.0)."""
    version = version_of(case)
    try:
        accounting_for(version)
    except InputError:
        return None, None
    pool = kv_pool(case["gpu_memory_bytes"], model_of(data, case["model"]), tp=case["tp"], ep=case.get("ep", 1),
                   num_sms=case["gpu_sms"],
                   gpu_memory_utilization=case["gpu_memory_utilization"],
                   max_num_batched_tokens=case["max_num_batched_tokens"], max_num_seqs=case["max_num_seqs"],
                   enforce_eager=case["enforce_eager"], block_size=case.get("block_size", 16),
                   kv_dtype_bytes=case.get("kv_dtype_bytes"), vllm_version=version, p2p=case.get("p2p", True),
                   sampler=case.get("sampler"),
                   # a non-torch figure the case's log prints (vLLM's own measurement, an input to its sizing)
                   non_torch_bytes=case["non_torch_gib"] * GiB if "non_torch_gib" in case else None)
    kind = case["figure"]["kind"]
    got = pool.tokens if kind == "tokens" else pool.blocks if kind == "blocks" else round(pool.available_bytes / GiB, 2)
    return got, pool


def rows(data: dict) -> list[dict]:
    out = []
    for c in data["cases"]:
        got, pool = ours(data, c)
        want = c["figure"]["value"]
        out.append({"case": c, "ours": got, "vllm": want, "error": None if got is None else got / want - 1, "pool": pool})
    return out


def table(data: dict) -> str:
    rs = rows(data)
    within = sum(r["error"] is not None and abs(r["error"]) <= TOLERANCE for r in rs)
    lines = ["Ours: blocks = (ceil(total x utilization) - weights - activation - non-torch - graph estimate) // block bytes, "
             "per GPU, by the case's vLLM version's rules (sim/hardware/kv_pool.py accounting_for); weights = parameters + the "
             "rotary cos/sin cache + what PyTorch's caching allocator keeps (a block keeps a remainder of 1 MiB or less), as vLLM's "
             "'Model loading took' reports them; activation = what the "
             "profile run keeps (MoE workspaces; the top-k/top-p buffer from 0.17) + the larger of one forward of the token "
             "budget and the sampler over min(max_num_seqs, budget) rows; non-torch 0.25 GiB at TP1, 2.10 with TP (graph capture "
             "in the profiling window: 0.18 to 0.26, not eager; H100 logs of vLLM 0.19), else 0.13 and 0.55 (vLLM 0.11.0 "
             "logs), the TP1 figure without P2P; sampler bytes a logit by the top-k/top-p path the log names or the "
             "version's default (14 Triton or FlashInfer, 38 sort); graph estimate from 0.21 (none eager) as "
             "profile_cudagraph_memory sums it over vLLM's default capture sizes: first capture + (graphs - 1) x per-graph "
             "bytes a layer, per mode, the per-capture bytes the medians of vLLM 0.19's own profiles "
             "(benchmarks/data/vllm_cudagraph_profile.json; 0.19 does not subtract them); the constants' logs are of "
             "runs not judged here, or judged by rules that do not use them. The V0 engine's releases by their own rules "
             "(V0_RULES): 0.2.4 torch's peak only; 0.2.5 everything used on the device after the run (the CUDA context "
             "0.51 GiB, 0.19's TP1 init snapshot; with TP distributed init's buffers and the all-reduce inputs held on NCCL's "
             "stream); 0.6.4 the peak plus every non-torch byte; 0.7.x growth from a snapshot before distributed init; the "
             "non-torch figure a case's log prints taken as vLLM's measured input; rank 0, which samples, is the smallest. "
             "Not modelled: other V0 releases, MLA, hybrid and sliding-window KV groups, speculative decoding, LoRA, multimodal "
             "encoders, KV connectors, pipeline parallelism.", "",
             f"vLLM's start-up figure against it ({within} of {len(rs)} within {TOLERANCE:.0%}; "
             "`python benchmarks/kv_pool_table.py`, cases and sources in benchmarks/data/vllm_kv_pool_cases.json):", "",
             "| case | vLLM | GPU x TP | util | budget / seqs | unit | vLLM's | ours | error | why off |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        c = r["case"]
        gpu = c["gpu"].split(" x")[0]
        fmt = ",.2f" if c["figure"]["kind"] == "GiB" else ","
        url = c["source"].split()[0]
        name = f"[{c['id']}]({url})" if url.startswith("https://") else c["id"]  # a source without an address: named in the note
        lines.append(f"| {name} | {c['vllm_version'].split(' (')[0]} | {gpu} x{c['tp']} "
                     f"| {c['gpu_memory_utilization']} | {c['max_num_batched_tokens']} / {c['max_num_seqs']} "
                     f"| {c['figure']['kind']} | {format(r['vllm'], fmt)} | {'not modelled' if r['ours'] is None else format(r['ours'], fmt)} "
                     f"| {'-' if r['error'] is None else format(r['error'], '+.1%')} | {c.get('note', '')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=str(CASES), help="the cases file (default benchmarks/data/vllm_kv_pool_cases.json)")
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "profiles.md"), default=None, metavar="PAGE",
                    help="also replace the table in PAGE (default docs/reference/profiles.md)")
    a = ap.parse_args(argv)
    data = load(a.cases)
    body = table(data)
    print(body)
    for r in rows(data):
        p = r["pool"]
        if p is None:
            print(f"  {r['case']['id']}: vLLM {version_of(r['case'])}'s accounting is not modelled", file=sys.stderr)
            continue
        print(f"  {r['case']['id']}: weights {p.weights_bytes / GiB:.2f} GiB, activation {p.activation_bytes / GiB:.2f} "
              f"(forward {p.forward_peak_bytes / GiB:.2f}, sampler {p.sampler_peak_bytes / GiB:.2f}), non-torch "
              f"{p.non_torch_bytes / GiB:.2f}, graphs {p.cudagraph_bytes / GiB:.2f}, KV {p.available_bytes / GiB:.2f} GiB",
              file=sys.stderr)
    if a.write_docs:
        write_block(a.write_docs, "kv_pool_table", KEY, body)
        print(f"wrote {a.write_docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
