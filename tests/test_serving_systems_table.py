"""benchmarks/serving_systems_table.py (issue 18 item 5): a tiny run has every system's row
with finite numbers, writes its block and figure, and docs/reference/serving_systems.md holds the
block the default command writes (same key, same rows)."""
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from benchmarks import serving_systems_table as sst  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "serving_systems.md"
BLOCK = re.compile(rf"^<!-- {sst.SCRIPT}: (.*?) -->\n\n(.*?)\n\n<!-- end {sst.SCRIPT} -->$", re.S | re.M)


def tables(text: str) -> dict[str, list[list[str]]]:
    """'Table: ...' heading -> its rows' cells (header and rule dropped)."""
    out, head = {}, None
    for line in text.split("\n"):
        if line.startswith("Table: "):
            head = line
            out[head] = []
        elif head and line.startswith("| ") and not line.startswith("| system |"):
            out[head].append([c.strip() for c in line.strip("|").split("|")])
        elif not line.startswith("|"):
            head = None if line else head
    return out


def finite(cell: str) -> bool:
    try:
        return all(math.isfinite(float(x.strip().rstrip("%"))) for x in cell.split("/"))
    except ValueError:
        return False


def check_rows(text: str, systems: list[str], n_tables: int, cols: int = 12) -> None:
    t = tables(text)
    assert len(t) == n_tables, list(t)
    for head, rows in t.items():
        assert [r[0] for r in rows] == systems, head
        for r in rows:
            assert len(r) == cols, r
            bad = [c for c in r[1:] if not finite(c) and not re.fullmatch(r"n/a \[\d+\]", c)]
            assert not bad, (head, r)
            for n in re.findall(r"n/a \[(\d+)\]", " ".join(r)):  # a refused combination has its reason below
                assert f"\n[{n}] refused by the run builder: " in text


def test_quick_run_writes_its_block_and_figure(tmp_path, capsys):
    a = sst.parse_args(["--quick"])
    key = sst.table_key(a)
    page = tmp_path / "page.md"
    page.write_text(f"before\n<!-- {sst.SCRIPT}: {key} -->\n\nstale\n\n<!-- end {sst.SCRIPT} -->\nafter\n")
    fig = tmp_path / "fig.png"
    text = sst.main(["--quick", "--write-docs", str(page), "--figure", str(fig)])
    assert text in capsys.readouterr().out
    systems = sst.DEFAULT_SYSTEMS.split(",")
    check_rows(text, systems, 1)
    assert "n/a" not in text  # every combination is accepted today; a refusal would need its footnote
    vals = {r[0]: r for r in tables(text)[next(iter(tables(text)))]}
    assert float(vals["vllm"][1]) > 0 and float(vals["1p1d"][1]) > 0
    written = page.read_text()
    assert written.startswith("before\n") and written.endswith("after\n") and "stale" not in written
    assert BLOCK.search(written).group(2) == text
    drawn = json.loads(fig.with_suffix(".json").read_text())
    assert fig.stat().st_size > 0 and len(drawn) == 1
    assert drawn[0]["bars"]["no offload"]["x"] == systems


REAL_SESSIONS = ROOT.parent / "shared" / "external-traces" / "agentcgroup" / "experiments"  # the team's copy


@pytest.mark.skipif(not REAL_SESSIONS.is_dir(), reason="needs ../shared/external-traces")
def test_real_cell_is_built_in_a_temporary_directory(capsys):
    text = sst.main(["--cells", "real:26124:0.3:3", "--systems", "vllm,1p1d", "--workers", "1", "--real-sessions", str(REAL_SESSIONS)])
    check_rows(text, ["vllm", "1p1d"], 1)
    assert "Table: real Claude Code sessions (AgentCgroup, resampled), 3 programs" in text
    assert not list(ROOT.rglob("real300.parquet"))  # the GPL-derived trace never lands in the repository


def test_the_page_holds_the_default_command_s_block():
    text = PAGE.read_text()
    blocks = dict(BLOCK.findall(text))
    assert len(blocks) == len(BLOCK.findall(text))  # no key marked twice
    default = sst.table_key(sst.parse_args([]))
    assert default in blocks  # what `--write-docs` with no other flag replaces
    reading = (ROOT / "docs" / "serving_systems.md").read_text()  # the page that summarises the tables
    assert "python benchmarks/serving_systems_table.py --write-docs\n" in reading
    assert (ROOT / "docs" / "figures" / "serving_systems.png").is_file() and "figures/serving_systems.png" in reading
    for key, body in blocks.items():  # every block in the script's format, as its key defines it
        a = sst.parse_args(key.split())
        cells = [sst.parse_cell(c) for c in a.cells]
        check_rows(body, a.systems.split(","), sum(len(loads) for _, _, loads, _ in cells),
                   cols=1 + (7 if "gpu" in a.tiers else 0) + (4 if "cpu" in a.tiers else 0))
        assert body.startswith(f"Profile `{a.profile}`")


def test_the_docs_figure_is_drawn_only_for_the_default_tables_written_into_the_docs_page(tmp_path):
    # benchmarks/docs_tables.py --check writes the default tables into a scratch page: the
    # docs' figure must stay as it is then
    assert sst.figure_path(sst.parse_args(["--write-docs"])) == str(sst.FIGURE)
    assert sst.figure_path(sst.parse_args(["--write-docs", str(tmp_path / "serving_systems.md")])) is None
    assert sst.figure_path(sst.parse_args(["--quick", "--write-docs"])) is None
    assert sst.figure_path(sst.parse_args([])) is None
    assert sst.figure_path(sst.parse_args(["--figure", str(tmp_path / "f.png")])) == str(tmp_path / "f.png")


def test_the_real_cell_without_its_folder_names_the_flag(monkeypatch):
    monkeypatch.delenv(sst.REAL_SESSIONS_ENV, raising=False)
    with pytest.raises(SystemExit, match="give --real-sessions DIR or set AGENTCGROUP_EXPERIMENTS"):
        sst.main(["--cells", "real:26124:0.3:3", "--systems", "vllm", "--workers", "1"])
