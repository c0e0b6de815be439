"""The replay client against a real OpenAI-compatible vLLM server running the policy
adapter (`--scheduler-cls`, `--additional-config`), as a user would deploy it."""
import json

import numpy as np
import pytest

from calibrate.engine import default_model
from calibrate.replay import TraceReplay, replay_server
from calibrate.validate import fit_trace
from conftest import vllm_server
from traces.schema import read_trace

MODEL = default_model("cpu")

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server():
    with vllm_server(MODEL, "--skip-tokenizer-init", "--num-gpu-blocks-override", "48", "--max-model-len", "4096",
                     "--enable-prefix-caching", "--enable-prompt-tokens-details",
                     "--scheduler-cls", "sim.vllm_scheduler.PolicyScheduler",
                     "--additional-config", json.dumps({"agentsim": {"policy": "continuum"}}), start_s=180) as url:
        yield url


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
