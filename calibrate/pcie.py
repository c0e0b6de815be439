"""Host<->GPU copy bandwidth and latency with pinned memory (torch, CUDA only)."""
from __future__ import annotations

import numpy as np

from calibrate.fit import nnls_relative

NOT_MEASURED = {"measured": False, "bandwidth_GBps": None, "latency_s": None,
                "method": "not measured: no CUDA device (CPU engine); give pcie.bandwidth_GBps by hand to simulate offload"}


def measure_pcie(device: str, sizes_mb=(1, 4, 16, 64, 256), reps: int = 5) -> dict:
    """Fit t = latency + bytes / bandwidth per direction; `bandwidth_GBps` is the slower one."""
    if device != "cuda":
        return dict(NOT_MEASURED)
    import torch

    result = {"measured": True, "method": "torch pinned host tensor <-> cuda tensor copy_(non_blocking), "
              f"CUDA events, median of {reps} per size, sizes {list(sizes_mb)} MiB, fit t = latency + bytes/bw"}
    for name in ("h2d", "d2h"):
        times = []
        for mb in sizes_mb:
            host = torch.empty(mb << 20, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(mb << 20, dtype=torch.uint8, device="cuda")
            src, dst = (host, dev) if name == "h2d" else (dev, host)
            dst.copy_(src, non_blocking=True)  # warm-up
            torch.cuda.synchronize()
            samples = []
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
            times.append(float(np.median(samples)))
        nbytes = np.array(sizes_mb, float) * (1 << 20)
        lat, inv_bw = nnls_relative(np.stack([np.ones_like(nbytes), nbytes], 1), times)
        result[f"{name}_GBps"] = round(1 / inv_bw / 1e9, 3) if inv_bw > 0 else None
        result[f"{name}_latency_s"] = float(lat)
        result[f"{name}_samples_s"] = dict(zip((f"{mb}MiB" for mb in sizes_mb), times))
    bws = [b for b in (result["h2d_GBps"], result["d2h_GBps"]) if b]
    result["bandwidth_GBps"] = min(bws) if bws else None
    result["latency_s"] = max(result["h2d_latency_s"], result["d2h_latency_s"])
    return result
