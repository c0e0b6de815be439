"""Results tables written into the docs by their scripts (benchmarks/docs_tables.py):
`rebuild_priced_ttl_table.py --write-docs` on a tiny run into a copy of docs/reference/policies.md,
and the page's marked tables against the script's format."""
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from benchmarks import docs_tables  # noqa: E402
from benchmarks import rebuild_priced_ttl_table as rpt  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "policies.md"
TINY = ["--cells", "swebench:3000:0.5", "--programs", "5", "--seeds", "0", "--tiers", "gpu",
        "--policies", "rebuild-priced-ttl,vllm"]
TINY_KEY = "--cells swebench:3000:0.5 --programs 5 --seeds 0 --offload cpu:100GiB --tiers gpu --policies rebuild-priced-ttl,vllm"


def test_write_docs_replaces_only_its_table(tmp_path, capsys):
    page = tmp_path / "policies.md"
    before = PAGE.read_bytes()
    start, end = f"<!-- rebuild_priced_ttl_table: {TINY_KEY} -->".encode(), b"<!-- end rebuild_priced_ttl_table -->"
    page.write_bytes(before + b"\n" + start + b"\n\nstale\n\n" + end + b"\n")
    rpt.main([*TINY, "--write-docs", str(page)])
    printed = capsys.readouterr().out
    after = page.read_bytes()
    assert after.startswith(before + b"\n" + start) and after.endswith(end + b"\n")
    body = after[len(before) + 1 + len(start):-len(end) - 1].decode()
    assert body.strip() in printed and "stale" not in body
    assert body.startswith("\n\nTable: swebench, 5 programs, 3000 KV blocks, mean over seeds 0;")
    assert "| rebuild-priced-ttl | " in body and "| vllm | " in body and "| gain of rebuild-priced-ttl | " in body
    rpt.main([*TINY, "--write-docs", str(page)])  # the same run again: nothing moves
    assert page.read_bytes() == after


def test_an_unmarked_table_is_refused_and_the_page_kept(tmp_path):
    page = tmp_path / "policies.md"
    shutil.copy(PAGE, page)
    with pytest.raises(SystemExit, match="marked tables: .*--cells bfcl:12000:0.2,0.3"):
        docs_tables.write_block(page, "rebuild_priced_ttl_table", TINY_KEY, "x")
    assert page.read_bytes() == PAGE.read_bytes()


def test_the_policies_page_marks_each_table_in_the_scripts_format():
    text = PAGE.read_text()
    blocks = re.findall(r"^<!-- rebuild_priced_ttl_table: (.*?) -->\n\n(.*?)\n\n<!-- end rebuild_priced_ttl_table -->$",
                        text, re.S | re.M)
    assert len(blocks) == 5
    for key, body in blocks:
        a = dict(re.findall(r"--([\w-]+) (\S+)", key))
        trace, blocks_, loads = a["cells"].rsplit(":", 2)
        head, rows = body.split("\n\n", 1)
        assert head.startswith(f"Table: {Path(trace).name}, {a['programs']} programs, {blocks_} KV blocks, "
                               f"mean over seeds {a['seeds']}; mean JCT (p95) in s; cpu = offload {a['offload']}")
        cols = [f"JPS {j} {t}" for j in loads.split(",") for t in a["tiers"].split(",")]
        assert rows.split("\n")[0] == "| policy | " + " | ".join(cols) + " |"
        assert [r.split(" | ")[0] for r in rows.split("\n")[2:]] == [
            "| " + ("infercept (no oracle)" if p == "infercept" else p) for p in a.get("policies", rpt.POLICIES).split(",")] + [
            "| gain of rebuild-priced-ttl"]


def test_infercept_ablation_writes_its_table_and_the_results_page_marks_it(tmp_path, capsys):
    from benchmarks import infercept_ablation as ia

    results = ROOT / "docs" / "reference" / "results.md"
    marked = re.findall(r"^<!-- infercept_ablation: (.*?) -->\n\n(Table: .*?)\n\n<!-- end infercept_ablation -->$",
                        results.read_text(), re.S | re.M)
    assert len(marked) == 1
    key, body = marked[0]
    assert body.split("\n")[0] == "Table: profile `llama3.1-8b-h100`, no offload, 300 programs, mean JCT (s) over seeds 0,1,2"
    assert [r.split(" | ")[0][2:] for r in body.split("\n")[4:]] == [label for label, _, _ in ia.variants("--one-on" in key)]
    tiny = ["--traces", "swebench", "--programs", "4", "--num-gpu-blocks", "3000", "--jps", "0.5", "--seeds", "0"]
    tiny_key = "--traces swebench --programs 4 --num-gpu-blocks 3000 --jps 0.5 --seeds 0 --profile llama3.1-8b-h100"
    page = tmp_path / "results.md"
    page.write_text(f"before\n<!-- infercept_ablation: {tiny_key} -->\nold\n<!-- end infercept_ablation -->\nafter\n")
    text = ia.main([*tiny, "--write-docs", str(page)])
    assert text in capsys.readouterr().out
    assert page.read_text() == (f"before\n<!-- infercept_ablation: {tiny_key} -->\n\n{text}\n\n"
                                "<!-- end infercept_ablation -->\nafter\n")
    assert "| infercept, all off (= continuum) | " in text


def test_offload_table_writes_its_tables_and_the_results_page_marks_them(tmp_path, capsys):
    from benchmarks import offload_table as ot

    results = (ROOT / "docs" / "reference" / "results.md").read_text()
    marked = re.findall(r"^<!-- offload_table: (.*?) -->\n\n(Table: .*?)\n\n<!-- end offload_table -->$", results, re.S | re.M)
    assert len(marked) == 2  # the bundled traces with the GPU-memory sweep; the real sessions
    key, body = next(m for m in marked if "--traces swebench,bfcl" in m[0])
    a = dict(re.findall(r"--([\w-]+) (\S+)", key))
    assert body.startswith(f"Table: {a['programs']} programs per trace, JPS swebench 0.25, bfcl 0.12, seed {a['seed']}; "
                           f"profile `{a['profile']}` with {a['num-gpu-blocks']} GPU KV blocks")
    assert [r.split(" | ")[0][2:] for r in body.split("\n") if r.startswith("| ") and "(" not in r.split(" | ")[0]
            and r.split(" | ")[0] != "| policy"] == a["policies"].split(",")
    assert body.count("\n| ") - 2 == len(a["policies"].split(",")) + len(a["sweep-blocks"].split(","))
    tiny = ["--programs", "4", "--traces", "swebench", "--jps", "0.5", "--policies", "vllm,continuum",
            "--sweep-blocks", "3000", "--workers", "1"]
    page = tmp_path / "results.md"
    args = ot.main([*tiny])  # the text it prints
    tiny_key = ("--programs 4 --traces swebench --jps 0.5 --num-gpu-blocks 6000 --offload cpu:100GB --policies vllm,continuum "
                "--sweep-trace swebench --sweep-blocks 3000 --seed 0 --profile llama3.1-8b-h100")
    page.write_text(f"<!-- offload_table: {tiny_key} -->\nold\n<!-- end offload_table -->\n")
    text = ot.main([*tiny, "--write-docs", str(page)])
    assert text == args and text in capsys.readouterr().out
    assert page.read_text() == f"<!-- offload_table: {tiny_key} -->\n\n{text}\n\n<!-- end offload_table -->\n"
    assert "Table: GPU memory sweep, swebench at JPS 0.5, 4 programs, seed 0" in text


def test_sim_speed_writes_its_table_and_the_results_page_marks_it(tmp_path, capsys):
    """benchmarks/sim_speed.py on a tiny point against HEAD (the same code: same steps and
    mean JCT), its table written into a page; the results page holds a written table."""
    from benchmarks import sim_speed

    results = (ROOT / "docs" / "reference" / "results.md").read_text()
    marked = re.findall(r"^<!-- sim_speed: (.*?) -->\n\n(.*?)\n\n<!-- end sim_speed -->$", results, re.S | re.M)
    assert marked
    for _, body in marked:
        assert body.startswith("baseline ") and "| **ratio** |" in body
        ratios = [r for r in body.split("\n") if "| **ratio** |" in r]
        assert all(r.endswith("same steps and mean JCT: True |") for r in ratios)
    page = tmp_path / "results.md"
    key = "--baseline HEAD --reps 1 --points 1x4 --policies vllm"
    page.write_text(f"<!-- sim_speed: {key} -->\nold\n<!-- end sim_speed -->\n")
    text = sim_speed.main(["--baseline", "HEAD", "--reps", "1", "--points", "1x4", "--policies", "vllm", "--write-docs", str(page)])
    assert text in capsys.readouterr().out
    assert page.read_text() == f"<!-- sim_speed: {key} -->\n\n{text}\n\n<!-- end sim_speed -->\n"
    rows = [r for r in text.split("\n") if r.startswith("| vllm | 1x4 |")]
    assert [r.split("|")[4].strip() for r in rows] == ["baseline", "current", "**ratio**"]
    assert rows[2].endswith("same steps and mean JCT: True |")
    # the baseline ran with its compiled parts built, as an installed tree runs
    assert list((sim_speed.worktree("HEAD") / "sim").rglob("_block_pool*.so"))


def test_redo_checks_a_marked_table_against_its_command_and_skips_what_it_cannot_run(tmp_path):
    """benchmarks/docs_tables.py: write mode puts the command's table in; --check then finds
    it current, finds a planted number stale (exit 1) and leaves the page as it was; a
    timing table and one whose input file is missing are skipped, each with why."""
    key = "--trace swebench --programs 6 --num-gpu-blocks 2000 --concurrency 2 --policies vllm --profile llama3.1-8b-h100"
    page = tmp_path / "results.md"
    page.write_text(f"# R\n\n<!-- closed_loop_table: {key} -->\n\nold\n\n<!-- end closed_loop_table -->\n\n"
                    "<!-- sim_speed: --baseline HEAD --reps 1 -->\n\nx\n\n<!-- end sim_speed -->\n\n"
                    "<!-- policy_table: --trace /no/such.parquet --programs 5 -->\n\ny\n\n<!-- end policy_table -->\n\n"
                    "<!-- rebuild_priced_ttl_table: --cells /no/cell.parquet:100:0.1 -->\n\nz\n\n"
                    "<!-- end rebuild_priced_ttl_table -->\n")
    said = []
    assert docs_tables.redo(False, docs=tmp_path, out=said.append) == 0
    body = next(b.body for b in docs_tables.marked_blocks(tmp_path) if b.name == "closed_loop_table")
    assert body != "old" and "| 2 |" in body
    assert any(s.startswith("skipped") and "policy_table: /no/such.parquet is missing" in s for s in said)
    assert any(s.startswith("skipped") and "rebuild_priced_ttl_table: /no/cell.parquet is missing" in s for s in said)
    assert any(s.startswith("skipped") and "sim_speed: wall-clock timings" in s for s in said)
    said.clear()
    assert docs_tables.redo(True, docs=tmp_path, out=said.append) == 0
    assert [s.split()[0] for s in said if "closed_loop_table" in s] == ["current"]
    planted = page.read_text().replace(body, body.replace("| 2 |", "| 3 |", 1))
    page.write_text(planted)
    said.clear()
    assert docs_tables.redo(True, docs=tmp_path, out=said.append) == 1
    assert [s.split()[0] for s in said if "closed_loop_table" in s] == ["STALE"]
    assert page.read_text() == planted


def test_the_docs_tables_that_are_quick_to_redo_are_what_their_commands_give(monkeypatch):
    """The closed-loop, offload and profile-check tables redone by their markers' commands
    (about 80 s): a change of the simulator's results fails here until
    `python benchmarks/docs_tables.py` (or the one script) has rewritten the docs."""
    from agentsim.errors import InputError
    from sim.hardware.check import _aic

    try:  # the profile-check table has aiconfigurator rows: checked where the optional extra is installed
        _aic()
        with_aic = {"profile_check_table"}
    except InputError:
        with_aic = set()
    # tables of the real sessions (a trace built in /tmp, minutes each) are left to docs_tables.py
    real = docs_tables.missing_input
    monkeypatch.setattr(docs_tables, "missing_input", lambda key: ("/tmp/" if " /tmp/" in key else None) or real(key))
    said = []
    assert docs_tables.redo(True, only={"closed_loop_table", "offload_table"} | with_aic, out=said.append) == 0, said
    ran = [s for s in said if "/tmp/ is missing" not in s]
    assert len(ran) == 2 + len(with_aic), said
    assert all(s.startswith("current") for s in ran), said
    assert sum(s.startswith("current") for s in ran) >= 2, said


def test_the_measured_workload_tables_are_what_their_commands_give():
    """The tables of docs/reference/results.md on programs sampled from the shipped measured specs
    (`--trace spec:NAME`, `--table5-trace spec:NAME`, Fig. 9 loads `spec:NAME:JPS`), each
    redone by its marker's command (about a minute each on 2 cores)."""
    said = []
    measured = lambda b: b.page.name == "results.md" and "spec:" in b.key  # noqa: E731
    assert docs_tables.redo(True, only={"policy_table", "table5_fig9"}, out=said.append, select=measured) == 0, said
    assert len(said) >= 5 and all(s.startswith("current") for s in said), said
    assert {s.split()[2].rstrip(":") for s in said} >= {"policy_table", "table5", "fig9"}


def test_a_pages_second_table5_and_fig9_are_one_run_apart_from_the_first(tmp_path, monkeypatch):
    """Two table5/fig9 pairs on a page: the n-th table5 block and the n-th fig9 block are
    written by one run of table5_fig9.py with their two keys' flags (not all four's)."""
    import subprocess
    import sys

    k5 = ["--programs 3 --concurrency 2 --policies vllm", "--programs 3 --concurrency 2 --policies vllm --table5-trace spec:codex"]
    k9 = ["--fig9-programs 3 --loads swebench:0.5 --seeds 0", "--fig9-programs 3 --loads spec:codex:0.5 --seeds 0"]
    page = tmp_path / "results.md"
    page.write_text("".join(f"<!-- table5: {a} -->\n\nold\n\n<!-- end table5 -->\n\n<!-- fig9: {b} -->\n\nold\n\n"
                            f"<!-- end fig9 -->\n\n" for a, b in zip(k5, k9)))
    cmds, run = [], subprocess.run
    monkeypatch.setattr(docs_tables.subprocess, "run", lambda cmd, **kw: cmds.append(cmd) or run([sys.executable, "-c", ""], **kw))
    assert docs_tables.redo(True, only={"table5_fig9"}, docs=tmp_path, out=lambda s: None) == 0
    assert [" ".join(c[2:-2]) for c in cmds] == [f"{a} {b}" for a, b in zip(k5, k9)]


def test_every_marked_table_is_keyed_by_the_flags_that_redo_it():
    """A marker's key is the command line docs_tables.py runs the script with: flags, each
    `--name`, never a bare word the script would not parse."""
    blocks = docs_tables.marked_blocks()
    assert len(blocks) > 10
    for b in blocks:
        assert b.key.startswith("--"), (b.page.name, b.line, b.key)


def test_match_redoes_only_the_tables_whose_flags_contain_it(tmp_path, monkeypatch, capsys):
    """`docs_tables.py --match TEXT`: only markers whose flags contain TEXT are redone."""
    keys = [f"--trace swebench --programs {n} --num-gpu-blocks 2000 --concurrency 2 --policies vllm --profile llama3.1-8b-h100"
            for n in (5, 6)]
    (tmp_path / "results.md").write_text("".join(f"<!-- closed_loop_table: {k} -->\n\nold\n\n<!-- end closed_loop_table -->\n\n"
                                                 for k in keys))
    monkeypatch.setattr(docs_tables, "DOCS", tmp_path)
    assert docs_tables.main(["--match", "--programs 6"]) == 0
    bodies = {b.key: b.body for b in docs_tables.marked_blocks(tmp_path)}
    assert bodies[keys[0]] == "old" and bodies[keys[1]] != "old"
    assert "--programs 5" not in capsys.readouterr().out
