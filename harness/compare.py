"""Comparison against the float64 oracle, and the tolerance model.

The tolerance model
-------------------
Each output element y_i is judged against the oracle value r_i computed in float64
from the exact (already rounded) inputs.  The op's error model gives, per element,
the L2 norm of the terms that element is made of, s_i = sqrt(sum_j t_ij**2), and the
reduction length n (terms per element; 1 for an elementwise output).  The bound is

    tol_i = u_out * |r_i|  +  C * (u_in + u_acc * sqrt(n)) * s_i  +  tiny(dtype)

  u_out  unit roundoff of the output dtype: the final store rounds once;
  u_in   unit roundoff of the input dtype: each term may be formed with a few roundings
         in the input precision (torch eager does, e.g. g*b in bf16 before summing);
  u_acc  unit roundoff of the accumulation dtype, float32 (float64 for float64 cases):
         the rule is "accumulate in at least float32";
  sqrt(n) rounding errors of a sum of n terms with random signs add like a random walk,
         so the error of the sum grows like sqrt(n) times the size of the partial sums,
         which is about s_i;
  C = 8  covers up to ~4 roundings per term times a margin of several standard deviations.

Why s_i and not sum |t_ij|: the worst-case bound uses sum |t_ij|, which for large n is
sqrt(n) times s_i, and would let an all-zero output pass when the true sum cancels.
With random-sign inputs |r_i| is of order s_i, so an all-zero (or unreduced, or
mis-indexed) output misses by about s_i, far above tol_i; a test proves every case
rejects zeros.  An accumulator in float16/bfloat16 over n terms errs by about
u_in * sqrt(n) * s_i, which exceeds the bound once n is more than a handful, as it should.

Exact outputs.  On an op's exact-arithmetic input set (harness/exact.py) the outputs the op
declares exact have no rounding error before the final store, so their bound is that one
rounding alone: tol_i = ulp_out(r_i) / 2, half a unit in the last place of the output dtype
at r_i (0 where r_i = 0).  It is never looser than the model above (ulp/2 <= u_out*|r|), and a
missing or extra term, or a partial sum rounded to 16 bits, misses it by a grid step.

NaN in the output fails wherever the oracle is finite (outputs are NaN-poisoned before
the call, so unwritten elements fail).  Inf must match the oracle's sign exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod, sqrt

import numpy as np

from harness import dtypes, status

SAFETY = 8.0


@dataclass
class OutputReport:
    name: str
    passed: bool
    max_abs: float = 0.0
    max_abs_index: tuple = ()
    max_rel: float = 0.0
    rel_l2: float = 0.0
    mismatches: int = 0
    numel: int = 0
    worst_ratio: float = 0.0  # max err/tol: < 1 passes
    worst_index: tuple = ()
    message: str = ""  # shape/dtype problems, or the worst element spelled out
    details: dict = field(default_factory=dict)

    def line(self) -> str:
        """One line in the style kernel engineers already print."""
        verdict = status.PASS if self.passed else status.FAIL
        if self.message and not self.numel:
            return f"[{self.name}] {verdict} {self.message}"
        idx = ",".join(map(str, self.max_abs_index))
        text = (f"[{self.name}] {verdict} max_abs={self.max_abs:.4e} @ ({idx}) max_rel={self.max_rel:.3g} "
                f"rel_l2={self.rel_l2:.3g} mismatches={self.mismatches}/{self.numel} err/tol={self.worst_ratio:.3g}")
        return text + (f"  {self.message}" if self.message else "")

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "passed", "max_abs", "max_rel", "rel_l2", "mismatches",
                                           "numel", "worst_ratio", "message")}
        d["max_abs_index"] = list(self.max_abs_index)
        d["worst_index"] = list(self.worst_index)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "OutputReport":
        """The report back from its JSON (details are not in it)."""
        keys = {"name", "passed", "max_abs", "max_rel", "rel_l2", "mismatches", "numel", "worst_ratio", "message"}
        return cls(**{k: v for k, v in d.items() if k in keys},
                   max_abs_index=tuple(d.get("max_abs_index") or ()), worst_index=tuple(d.get("worst_index") or ()))


def tolerance(ref: np.ndarray, scale: np.ndarray, n: int, dtype: str) -> np.ndarray:
    """The per-element bound of the model above."""
    u = dtypes.unit_roundoff(dtype)
    u_acc = dtypes.unit_roundoff(dtypes.accumulate_dtype(dtype))
    return u * np.abs(ref) + SAFETY * (u + u_acc * sqrt(max(n, 1))) * scale + dtypes.tiny(dtype)


# Significand bits (with the implicit one) and the exponent of the smallest normal, per dtype.
_PRECISION = {"f64": (53, -1022), "f32": (24, -126), "f16": (11, -14), "bf16": (8, -126)}


def exact_tolerance(ref: np.ndarray, dtype: str) -> np.ndarray:
    """Half an ulp of `dtype` at each |ref| (subnormal spacing below the normal range; 0 at 0 and
    at non-finite values, which compare judges by equality): the bound of an exact output."""
    bits, emin = _PRECISION[dtypes.check(dtype)]
    ref = np.asarray(ref, np.float64)
    finite = np.isfinite(ref) & (ref != 0)
    _, e = np.frexp(np.where(finite, ref, 1.0))  # |ref| = m * 2**e, m in [0.5, 1): its binade is 2**(e-1)
    return np.where(finite, np.ldexp(0.5, np.maximum(e - 1, emin) - (bits - 1)), 0.0)


def compare(name: str, got: np.ndarray, ref: np.ndarray, scale: np.ndarray, n: int, dtype: str,
            got_dtype: str | None = None, exact: bool = False) -> OutputReport:
    """Judge one output (already float64 on the host) against the oracle; `exact`: the output is
    exact on its inputs (harness/exact.py) and gets the rounding of its final store alone."""
    if tuple(got.shape) != tuple(ref.shape):
        return OutputReport(name, False, message=f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}")
    if got_dtype is not None and got_dtype != dtype:
        return OutputReport(name, False, message=f"dtype {got_dtype}, expected {dtype}")
    numel = prod(ref.shape)
    if numel == 0:
        return OutputReport(name, True, numel=0, message="empty output")
    tol = exact_tolerance(ref, dtype) if exact else tolerance(ref, scale, n, dtype)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # Everything finite (a sum is finite only then, barring an overflow, which takes the general
        # path) and no NaN in tol: the same report, a chunk at a time.
        if np.isfinite(got.sum()) and np.isfinite(ref.sum()) and not np.isnan(tol.sum()):
            return _finite_report(name, got, ref, tol, numel, exact)
        return _general_report(name, got, got - ref, ref, tol, numel, exact)


def _general_report(name: str, got: np.ndarray, diff: np.ndarray, ref: np.ndarray, tol: np.ndarray, numel: int,
                    exact: bool) -> OutputReport:
    """compare's report with NaN and inf handled element by element (the spec of the fast path)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.abs(diff)
        both_inf = np.isinf(ref) & (got == ref)
        err = np.where(both_inf, 0.0, err)
        err = np.where(np.isnan(ref) & np.isnan(got), 0.0, err)  # NaN where the oracle says NaN is right
        # Where the oracle is inf its tol is inf too: only the same inf passes there.
        missed_inf = np.isinf(ref) & ~both_inf
        bad = ~(err <= tol) | missed_inf  # NaN err counts as bad
        ratio = np.where(np.isnan(err) | missed_inf, np.inf, np.where(err == 0, 0.0, err / tol))  # 0/0: exact zero
        rel = np.where(np.abs(ref) > 0, err / np.abs(ref), np.where(err > 0, np.inf, 0.0))
    finite_err = np.where(np.isnan(err), np.inf, err)
    i_abs = np.unravel_index(int(np.argmax(finite_err)), ref.shape)
    i_worst = np.unravel_index(int(np.argmax(ratio)), ref.shape)
    ref_norm = float(np.linalg.norm(np.where(np.isfinite(ref), ref, 0.0)))
    diff = np.where(np.isfinite(diff), diff, np.where(both_inf, 0.0, np.inf))
    rel_l2 = float(np.linalg.norm(diff)) / ref_norm if ref_norm else float(np.linalg.norm(diff))
    report = OutputReport(
        name=name, passed=not bad.any(), max_abs=float(finite_err[i_abs]), max_abs_index=tuple(map(int, i_abs)),
        max_rel=float(np.max(rel)), rel_l2=rel_l2, mismatches=int(bad.sum()), numel=numel,
        worst_ratio=float(ratio[i_worst]), worst_index=tuple(map(int, i_worst)))
    if bad.any():
        w = i_worst
        report.message = (f"worst at ({','.join(map(str, w))}): got {float(got[w]):.6g} expected {ref[w]:.6g} "
                          f"tol {tol[w]:.3g}" + (" (exact: half an ulp)" if exact else ""))
    return report


# Elements a chunk of _finite_report: its temporaries (a few arrays of this many float64) stay in cache,
# where whole-array temporaries went to memory and back a dozen times (1.2 s for 26M elements).
CHUNK = 1 << 16


def _first_max(best: tuple, values: np.ndarray, start: int) -> tuple:
    """(value, flat index) of np.argmax over the chunks so far and `values` (from flat index `start`):
    the first NaN, else the first largest value."""
    k = int(np.argmax(values))
    v = float(values[k])
    if best[0] != best[0] or (v == v and v <= best[0]):
        return best
    return v, start + k


def _finite_report(name: str, got: np.ndarray, ref: np.ndarray, tol: np.ndarray, numel: int,
                   exact: bool) -> OutputReport:
    """compare's report where got and ref are finite and tol has no NaN: no inf or NaN to mask.  The
    model's tol is > 0, so err / tol is the ratio; an exact output's tol is 0 at a zero oracle value,
    where a zero error is ratio 0 (not 0/0).  err / |ref| is the relative error (0/0, at an exact zero,
    is NaN here and 0 there: fmax skips it).  Computed CHUNK elements at a time; tests/test_compare.py
    checks it against the general path (rel_l2 to rounding: its sums of squares are per chunk)."""
    g, r, t = (np.ravel(a) for a in (got, ref, tol))
    top_abs, top_ratio = (-1.0, 0), (-1.0, 0)
    max_rel, ss_ref, ss_diff, mismatches = float("nan"), 0.0, 0.0, 0
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for s in range(0, numel, CHUNK):
            gc, rc, tc = g[s:s + CHUNK], r[s:s + CHUNK], t[s:s + CHUNK]
            diff = gc - rc
            err = np.abs(diff)
            mismatches += int(np.count_nonzero(~(err <= tc)))
            ratio = np.divide(err, tc, out=np.zeros_like(err), where=err != 0) if exact else err / tc
            top_abs = _first_max(top_abs, err, s)
            top_ratio = _first_max(top_ratio, ratio, s)
            max_rel = float(np.fmax(max_rel, np.fmax.reduce(err / np.abs(rc))))
            ss_ref += float(np.dot(rc, rc))
            ss_diff += float(np.dot(diff, diff))
    i_abs = np.unravel_index(top_abs[1], ref.shape)
    i_worst = np.unravel_index(top_ratio[1], ref.shape)
    ref_norm, diff_norm = float(np.sqrt(ss_ref)), float(np.sqrt(ss_diff))
    report = OutputReport(
        name=name, passed=mismatches == 0, max_abs=top_abs[0], max_abs_index=tuple(map(int, i_abs)),
        max_rel=0.0 if max_rel != max_rel else max_rel, rel_l2=diff_norm / ref_norm if ref_norm else diff_norm,
        mismatches=mismatches, numel=numel, worst_ratio=top_ratio[0], worst_index=tuple(map(int, i_worst)))
    if mismatches:
        w = i_worst
        report.message = f"worst at ({','.join(map(str, w))}): got {float(got[w]):.6g} expected {ref[w]:.6g} " \
                         f"tol {tol[w]:.3g}" + (" (exact: half an ulp)" if exact else "")
    return report
