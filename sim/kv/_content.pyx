# cython: language_level=3
"""sim/kv/content.py's `PyContentKeys` (the reference) compiled: the same object, the same
keys to the bit. A block's key is hash((digest, run id, offset)); here the tuple is
never built: CPython hashes a tuple from its items' hashes (xxHash's lanes,
Objects/tupleobject.c), so the digest's and the run's lanes are mixed once per run and
each block adds only its offset's. tests/test_segments.py compares every key with
Python's own hash of the tuple.
"""
from libc.stdint cimport uint64_t

cdef uint64_t _P1 = 11400714785074694791ULL
cdef uint64_t _P2 = 14029467366897019727ULL
cdef uint64_t _P5 = 2870177450012600261ULL
cdef uint64_t _LEN3 = 3 ^ (2870177450012600261ULL ^ 3527539ULL)  # a 3-tuple's closing term


cdef inline uint64_t _lane(uint64_t acc, uint64_t h):
    acc += h * _P2
    acc = (acc << 31) | (acc >> 33)
    return acc * _P1


cdef class ContentKeys:
    cdef readonly Py_ssize_t block_size
    cdef readonly Py_ssize_t length
    cdef readonly list runs  # (id, first token's position, length, digest of the runs before)
    cdef readonly list keys
    cdef readonly object digest  # hash of all runs so far: names the output that follows
    cdef Py_ssize_t _run  # run holding the last token of block len(keys)

    def __init__(self, Py_ssize_t block_size):
        self.block_size = block_size
        self.runs = []
        self.length = 0
        self.keys = []
        self.digest = 0
        self._run = 0

    def append(self, cid, Py_ssize_t n):
        if n > 0:
            self.runs.append((cid, self.length, n, self.digest))
            self.length += n
            self.digest = hash((self.digest, cid, n))

    def append_output(self, Py_ssize_t n):
        """The output of the call whose prompt is everything appended so far."""
        self.append(("out", self.digest), n)

    cpdef list prefix(self, Py_ssize_t n):
        """Keys of blocks 0..n-1."""
        if n > len(self.keys):
            self.key(n - 1)
        return self.keys[:n]

    cpdef key(self, Py_ssize_t i):
        """Block i's key (PyContentKeys.key)."""
        cdef list keys = self.keys, runs = self.runs
        cdef Py_ssize_t bs = self.block_size, last, r, hi, start, n, end, stop, off
        cdef Py_ssize_t hd, hc  # Py_hash_t: signed
        cdef uint64_t acc, h
        if i < len(keys):
            return keys[i]
        last = (i + 1) * bs
        if last > self.length:
            raise IndexError(f"block {i} is not full: the context has {self.length} tokens")
        r, hi = self._run, (len(keys) + 1) * bs
        while hi <= last:
            cid, start, n, d = runs[r]
            end = start + n
            if end < hi:  # the block ends past this run
                r += 1
                continue
            stop = min(end, last)
            hd, hc = hash(d), hash(cid)
            acc = _lane(_lane(_P5, <uint64_t>hd), <uint64_t>hc)
            for off in range(hi - start, stop + 1 - start, bs):  # offsets are small ints: hash(off) == off
                h = _lane(acc, <uint64_t>off) + _LEN3
                keys.append(<Py_ssize_t>h if h != <uint64_t>-1 else 1546275796)
            hi += ((stop - hi) // bs + 1) * bs
        self._run = r
        return keys[i]
