"""What a new user trips on, each pinned by a test.

Plots' subtitles are tested in tests/test_plot.py, the top-12 TTL list and `sim run`'s
pressure note in tests/test_sim_run.py; here: `sim sweep`'s pressure note, units of the
output columns, the profile error message, how to run the notebook, and the calibration
test's runtime stated once."""
import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import trace_and_profile_files
from sim.cli import main
from sim.run.metrics import COLUMNS, write_table

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


# --- `sim sweep` says when no point put the KV pool under pressure ---------------------

def _notes(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("note:")]


def test_sweep_says_when_the_pool_was_never_under_pressure(tmp_path, capsys):
    trace, prof = trace_and_profile_files(tmp_path, 3, 12, 2000)
    base = ["sweep", "--out", str(tmp_path / "s"), "--axis", f"trace={trace}", "--axis", f"profile={prof}",
            "--axis", "policy=vllm,continuum", "--no-progress"]
    assert main([*base, "--axis", "jps=0.5"]) == 0  # 12 small programs on 2,000 blocks
    notes = _notes(capsys.readouterr().out)
    t = pd.read_parquet(tmp_path / "s" / "results.parquet")
    assert (t["peak_kv_usage"] < 0.9).all()
    assert len(notes) == 1 and "never under pressure" in notes[0] and "every one of the 2 points" in notes[0]
    assert "retention policies cannot differ" in notes[0] and "--axis num_gpu_blocks=N" in notes[0]

    assert main([*base, "--axis", "jps=50", "--axis", "num_gpu_blocks=160"]) == 0  # all at once on 160 blocks
    t = pd.read_parquet(tmp_path / "s" / "results.parquet")
    assert (t.loc[t["num_gpu_blocks"] == 160, "peak_kv_usage"] >= 0.9).all()
    assert not _notes(capsys.readouterr().out)  # only this grid's points count, not the table's

    assert main([*base, "--axis", "jps=0.5,50", "--axis", "num_gpu_blocks=160,none"]) == 0
    notes = _notes(capsys.readouterr().out)
    t = pd.read_parquet(tmp_path / "s" / "results.parquet")
    n_low = int((t["peak_kv_usage"] < 0.9).sum())
    assert len(t) == 8 and 2 <= n_low < 8
    assert len(notes) == 1 and f"in {n_low} of 8 points" in notes[0] and "cannot differ at those points" in notes[0]


# --- output columns carry units ---------------------------------------------------------

def _docs_units() -> dict[tuple[str, str], str]:
    """(file stem, column) -> unit, from the table of docs/reference/cli.md's "Output tables"."""
    rows = re.findall(r"^\| `(\w+)\.parquet` \| `(\w+)` \| ([^|]+?) \|", (DOCS / "reference" / "cli.md").read_text(), re.M)
    return {(f, c): u for f, c, u in rows}


def test_every_output_column_has_a_unit_in_the_file_and_in_the_docs(tmp_path):
    out = tmp_path / "r"
    assert main(["run", "--trace", "swebench", "--programs", "3", "--jps", "1", "--replicas", "2",
                 "--offload", "cpu:1GB", "--policy", "continuum", "--out", str(out), "--no-progress"]) == 0
    docs = _docs_units()
    for name in ("turns", "programs", "kv_usage"):
        schema = pq.read_schema(out / f"{name}.parquet")
        for field in schema:
            meta = field.metadata or {}
            assert meta.get(b"unit") and meta.get(b"description"), f"{name}.parquet column {field.name!r} has no unit"
            assert docs.get((name, field.name)) == meta[b"unit"].decode(), \
                f"{name}.parquet column {field.name!r} is not in docs/reference/cli.md's output table with its unit"
        assert set(COLUMNS[name]) == set(schema.names), f"COLUMNS[{name!r}] and what is written differ"
        # the units ride along: pandas reads the file exactly as it read to_parquet's
        df = pd.read_parquet(out / f"{name}.parquet")
        df.to_parquet(tmp_path / "plain.parquet", index=False)
        pd.testing.assert_frame_equal(df, pd.read_parquet(tmp_path / "plain.parquet"), check_exact=True)
    assert set(docs) == {(n, c) for n, cols in COLUMNS.items() for c in cols}, "docs table rows differ from COLUMNS"


def test_write_table_keeps_columns_it_has_no_unit_for(tmp_path):
    write_table(pd.DataFrame({"t": [0.0], "extra": [1]}), tmp_path / "k.parquet", "kv_usage")
    s = pq.read_schema(tmp_path / "k.parquet")
    assert s.field("t").metadata[b"unit"] == b"s" and not s.field("extra").metadata


# --- no `'name''s` in messages -------------------------------------------------------------

@pytest.mark.parametrize("profile", [None, "llama3.1-8b-a100-80gb"])
def test_profile_limit_message_reads_cleanly(profile, capsys):
    argv = ["run", "--max-model-len", "99999999", "--no-progress"] + (["--profile", profile] if profile else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    name = profile or "llama3.1-8b-h100"
    assert f"exceeds the max_model_len 131072 of profile '{name}'" in err
    assert "''s" not in err and "'s " not in err


def test_no_message_puts_s_after_a_quoted_name():
    bad = re.compile(r"!r\}'s|''s")  # f"{name!r}'s" prints 'name''s
    hits = [f"{p.relative_to(ROOT)}:{i}" for d in ("sim", "calibrate", "traces", "policies", "agentsim", "benchmarks")
            for p in sorted((ROOT / d).rglob("*.py")) for i, ln in enumerate(p.read_text().splitlines(), 1)
            if bad.search(ln)]
    assert not hits, f"reword (e.g. 'the X of profile {{name!r}}'): {hits}"


# --- the docs say how to run the notebook ------------------------------------------------

def test_docs_say_how_to_run_the_notebook():
    cli = (DOCS / "reference" / "cli.md").read_text()
    section = cli.split("### The notebook", 1)[1].split("\n## ", 1)[0]
    assert "pip install -e '.[test]'" in section and "jupyter execute notebooks/sweep_jps_ttl.ipynb" in section
    assert (ROOT / "notebooks" / "sweep_jps_ttl.ipynb").is_file()
    assert "docs/reference/cli.md#the-notebook" in (ROOT / "README.md").read_text()
    # what that command needs is what the test extra installs: nbclient's `jupyter execute` and a kernel
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    names = {re.split(r"[<>=\[]", r, maxsplit=1)[0] for r in extra}
    assert {"nbclient", "ipykernel"} <= names
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert any(e.name == "jupyter-execute" and e.value.startswith("nbclient") for e in scripts)


# --- the calibration test's runtime is stated one way ----------------------------------

def test_calibration_test_runtime_is_stated_one_way():
    doc = ast.get_docstring(ast.parse((ROOT / "tests" / "test_calibrate_engine.py").read_text()))
    runtime = re.search(r"\(about ([^)]*?)\)", doc).group(1)  # "2 minutes on 2 cores"
    stated = [(p.name, m) for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
              for ln in p.read_text().splitlines() if "test_calibrate_engine.py" in ln
              for m in re.findall(r"\(about ([^)]*?)\)", ln)]
    assert stated, "the docs no longer say how long tests/test_calibrate_engine.py takes"
    assert all(m == runtime for _, m in stated), f"test docstring says {runtime!r}, docs say {stated}"
