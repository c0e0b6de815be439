"""benchmarks/table5_fig9.py: the Table 5 set-up (closed loop, OpenHands-shaped programs, GLM-4.5-FP8
on 8 H100s) and the Fig. 9 comparison, run on a tiny size; the results page carries both blocks."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from benchmarks import table5_fig9 as t59  # noqa: E402


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("t59")
    return t59.roofline_profile(d), t59.openhands_trace(d, 6)


def test_table5_structure_and_ratio_column(tiny):
    profile, trace = tiny
    text = t59.table5(trace, profile, 6, [2, 3], ["vllm", "thunderagent", "continuum"])
    lines = text.split("\n")
    assert lines[0].startswith("Table: Table 5 set-up: 6 OpenHands-shaped programs") and "GLM-4.5-FP8" in lines[0]
    rows = [_cells(r) for r in lines[4:]]
    assert [(r[0], r[1]) for r in rows] == [(n, p) for n in ("2", "3") for p in ("vllm", "thunderagent", "continuum")]
    for i in range(0, len(rows), 3):
        base = float(rows[i][2])
        assert rows[i][3] == "1.00"
        for r in rows[i:i + 3]:  # the ratio column is steps/min over vllm's (both as printed, so to rounding)
            assert float(r[3]) == pytest.approx(float(r[2]) / base, abs=0.006)
    # the profile is the 8-GPU GLM one: a far bigger KV pool than one H100 with Llama-3.1-8B
    import json
    p = json.loads(Path(profile).read_text())
    assert p["model"]["name"] == "zai-org/GLM-4.5-FP8" and p["model"]["tensor_parallel_size"] == 8


def test_fig9_gain_column_by_hand(tiny):
    _, trace = tiny
    rows = t59.fig9_rows({"swebench": "swebench", "openhands": trace}, 4, {"swebench": [0.5], "openhands": [0.05]}, [0])
    assert [r["trace"] for r in rows] == ["swebench", "openhands"]
    for r in rows:
        assert r["gain"] == pytest.approx(r["vllm"]["mean_jct"] / r["continuum"]["mean_jct"])
    import pandas as pd
    oh = pd.read_parquet(trace)
    assert rows[1]["turns"] == pytest.approx(len(oh[oh["program_id"].isin(sorted(oh["program_id"].unique())[:4])]) / 4)
    text = t59.fig9({"swebench": "swebench"}, 4, {"swebench": [0.5]}, [0])
    row = _cells(text.split("\n")[4])
    assert row[0] == "swebench" and row[2] == "0.5"
    assert float(row[5].rstrip("x")) == pytest.approx(float(row[3]) / float(row[4]), rel=0.02, abs=0.01)


def test_parse_loads():
    assert t59.parse_loads("swebench:1,2/openhands:0.05") == {"swebench": [1.0, 2.0], "openhands": [0.05]}
    assert t59.parse_loads("spec:mini-swe-agent:0.1,0.2/bfcl:1") == {"spec:mini-swe-agent": [0.1, 0.2], "bfcl": [1.0]}
    with pytest.raises(SystemExit):
        t59.parse_loads("swebench")


def test_results_page_marks_both_blocks():
    page = (ROOT / "docs" / "reference" / "results.md").read_text()
    for name, first in (("table5", "Table: Table 5 set-up"), ("fig9", "Table: Fig. 9 comparison")):
        found = re.findall(rf"^<!-- {name}: (.*?) -->\n\n(Table: .*?)\n\n<!-- end {name} -->$", page, re.S | re.M)
        assert len(found) == 2, name  # the synthetic workloads, then the measured ones
        assert "spec:" not in found[0][0] and "spec:" in found[1][0]
        for key, body in found:
            assert body.startswith(first)
            rows = body.split("\n")[4:]
            assert rows and all(r.startswith("| ") for r in rows)
    for key5 in re.findall(r"^<!-- table5: (.*?) -->$", page, re.M):
        conc = re.search(r"--concurrency (\S+)", key5).group(1).split(",")
        pols = re.search(r"--policies (\S+)", key5).group(1).split(",")
        body5 = page.split(f"<!-- table5: {key5} -->")[1].split("<!-- end table5 -->")[0].strip().split("\n")[4:]
        assert [(_cells(r)[0], _cells(r)[1]) for r in body5] == [(n, p) for n in conc for p in pols]


def test_main_writes_both_blocks(tmp_path, capsys):
    args = ["--programs", "4", "--concurrency", "2", "--policies", "vllm,continuum", "--fig9-programs", "3",
            "--loads", "swebench:0.5", "--seeds", "0"]
    k5 = "--programs 4 --concurrency 2 --policies vllm,continuum"
    k9 = "--fig9-programs 3 --loads swebench:0.5 --seeds 0"
    page = tmp_path / "results.md"
    page.write_text(f"a\n<!-- table5: {k5} -->\nold\n<!-- end table5 -->\nb\n<!-- fig9: {k9} -->\nold\n<!-- end fig9 -->\nc\n")
    t5, f9 = t59.main([*args, "--write-docs", str(page)])
    out, text = capsys.readouterr().out, page.read_text()
    assert t5 in out and f9 in out and t5 in text and f9 in text and "old" not in text
    assert text.startswith("a\n") and text.endswith("c\n")


def test_table5_and_fig9_on_a_measured_spec(tiny, tmp_path, capsys):
    """--table5-trace spec:NAME and Fig. 9 loads spec:NAME:JPS run on programs sampled from
    the shipped spec (seed 0) and say so; the Fig. 9 row's turns are the spec's sample's;
    --table5-trace that is neither openhands nor spec:NAME is refused (exit 2)."""
    profile, _ = tiny
    from benchmarks.docs_tables import workload_trace

    trace = workload_trace("spec:codex", 4, tmp_path)
    text = t59.table5(trace, profile, 4, [2], ["vllm", "continuum"], "spec:codex")
    assert text.startswith("Table: Table 5 set-up: 4 programs sampled from the measured spec codex (`sim trace gen --spec`, seed 0)")
    f9 = t59.fig9({"spec:codex": trace}, 4, {"spec:codex": [0.5]}, [0])
    assert "4 programs per trace (spec:codex: `sim trace gen --spec codex`, seed 0)" in f9.split("\n")[0]
    row = _cells(f9.split("\n")[4])
    assert row[0] == "spec:codex" and row[1] == "9.0"  # codex sessions: 9 calls each
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        t59.main(["--table5-trace", "swebench"])
    assert e.value.code == 2 and "--table5-trace 'swebench': give openhands or spec:NAME" in capsys.readouterr().err
