"""Results pages are written by the benchmark scripts, not by hand.

`benchmarks/policy_table.py --write-docs` replaces its table in docs/reference/results.md between
`<!-- policy_table: FLAGS -->` and `<!-- end policy_table -->`; here on a tiny run (5
programs), into a copy of the page, checking every other byte is kept."""
import importlib.util
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "reference" / "results.md"


@pytest.fixture(scope="module")
def pt():
    spec = importlib.util.spec_from_file_location("policy_table", ROOT / "benchmarks" / "policy_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TINY = ["--trace", "swebench", "--programs", "5", "--num-gpu-blocks", "3000", "--loads", "0.5", "--seeds", "0",
        "--policies", "vllm,continuum", "--workers", "1"]
TINY_KEY = ("--trace swebench --programs 5 --num-gpu-blocks 3000 --profile llama3.1-8b-h100 --loads 0.5 --seeds 0 "
            "--policies vllm,continuum")


def test_write_docs_replaces_only_its_table(pt, tmp_path, capsys):
    page = tmp_path / "results.md"
    shutil.copy(RESULTS, page)
    before = page.read_bytes()
    old = b"\n\nstale table\n| a |\n\n"
    block_start = f"<!-- policy_table: {TINY_KEY} -->".encode()
    # the tiny table's block between two of the page's own paragraphs
    cut = before.index(b"\n## ", 10) + 1
    page.write_bytes(before[:cut] + block_start + old + b"<!-- end policy_table -->\n\n" + before[cut:])
    text = pt.main([*TINY, "--write-docs", str(page)])
    assert text in capsys.readouterr().out  # what was printed is what was written
    after = page.read_bytes()
    head, rest = after.split(block_start)
    body, tail = rest.split(b"<!-- end policy_table -->", 1)
    assert head == before[:cut] and tail == b"\n\n" + before[cut:]  # the rest byte-identical
    assert body == b"\n\n" + text.encode() + b"\n\n"
    assert body.startswith(b"\n\nswebench, 5 programs, profile llama3.1-8b-h100 with 3000 KV blocks")
    assert b"| vllm | " in body and b"| continuum | " in body and b"stale" not in body
    # once more with the same table: nothing moves
    pt.write_docs(page, TINY_KEY, text)
    assert page.read_bytes() == after


def test_an_unmarked_table_is_refused_and_the_page_kept(pt, tmp_path):
    page = tmp_path / "results.md"
    shutil.copy(RESULTS, page)
    with pytest.raises(SystemExit, match="marked tables: .*--trace bfcl --programs 300"):
        pt.write_docs(page, TINY_KEY, "x")
    assert page.read_bytes() == RESULTS.read_bytes()


def test_the_results_page_marks_each_table_of_the_script(pt):
    """Every marked block holds the script's output for its flags (header line and rows),
    and every table the script printed into the page is marked."""
    text = RESULTS.read_text()
    blocks = re.findall(r"^<!-- policy_table: (.*?) -->\n\n(.*?)\n\n<!-- end policy_table -->$", text, re.S | re.M)
    assert len(blocks) == 6 and len(blocks) == len(re.findall(r"^<!-- end policy_table -->$", text, re.M))
    assert sum(a.startswith("--trace spec:") for a, _ in blocks) == 3  # the measured workloads' tables
    for key, body in blocks:
        a = dict(re.findall(r"--([\w-]+) (\S+)", key))
        trace, blocks_, profile = a["trace"], a["num-gpu-blocks"], a["profile"]
        head = body.splitlines()[0]
        assert re.match(rf"(Table: )?{re.escape(trace)}, {a['programs']} programs, profile `?{re.escape(profile)}`? "
                        rf"with {blocks_} KV blocks", head), (key, head)
        pols = a.get("policies", pt.DEFAULT_POLICIES).split(",")
        assert [r.split(" | ")[0][2:] for r in body.splitlines() if r.startswith("| ") and "JPS" not in r] == pols
        for j in a["loads"].split(","):
            assert f"JPS {j}: mean JCT" in body
    # no table of the script left unmarked: each header line sits inside a block
    heads = re.findall(r"^(?:Table: )?\S+, \d+ programs, profile .* KV blocks .*Poisson arrivals.*$", text, re.M)
    assert len(heads) == len(blocks)


def test_a_measured_spec_runs_as_a_trace_and_a_bad_one_is_refused(pt, capsys):
    """--trace spec:NAME: the table runs on programs sampled from the shipped spec (seed 0),
    the same as on that trace written by `sim trace gen --spec`; an unknown spec is refused
    in one line, exit 2."""
    import pandas as pd

    from traces.fit import generate_from_spec, read_spec
    from traces.schema import write_trace

    args = ["--programs", "3", "--num-gpu-blocks", "3000", "--loads", "0.5", "--seeds", "0", "--policies", "vllm", "--workers", "1"]
    text = pt.main(["--trace", "spec:codex", *args])
    assert text.startswith("spec:codex, 3 programs, profile llama3.1-8b-h100 with 3000 KV blocks")
    df, meta = generate_from_spec(read_spec("codex"), 3, 0)
    path = write_trace(df, Path(pytest.importorskip("tempfile").mkdtemp()) / "codex.parquet", meta)
    again = pt.main(["--trace", str(path), *args])
    assert text.split("\n", 1)[1] == again.split("\n", 1)[1]  # the same rows
    assert len(pd.read_parquet(path)) == 27  # codex: 9 calls per program
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        pt.main(["--trace", "spec:no-such-agent", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --trace spec:no-such-agent:") and "codex" in err[0]
