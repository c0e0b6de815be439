"""Block keys chained from content, as vLLM chains block hashes.

vLLM keys a full block by hash(parent block's hash, the block's token ids), so two
requests share a block exactly when their contexts agree up to its end. Here a
program's context is a list of runs (segment id, length): an input segment, or the
output of a call, named by the content of the prompt it continues (greedy decoding:
the same prompt yields the same output, and a shorter output is a prefix of a
longer one). Block i's key hashes the digest of the runs before the one holding its
last token with that run's id and the block's end offset in it. One object per
program, shared by its calls: the context is append-only, so keys once computed never
change, and each is computed once.

Where the runs come from (sim/run/workload.py): a trace's content segments
(traces/segments.py); without them, turn 0's `shared_prefix_tokens` is one run every
program shares and everything else is the program's own.

Python's hash is 64-bit: a false hit needs a collision among a run's blocks (about
n^2 / 2^64), ignored.

`ContentKeys` is the compiled object (sim/kv/_content.pyx, built by the install step: the
same keys, with no tuple built per block); `PyContentKeys` stays as its reference.
"""
from __future__ import annotations

from itertools import repeat


def held_prefix(keys: list, held) -> int:
    """How many leading keys of a context `held` (a dict or set) holds, where `held` keeps
    the prefix of every key in it (a prefix cache): a chained key held means its whole
    prefix is, so a binary search finds the end."""
    lo, hi = 0, len(keys)  # keys[:lo] held; keys[hi:] not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PyContentKeys:
    __slots__ = ("block_size", "runs", "length", "keys", "digest", "_run")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.runs: list[tuple[object, int, int, int]] = []  # (id, first token's position, length, digest of the runs before)
        self.length = 0
        self.keys: list[int] = []
        self.digest = 0  # hash of all runs so far: names the output that follows
        self._run = 0  # run holding the last token of block len(keys)

    def append(self, cid, n: int) -> None:
        if n > 0:
            self.runs.append((cid, self.length, n, self.digest))
            self.length += n
            self.digest = hash((self.digest, cid, n))

    def append_output(self, n: int) -> None:
        """The output of the call whose prompt is everything appended so far."""
        self.append(("out", self.digest), n)

    def prefix(self, n: int) -> list[int]:
        """Keys of blocks 0..n-1."""
        if n > len(self.keys):
            self.key(n - 1)
        return self.keys[:n]

    def key(self, i: int) -> int:
        """Block i's key: the digest of the runs before the run holding its last token,
        that run's id, and how far into it the block ends. Equal keys, equal runs up to the
        block's end (as chaining each block's pieces to its parent's key would give), but
        the blocks ending inside one run are keyed by one comprehension."""
        keys, bs = self.keys, self.block_size
        if i < len(keys):
            return keys[i]
        last = (i + 1) * bs
        if last > self.length:
            raise IndexError(f"block {i} is not full: the context has {self.length} tokens")
        runs, r, hi = self.runs, self._run, (len(keys) + 1) * bs
        while hi <= last:
            cid, start, n, d = runs[r]
            end = start + n
            if end < hi:  # the block ends past this run
                r += 1
                continue
            stop = min(end, last)
            # hash((d, cid, offset)) for each block ending in this run, tuples built in C
            keys.extend(map(hash, zip(repeat(d), repeat(cid), range(hi - start, stop + 1 - start, bs))))
            hi += ((stop - hi) // bs + 1) * bs
        self._run = r
        return keys[i]


try:
    from sim.kv._content import ContentKeys
except ImportError:  # a source checkout that was never installed: the reference runs
    ContentKeys = PyContentKeys


def carried(content, mode: str, n: int):
    """The context a program's next prompt continues when the last call's output (the last
    run of `content`) reaches it other than as generated (traces/schema.py `carry`): a new
    context with the same runs before that output, whose blocks keep their keys, then `n`
    tokens named by the mode and the prompt they follow (re-rendered text, or the output
    without its reasoning), which match no block of the output."""
    *before, (_, _, _, digest) = content.runs
    fork = ContentKeys(content.block_size)
    for cid, _, n_run, _ in before:
        fork.append(cid, n_run)
    fork.append((mode, digest), n)
    return fork
