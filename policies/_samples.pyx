# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled SortedSamples: tool durations kept sorted, with Continuum's Eq. 2 over them.

The same object as policies/continuum.py's PySortedSamples (the reference, and what runs
where this is not built), in C: inside vLLM the policy runs once per finished call, and
there the dozen numpy calls of an insertion and an Eq. 2 pass cost ~30 us (issue 20).
Built by the project's install step (setup.py); tests compare it with the reference.
"""
from libc.math cimport INFINITY
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memcpy, memmove

import numpy as np


cdef int _cmp(const void* a, const void* b) noexcept nogil:
    cdef double x = (<const double*>a)[0]
    cdef double y = (<const double*>b)[0]
    return (x > y) - (x < y)


cdef class SortedSamples:
    """Adds are queued after the sorted run and merged on the next read (one by
    insertion, several by sorting them and merging from the end), as the reference."""

    cdef double* buf
    cdef Py_ssize_t n  # sorted samples
    cdef Py_ssize_t k  # queued after them
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.buf = <double*>malloc(16 * sizeof(double))
        if self.buf == NULL:
            raise MemoryError()
        self.cap, self.n, self.k = 16, 0, 0

    def __dealloc__(self):
        free(self.buf)

    def add(self, double t):
        if t != t:
            raise ValueError("a tool time is NaN")
        cdef double* grown
        if self.n + self.k == self.cap:
            grown = <double*>realloc(self.buf, 2 * self.cap * sizeof(double))
            if grown == NULL:
                raise MemoryError()
            self.buf, self.cap = grown, 2 * self.cap
        self.buf[self.n + self.k] = t
        self.k += 1

    cdef int _merge(self) except -1:
        cdef Py_ssize_t n = self.n, k = self.k, lo = 0, hi = n, mid, i, j, w
        cdef double* buf = self.buf
        cdef double* tmp
        cdef double t
        if k == 1:
            t = buf[n]
            while lo < hi:  # first position whose value is >= t
                mid = (lo + hi) >> 1
                if buf[mid] < t:
                    lo = mid + 1
                else:
                    hi = mid
            memmove(buf + lo + 1, buf + lo, (n - lo) * sizeof(double))
            buf[lo] = t
        elif k > 1:
            tmp = <double*>malloc(k * sizeof(double))
            if tmp == NULL:
                raise MemoryError()
            memcpy(tmp, buf + n, k * sizeof(double))
            qsort(tmp, k, sizeof(double), _cmp)
            i, j, w = n - 1, k - 1, n + k - 1
            while j >= 0:  # merge from the end: the sorted run moves up only as far as needed
                if i >= 0 and buf[i] > tmp[j]:
                    buf[w] = buf[i]
                    i -= 1
                else:
                    buf[w] = tmp[j]
                    j -= 1
                w -= 1
            free(tmp)
        self.n, self.k = n + k, 0
        return 0

    @property
    def values(self):
        """The samples, sorted (a copy)."""
        if self.k:
            self._merge()
        out = np.empty(self.n)
        cdef double[::1] view = out
        if self.n:
            memcpy(&view[0], self.buf, self.n * sizeof(double))
        return out

    def __len__(self):
        return self.n + self.k

    def __reduce__(self):  # copy and pickle (replicas deep-copy their policy; sweeps pickle)
        return _sorted_samples, (self.values,)

    def __iter__(self):
        return iter(self.values)

    def best_ttl(self, double benefit):
        """Eq. 2 over the samples: continuum.best_ttl(self.values, benefit), the same
        float operations in the same order ((i+1)/n, times benefit, minus s[i]), the
        first maximum, the scan stopping at the first sample > benefit."""
        if self.k:
            self._merge()
        cdef Py_ssize_t n = self.n, i, best_i = -1
        cdef double nf = <double>n, best = -INFINITY, v, s
        if n == 0 or not benefit > 0.0:
            return 0.0
        for i in range(n):
            s = self.buf[i]
            if s > benefit:
                break
            v = ((i + 1.0) / nf) * benefit - s
            if v > best:
                best, best_i = v, i
        return self.buf[best_i] if best_i >= 0 and best > 0.0 else 0.0


def _sorted_samples(values):
    """A SortedSamples holding `values` (one read merges them)."""
    s = SortedSamples()
    for t in values:
        s.add(t)
    return s
