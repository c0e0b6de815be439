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
    (["--concurrency", "5"], "at least two different counts above 0"),
    (["--concurrency", "0,8"], "at least two different counts above 0"),
    (["--concurrency", "0,x"], "comma-separated whole numbers"),
    (["--concurrency", "8,16,-4"], "none negative"),
    (["--record", "r.json"], "--record applies only with --concurrency"),
    (["--concurrency", "0,8,16", "--host-cpu-factor", "2"], "--host-cpu-factor goes with the one-request-at-a-time"),
    (["--concurrency", "0,8,16", "--into", "cpu-micro-llama", "--out", "p.json"], "no `server` section to add to"),
])
def test_bad_flags_refused(argv, says, monkeypatch, capsys, tmp_path):
    assert_script_refuses(server_time.main, argv, says, monkeypatch, capsys, tmp_path)  # nothing written


def test_recorded_wait_per_stream_ahead_is_the_server_sections():
    """The stored --concurrency record's fits are its rows', and the server section the judge uses carries that
    run's wait per stream ahead (`--concurrency --record FILE --into P --out P`): the API server's own CPU time
    per stream and step, measured apart from the one-request-at-a-time fields, which cannot see it (one request
    at a time the API server keeps up)."""
    ahead = json.loads((ROOT / "benchmarks/host/server-ahead.json").read_text())
    server = json.loads((ROOT / "benchmarks/host/cpu-micro-llama-server.json").read_text())["server"]
    a, c = np.array(ahead["rows"]), np.array(ahead["cpu_rows"])
    assert len(a) >= 20 and ahead["columns"] == ["running_streams", "client_ttft_s", "server_ttft_s"]
    assert ahead["cpu_columns"] == ["running_streams", "api_server_cpu_per_step_s"] and len(set(c[:, 0])) >= 2
    (_, gap_per), *_ = np.linalg.lstsq(np.c_[np.ones(len(a)), a[:, 0]], a[:, 1] - a[:, 2], rcond=None)
    (_, cpu_per), *_ = np.linalg.lstsq(np.c_[np.ones(len(c)), c[:, 0]], c[:, 1], rcond=None)
    assert gap_per == pytest.approx(ahead["gap_per_stream_s"], rel=1e-3)  # the record's fits are its rows'
    assert cpu_per == pytest.approx(ahead["per_output_ahead_s"], rel=1e-3)
    assert server["per_output_ahead_s"] == ahead["per_output_ahead_s"] and ahead["source"] in server["ahead_measured"]
    assert server["per_output_ahead_s"] > 2 * server["per_output_token_s"]


@pytest.mark.engine
def test_a_first_token_waits_behind_running_streams(start_environ):
    """On a real vLLM API server: a probe's first token reaches the client later the more requests stream
    beside it, and the API server's own CPU time per step grows with the streams it serves."""
    r = server_time.measure_ahead([0, 8, 24], 5, window_s=8.0)
    a, cpu = np.array(r["rows"]), dict(r["cpu_rows"])
    gap = {n: np.median(a[a[:, 0] == n, 1] - a[a[:, 0] == n, 2]) for n in (0, 24)}
    assert len(a) >= 12 and set(cpu) == {8, 24}
    assert gap[24] - gap[0] > 24 * 20e-6, gap  # 54-78 us of API server CPU a stream on a 2-core EPYC
    assert cpu[24] - cpu[8] > 16 * 25e-6, cpu
    assert 25e-6 < r["per_output_ahead_s"] < 400e-6
