"""The tables of docs/reference/profiles.md on the roofline zoo: what the H100 profiles of its MoE,
FP8 and sliding-window models hold (weights and KV per GPU, pool, decode and prefill step
times as the simulator prices them); Qwen3-30B-A3B's roofline on four GPUs against
aiconfigurator's kernel database (the one of those models it ships); and rooflines on five
GPUs at one and more GPUs per replica against the same database. The last
two need the optional extra `pip install -e '.[aiconfigurator]'`.

    python benchmarks/roofline_zoo_table.py [--table holds|aiconfigurator|tp] [--write-docs [PAGE]]

--table picks one table (default all); --write-docs puts each table printed into
docs/reference/profiles.md (or PAGE) in place of its block `<!-- roofline_zoo_table: --table NAME -->`
... `<!-- end roofline_zoo_table -->` (benchmarks/docs_tables.py redoes each by its marker).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: the repository root, for `benchmarks.`
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402

from agentsim.errors import InputError  # noqa: E402
from sim.hardware import check as pc  # noqa: E402
from sim.hardware import model_shape  # noqa: E402
from sim.hardware import roofline  # noqa: E402
from sim.hardware.profile import parse_profile  # noqa: E402

# (how the table names it, model, tp, ep)
ZOO = (("glm-4.5-fp8, `--tp 8`", "glm-4.5-fp8", 8, 1), ("glm-4.5-fp8, `--ep 8`", "glm-4.5-fp8", 1, 8),
       ("qwen3-30b-a3b", "qwen3-30b-a3b", 1, 1), ("gemma-3-12b", "gemma-3-12b", 1, 1))
AIC_GPUS = ("H100", "H200", "B200", "A100-80GB")
DENSE_GPUS = (*AIC_GPUS, "L40S")
ALL_AT_TP = (("llama3.1-8b", 1), ("llama3.1-8b", 4), ("qwen3-32b", 1), ("qwen3-32b", 4), ("llama3.1-70b", 4),
             ("llama3.1-70b", 8), ("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 4), ("qwen3-32b-fp8", 1),
             ("qwen3-30b-a3b-fp8", 1))
KINDS = ("fresh prefill", "cached prefill", "decode B=1", "decode B=2-16", "decode B=17-64", "decode B=65-256", "mixed")
CTX = 8192  # decode steps over 8K contexts


def _tokens(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def holds() -> str:
    lines = ["What these profiles hold on an H100 (KV pool in tokens; decode steps over 8K contexts; "
             "`python benchmarks/roofline_zoo_table.py`):", "",
             "| profile | weights / GPU | KV per token (per GPU) | pool | decode B=1 / 16 / 32 / 128 | 8K prefill |",
             "|---|---|---|---|---|---|"]
    for label, model, tp, ep in ZOO:
        raw, _ = roofline.roofline_profile("H100", model, tp, ep=ep)
        p = parse_profile(raw, model)
        m = roofline.find_model(model)[1]
        layout, n = ("ep", ep) if ep > 1 else ("tp", tp)
        weights = model_shape.per_gpu(m, model_shape.weight_bytes_total(m), layout, n)
        kv_tok = raw["kv_bytes_per_block"] / p.block_size
        pool = p.engine.num_gpu_blocks * p.block_size
        dec = " / ".join(f"{p.step_time(b, b, float(b * CTX), float(b * CTX)) * 1e3:.1f}" for b in (1, 16, 32, 128))
        lines.append(f"| {label} | {weights / 1e9:.1f} GB | {kv_tok:,.0f} B | {_tokens(pool)}"
                     + (f" ({_tokens(pool / ep)} per GPU)" if ep > 1 else "")
                     + f" | {dec} ms | {p.prefill_time(8192) * 1e3:.0f} ms |")
    return "\n".join(lines)


def aiconfigurator() -> str:
    refs = []
    for g in AIC_GPUS:
        raw, _ = roofline.roofline_profile(g, "qwen3-30b-a3b")
        refs.append(pc.aiconfigurator_reference(parse_profile(raw, f"qwen3-30b-a3b-{g}")))
    lines = [f"Qwen3-30B-A3B's roofline against aiconfigurator ({refs[0]['package']}, vLLM kernels), MAPE "
             "(signed mean), by `python benchmarks/roofline_zoo_table.py`:", "",
             "| kind (points) | " + " | ".join(AIC_GPUS) + " |", "|" + "---|" * (len(AIC_GPUS) + 1)]
    by = [{s["kind"]: s for s in r["summary"]} for r in refs]
    for k in (*KINDS, "all"):
        lines.append(f"| {k} ({by[0][k]['points']}) | "
                     + " | ".join(f"{b[k]['mape_pct']:.1f}% ({b[k]['mean_error_pct']:+.1f}%)" for b in by) + " |")
    return "\n".join(lines)


def at_tp() -> str:
    """Per (model, tp) and GPU: MAPE and signed mean over all of aiconfigurator's points."""
    lines = ["Rooflines against aiconfigurator at one and more GPUs per replica (same grid, all points: MAPE "
             "(signed mean); each at the profile's tp), by `python benchmarks/roofline_zoo_table.py`:", "",
             "| model, tp | " + " | ".join(DENSE_GPUS) + " |", "|" + "---|" * (len(DENSE_GPUS) + 1)]
    for model, tp in ALL_AT_TP:
        cells = []
        for g in DENSE_GPUS:
            try:
                raw, _ = roofline.roofline_profile(g, model, tp)
            except InputError:
                cells.append("does not fit")
                continue
            try:
                ref = pc.aiconfigurator_reference(parse_profile(raw, f"{model}-{g}-tp{tp}"))
            except InputError:  # e.g. no FP8 kernel data for a GPU without FP8
                cells.append("no data")
                continue
            a = {s["kind"]: s for s in ref["summary"]}["all"]
            cells.append(f"{a['mape_pct']:.0f}% ({a['mean_error_pct']:+.0f}%)")
        lines.append(f"| {model}, tp {tp} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", choices=("holds", "aiconfigurator", "tp"), default=None, help="one table (default all)")
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "profiles.md"), default=None, metavar="PAGE",
                    help="also replace the tables in PAGE (default docs/reference/profiles.md)")
    a = ap.parse_args(argv)
    names = [a.table] if a.table else ["holds", "aiconfigurator", "tp"]
    tables = {"holds": holds()} if "holds" in names else {}
    if set(names) - {"holds"}:
        try:
            pc._aic()
        except InputError as e:
            if a.write_docs or a.table:
                raise SystemExit(f"error: the aiconfigurator tables need the optional extra: {e}")
            print(f"note: no aiconfigurator tables ({e})", file=sys.stderr)
        else:
            tables.update({n: {"aiconfigurator": aiconfigurator, "tp": at_tp}[n]() for n in names if n != "holds"})
    print("\n\n".join(tables.values()))
    if a.write_docs:
        for key, body in tables.items():
            write_block(a.write_docs, "roofline_zoo_table", f"--table {key}", body)
        print(f"wrote {a.write_docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
