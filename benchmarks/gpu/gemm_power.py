"""Does a compute-bound GEMM's time on this GPU depend on the values it multiplies and on how long it runs?

    python benchmarks/gpu/gemm_power.py [--seconds 2] [--dtype bf16|fp8] > gemm_power.json   (on the GPU; about 2.5 min)

Why: aiconfigurator's vLLM GEMM table (its collector builds RowParallelLinear layers and times them,
CUDA graph of 6 layers, 3 warm-up and 6 timed replays) prices Llama-shaped prefill GEMMs at
727-803 TFLOPS on H100/H200, while the project's torch probes of the same shapes with random
bf16 weights, run for seconds, imply 595-669 TFLOPS for the GEMMs (`python benchmarks/prefill_terms.py`).
vLLM creates linear weights with torch.empty and the collector loads none, so its weights are
whatever the allocator hands back (zeros on fresh device memory); a matmul's switching power, so
its clock under the power limit, depends on the values (zeros draw least). Real servers lie in
between (prefill of requests that ran alone 6-10% above aiconfigurator's price). This separates the
causes: the weights' values (empty as the collector leaves them, zeros, randn, randn x 0.02 as a
trained layer's scale) and the duty (the collector's short replays; a sustained run of --seconds;
bursts of one prefill's GEMMs with idle gaps as a lightly loaded server makes).

For Llama-3.1-8B's GEMMs (qkv 4096->6144 and gate-up 4096->28672 by default; o 4096->4096 and
down 14336->4096 with --gemms) at m = 1024 and 8192 tokens, and at m = 16 (memory-bound: values
should not matter), activations randn; "empty" also reports the share of its weights that were zero. Reports per case the seconds per GEMM, TFLOPS, and the SM clock and
power nvidia-smi sampled while it ran (every 50 ms; null if nvidia-smi is missing).
--dtype fp8 times the same GEMMs as vLLM's per-tensor FP8 linear layers run them (torch._scaled_mm,
FP8 e4m3 weights and activations, bf16 out): "empty" and "zeros" as above, "randn_x0.02" a trained
layer quantized with its per-tensor scale, so its codes span e4m3's range as a checkpoint's do.
Needs torch with CUDA only.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import torch

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
MS = (16, 1024, 8192)
FILLS = {"bf16": ("empty", "zeros", "randn", "randn_x0.02"), "fp8": ("empty", "zeros", "randn_x0.02")}
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value: a per-tensor scale maps a tensor's amax to it
LAYERS = 6  # the collector's layers per graph (outside_loop_count)


class Sampler:
    """nvidia-smi's SM clock (MHz) and power draw (W) every 50 ms while the block runs."""

    def __init__(self):
        self.rows, self.proc = [], None

    def __enter__(self):
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                          "-lms", "50", "-i", str(torch.cuda.current_device())],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        except OSError:
            self.proc = None
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                clk, pw = (float(x) for x in line.split(","))
                self.rows.append((clk, pw))
            except ValueError:
                pass

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()

    def summary(self) -> dict | None:
        if not self.rows:
            return None
        clk = sorted(r[0] for r in self.rows)
        pw = sorted(r[1] for r in self.rows)
        return {"sm_clock_mhz_median": clk[len(clk) // 2], "sm_clock_mhz_min": clk[0],
                "power_w_median": pw[len(pw) // 2], "power_w_max": pw[-1], "samples": len(self.rows)}


def weights(fill: str, k: int, n: int, dtype: str = "bf16", device: str = "cuda") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """LAYERS (weight, per-tensor scale) pairs of shape (n, k); the scale is 1 for bf16 and unfilled weights."""
    out = []
    one = torch.ones((), dtype=torch.float32, device=device)
    for _ in range(LAYERS):
        if fill == "randn_x0.02":
            w, scale = torch.randn(n, k, device=device) * 0.02, one
            if dtype == "fp8":
                scale = w.abs().max() / FP8_MAX
                w = w / scale
            out.append((w.to(FP8 if dtype == "fp8" else torch.bfloat16), scale))
        elif fill == "randn":
            out.append((torch.randn(n, k, dtype=torch.bfloat16, device=device), one))
        else:
            make = torch.empty if fill == "empty" else torch.zeros
            out.append((make(n, k, dtype=FP8 if dtype == "fp8" else torch.bfloat16, device=device), one))
    return out


def activations(m: int, k: int, dtype: str = "bf16", device: str = "cuda") -> torch.Tensor:
    """randn rows; for fp8 cast with scale 1 (randn lies well within e4m3's range)."""
    return torch.randn(m, k, device=device).to(FP8 if dtype == "fp8" else torch.bfloat16)


def linear(x: torch.Tensor, w: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """y = x w^T as the layer runs it: bf16 F.linear, or FP8 x FP8 -> bf16 with per-tensor scales."""
    if x.dtype != FP8:
        return torch.nn.functional.linear(x, w[0])
    one = torch.ones((), dtype=torch.float32, device=x.device)
    return torch._scaled_mm(x, w[0].t(), scale_a=one, scale_b=w[1], out_dtype=torch.bfloat16)


def graph_of(x: torch.Tensor, ws: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # the collector's warm-ups, before capture
            for w in ws:
                linear(x, w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for w in ws:
            linear(x, w)
    return g


def replays(g: torch.cuda.CUDAGraph, count: int) -> float:
    """Seconds per replay over `count` back-to-back replays (CUDA events)."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(count):
        g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3 / count


def case(name: str, m: int, fill: str, seconds: float, dtype: str = "bf16") -> dict:
    k, n = SHAPES[name]
    x = activations(m, k, dtype)
    ws = weights(fill, k, n, dtype)
    g = graph_of(x, ws)
    flops = 2 * m * n * k
    row = {"gemm": name, "m": m, "n": n, "k": k, "fill": fill, "dtype": dtype}
    if fill == "empty":
        row["empty_zero_fraction"] = float(sum((w.float() == 0).sum().item() for w, _ in ws) / (LAYERS * n * k))
    for _ in range(3):
        g.replay()
    with Sampler() as smp:
        per = replays(g, 6)  # the collector's timed replays
    row["collector"] = {"s": per / LAYERS, "tflops": flops * LAYERS / per / 1e12, "clocks": smp.summary()}
    time.sleep(0.5)  # cool down between regimes
    count = max(1, int(seconds / per))
    with Sampler() as smp:
        replays(g, count // 2)  # reach the steady clock first
        per = replays(g, count - count // 2)
    row["sustained"] = {"s": per / LAYERS, "tflops": flops * LAYERS / per / 1e12, "clocks": smp.summary(),
                        "replays": count}
    # bursts: one replay (6 GEMMs, about one layer-group of a prefill) then as long idle: 50% duty
    ts = []
    with Sampler() as smp:
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            ts.append(replays(g, 1))
            time.sleep(max(ts[-1], 2e-4))
    ts.sort()
    row["bursts_50pct"] = {"s": ts[len(ts) // 2] / LAYERS, "tflops": flops * LAYERS / ts[len(ts) // 2] / 1e12,
                           "clocks": smp.summary(), "bursts": len(ts)}
    del g, ws, x
    torch.cuda.empty_cache()
    time.sleep(0.5)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="length of the sustained and the burst runs per case")
    ap.add_argument("--gemms", default="qkv,gate_up", help="which of qkv,o,gate_up,down")
    ap.add_argument("--dtype", default="bf16", help="bf16 (F.linear) or fp8 (per-tensor scaled FP8, torch._scaled_mm)")
    a = ap.parse_args(argv)
    names = a.gemms.split(",")
    if bad := [x for x in names if x not in SHAPES]:
        print(f"error: --gemms {','.join(bad)}: choose from {','.join(SHAPES)}", file=sys.stderr)
        return 2
    if a.dtype not in FILLS:
        print(f"error: --dtype {a.dtype}: choose from {','.join(FILLS)}", file=sys.stderr)
        return 2
    if not a.seconds > 0:
        print(f"error: --seconds {a.seconds}: give a positive number of seconds", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    t0 = time.time()
    for name in names:
        for m in MS:
            for fill in FILLS[a.dtype]:
                r = case(name, m, fill, a.seconds if m > 16 else a.seconds / 4, a.dtype)
                rows.append(r)
                print(f"{name} m={m} {a.dtype} {fill}: " + ", ".join(f"{mode} {r[mode]['tflops']:.0f} TFLOPS"
                                                          for mode in ("collector", "sustained", "bursts_50pct")),
                      file=sys.stderr)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "seconds": a.seconds,
               "wall_s": time.time() - t0, "rows": rows}, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
