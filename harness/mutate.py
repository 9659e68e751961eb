"""`python -m harness mutate`: the mutation score, how many planted near-miss kernels a case set catches.

A mutant is an implementation with one realistic bug (tests/mutants/: a tail tile dropped, a
16-bit accumulator, eps outside the square root, a mask edge off by one, ...).  It is caught
when at least one case of the set FAILs on it: through `runner.run_case`, the very check `run`
makes (oracle on the random inputs, guards, repeats, the stale-output set, the exact-arithmetic
set).  The score is caught / planted, per op.  Each survivor is listed with the case that came
closest to catching it: its largest err/tol over the random and the exact input sets.

Cases run cheapest first (by the op's byte count) and a mutant stops at its first FAIL, so a
set's score costs about what its cheap cases cost; only survivors see every case.  The
mutants' module (default `mutants`, from the repository's tests/ folder) must define a Backend
`mutant`, registered or not; its implementations are the mutants and their docstrings the bugs.
Exit status: 0 when every op scores 100%, 1 otherwise (CI asserts it), 2 on a bad case set.
"""
from __future__ import annotations

import importlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness import exact, status
from harness.registry import Backend, Impl, get_op

TESTS = Path(__file__).resolve().parents[1] / "tests"
SETS = {"random": "random set", "exact": "exact set", "stale": "second input set", "repeat": "repeated call",
        "guard": "guard"}


@dataclass
class Verdict:
    """One mutant on one case set."""

    op: str
    mutant: str  # implementation id, e.g. mutant@drops_tail_tile
    bug: str  # the first line of its docstring
    caught: bool = False
    case: str = ""  # the first case that caught it
    check: str = ""  # what caught it there (SETS)
    closest: dict = field(default_factory=dict)  # a survivor's nearest miss: {case, ratio, set}
    cases_run: int = 0
    errors: list = field(default_factory=list)  # (case, message) where the mutant raised


def load_mutants(module: str = "mutants") -> Backend:
    """The `mutant` Backend of `module` (imported from tests/ when not importable as it is)."""
    if str(TESTS) not in sys.path:
        sys.path.append(str(TESTS))
    found = getattr(importlib.import_module(module), "mutant", None)
    if not isinstance(found, Backend):
        raise SystemExit(f"error: module {module!r} defines no Backend named 'mutant'")
    return found


def mutants_of(backend: Backend, op: str) -> list[Impl]:
    return [impl for (o, _), impl in sorted(backend.impls.items()) if o == op]


def _caught_by(result) -> str:
    """Which check of run_case failed the mutant (the keys of SETS)."""
    from harness.runner import STALE

    reason = result.reason or ""
    if reason.startswith(exact.EXACT):
        return "exact"
    if reason.startswith(STALE):
        return "stale"
    if "on the same inputs" in reason:
        return "repeat"
    if any(o.details.get("check") for o in result.outputs if not o.passed):
        return "guard"
    return "random"


def _worst(reports) -> float:
    ratios = [o.worst_ratio for o in reports if o.numel and not math.isnan(o.worst_ratio)]
    return max(ratios, default=0.0)


def score(op: str, cases: list, backend: Backend, seed: int = 0, device: str = "cpu") -> list[Verdict]:
    """Run every mutant of `op` on `cases` (cheapest first) until each is caught or the cases run out."""
    from harness.runner import run_case

    spec = get_op(op)
    impls = mutants_of(backend, op)
    verdicts = {i.id: Verdict(op, i.id, (i.fn.__doc__ or "").strip().split("\n")[0]) for i in impls}
    ordered = sorted((c for c in cases if c.op == op), key=lambda c: spec.cost(c).bytes)
    for case in ordered:
        live = [i for i in impls if not verdicts[i.id].caught]
        if not live:
            break
        for impl in live:
            v = verdicts[impl.id]
            try:
                result = run_case(impl, case, device, seed)
            except Exception as exc:  # noqa: BLE001 - a broken mutant is reported, not fatal
                v.errors.append((case.id, f"{type(exc).__name__}: {exc}"))
                continue
            if result.status == status.SKIP:
                continue
            v.cases_run += 1
            if result.status == status.FAIL:
                v.caught, v.case, v.check = True, case.id, _caught_by(result)
            elif result.status == status.ERROR:
                v.errors.append((case.id, result.reason))
            else:
                for name, reports in (("random", result.outputs), ("exact", exact.last())):
                    ratio = _worst(reports)
                    if ratio > v.closest.get("ratio", -1.0):
                        v.closest = {"case": case.id, "ratio": ratio, "set": name}
    return list(verdicts.values())


def table(per_op: dict[str, list[Verdict]]) -> str:
    """The score table (planted, caught, score per op and in all), then the survivors."""
    lines = [f"{'op':24} {'planted':>7} {'caught':>7} {'score':>7}"]
    total = caught = 0
    for op, verdicts in per_op.items():
        n, c = len(verdicts), sum(v.caught for v in verdicts)
        total, caught = total + n, caught + c
        lines.append(f"{op:24} {n:7d} {c:7d} {_pct(c, n):>7}")
    lines.append(f"{'all':24} {total:7d} {caught:7d} {_pct(caught, total):>7}")
    survivors = [v for vs in per_op.values() for v in vs if not v.caught]
    if survivors:
        lines.append("\nsurvivors (the case that came closest: its largest err/tol, random or exact input set):")
        for v in survivors:
            near = v.closest
            where = (f"{near['case']} err/tol={near['ratio']:.3g} ({SETS[near['set']]})" if near
                     else "no case ran it")
            lines.append(f"  {v.op} {v.mutant}: {where}\n      bug: {v.bug}")
            for case_id, message in v.errors[:3]:
                lines.append(f"      raised on {case_id}: {message}")
    return "\n".join(lines)


def catches(per_op: dict[str, list[Verdict]]) -> str:
    """Each caught mutant with the case and the check that caught it (-v)."""
    return "\n".join(f"  {v.op:22} {v.mutant:42} {v.case} ({SETS[v.check]})"
                     for vs in per_op.values() for v in vs if v.caught)


def _pct(c: int, n: int) -> str:
    return f"{100.0 * c / n:.0f}%" if n else "-"


def cmd_mutate(args) -> int:
    from cases import select

    backend = load_mutants(args.module)
    cases = select(args.cases)
    ops = args.op or sorted({op for op, _ in backend.impls})
    started = time.time()
    print(f"mutation score: cases={args.cases} seed={args.seed} device=cpu mutants={args.module}")
    per_op = {}
    for op in ops:
        get_op(op)
        per_op[op] = score(op, cases, backend, args.seed)
        if args.verbose:
            print(f"{op}: {sum(v.caught for v in per_op[op])}/{len(per_op[op])} caught "
                  f"({time.time() - started:.0f}s)", flush=True)
    print(table(per_op))
    if args.verbose:
        print("\ncaught by:\n" + catches(per_op))
    print(f"({time.time() - started:.1f}s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "cases": args.cases, "seed": args.seed, "device": "cpu",
            "ops": {op: {"planted": len(vs), "caught": sum(v.caught for v in vs)} for op, vs in per_op.items()},
            "mutants": [asdict(v) for vs in per_op.values() for v in vs]}, indent=1))
    return 0 if all(v.caught for vs in per_op.values() for v in vs) else 1


def add_parser(sub) -> None:
    p = sub.add_parser("mutate", help="mutation score: which planted near-miss kernels (tests/mutants/) "
                                      "the cases catch")
    p.add_argument("--op", action="append", help="op name (repeatable); default: every op with mutants")
    p.add_argument("--cases", default="smoke", help="smoke | full | perf | all | FILE.json|yaml | JSON case")
    p.add_argument("--seed", type=int, default=0, help="run seed (default 0: a CI score is reproducible)")
    p.add_argument("--module", default="mutants", help="module defining the Backend 'mutant' (default: tests/mutants)")
    p.add_argument("--json", help="write the table and every mutant's verdict to this JSON file")
    p.add_argument("-v", "--verbose", action="store_true", help="progress per op, and the case that caught each mutant")
