"""Golden runs: a few fixed small `sim run`s whose summaries must be reproduced exactly.

They guard refactors (config, scheduler, pins, profile types) against changing simulator
results: every float is compared exactly, since a run is deterministic. The stored JSON
under tests/fixtures/golden/ was written by the code before those refactors. The summary
is compared on the keys stored: a key added to the summary later is a new figure, not a
changed result (its own tests cover it).

Regenerate with

    python tests/test_golden_runs.py --regenerate [NAME ...]

only when a change is *meant* to alter results (a bug fix in the model), and say which
change and why in the commit message: a regenerated file hides every other difference.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "fixtures" / "golden"

# contended pool (3000 blocks, 40 SWE-bench programs at 1 job/s: peak KV use 100%)
_SWE = ["--trace", "swebench", "--programs", "40", "--jps", "1", "--num-gpu-blocks", "3000"]
RUNS: dict[str, list[str]] = {
    "vllm": [*_SWE, "--policy", "vllm"],
    "continuum": [*_SWE, "--policy", "continuum"],
    "infercept_offload": [*_SWE, "--policy", "infercept", "--offload", "cpu:2GiB"],
    "thunderagent_bfcl": ["--trace", "bfcl", "--programs", "50", "--jps", "2", "--num-gpu-blocks", "8000",
                          "--policy", "thunderagent"],
    "static_ttl_replicas3_prefix": [*_SWE, "--policy", "static-ttl", "--policy-arg", "cold_tool_mean=2",
                                    "--replicas", "3", "--router", "prefix", "--seed", "5"],
    "fcfs_nochunk_limits": [*_SWE, "--policy", "program-fcfs", "--no-enable-chunked-prefill",
                            "--max-num-seqs", "32", "--max-num-batched-tokens", "16384"],
}
# content segments shared across programs (a system prompt, task texts, repeated tool
# results; built from 40 SWE-bench programs): prefix hits by content, radix cache, routers
_SEG = ["--trace", "tests/fixtures/golden/segments_trace.parquet", "--jps", "1", "--num-gpu-blocks", "3000"]
RUNS.update({
    "segments_continuum": [*_SEG, "--policy", "continuum"],
    "segments_radix_cache_aware": [*_SEG, "--policy", "continuum", "--cache", "radix", "--router", "cache_aware", "--replicas", "2"],
    "disagg_1p1d_continuum": [*_SWE, "--policy", "continuum", "--disagg", "1P1D"],
    "contextserve_replicas4_session": [*_SWE, "--policy", "contextserve", "--replicas", "4", "--router", "session",
                                       "--num-gpu-blocks", "1200", "--offload", "cpu:1GiB"],
})
_WALL = ("wall_s", "sim_s_per_wall_s")  # wall-clock figures: not part of the result


def _main():
    try:
        from agentsim.cli import main
    except ImportError:  # before the CLI left sim/
        from sim.cli import main
    return main


def golden_run(name: str, tmp: Path) -> dict:
    """The run's summary (minus wall-clock figures) and its per-program JCTs."""
    import pandas as pd

    out = tmp / name
    root = GOLDEN.parents[2]  # fixture paths are relative to the repository, wherever it is cloned
    args = [str(root / a) if a.startswith("tests/") else a for a in RUNS[name]]
    rc = _main()(["run", *args, "--no-progress", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    for k in _WALL:
        summary.pop(k)
    if summary.get("trace", "").startswith(str(root)):
        summary["trace"] = str(Path(summary["trace"]).relative_to(root))
    progs = pd.read_parquet(out / "programs.parquet")
    return {"args": RUNS[name], "summary": summary,
            "program_jct": dict(zip(progs["program_id"].astype(str), progs["jct"].astype(float)))}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_run_reproduced_exactly(name, tmp_path):
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    got = json.loads(json.dumps(golden_run(name, tmp_path)))  # the same JSON round trip as the stored file
    assert got["args"] == want["args"], "RUNS changed: regenerate (see the module docstring)"
    assert got["program_jct"] == want["program_jct"]
    missing = set(want["summary"]) - set(got["summary"])
    assert not missing, f"summary keys dropped: {sorted(missing)}"
    assert same_as_golden(got, want)


def same_as_golden(got: dict, want: dict) -> bool:
    """A run reproduces its fixture: the same arguments and program JCTs, and the fixture's
    summary keys, exactly; keys added to the summary since it was written (vLLM's request
    metrics, closed-loop rates) are covered by their own tests, not here."""
    return (got["args"] == want["args"] and got["program_jct"] == want["program_jct"]
            and {k: got["summary"].get(k) for k in want["summary"]} == want["summary"])


def test_golden_runs_are_contended():
    """A golden run on an idle pool would not notice a broken retention policy."""
    for name in RUNS:
        s = json.loads((GOLDEN / f"{name}.json").read_text())["summary"]
        assert s["peak_kv_usage"] >= 0.9, name


def regenerate(names: list[str]) -> None:
    import tempfile

    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for name in names or sorted(RUNS):
            (GOLDEN / f"{name}.json").write_text(json.dumps(golden_run(name, Path(d)), indent=1, sort_keys=True) + "\n")
            print(f"wrote {GOLDEN / name}.json")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "--regenerate":
        sys.exit("usage: python tests/test_golden_runs.py --regenerate [NAME ...]  (needs a reason: see the docstring)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    regenerate(sys.argv[2:])
