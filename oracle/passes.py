"""Where an oracle's float64 passes run: numpy on the host, or, for the perf-size cases the harness
hands over (harness/prepare.py, opt-in: GRADORACLE_ORACLE_PASSES=cuda), the same numpy formulas on an
array module with numpy's API on the GPU (cupy).

The formulas do not change: a pass that supports it takes `xp = passes.current()` once, in the
calling thread, and uses xp.* where it used np.*.  A pass that does not read it runs on the host
as always.  Why: the attention passes that make a long case's inputs (the forward's o and lse) and
its error scale ran at about 17 GFLOP/s on the H100 machine's host, 44-168 s a case
(results/h100/s7/long/: prepare 44.1 s and wait 123.7 s for S=8k GQA, 75.1 s for S=16k).
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

import numpy as np

_XP: contextvars.ContextVar = contextvars.ContextVar("gradoracle_oracle_passes", default=np)


def current():
    """The array module of this thread's passes (numpy unless inside `on`)."""
    return _XP.get()


@contextmanager
def on(xp):
    """Run the passes entered in this thread on `xp` (None: numpy)."""
    token = _XP.set(np if xp is None else xp)
    try:
        yield
    finally:
        _XP.reset(token)


def to_host(x) -> np.ndarray:
    """A numpy array of x (a device array is copied to the host)."""
    return x if isinstance(x, np.ndarray) else x.get()
