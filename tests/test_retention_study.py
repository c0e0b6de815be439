"""docs/reference/retention.md is written by benchmarks/retention_study.py: its quick table is what the
script prints now, every table's winner is the cell's fastest, and the study's cells are all there."""
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import retention_study as rs
from sim.study.sweep import canonical

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "retention.md"


def block(text: str, study: str) -> str:
    m = re.search(rf"^<!-- retention_study: --study {study} -->\n\n(.*?)\n\n<!-- end retention_study -->$", text, re.S | re.M)
    assert m, f"docs/reference/retention.md has no `--study {study}` block"
    return m[1]


def test_the_quick_table_on_the_page_is_what_the_script_gives(tmp_path, capsys):
    page = tmp_path / "retention.md"
    shutil.copy(PAGE, page)
    printed = rs.main(["--study", "quick", "--workers", "1", "--write-docs", str(page)])
    assert block(PAGE.read_text(), "quick") == printed  # the page is current
    assert page.read_bytes() == PAGE.read_bytes()  # and writing it moved nothing else


def _check_winners(body: str) -> int:
    """Every main-table row's winners are its least mean and p95 (as shown: of those tied there, one);
    returns the rows seen."""
    labels = [*rs.POLICIES, "tuned"]
    rows = 0
    for table in re.findall(r"^\| KV blocks \| JPS \| vllm .*?(?=\n\n|\Z)", body, re.S | re.M):
        for line in table.split("\n")[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            pairs = [tuple(map(float, c.split(" / "))) for c in cells[2:2 + len(labels)]]
            for col, k in ((-2, 0), (-1, 1)):  # the winner has the least value as shown (ties at 0.1 s: any of them)
                least = min(p[k] for p in pairs)
                assert cells[col] in {lab for lab, p in zip(labels, pairs) if p[k] == least}, line
            rows += 1
    return rows


def test_every_cell_of_the_full_study_is_on_the_page_with_its_winner():
    body = block(PAGE.read_text(), "full")
    spec = rs.STUDIES["full"]
    want = sum(len(pools) * len(loads) for _, pools, loads in spec["workloads"].values())
    assert _check_winners(body) == want
    for wl, (programs, pools, loads) in spec["workloads"].items():
        assert f"**{wl}**, {programs} programs" in body
        for b in pools:
            for j in loads:
                assert len(re.findall(rf"^\| {b} \| {j:g} \| ", body, re.M)) == 2  # JCT row and twin row
    assert _check_winners(block(PAGE.read_text(), "quick")) == 1


def test_an_empty_text_parameter_is_kept_and_a_none_default_still_takes_none():
    # client-ttl's tool_ttls defaults to '' (no per-tool TTLs): `sim tune` holds it there
    assert canonical({"policy": "client-ttl"})["tool_ttls"] == ""
    assert canonical({"policy": "client-ttl", "tool_ttls": ""})["tool_ttls"] == ""
    assert canonical({"policy": "client-ttl", "half_life": "none"})["half_life"] is None


@pytest.mark.parametrize("argv, said", [(["--study", "huge"], "--study: invalid choice"),
                                        (["--workers", "0"], "--workers must be >= 1")])
def test_bad_flags_are_one_line_and_exit_2(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        rs.main(argv)
    assert e.value.code == 2 and said in capsys.readouterr().err
