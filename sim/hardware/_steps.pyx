# cython: language_level=3
"""Compiled per-step loops of a decode stretch: sim/hardware/stretch.py's `py_decode_stretch` and
`py_account_steps` (the reference) in C, line for line. Built with FP contraction off
(setup.py): each + and * rounds as Python's, so the same bits; tests compare them.
"""


def decode_stretch(double head, double c2, double c3s, double c4, double c5, double seqs,
                   double sqk, double sk, double sqc, double t, double nxt, double reader, Py_ssize_t room,
                   double host=0.0, bint overlap=False):
    cdef list out = []
    cdef double d
    while room > 0 and t < nxt:
        d = head + c2 * sqk + c3s + c4 * sk + c5 * sqc
        if host != 0.0:
            if overlap:
                if d < host:
                    d = host
            else:
                d = d + host
        if t + d >= reader:
            break
        out.append(d)
        t += d
        room -= 1
        sqk += seqs
        sk += seqs
        sqc += seqs
    return out


def account_steps(list dts, list grow, Py_ssize_t used, double area, double busy, double t,
                  double last, list samples, pinned):
    cdef Py_ssize_t j, n = min(len(dts), len(grow))
    cdef double d
    for j in range(n):
        d = dts[j]
        used += <Py_ssize_t>grow[j]
        area += used * d
        busy += d
        if t - last >= 1.0:
            samples.append((t, used, pinned))
            last = t
        t += d
    return used, area, busy, t


def add_in_order(double x, list dts):
    cdef double d
    for d in dts:
        x += d
    return x
