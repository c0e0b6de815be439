"""`--metrics-at engine|client`: the client view adds the profile's API-server time after
the run, from the engine's timestamps; the steps do not change."""
import json

import numpy as np
import pytest

from agentsim.cli import main
from agentsim.errors import InputError
from sim.hardware.profile import ServerTime, load_profile
from sim.run.config import SimConfig, build_run, execute
from sim.run.metrics import client_view, outputs_ahead

SERVER = {"request_s": 0.004, "per_prompt_token_s": 2e-6, "per_output_token_s": 0.0005, "handoff_s": 0.003,
          "handoff_per_prompt_token_s": 1e-6, "per_output_ahead_s": 0.0002, "host_cpu_factor": 2.0, "cpu": "test CPU",
          "source": "hand-made for the test"}


@pytest.fixture
def profile_with_server(tmp_path):
    raw = dict(load_profile("llama3.1-8b-h100").raw)
    raw["server"] = SERVER
    p = tmp_path / "h100-server.json"
    p.write_text(json.dumps(raw))
    return str(p)


def _run(profile, view, kind="simpy", async_scheduling=False):
    cfg = SimConfig.model_validate({"workload": {"trace": "swebench", "programs": 6, "jps": 2.0},
                                    "engine": {"profile": profile, "metrics_at": view, "scheduler": kind,
                                               "async_scheduling": async_scheduling}})
    return execute(build_run(cfg))


def test_client_view_moves_ttft_and_e2el_not_the_steps(profile_with_server):
    eng, cli = _run(profile_with_server, "engine"), _run(profile_with_server, "client")
    a, b = eng.summary, cli.summary
    for k in ("steps", "engine_busy_s", "mean_jct", "makespan_s", "preemptions", "prefill_tokens_computed"):
        assert a[k] == b[k], k
    assert b["metrics_at"] == "client" and "metrics_at" not in a
    te, tc = eng.turns, cli.turns
    assert np.array_equal(te["first_token"], tc["first_token"]) and np.array_equal(te["finish"], tc["finish"])
    f = SERVER["host_cpu_factor"]
    # the hand-off (vLLM's arrival stamp to the engine core and the first output back) adds to the front like the rest
    pre = f * (SERVER["request_s"] + SERVER["handoff_s"]
               + (SERVER["per_prompt_token_s"] + SERVER["handoff_per_prompt_token_s"]) * te["prompt_tokens"])
    post = f * SERVER["per_output_token_s"] * (te["output_tokens"] - 1)
    ahead = f * SERVER["per_output_ahead_s"] * outputs_ahead(te)
    assert ahead.max() > 0  # calls overlap: some first tokens wait behind others' streams
    assert np.allclose(tc["ttft"], te["ttft"] + pre + ahead) and np.allclose(tc["e2el"], te["e2el"] + pre + post)
    assert b["mean_ttft_ms"] == pytest.approx(a["mean_ttft_ms"] + (pre + ahead).mean() * 1000)
    assert b["mean_e2el_ms"] == pytest.approx(a["mean_e2el_ms"] + (pre + post).mean() * 1000)


def test_outputs_ahead_counts_the_calls_streaming_in_the_first_tokens_step():
    """Replica 0: a streams over [1, 5]; b's first token at 3 (a ahead), c's at 5 (a's last
    token and b ahead), d's at 6 (b and c ahead; a finished at 5). Replica 1's e is alone although
    its first token is at a time replica 0 streams."""
    t = {"first_token": np.array([1.0, 3.0, 5.0, 6.0, 3.0]), "finish": np.array([5.0, 7.0, 9.0, 6.0, 4.0]),
         "replica": np.array([0, 0, 0, 0, 1])}
    assert outputs_ahead(t).tolist() == [0, 1, 2, 2, 0]
    server = ServerTime(request_s=0.0, per_prompt_token_s=0.0, per_output_token_s=0.5, per_output_ahead_s=0.25)
    seen = client_view({**t, "prompt_tokens": np.zeros(5), "output_tokens": np.array([5, 5, 5, 1, 2])}, server)
    assert seen["first_token"].tolist() == [1.0, 3.25, 5.5, 6.5, 3.0]
    assert seen["finish"][3] == seen["first_token"][3]  # one output token: its last is its first
    assert seen["finish"].tolist()[:3] == [7.0, 9.0, 11.0] and seen["finish"][4] == 4.5


def test_a_server_section_without_the_hand_off_or_the_wait_ahead_reads_as_none(tmp_path):
    raw = dict(load_profile("llama3.1-8b-h100").raw)
    raw["server"] = {k: v for k, v in SERVER.items() if not k.startswith(("handoff", "per_output_ahead"))}
    p = tmp_path / "p.json"
    p.write_text(json.dumps(raw))
    s = load_profile(str(p)).server
    assert s.handoff_s == 0.0 and s.handoff_per_prompt_token_s == 0.0 and s.per_output_ahead_s == 0.0
    assert s.request_s == pytest.approx(0.008)


def test_client_view_without_a_server_section_refused(capsys):
    assert main(["run", "--profile", "cpu-tiny-llama", "--programs", "2", "--metrics-at", "client", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--metrics-at client" in err and "`server` section" in err and "\n" not in err
    with pytest.raises(InputError, match="metrics-at"):
        SimConfig.model_validate({"engine": {"metrics_at": "client"}}) and build_run(
            SimConfig.model_validate({"engine": {"metrics_at": "client", "profile": "cpu-tiny-llama"}}))


def test_unknown_view_refused(capsys):
    assert main(["run", "--metrics-at", "browser", "--no-progress"]) == 2
    assert "client" in capsys.readouterr().err


def test_bad_server_section_refused(tmp_path):
    raw = dict(load_profile("cpu-tiny-llama").raw)
    raw["server"] = {**SERVER, "request_ms": 4}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(InputError, match="server"):
        load_profile(str(p))


@pytest.mark.engine
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_twin_stays_exact_with_the_client_view(profile_with_server, tmp_path, async_scheduling):
    """vLLM's own scheduler (--scheduler vllm) and the SimPy one see the same step ends, host
    time per step on; the client view, computed after the run, is then the same too."""
    raw = json.loads(open(profile_with_server).read())
    raw["host"] = {"step_s": 0.0008, "per_seq_s": 1e-5, "per_token_s": 1e-7}
    prof = tmp_path / "h100-server-host.json"
    prof.write_text(json.dumps(raw))
    a, b = (_run(str(prof), "client", k, async_scheduling) for k in ("simpy", "vllm"))
    assert a.summary["host_time"] == ("overlapped" if async_scheduling else "added")
    for k in ("steps", "mean_jct", "mean_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "mean_tpot_ms"):
        assert a.summary[k] == b.summary[k], k
    assert np.array_equal(a.turns["ttft"], b.turns["ttft"])
