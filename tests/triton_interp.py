"""Running a test module's Triton cases under the interpreter (TRITON_INTERPRET=1), shared by
tests/test_triton_interpret.py, test_triton_reduce_sum.py, test_triton_norms.py and the other
triton test modules.

TRITON_INTERPRET must be set before triton is imported.  The test session sets it on GPU-less
machines, and then the cases run in the test process.  Where it was not (a GPU machine), the
module's cases run in one worker subprocess that sets it: the test module, run as a script with a
flag, calls `report(cases, run_case)`, which prints one JSON line of {case id: "ok" or the
error}; `worker_results(__file__)` (a module-scoped fixture's body) starts it and reads that line.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def interpreting_here() -> bool:
    """Whether triton kernels in this process run in the interpreter."""
    from backends.triton.common import interpreted

    return interpreted() and os.environ.get("TRITON_INTERPRET") == "1"


def needs_interpreter() -> None:
    """Skip the calling test unless this process interprets (its cases then run in the worker)."""
    if not interpreting_here():
        pytest.skip("needs TRITON_INTERPRET=1 in this process (covered by the worker's cases)")


def worker_results(test_file, flag: str = "--worker", timeout: int = 900) -> dict | None:
    """None when this process interprets (run the cases here); else the results of `test_file`
    run as a script with `flag` and TRITON_INTERPRET=1 set before triton's import."""
    if interpreting_here():
        return None
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(test_file), flag], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"interpreter worker failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_result(results: dict | None, case_id: str, run_case) -> None:
    """A case's test body: run it here (results None), else assert the worker's verdict."""
    if results is None:
        run_case(case_id)
    else:
        assert results[case_id] == "ok", results[case_id]


def report(cases, run_case) -> None:
    """The worker side: run every case, print {case id: "ok" or "<error type>: <message>"} as JSON."""
    out = {}
    for case_id in cases:
        try:
            run_case(case_id)
            out[case_id] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the test side
            out[case_id] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
