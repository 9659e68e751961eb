"""What `harness run` prints around its rows, and the decisions it makes before the first one:
the import failures of backends, whether cases run in a worker process, the row line, the closing
implementation x op matrix, and the exit status of a run in which nothing ran."""
from __future__ import annotations

import sys
from collections import Counter

from harness import status
from harness.isolate import backend_module
from harness.registry import BROKEN, env_backend_modules, is_baseline
from harness.report.text import status_matrix
from harness.runner import module_root

NOTHING_RAN_EXIT = 5  # as pytest's "no tests collected": every selected case was skipped, or none selected
TOP_REASONS = 5

HEADER = f"{'status':6} {'op':16} {'impl':16} {'case':48} {'err/tol':>8} {'rel_l2':>9} {'time_ms':>9}"


def row_line(r) -> str:
    """A result's table line: err/tol of its worst element (< 1 passes) and the relative L2 error
    ||got - ref||_2 / ||ref||_2 of its worst output; blank when no output was compared."""
    compared = [o for o in r.outputs if o.numel]
    ratio = f"{max(o.worst_ratio for o in compared):8.3g}" if compared else " " * 8
    rel_l2 = f"{max(o.rel_l2 for o in compared):9.2e}" if compared else " " * 9
    t = f"{r.time_ms:9.4f}" if r.time_ms is not None else " " * 9
    return f"{r.status:6} {r.op:16} {r.impl:16} {r.case:48} {ratio} {rel_l2} {t}"


def _named(label: str, wanted: set) -> bool:
    """Whether the user named the backend module `label` (a module, package or entry-point name)."""
    return label in wanted or label.rsplit(".", 1)[-1] in wanted


def import_failures(backends, stream=None) -> bool:
    """Print each backend module that failed to import (registry.BROKEN, filled by the discovery the run
    does anyway): in full, as an error, when the user named it (--backend, or $GRADORACLE_BACKENDS);
    one warning line otherwise.  Returns whether a named one failed (the run then exits non-zero)."""
    stream = stream or sys.stderr
    wanted = {w.split("@", 1)[0] for w in backends or []} | set(env_backend_modules())
    named = False
    for label, reason in sorted(BROKEN.items()):
        if _named(label, wanted):
            named = True
            print(f"error: backend {label} failed to import: {reason}", file=stream)
        else:
            print(f"warning: backend {label} is unavailable: {reason.splitlines()[0]}", file=stream)
    return named


def isolate_by_default(args, pairs) -> bool:
    """--isolate, --no-isolate, else isolation whenever a selected implementation is not a baseline of
    backends/baselines/ (a kernel under test may crash its process; the baselines are libraries) and
    every selected implementation can be imported by a worker (not one defined in a script's __main__)."""
    if args.no_isolate:
        return False
    if args.isolate:
        return True
    impls = [impl for _, chosen in pairs for impl in chosen]
    if any(not _importable(backend_module(impl)) for impl in impls):
        return False
    return any(not is_baseline(impl.backend) for impl in impls)


def _importable(module: str) -> bool:
    """Whether a worker process can import `module` by name (a script's __main__ is not)."""
    return module != "__main__" and module_root(module) is not None


def print_matrix(results, stream=None) -> None:
    """The implementation x op matrix of verdict counts (harness/report/text.py), after the rows."""
    lines = status_matrix((r.op, r.impl, r.status) for r in results)
    if lines:
        print("\n" + "\n".join(lines), file=stream or sys.stdout)


def nothing_ran(results, stream=None) -> int:
    """0 when some case ran (any verdict but SKIP); else NOTHING_RAN_EXIT, after saying why:
    the most common skip reasons with their counts, or that nothing was selected."""
    stream = stream or sys.stdout
    if any(r.status != status.SKIP for r in results):
        return 0
    if not results:
        print("nothing ran: the selection is empty (no case of the chosen ops and dtypes)", file=stream)
        return NOTHING_RAN_EXIT
    reasons = Counter(r.reason or "no reason given" for r in results)
    print(f"nothing ran: all {len(results)} selected cases were skipped; top reasons:", file=stream)
    for reason, n in reasons.most_common(TOP_REASONS):
        print(f"  {n:5d} x {reason.splitlines()[0]}", file=stream)
    if len(reasons) > TOP_REASONS:
        print(f"  ({len(reasons) - TOP_REASONS} other reasons; --show-skips prints every row)", file=stream)
    return NOTHING_RAN_EXIT
