"""`select()`: which (case, implementations) pairs a run covers, chosen by case set, op, dtype and
backend: the one selection behind `run`, `bench`, the pytest tests and the `--gpus` workers.

    select(cases, ops, dtypes, backends, shard=None, by_op=False, strict=False)
        -> [(case, [impl, ...]), ...]

cases: a case-set spec (smoke, full, perf, stress, all, a JSON/YAML file, one JSON case:
cases.registry.select) or a list of Cases.  ops, dtypes: keep only these (None: all).
backends: backend or backend@variant names; an implementation is kept when its id or its
backend's name is one of them (None: every implementation, baseline first).  A case that keeps
no implementation is left out.  shard "K/N": only cases K, K+N, ... of the case list after the
dtype filter (`run --shard`, the `--gpus` workers), so N shards cover it in N parts.

Order: the cases' order (registry order, or the file's), or with by_op=True op by op (the ops
in `ops` order, else sorted, as `run` prints them), the cases in order within each op.
strict=True (`run`): a name in `backends` that no implementation of a selected op has raises
SelectionError, unless another name chose implementations of that op; without `ops`, only the
ops the named backends implement are selected (the first op when none is, so its error shows).
"""
from __future__ import annotations

from cases.registry import select as select_cases
from harness.registry import impls_for


class SelectionError(ValueError):
    """A selection names what is not there (a backend with no implementation of the op, a bad shard)."""


def shard(cases: list, spec: str) -> list:
    """Every N-th case from the K-th: `--shard K/N` over the same selection covers it in N parts."""
    try:
        k, n = (int(x) for x in spec.split("/"))
        if not 0 <= k < n:
            raise ValueError
    except ValueError:
        raise SelectionError(f"--shard expects K/N with 0 <= K < N, got {spec!r}") from None
    return cases[k::n]


def _chosen(op: str, backends) -> list:
    """The implementations of `op` that `backends` names (all of them when it names none)."""
    return [i for i in impls_for(op) if not backends or i.id in backends or i.backend.name in backends]


def _check_names(op: str, backends, chosen: list) -> None:
    unknown = [w for w in backends if not any(w in (i.id, i.backend.name) for i in impls_for(op))]
    if unknown and not chosen:
        known = ", ".join(i.id for i in impls_for(op))
        raise SelectionError(f"no implementation {', '.join(unknown)} of {op}: registered are {known}")


def select(cases="smoke", ops=None, dtypes=None, backends=None, *, shard_spec: str | None = None,
           by_op: bool = False, strict: bool = False) -> list[tuple]:
    """[(case, [impls])] of the selection; see the module docstring."""
    found = select_cases(cases) if isinstance(cases, str) else list(cases)
    run_ops = list(ops) if ops else sorted({c.op for c in found})  # of the whole set: every shard has the same
    if backends and not ops and strict:  # the ops the named backends implement; the first if none, to say so
        run_ops = [op for op in run_ops if any(w in (i.id, i.backend.name) for w in backends
                                               for i in impls_for(op))] or run_ops[:1]
    if dtypes:
        found = [c for c in found if c.dtype in dtypes]
    if shard_spec:
        found = shard(found, shard_spec)
    chosen = {op: _chosen(op, backends) for op in run_ops}
    if strict and backends:
        for op in chosen:
            _check_names(op, backends, chosen[op])
    if by_op:
        return [(c, chosen[op]) for op in run_ops for c in found if c.op == op and chosen[op]]
    return [(c, chosen[c.op]) for c in found if chosen.get(c.op)]
