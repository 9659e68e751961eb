"""The verdicts a result row can carry, and which of them fail a run.  Imports nothing.

PASS     every output within tolerance, every guard quiet
FAIL     an output out of tolerance, or a guard fired (unwritten, out of bounds, mutated input,
         non-repeatable, stale)
ERROR    the implementation raised
SKIP     the implementation declines the case (dtype, device, feature), with its reason
CRASH    the worker process died on the case (harness/isolate.py)
TIMEOUT  the case ran past --case-timeout (harness/isolate.py)
XFAIL    a FAIL that the implementation declared beforehand as a known, explained deviation
         (`registry.Deviation`: which cases, which outputs, why, and where that is written
         up); shown, counted and kept in the JSON, but it does not fail the run
XPASS    a case covered by such a declaration that passed this time (the deviations are
         input-dependent, e.g. JAX's bf16 partial sums go over tolerance on some seeds only)
"""
from __future__ import annotations

PASS, FAIL, ERROR, SKIP, CRASH, TIMEOUT, XFAIL, XPASS = (
    "PASS", "FAIL", "ERROR", "SKIP", "CRASH", "TIMEOUT", "XFAIL", "XPASS")
ALL = (PASS, FAIL, ERROR, SKIP, CRASH, TIMEOUT, XFAIL, XPASS)
FAILED = (FAIL, ERROR, CRASH, TIMEOUT)  # the statuses that make a run exit non-zero
OK = (PASS, SKIP, XFAIL, XPASS)
REPRO = FAILED + (XFAIL,)  # rows whose report ends with the one-line repro command


def counts(statuses) -> dict:
    """{status: how many} over ALL, zeros included (the JSON and the summary line read it)."""
    out = dict.fromkeys(ALL, 0)
    for s in statuses:
        out[s] = out.get(s, 0) + 1
    return out


def summary(c: dict, seconds: float, suffix: str = "") -> str:
    """The run's closing line: 'N passed, N failed[ (..)], N skipped[, N xfailed][, N xpassed] in Ts'.

    'N passed, N failed' leads, as the CI reads it; xfailed/xpassed appear only when non-zero."""
    failed = sum(c.get(s, 0) for s in FAILED)
    crashed = f" ({c.get(CRASH, 0)} crashed, {c.get(TIMEOUT, 0)} timed out)" if c.get(CRASH, 0) + c.get(TIMEOUT, 0) \
        else ""
    known = "".join(f", {c[s]} {label}" for s, label in ((XFAIL, "xfailed"), (XPASS, "xpassed")) if c.get(s))
    return f"{c.get(PASS, 0)} passed, {failed} failed{crashed}, {c.get(SKIP, 0)} skipped{known} in {seconds:.1f}s{suffix}"
