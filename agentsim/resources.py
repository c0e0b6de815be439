"""Memory a command will need, checked before the work starts.

A count a flag accepts (programs, turn repeats, replicas, sweep points) can ask for more
memory than the machine has; the command would then die in numpy or the kernel's OOM killer
after minutes of work. Each generator estimates its peak from its counts (bytes per row
measured on the bundled traces, rounded up) and `check_memory` refuses with one line naming
the estimate and the limit. The limit is the memory available now (MemAvailable of
/proc/meminfo), or AGENTSIM_MEMORY_BYTES when set (tests; a machine shared with other jobs).
"""
from __future__ import annotations

import os

from agentsim.errors import InputError

MEMORY_ENV = "AGENTSIM_MEMORY_BYTES"

# Peak bytes per unit, measured with ru_maxrss (rounded up about 2x from the larger of the
# measured marginal costs): a generated trace row (numpy draws, the DataFrame, its
# validation: 0.5-0.55 KiB at 40,000 programs), a resampled row (whole sessions copied and
# concatenated), a simulated call (its Call, its record, the turns table: 7.7 KiB between
# 100 and 500 SWE-bench programs), a replica's KV block (1.04 MB for 27,387 blocks) and one
# replica's fixed part, a sweep point (its canonical dict, its results row).
TRACE_ROW_BYTES = 1024
RESAMPLED_ROW_BYTES = 2048
CALL_BYTES = 16 * 1024
BLOCK_BYTES = 64
REPLICA_BYTES = 256 * 1024
SWEEP_POINT_BYTES = 8 * 1024


def available_bytes() -> tuple[int, str] | None:
    """Memory this process may still use and where the figure comes from: AGENTSIM_MEMORY_BYTES,
    else MemAvailable; None if unknown."""
    env = os.environ.get(MEMORY_ENV)
    if env is not None:
        try:
            v = int(env)
        except ValueError:
            v = -1
        if v <= 0:
            raise InputError(f"{MEMORY_ENV}={env!r} is not a whole number of bytes > 0; fix or unset it")
        return v, MEMORY_ENV
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    return None


def format_bytes(n: float) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} bytes"


def check_memory(need: float, what: str, fix: str) -> None:
    """Refuse `what` (e.g. "--programs 1000000000000: about 10,900,000,000,000 trace rows")
    when its estimated `need` in bytes exceeds the memory available."""
    known = available_bytes()
    if known is not None and need > known[0]:
        raise InputError(f"{what} need about {format_bytes(need)} of memory, more than the {format_bytes(known[0])} "
                         f"available ({known[1]}); {fix}")
