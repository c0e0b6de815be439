"""How fast this CPU runs an API server's kind of Python work, against another machine's record.

    python benchmarks/cpu_speed.py [--repeats 5] [--out FILE] [--against FILE]

vLLM's API server is one Python process: per request it validates a pydantic model, splits and
renders the prompt, and per streamed token it builds and serialises a JSON chunk on an asyncio
event loop. The `server` section of a profile (benchmarks/server_time.py) is measured on the CPU
it ran on; `host_cpu_factor` scales it to a serving host's CPU. This times that kind of work, one
thread, on fixed inputs: pydantic validation of a completion request, a regex word split of a
1,000-word prompt, JSON dumps and loads of a streaming chunk, and an asyncio queue handing items
from a producer to a consumer. Each part is the median of --repeats runs.

--out writes the record (CPU model, Python, per-part seconds). --against FILE prints, per part and
in total, this machine's time over the record's: the factor a section measured here takes on the
record's machine is the record's time over this one's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsim.errors import InputError  # noqa: E402
from agentsim.files import atomic_write, read_json  # noqa: E402

WORDS = " ".join(f"word{i % 97} the quick brown fox" for i in range(200))  # 1,000 words
CHUNK = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1764460800, "model": "meta-llama/Llama-3.1-8B",
         "choices": [{"index": 0, "text": " fox", "logprobs": None, "finish_reason": None, "stop_reason": None}],
         "usage": None}


def _pydantic(n: int) -> None:
    from pydantic import BaseModel

    class Request(BaseModel):  # the fields a completion request carries
        model: str
        prompt: str
        max_tokens: int = 16
        temperature: float | None = None
        top_p: float | None = None
        stream: bool = False
        ignore_eos: bool = False

    body = {"model": "m", "prompt": WORDS[:400], "max_tokens": 248, "stream": True, "ignore_eos": True}
    for _ in range(n):
        Request.model_validate(body)


def _split(n: int) -> None:
    word = re.compile(r"\S+")
    for _ in range(n):
        word.findall(WORDS)


def _json(n: int) -> None:
    for i in range(n):
        CHUNK["choices"][0]["text"] = f" w{i}"
        json.loads(json.dumps(CHUNK))


def _asyncio(n: int) -> None:
    async def main():
        q: asyncio.Queue = asyncio.Queue()

        async def produce():
            for i in range(n):
                await q.put(i)
            await q.put(None)

        async def consume():
            while await q.get() is not None:
                pass

        await asyncio.gather(produce(), consume())

    asyncio.run(main())


PARTS = {"pydantic validate a request x20k": lambda: _pydantic(20_000), "regex split 1,000 words x2k": lambda: _split(2_000),
         "json chunk dumps+loads x50k": lambda: _json(50_000), "asyncio queue 100k items": lambda: _asyncio(100_000)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(repeats: int) -> dict:
    parts = {}
    for name, fn in PARTS.items():
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        parts[name] = statistics.median(ts)
    return {"cpu": cpu_model(), "python": platform.python_version(), "repeats": repeats,
            "date": time.strftime("%Y-%m-%d"), "seconds": parts, "total_s": sum(parts.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", metavar="FILE", help="write the record as JSON")
    ap.add_argument("--against", metavar="FILE", help="a record of another machine to compare with")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        print(f"error: --repeats {a.repeats}: give at least 1", file=sys.stderr)
        return 2
    try:
        other = read_json(a.against, "--against") if a.against else None
        if other is not None and set(other.get("seconds", {})) != set(PARTS):
            raise InputError(f"--against {a.against}: not a benchmarks/cpu_speed.py record of these parts")
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rec = measure(a.repeats)
    print(f"{rec['cpu']}, Python {rec['python']}")
    for name, s in rec["seconds"].items():
        print(f"  {name:36s} {s:8.3f} s" + (f"   x{s / other['seconds'][name]:.2f} of {other['cpu']}" if other else ""))
    print(f"  {'total':36s} {rec['total_s']:8.3f} s" + (f"   x{rec['total_s'] / other['total_s']:.2f}" if other else ""))
    if a.out:
        atomic_write(a.out, lambda tmp: Path(tmp).write_text(json.dumps(rec, indent=1) + "\n"))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
