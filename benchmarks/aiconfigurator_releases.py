"""Older aiconfigurator databases' vLLM GEMMs against the installed aiconfigurator-core's, per GPU, release and dtype.

    pip download --no-deps -d WHEELS 'aiconfigurator==0.4.0' 'aiconfigurator==0.6.0' 'aiconfigurator==0.8.0' \
        'aiconfigurator==0.10.0'
    python benchmarks/aiconfigurator_releases.py --wheels WHEELS [--gpus h100_sxm,b200_sxm] [--write-docs [PAGE]]

Whether a GPU's kernels measured on an older vLLM release (aiconfigurator's earlier wheels ship earlier releases'
tables: systems/data/<gpu>/vllm/<release>/gemm_perf.txt or .parquet) could price a run of that release in place of
the installed database's (sim/hardware/check.py AIC_VERSION: vLLM 0.24.0). Per GPU and older release, the device the
table was measured on, and the median over shared (m, n, k) shapes (n and k of at least 1,024, model GEMMs) by row
count m of the older latency over the installed one's, per dtype (the installed bf16 against an older float16 where
that is what it measured); then each release's per-tensor FP8 over its own bf16, the FP8 kernels' speed-up. Read from
the wheels' files in place (nothing installed); a diagnostic: it changes no profile. --write-docs puts the table into
docs/reference/validation.md (or PAGE) in place of its block, whose marker names the folder by $AGENTSIM_AIC_WHEELS
(benchmarks/docs_tables.py skips the block where it is not set).
"""
from __future__ import annotations

import argparse
import io
import re
import sys
import zipfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402
from sim.hardware.kv_pool import release  # noqa: E402
from benchmarks.docs_tables import DOCS, write_block  # noqa: E402

KEY = "--wheels $AGENTSIM_AIC_WHEELS"  # the docs block's marker: the default GPUs, the folder from the environment

DEFAULT_GPUS = "h100_sxm,b200_sxm"
BANDS = (0, 16, 64, 256, 1024, 4096, 65536)
BAND_NAMES = ("1-16", "17-64", "65-256", "257-1K", "1K-4K", ">4K")
TABLE = re.compile(r"systems/data/(?P<gpu>[^/]+)/vllm/(?P<release>[^/]+)/gemm_perf\.(?P<ext>txt|parquet)$")


def _read(raw: bytes, ext: str) -> pd.DataFrame:
    return pd.read_parquet(io.BytesIO(raw)) if ext == "parquet" else pd.read_csv(io.BytesIO(raw))


def _wheel_version(name: str) -> tuple[int, int, int]:
    return release(name.split("-")[1])  # aiconfigurator-0.10.0-cp310-...whl


def wheel_tables(wheels: Path, gpus: set[str]) -> dict[tuple[str, str], tuple[str, pd.DataFrame]]:
    """(gpu, release) -> (wheel name, GEMM table) from every aiconfigurator wheel in `wheels`; a release two wheels
    ship is taken from the newer wheel."""
    found = {}
    paths = sorted(wheels.glob("aiconfigurator-*.whl"), key=lambda p: _wheel_version(p.name))
    if not paths:
        raise InputError(f"--wheels {wheels}: no aiconfigurator-*.whl there (pip download --no-deps -d {wheels} "
                         "'aiconfigurator==0.8.0')")
    for path in paths:
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                m = TABLE.search(name)
                if m and m["gpu"] in gpus:
                    found[(m["gpu"], m["release"])] = (path.name, _read(z.read(name), m["ext"]))
    return found


def installed_table(gpu: str) -> tuple[str, pd.DataFrame]:
    """(release, GEMM table) of the installed aiconfigurator-core's vLLM database for gpu."""
    from importlib import resources

    from sim.hardware import check as pc

    pc._aic()  # one line naming the extra when it is missing
    root = resources.files("aiconfigurator_core") / "systems" / "data" / gpu / "gemm" / "vllm"
    releases = sorted((p.name for p in root.iterdir()), key=release)
    if not releases:
        raise InputError(f"aiconfigurator-core {pc.AIC_VERSION} has no vLLM GEMM table for {gpu}")
    return releases[-1], pd.read_parquet(str(root / releases[-1] / "gemm_perf.parquet"))


def _bf16(t: pd.DataFrame) -> str:
    return "bfloat16" if "bfloat16" in set(t["gemm_dtype"]) else "float16"


def band_medians(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, float]:
    """Median of a's latency over b's on their shared (m, n, k) shapes with n, k >= 1024, by row-count band."""
    j = a.merge(b, on=["m", "n", "k"], suffixes=("_a", "_b"))
    j = j[(j["n"] >= 1024) & (j["k"] >= 1024)]
    r = (j["latency_a"] / j["latency_b"]).groupby(pd.cut(j["m"], BANDS, labels=BAND_NAMES), observed=True).median()
    return {k: float(v) for k, v in r.items()}


def rows(tables: dict, installed: dict) -> list[dict]:
    out = []
    for (gpu, release), (wheel, t) in sorted(tables.items()):
        if gpu not in installed:
            continue
        new_release, new = installed[gpu]
        for dtype in ("bf16", "fp8"):
            a = t[t["gemm_dtype"] == (_bf16(t) if dtype == "bf16" else "fp8")]
            b = new[new["gemm_dtype"] == (_bf16(new) if dtype == "bf16" else "fp8")]
            if a.empty or b.empty:
                continue
            out.append({"gpu": gpu, "release": release, "wheel": wheel, "device": str(t["device"].iloc[0]),
                        "what": f"{dtype} / {new_release} {dtype}", "bands": band_medians(a, b)})
        f, h = t[t["gemm_dtype"] == "fp8"], t[t["gemm_dtype"] == _bf16(t)]
        if not f.empty and not h.empty:
            out.append({"gpu": gpu, "release": release, "wheel": wheel, "device": str(t["device"].iloc[0]),
                        "what": "fp8 / its bf16", "bands": band_medians(f, h)})
    for gpu, (release, t) in sorted(installed.items()):
        f, h = t[t["gemm_dtype"] == "fp8"], t[t["gemm_dtype"] == _bf16(t)]
        out.append({"gpu": gpu, "release": release, "wheel": "installed", "device": str(t["device"].iloc[0]),
                    "what": "fp8 / its bf16", "bands": band_medians(f, h)})
    return out


def render(rs: list[dict]) -> str:
    head = "| GPU | vLLM | wheel | measured on | latency ratio | " + " | ".join(f"m {b}" for b in BAND_NAMES) + " |"
    lines = [head, "|" + "---|" * 5 + "---:|" * len(BAND_NAMES)]
    for r in rs:
        lines.append(f"| {r['gpu']} | {r['release']} | {r['wheel']} | {r['device']} | {r['what']} | "
                     + " | ".join(f"{r['bands'][b]:.2f}" if b in r["bands"] else "-" for b in BAND_NAMES) + " |")
    return "\n".join(lines)


def docs_body(rs: list[dict]) -> str:
    wheels = sorted({r["wheel"] for r in rs if r["wheel"] != "installed"}, key=_wheel_version)
    from sim.hardware import check as pc

    return (f"Made by `python benchmarks/aiconfigurator_releases.py --wheels DIR --write-docs`, DIR holding {', '.join(wheels)} "
            f"(pip download --no-deps), against the installed {pc.AIC_PACKAGE} {pc.AIC_VERSION}: the median, over the GEMM "
            "shapes two tables share (n and k of at least 1,024), of one latency over the other, by row count m:\n\n"
            + render(rs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", type=Path, required=True, help="a folder of aiconfigurator-*.whl files")
    ap.add_argument("--gpus", default=DEFAULT_GPUS, help="aiconfigurator system names, comma-separated")
    ap.add_argument("--write-docs", nargs="?", const=str(DOCS / "reference" / "validation.md"), default=None, metavar="PAGE",
                    help="write the table into docs/reference/validation.md (or PAGE) in place of its block")
    args = ap.parse_args(argv)
    try:
        if not args.wheels.is_dir():
            raise InputError(f"--wheels {args.wheels}: not a folder")
        if args.write_docs and args.gpus != DEFAULT_GPUS:
            raise InputError(f"--write-docs writes the table of the default --gpus {DEFAULT_GPUS}; drop --gpus {args.gpus}")
        gpus = {g for g in args.gpus.split(",") if g}
        older = wheel_tables(args.wheels, gpus)
        rs = rows(older, {g: installed_table(g) for g in sorted(gpus)})
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(rs))
    if args.write_docs:
        write_block(args.write_docs, "aiconfigurator_releases", KEY, docs_body(rs))
        print(f"wrote {args.write_docs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
