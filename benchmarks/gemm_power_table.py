"""The table of a benchmarks/gpu/gemm_power.py record: a GEMM's time by its weights' values and its duty.

    python benchmarks/gemm_power_table.py --record FILE [--write-docs [PAGE]]

aiconfigurator's vLLM GEMM table (the measured kernels the `measured-kernels` profiles are
fitted to) times linear layers whose weights are never loaded (`torch.empty` on fresh device
memory: zeros) in short CUDA-graph replays. A compute-bound GEMM's switching power, so its
clock under the power limit, depends on the values it multiplies and on how long it runs.
This prints, per GEMM, row count and weight fill, the throughput in each regime (the
collector's short replays; a sustained run; 50% duty bursts) with the clock nvidia-smi read,
and each against the collector's own setting (empty weights, short replays). With --write-docs
the table goes into docs/reference/validation.md (or PAGE).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402
from agentsim.files import read_json  # noqa: E402
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402
from sim.hardware import measured_kernels as mk  # noqa: E402

PAGE = DOCS / "reference" / "validation.md"
MODES = (("collector", "short replays"), ("sustained", "sustained"), ("bursts_50pct", "50% duty bursts"))


def read(path: str) -> dict:
    rec = read_json(path, "--record")
    if not isinstance(rec, dict) or not rec.get("rows") or not all("collector" in r for r in rec["rows"]):
        raise InputError(f"--record {path}: not a benchmarks/gpu/gemm_power.py record (no rows of timed cases)")
    return rec


def _clock(c: dict | None) -> str:
    return "" if not c else f" ({c['sm_clock_mhz_median']:.0f} MHz, {c['power_w_median']:.0f} W)"


def label(dtype: str, fill: str) -> str:
    """A row's weights: its fill, with its dtype where that is not bf16."""
    return fill if dtype == "bf16" else f"{dtype} {fill}"


def ratios(rec: dict) -> dict:
    """Per regime and weights, the (min, max) over compute-bound cases of time / the collector's time with
    empty weights of the same dtype for the same GEMM and m (measured_kernels.gemm_value_ratios: the ratios
    the profiles' factor is the median of)."""
    return {(mode, label(*k)): (min(v), max(v)) for mode, _ in MODES for k, v in mk.gemm_value_ratios(rec["rows"], mode).items()}


def table(rec: dict, cmd: str) -> str:
    q = ratios(rec)
    base = mk.gemm_empty_base(rec["rows"])
    fills = list(dict.fromkeys(label(r.get("dtype", "bf16"), r["fill"]) for r in rec["rows"]))
    lines = [f"Made by `{cmd}` ({rec['device']}, torch {rec['torch']}, {rec['seconds']:g} s a sustained or burst run; "
             "`python benchmarks/gpu/gemm_power.py` on the GPU wrote the record): Llama-3.1-8B's GEMMs, six layers per CUDA "
             "graph as aiconfigurator's collector builds them, activations randn; TFLOPS per regime with the median SM clock "
             "and power nvidia-smi read (every 50 ms), and in brackets the time against the collector's own setting "
             "(empty weights, short replays) for the same GEMM and rows:", "",
             "| GEMM | rows | weights | " + " | ".join(f"{name}: TFLOPS (x time)" for _, name in MODES) + " |",
             "|---|---:|---|" + "---|" * len(MODES)]
    for r in rec["rows"]:
        b = base[r.get("dtype", "bf16"), r["gemm"], r["m"]]
        cells = [f"{r[mode]['tflops']:.0f}{_clock(r[mode].get('clocks'))} (x{r[mode]['s'] / b:.2f})" for mode, _ in MODES]
        lines.append(f"| {r['gemm']} {r['k']}->{r['n']} | {r['m']:,} | {label(r.get('dtype', 'bf16'), r['fill'])} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Compute-bound cases (rows >= 1,024), time against the collector's setting, range over the GEMMs and rows: "
              + "; ".join(f"{name}: " + ", ".join(f"{f} x{q[mode, f][0]:.2f}-{q[mode, f][1]:.2f}" for f in fills if (mode, f) in q)
                          for mode, name in MODES) + "."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", required=True, help="a JSON record benchmarks/gpu/gemm_power.py wrote")
    ap.add_argument("--write-docs", nargs="?", const=str(PAGE), metavar="PAGE", help="put the table into PAGE")
    a = ap.parse_args(argv)
    try:
        rec = read(a.record)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    body = table(rec, f"python benchmarks/gemm_power_table.py --record {a.record}")
    print(body)
    if a.write_docs:
        write_block(a.write_docs, "gemm_power_table", f"--record {a.record}", body)
        print(f"wrote {a.write_docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
