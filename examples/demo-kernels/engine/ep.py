"""Expert-parallel dispatch and combine: a model of DeepEP v1.2.1's intranode calls.

While the CPU waits for the GPU (here: for `ms` milliseconds), the real C++ calls kept the
Python GIL, so no other Python thread could run. RELEASE_GIL = True models the fix: the
wait happens with the GIL released.
"""

import time

RELEASE_GIL = False

_SPIN = 0


def _calibrate():
    global _SPIN
    n = 200_000
    started = time.perf_counter()
    sum(range(n))
    _SPIN = n / (time.perf_counter() - started)


def _hold_gil(ms):
    # sum() over a range runs in C without returning to the interpreter loop, so it never
    # gives the GIL away: like a C++ call that does not release it.
    if not _SPIN:
        _calibrate()
    sum(range(int(_SPIN * ms / 1000)))


def wait_for_gpu(ms):
    if RELEASE_GIL:
        time.sleep(ms / 1000)
    else:
        _hold_gil(ms)


def dispatch(ms=2.0):
    wait_for_gpu(ms)


def combine(ms=2.0):
    wait_for_gpu(ms)
