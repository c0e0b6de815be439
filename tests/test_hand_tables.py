"""The reference tables once copied by hand, now written by the scripts that own their
numbers: each marked block is what its script makes from its source (a profile, SHAPES,
a stored report or run file, `sim plan`'s output), and a changed source changes it."""
import difflib
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import docs_tables, fit_error_table, plan_table, ranking_fidelity, scheduler_overhead

ROOT = Path(__file__).resolve().parents[1]


def blocks(name: str) -> list:
    found = [b for b in docs_tables.marked_blocks() if b.name == name]
    assert found, f"no {name} block on the docs pages"
    return found


def flag(key: str, name: str) -> str | None:
    toks = shlex.split(key)
    return toks[toks.index(name) + 1] if name in toks else None


def test_the_fit_error_tables_are_the_bundled_profiles():
    got = {b.key: b.body for b in blocks("fit_error_table")}
    assert set(got) == {"--table default", "--table calibration"}
    assert all(b.page.name == "profiles.md" for b in blocks("fit_error_table"))
    for key, body in got.items():
        assert body == fit_error_table.TABLES[flag(key, "--table")](), key


def test_a_changed_fit_error_changes_the_tables(tmp_path, monkeypatch):
    for name in ("llama3.1-8b-h100", "llama3.1-8b-h100-torch", "cpu-tiny-llama", "cpu-micro-llama"):
        p = json.loads((fit_error_table.BUNDLED_DIR / f"{name}.json").read_text())
        p["fit_error"]["heldout_mixed" if name == "llama3.1-8b-h100" else "step_model_mape"] = 42.42
        p["provenance"]["total_calibration_s"] = 3000.0
        (tmp_path / f"{name}.json").write_text(json.dumps(p))
    monkeypatch.setattr(fit_error_table, "BUNDLED_DIR", tmp_path)
    default = fit_error_table.default_table()
    assert "| 1.69 | 2.4 | 4.19 | 2.84 | 2.6 | 1.6 | 42.42 | 2.03 |" in default and "| GPU step model | 42.42 |" in default
    rows = [r for r in fit_error_table.calibration_table().split("\n") if r.startswith(("| vllm-cpu", "| the same"))]
    assert len(rows) == 2 and all("| 50 minutes | 42.4% (" in r for r in rows)


def test_the_validation_tables_are_shapes_and_the_stored_report():
    got = {b.key: b.body for b in blocks("ranking_fidelity")}
    assert {flag(k, "--table") for k in got} == {"shapes", "bfcl", "swebench", "rankings"}
    for key, body in got.items():
        assert (key, body) == ranking_fidelity.table(flag(key, "--table"), flag(key, "--report") or ranking_fidelity.REPORT)


def test_the_shapes_table_follows_shapes(monkeypatch):
    shapes = dict(ranking_fidelity.SHAPES)
    shapes["swebench"] = replace(shapes["swebench"], programs=8, max_turns=2, tool_scale=0.5)
    monkeypatch.setattr(ranking_fidelity, "SHAPES", shapes)
    row = next(r for r in ranking_fidelity.shapes_table().split("\n") if r.startswith("| swebench |"))
    assert row.startswith("| swebench | the first 8 SWE-bench | 2 | ") and "| x 0.5, capped at 4 s |" in row
    assert row.endswith("| 16 |")  # 8 programs x 2 turns


def test_the_rankings_are_recomputed_from_the_report_rows(tmp_path):
    stored = json.loads((ROOT / ranking_fidelity.REPORT).read_text())
    bfcl = stored["shapes"]["bfcl"]["policies"]
    bfcl["vllm"]["real"]["mean_jct"] = 1.0  # now the fastest on the real side
    # a run's own report.json keeps victim and discarded pins apart: the same table
    for side in ("real", "sim"):
        d = bfcl["oracle"][side]
        d["pins_victim"], d["pins_discarded"] = d.pop("pins_dropped") - 1, 1
    path = tmp_path / "report.json"
    path.write_text(json.dumps(stored))
    rankings = ranking_fidelity.table("rankings", str(path))[1]
    assert "| BFCL | vllm < oracle < " in rankings
    old = ranking_fidelity.table("bfcl", ranking_fidelity.REPORT)[1].split("\n")
    new = ranking_fidelity.table("bfcl", str(path))[1].split("\n")
    changed = [(a, b) for a, b in zip(old[2:], new[2:]) if a != b]
    assert [b.split(" | ")[0] for _, b in changed] == ["| vllm"] and "| 1.00 |" in changed[0][1]


def test_the_adapter_overhead_table_is_the_stored_runs(tmp_path):
    (b,) = blocks("scheduler_overhead")
    assert b.page.name == "validation.md" and flag(b.key, "--runs") == scheduler_overhead.RUNS
    assert b.body == scheduler_overhead.main(shlex.split(b.key))
    runs = json.loads((ROOT / scheduler_overhead.RUNS).read_text())
    runs["runs"][1]["policies"]["continuum"]["whole_pct"] = 12.3
    runs["runs"][1]["vllm_scheduler_us"]["median"] = 300
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    text = scheduler_overhead.main(["--runs", str(path), "--table"])
    assert "| `continuum` | the same 912 as `program-fcfs` | **+8.9% / +8.8%; +12.3% / +9.5%** |" in text
    assert "(vLLM's Scheduler: 255-300 us median, 322-350 us mean per step there)" in text


def test_plan_table_writes_what_sim_plan_prints_on_a_small_question(tmp_path, capsys):
    question = tmp_path / "q.md"
    question.write_text("# Q\n\n    sim plan --trace swebench --programs 12 --jps 1.0 --slo 'p95_jct<=600' --gpu H100 \\\n"
                        "             --policy vllm --router session --workers 1 --out out/q\n")
    page = tmp_path / "planning.md"
    key = f"--page {question}"
    page.write_text(f"before\n\n<!-- plan_table: {key} -->\n\nold\n\n<!-- end plan_table -->\n")
    text = plan_table.main(["--page", str(question), "--write-docs", str(page)])
    assert text in capsys.readouterr().out
    assert page.read_text() == f"before\n\n<!-- plan_table: {key} -->\n\n{text}\n\n<!-- end plan_table -->\n"
    assert "\nPlan: trace swebench (first 12 programs), 1 programs/s, SLO p95_jct<=600" in text and "\nAnswer: " in text
    assert "| 1 | H100 | llama3.1-8b | 1 | vllm | none | session |" in text
    assert "sim plan --trace" not in text and not re.search(r"candidates? in [\d.]+ s", text)


def test_the_plan_on_the_page_is_what_sim_plan_prints_now(capsys):
    """The documented question run whole (one to two minutes on 2 cores)."""
    (b,) = blocks("plan_table")
    assert b.page.name == "planning.md" and b.body.split("\n")[2].startswith("Plan: trace swebench")
    got = plan_table.main([])
    assert got == b.body, "\n".join(difflib.unified_diff(b.body.split("\n"), got.split("\n"), "page", "now", lineterm=""))


@pytest.mark.engine
def test_record_stores_a_run_the_table_reads(tmp_path):
    """scheduler_overhead.py --record on vLLM's own scheduler (one round, about a minute):
    the figures it printed land in --runs, and --table shows them."""
    runs = tmp_path / "runs.json"
    scheduler_overhead.main(["--model-free-rounds", "1", "--policies", "vllm", "--record", "--runs", str(runs)])
    (run,) = json.loads(runs.read_text())["runs"]
    assert run["rounds"] == 1 and run["steps"] == run["policies"]["vllm"]["steps"] > 0
    assert run["policies"]["vllm"]["same_steps"] is not None and run["vllm_scheduler_us"]["median"] > 0
    text = scheduler_overhead.main(["--runs", str(runs), "--table"])
    row = next(r for r in text.split("\n") if r.startswith("| `vllm` ("))
    assert f"{run['vllm_scheduler_us']['median']} us median" in row and "| vLLM's, step for step |" in row
