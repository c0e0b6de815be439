"""benchmarks/aiconfigurator_releases.py: older aiconfigurator wheels' vLLM GEMM tables against the installed one's."""
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import aiconfigurator_releases as ar

ROOT = Path(__file__).resolve().parents[1]


def table(release: str, device: str, rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame([{"framework": "VLLM", "version": release, "device": device, "op_name": "gemm",
                          "kernel_source": "vllm_default", "gemm_dtype": d, "m": m, "n": n, "k": k, "latency": lat}
                         for d, m, n, k, lat in rows])


def wheel(path: Path, files: dict[str, pd.DataFrame]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, t in files.items():
            if name.endswith(".parquet"):
                buf = io.BytesIO()
                t.to_parquet(buf)
                z.writestr(name, buf.getvalue())
            else:
                z.writestr(name, t.to_csv(index=False))


def test_ratios_by_row_band_per_dtype_and_the_newer_wheel_wins(tmp_path):
    old = table("0.12.0", "NVIDIA H100 80GB HBM3",
                [("float16", 8, 4096, 4096, 1.1), ("float16", 2048, 4096, 4096, 0.9), ("fp8", 8, 4096, 4096, 3.0),
                 ("fp8", 2048, 4096, 4096, 1.8), ("float16", 8, 512, 4096, 9.0)])  # n < 1024: not a model GEMM
    new = table("0.24.0", "NVIDIA H100 80GB HBM3",
                [("bfloat16", 8, 4096, 4096, 1.0), ("bfloat16", 2048, 4096, 4096, 1.0), ("fp8", 8, 4096, 4096, 2.0),
                 ("fp8", 2048, 4096, 4096, 0.9), ("bfloat16", 8, 512, 4096, 1.0)])
    stale = table("0.12.0", "NVIDIA H100 80GB HBM3", [("float16", 8, 4096, 4096, 50.0)])
    wheel(tmp_path / "aiconfigurator-0.6.0-py3-none-any.whl",
          {"aiconfigurator/systems/data/h100_sxm/vllm/0.12.0/gemm_perf.txt": stale})
    wheel(tmp_path / "aiconfigurator-0.10.0-py3-none-any.whl",
          {"aiconfigurator/systems/data/h100_sxm/vllm/0.12.0/gemm_perf.parquet": old,
           "aiconfigurator/systems/data/b200_sxm/vllm/0.19.0/gemm_perf.parquet": old})
    found = ar.wheel_tables(tmp_path, {"h100_sxm"})
    assert list(found) == [("h100_sxm", "0.12.0")]  # only the GPUs asked for
    assert found[("h100_sxm", "0.12.0")][0].startswith("aiconfigurator-0.10.0")  # 0.10.0 is newer than 0.6.0
    rs = {r["what"]: r for r in ar.rows(found, {"h100_sxm": ("0.24.0", new)})}
    assert rs["bf16 / 0.24.0 bf16"]["bands"] == pytest.approx({"1-16": 1.1, "1K-4K": 0.9})
    assert rs["fp8 / 0.24.0 fp8"]["bands"] == pytest.approx({"1-16": 1.5, "1K-4K": 2.0})
    fp8_own = [r for r in ar.rows(found, {"h100_sxm": ("0.24.0", new)}) if r["what"] == "fp8 / its bf16"]
    assert [(r["wheel"], r["bands"]) for r in fp8_own] == [
        (found[("h100_sxm", "0.12.0")][0], pytest.approx({"1-16": 3.0 / 1.1, "1K-4K": 2.0})),
        ("installed", pytest.approx({"1-16": 2.0, "1K-4K": 0.9}))]
    text = ar.render(list(rs.values()))
    assert "| h100_sxm | 0.12.0 |" in text and "| 1.10 | - | - | - | 0.90 | - |" in text


def test_a_folder_without_wheels_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "benchmarks/aiconfigurator_releases.py", "--wheels", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "--wheels" in p.stderr


def test_the_docs_block_is_the_default_gpus_table_and_names_its_wheels_in_release_order(tmp_path):
    p = subprocess.run([sys.executable, "benchmarks/aiconfigurator_releases.py", "--wheels", str(tmp_path), "--gpus", "h100_sxm",
                        "--write-docs", str(tmp_path / "x.md")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and "--gpus" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.md").exists()
    rs = [{"gpu": "h100_sxm", "release": r, "wheel": w, "device": "NVIDIA H100 80GB HBM3", "what": "bf16 / 0.24.0 bf16",
           "bands": {"1-16": 1.0}} for r, w in (("0.14.0", "aiconfigurator-0.10.0-py3-none-any.whl"),
                                                 ("0.11.0", "aiconfigurator-0.4.0-py3-none-any.whl"))]
    body = ar.docs_body(rs + [{**rs[0], "wheel": "installed"}])
    assert "DIR holding aiconfigurator-0.4.0-py3-none-any.whl, aiconfigurator-0.10.0-py3-none-any.whl (pip" in body
    assert body.endswith(ar.render(rs + [{**rs[0], "wheel": "installed"}]))
