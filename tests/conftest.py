import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# The environment this test run started with, before any test or import changed it: every
# real engine a test starts in a subprocess starts in it, as from a user's shell. An in-process
# vLLM engine leaves its own settings in os.environ (LD_PRELOAD of torch's libgomp,
# VLLM_ENABLE_V1_MULTIPROCESSING=0, ...). benchmarks/prefill_after.py, pinned to one core,
# ran 131 s in a process started with them after such an engine and 65 s in this one; with this
# one plus that LD_PRELOAD alone, 131 s (tests/test_validate_engine.py: the same on the replays).
START_ENV = dict(os.environ)

import numpy as np
import pandas as pd
import pytest

from sim.hardware.profile import parse_profile
from traces.schema import validate


def linear_profile(c0=0.01, c1=0.001, c2=0.0, c3=0.0, c4=0.0, c5=0.0, blocks=1000, block_size=16,
                   budget=8192, seqs=256, max_len=100_000, **gpu):
    """A hand-computable profile: step time = c0 + c1*tokens (+ optional terms; `gpu`: the
    GPU step model's w, launch, p, sim/hardware/profile.py)."""
    return parse_profile({
        "model": {"name": "test", "num_layers": 1, "num_kv_heads": 1, "head_dim": 64, "dtype_bytes": 2},
        "engine": {"block_size": block_size, "num_gpu_blocks": blocks, "max_num_batched_tokens": budget,
                   "max_num_seqs": seqs, "enable_chunked_prefill": True, "max_model_len": max_len},
        "step_time": {"c0": c0, "c1": c1, "c2": c2, "c3": c3, "c4": c4, "c5": c5, **gpu},
    }, "test-linear")


def simulate(trace, policy, profile, arrivals, *, disagg=None, progress=None, watch=None, **fields):
    """A run as every caller makes one (sim.run.config.build_run, then execute): `policy` a name or
    a Policy, `fields` flat config leaves (num_gpu_blocks=, enable_chunked_prefill=, cache=, offload=,
    replicas=, router=, fast_forward=, kind=, ...); `disagg` a spec ("1P1D") or a
    sim.cluster.disagg.Disagg whose link is the test's own (a config names only the shipped links)."""
    from dataclasses import replace

    from policies.registry import make_policy
    from sim.run.config import build_run, execute, from_flat, parse_config

    if isinstance(disagg, str):  # a spec such as "1P1D": a config leaf like the others
        fields, disagg = {**fields, "disagg": disagg}, None
    # a config refuses a router with nothing to route (agentsim/requires.py), where it would do
    # nothing; a Disagg of the test's own is not in the config, so its router is laid on the run
    router = fields.pop("router", None) if disagg is not None or not _routed(fields, disagg) else None
    run = build_run(parse_config(from_flat(fields), "test"), trace=trace, profile=profile,
                    arrivals=np.asarray(arrivals, float), policy=make_policy(policy) if isinstance(policy, str) else policy)
    if disagg is not None:
        from sim.cluster.router import make_router

        run = replace(run, disagg=disagg, **({} if router is None else {"router": make_router(router)}))
    return execute(run, progress, watch)


def _routed(fields: dict, disagg) -> bool:
    """More than one replica serves calls (with disaggregation: decode replicas)."""
    from sim.cluster.disagg import parse_disagg

    if disagg is not None:
        return disagg.decode > 1
    split = parse_disagg(fields.get("disagg"))
    return (split[1] if split else fields.get("replicas", 1)) > 1


def make_trace(programs: list[list[tuple[int, int, str | None, float | None]]], shared_prefix: int | None = None) -> pd.DataFrame:
    """programs: per program, turns as (new_input, output, tool, tool_duration)."""
    rows = []
    for p, turns in enumerate(programs):
        for t, (inp, out, tool, dur) in enumerate(turns):
            row = {"program_id": f"p{p:03d}", "turn": t, "new_input_tokens": inp, "output_tokens": out,
                   "tool": tool, "tool_duration_s": np.nan if dur is None else dur}
            if shared_prefix is not None:
                row["shared_prefix_tokens"] = shared_prefix
            rows.append(row)
    return validate(pd.DataFrame(rows))


def assert_script_refuses(main, argv: list[str], says: str, monkeypatch, capsys, folder) -> None:
    """A benchmark script's main() run in `folder` with `argv` exits 2 saying `says`, writing nothing."""
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["script.py", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert not list(Path(folder).iterdir())  # nothing written


def trace_and_profile_files(d, seed: int, programs: int, blocks: int) -> tuple[str, str]:
    """A random trace and a linear profile written under `d` (for CLI, sweep and config tests)."""
    import json

    from traces.schema import write_trace

    write_trace(random_trace(np.random.default_rng(seed), programs), d / "t.parquet", {"generator": "test"})
    (d / "prof.json").write_text(json.dumps(linear_profile(c2=1e-7, blocks=blocks).raw))
    return str(d / "t.parquet"), str(d / "prof.json")


def random_trace(rng: np.random.Generator, n_programs: int, max_turns: int = 6, tools=("ls", "cat", "pytest")) -> pd.DataFrame:
    progs = []
    for _ in range(n_programs):
        nt = int(rng.integers(1, max_turns + 1))
        progs.append([(int(rng.integers(40, 400)) if t == 0 else int(rng.integers(0, 200)), int(rng.integers(1, 60)),
                       None if t == nt - 1 else str(rng.choice(tools)), None if t == nt - 1 else float(rng.exponential(0.5)))
                      for t in range(nt)])
    return make_trace(progs, shared_prefix=int(rng.integers(0, 2)) * 32)


@pytest.fixture
def lin():
    return linear_profile


class FakeView:
    """A policy's EngineView from fixed numbers: prefill/reload costs `per_token` s per
    context token, blocks per program from a dict."""

    block_size = 16

    def __init__(self, blocks=None, free=0, per_token=0.001, num_blocks=100, avg_blocks=10.0):
        self.blocks, self.free, self.per_token = dict(blocks or {}), free, per_token
        self.num_blocks, self.avg_blocks = num_blocks, avg_blocks

    def free_blocks(self):
        return self.free

    def blocks_of(self, pid):
        return self.blocks.get(pid, 0)

    def avg_request_blocks(self):
        return self.avg_blocks

    def prefill_reload_time(self, tokens):
        return tokens * self.per_token

    def queue_delay(self):
        return 0.0


@pytest.fixture
def engine_log(request):
    """Print a progress line to the terminal past pytest's capture: the engine tests run
    for minutes, and `pytest -q` would otherwise show nothing while they wait."""
    import time

    capture = request.config.pluginmanager.getplugin("capturemanager")
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"  [{request.node.name} +{time.perf_counter() - t0:.0f}s] {msg}")

    return log


@contextlib.contextmanager
def vllm_server(model, *args: str, start_s: int = 240):
    """A vLLM OpenAI server (the CPU engine, dummy weights) of `model` on a free port, with
    `args` added; its URL while the block runs, then stopped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from calibrate.engine import engine_dtype

    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--load-format", "dummy",
           "--dtype", engine_dtype("cpu"), "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 30), "--port", str(port), *args]
    proc = subprocess.Popen(cmd, env={**START_ENV, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(start_s):
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, "the vLLM server exited during start-up"
                time.sleep(1)
        else:
            pytest.fail(f"the vLLM server did not come up in {start_s} s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture
def start_environ(environ_kept):
    """os.environ as this test run started (START_ENV) while the test runs: for code under test that
    starts an engine in a subprocess with os.environ (benchmarks/server_time.py's server)."""
    os.environ.clear()
    os.environ.update(START_ENV)
    yield


@pytest.fixture
def environ_kept():
    saved = dict(os.environ)  # distributed's Nanny sets OMP_NUM_THREADS=1 here and never restores it
    yield
    os.environ.clear()
    os.environ.update(saved)
