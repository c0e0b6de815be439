"""Prefix sharing by content on the real engine: the replay sends equal token ids for
equal segments, and vLLM's prefix cache serves them as the simulator says, call by call."""
import gc

import numpy as np
import pandas as pd
import pytest

from calibrate.engine import bundled_profile_name, default_model, start_engine
from calibrate.limits import read_limits
from calibrate.replay import TraceReplay, replay_in_process
from sim.hardware.profile import load_profile
from conftest import simulate
from traces.schema import validate

pytestmark = pytest.mark.engine

TURNS = [(300, 12, "ls", 0.2), (40, 8, "cat", 0.2), (90, 6, None, None)]


def trace() -> pd.DataFrame:
    """Three identical programs (same segments every turn), one that shares only the
    system prompt, one whose content is unknown (unique)."""
    rows = []
    for p, kind in enumerate(["same", "same", "same", "system-only", "unknown"]):
        for t, (inp, out, tool, dur) in enumerate(TURNS):
            if kind == "unknown":
                segs = None
            elif t == 0:
                segs = [{"id": "system", "tokens": 200}, {"id": "task" if kind == "same" else f"task{p}", "tokens": inp - 200}]
            else:
                segs = [{"id": f"result{t}" if kind == "same" else f"result{t}-{p}", "tokens": inp}]
            rows.append({"program_id": f"p{p}", "turn": t, "new_input_tokens": inp, "output_tokens": out, "tool": tool,
                         "tool_duration_s": np.nan if dur is None else dur, "segments": segs})
    return validate(pd.DataFrame(rows))


def test_cached_tokens_per_call_match_the_simulator():
    tr = trace()
    arrivals = np.arange(5) * 4.0  # one program at a time: the cache, not the timing, decides
    llm = start_engine(default_model("cpu"), "cpu", num_gpu_blocks=400, max_model_len=4096)
    try:
        limits = read_limits(llm)["engine"]
        replay = TraceReplay(tr, arrivals, llm.llm_engine.vllm_config.model_config.get_vocab_size(), seed=0)
        replay_in_process(llm, replay)
        real, _ = replay.tables()
    finally:
        del llm
        gc.collect()
    profile = load_profile(bundled_profile_name(default_model("cpu")))
    sim = simulate(tr, "vllm", profile, arrivals, num_gpu_blocks=limits["num_gpu_blocks"],
                   enable_chunked_prefill=bool(limits["enable_chunked_prefill"]),
                   **{k: limits[k] for k in ("block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len")}).turns
    key = ["program_id", "turn"]
    both = real[key + ["cached_tokens"]].merge(sim[key + ["cached_tokens"]], on=key, suffixes=("", "_sim")).set_index(key)
    print(both.to_string())
    assert both["cached_tokens"].tolist() == both["cached_tokens_sim"].tolist()
    c = both["cached_tokens"]
    # the copies are served from p0's blocks on every call; the others share at most the system prompt
    bs = limits["block_size"]
    assert c[("p1", 0)] == c[("p2", 0)] == (300 - 1) // bs * bs > 0
    assert c[("p3", 0)] == 200 // bs * bs and c[("p4", 0)] == 0
    assert (c.loc["p1"] >= c.loc["p0"]).all() and c.loc["p1"].sum() > c.loc["p0"].sum()
