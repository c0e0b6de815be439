"""The replay client against a real OpenAI-compatible vLLM server running the policy
adapter (`--scheduler-cls`, `--additional-config`), as a user would deploy it."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from calibrate.engine import default_model, engine_dtype
from calibrate.replay import TraceReplay, replay_server
from calibrate.validate import fit_trace
from traces.schema import read_trace

MODEL = default_model("cpu")

pytestmark = pytest.mark.engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
           "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", engine_dtype("cpu"), "--enforce-eager",
           "--kv-cache-memory-bytes", str(1 << 30), "--num-gpu-blocks-override", "48", "--max-model-len", "4096",
           "--enable-prefix-caching", "--enable-prompt-tokens-details", "--port", str(port),
           "--scheduler-cls", "sim.vllm_scheduler.PolicyScheduler",
           "--additional-config", json.dumps({"agentsim": {"policy": "continuum"}})]
    proc = subprocess.Popen(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(180):
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, "the vLLM server exited during start-up"
                time.sleep(1)
        else:
            pytest.fail("the vLLM server did not come up in 180 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_replay_against_a_server(server):
    trace = fit_trace(read_trace("swebench")[0], programs=3, max_turns=3, max_context=1500, max_output=8,
                      max_tool_s=0.5)
    replay = TraceReplay(trace, np.array([0.0, 0.3, 0.6]), 32000, seed=0)
    replay_server(server, str(MODEL), replay)
    turns, progs = replay.tables()
    assert len(turns) == len(trace) and len(progs) == 3
    # each turn's prompt = previous prompt + the 8 tokens returned + the turn's new input
    for pid, g in turns.groupby("program_id"):
        new = trace[trace["program_id"] == pid].sort_values("turn")["new_input_tokens"].to_numpy()
        assert np.array_equal(np.diff(g["prompt_tokens"].to_numpy()), new[1:] + 8)
    assert (progs["jct"] > 0).all() and (turns["finish"] > turns["arrival"]).all()
    assert (turns.loc[turns["turn"] > 0, "cached_tokens"] > 0).all()  # the context came back from cache
