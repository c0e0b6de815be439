"""benchmarks/server_time.py: the API server's time a client sees. Its --concurrency mode
measures on a real CPU vLLM API server that a first token waits behind the tokens the
server streams to the requests already running (what sim/run/metrics.outputs_ahead charges)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import server_time  # noqa: E402
from conftest import assert_script_refuses  # noqa: E402


@pytest.mark.parametrize("argv, says", [
    (["--concurrency", "5"], "at least two different counts"),
    (["--concurrency", "0,x"], "comma-separated whole numbers"),
    (["--concurrency", "0,-4"], "none negative"),
    (["--record", "r.json"], "--record applies only with --concurrency"),
    (["--concurrency", "0,8", "--host-cpu-factor", "2"], "--host-cpu-factor goes with the one-request-at-a-time"),
    (["--concurrency", "0,8", "--into", "cpu-micro-llama", "--out", "p.json"], "no `server` section to add to"),
])
def test_bad_flags_refused(argv, says, monkeypatch, capsys, tmp_path):
    assert_script_refuses(server_time.main, argv, says, monkeypatch, capsys, tmp_path)  # nothing written


def test_recorded_wait_per_stream_ahead_is_the_server_sections():
    """The stored --concurrency record's fit is its rows', and the server section the judge uses carries that
    run's wait per stream ahead (`--concurrency --record FILE --into P --out P`), measured apart from the
    one-request-at-a-time fields, which cannot see it: one request at a time the API server keeps up."""
    ahead = json.loads((ROOT / "benchmarks/host/server-ahead.json").read_text())
    server = json.loads((ROOT / "benchmarks/host/cpu-micro-llama-server.json").read_text())["server"]
    a = np.array(ahead["rows"])
    assert len(a) >= 20 and set(ahead["columns"]) == {"running_streams", "client_ttft_s", "server_ttft_s"}
    (gap0, per), *_ = np.linalg.lstsq(np.c_[np.ones(len(a)), a[:, 0]], a[:, 1] - a[:, 2], rcond=None)
    assert per == pytest.approx(ahead["per_output_ahead_s"], rel=1e-3)  # the record's fit is its rows'
    assert server["per_output_ahead_s"] == ahead["per_output_ahead_s"] and ahead["source"] in server["ahead_measured"]
    assert server["per_output_ahead_s"] > 2 * server["per_output_token_s"]


@pytest.mark.engine
def test_a_first_token_waits_behind_running_streams():
    r = server_time.measure_ahead([0, 24], 5)
    a = np.array(r["rows"])
    gap = {n: np.median(a[a[:, 0] == n, 1] - a[a[:, 0] == n, 2]) for n in (0, 24)}
    assert len(a) >= 8
    assert gap[24] - gap[0] > 24 * 40e-6, gap  # 139-169 us a stream measured on a 2-core EPYC: a third of that at least
    assert r["per_output_ahead_s"] > 40e-6
