"""layernorm_backward and rmsnorm_backward mutants: weight/bias gradients that skip the last row or
accumulate in 16 bits, statistics in 16 bits, eps outside the square root, a biased divisor, a missing
path of dx, strides ignored, an unwritten column."""
from __future__ import annotations

import numpy as np

from harness import dtypes
from mutants.common import HALF, as_contiguous, f64, low_accumulator, plant, reference, skip_last, write

LN, RMS = "layernorm_backward", "rmsnorm_backward"


def _low(x) -> str | None:
    name = str(np.asarray(x).dtype)
    return "bf16" if "bfloat16" in name else "f16" if name == "float16" else None


def _row_sum(t2: np.ndarray, rows: slice, low: str | None) -> np.ndarray:
    """Column sums of the (M, N) terms over `rows`, in a `low`-dtype accumulator when given."""
    t2 = t2[rows]
    return low_accumulator(low)(t2.T) if low else t2.sum(axis=0)


def _stats(x2: np.ndarray, rms: bool, low: str | None, ddof: int):
    """(mean, mean square deviation) per row; in a `low` accumulator: the sums rounded as they go."""
    n = x2.shape[1]
    total = (lambda t: low_accumulator(low)(t)) if low else (lambda t: t.sum(axis=1))
    mean = np.zeros(x2.shape[0]) if rms else total(x2) / n
    if low:  # the mean is stored in the accumulator's dtype too
        mean = mean.astype(dtypes.numpy_dtype(low)).astype(np.float64)
    dev = x2 - mean[:, None]
    return mean, total(dev * dev) / max(n - ddof, 1)


def norm_grads(inputs, params, rms: bool, *, read=f64, low_stats=False, low_sums=False, eps_outside=False,
               ddof=0, sums_without_weight=False, no_rstd_path=False, weight_rows=slice(None),
               bias_rows=slice(None)) -> dict:
    """{dx, dweight[, dbias]} in float64 with the statistics recomputed from x (the spec's definition)."""
    with np.errstate(invalid="ignore", over="ignore"):  # NaN gaps read as data, a 16-bit overflow: the bugs
        return _norm_grads(inputs, params, rms, read, low_stats, low_sums, eps_outside, ddof, sums_without_weight,
                           no_rstd_path, weight_rows, bias_rows)


def _norm_grads(inputs, params, rms, read, low_stats, low_sums, eps_outside, ddof, sums_without_weight,
                no_rstd_path, weight_rows, bias_rows) -> dict:
    dy, x = read(inputs["dy"]), read(inputs["x"])
    shape, n = x.shape, x.shape[-1]
    x2, dy2 = x.reshape(-1, n), dy.reshape(-1, n)
    weight = f64(inputs["weight"]) if "weight" in inputs else None
    eps = float(params.get("eps", 1e-6 if rms else 1e-5))
    low = _low(inputs["x"])
    mean, var = _stats(x2, rms, low if low_stats else None, ddof)
    rstd = 1.0 / (np.sqrt(var) + eps) if eps_outside else 1.0 / np.sqrt(var + eps)
    xhat = (x2 - mean[:, None]) * rstd[:, None]
    g = dy2 * weight if weight is not None else dy2
    gs = dy2 if sums_without_weight else g
    a = np.zeros_like(rstd) if rms else gs.mean(axis=1)
    b = (gs * xhat).mean(axis=1)
    dx = rstd[:, None] * (g - a[:, None] - (0 if no_rstd_path else xhat * b[:, None]))
    out = {"dx": dx.reshape(shape)}
    sums = low if low_sums else None
    if weight is not None:
        out["dweight"] = _row_sum(dy2 * xhat, weight_rows, sums)
    if not rms and params.get("bias", True):
        out["dbias"] = _row_sum(dy2, bias_rows, sums)
    return out


def _both(name: str, dtypes_=("f32", "f16", "bf16", "f64"), ops=(LN, RMS)):
    """Register one mutant for both norms (`fn(inputs, outs, params, rms)`)."""
    def register(fn):
        for op in ops:
            def impl(inputs, outs, params, _rms=op == RMS):
                fn(inputs, outs, params, _rms)
            impl.__doc__, impl.__name__ = fn.__doc__, fn.__name__
            plant(op, name, dtypes_)(impl)
        return fn
    return register


for _op in (LN, RMS):
    reference.impl(_op)(lambda inputs, outs, params, _rms=_op == RMS: write(outs, norm_grads(inputs, params, _rms)))


@_both("dweight_skips_last_row")
def dweight_skips_last_row(inputs, outs, params, rms):
    """dweight sums every row but the last (a row loop bound off by one)."""
    write(outs, norm_grads(inputs, params, rms, weight_rows=slice(0, -1)))


@_both("dbias_skips_last_row", ops=(LN,))
def dbias_skips_last_row(inputs, outs, params, rms):
    """dbias sums every row but the last."""
    write(outs, norm_grads(inputs, params, rms, bias_rows=slice(0, -1)))


@_both("stats_in_input_dtype", HALF)
def stats_in_input_dtype(inputs, outs, params, rms):
    """Recomputes the mean and variance (mean square) accumulating in the 16-bit input dtype."""
    write(outs, norm_grads(inputs, params, rms, low_stats=True))


@_both("dweight_accumulated_in_input_dtype", HALF)
def dweight_accumulated_in_input_dtype(inputs, outs, params, rms):
    """Sums dweight (and dbias) over the rows in the 16-bit input dtype instead of float32."""
    write(outs, norm_grads(inputs, params, rms, low_sums=True))


@_both("eps_outside_sqrt")
def eps_outside_sqrt(inputs, outs, params, rms):
    """rstd = 1 / (sqrt(var) + eps) instead of 1 / sqrt(var + eps)."""
    write(outs, norm_grads(inputs, params, rms, eps_outside=True))


@_both("divides_by_n_minus_1")
def divides_by_n_minus_1(inputs, outs, params, rms):
    """The variance (mean square) divides by N - 1 (torch.var's default), not N."""
    write(outs, norm_grads(inputs, params, rms, ddof=1))


@_both("row_sums_without_weight", ops=(LN,))
def row_sums_without_weight(inputs, outs, params, rms):
    """dx's two row means use dy where they need g = weight * dy."""
    write(outs, norm_grads(inputs, params, rms, sums_without_weight=True))


@_both("dx_drops_rstd_path", ops=(RMS,))
def dx_drops_rstd_path(inputs, outs, params, rms):
    """dx = rstd * g: the path through rstd (xhat * mean(g * xhat)) is missing."""
    write(outs, norm_grads(inputs, params, rms, no_rstd_path=True))


@_both("strided_input_as_contiguous")
def strided_input_as_contiguous(inputs, outs, params, rms):
    """Reads dy and x as if they were contiguous (a transposed or sliced view's strides ignored)."""
    write(outs, norm_grads(inputs, params, rms, read=as_contiguous))


@_both("dx_last_element_unwritten")
def dx_last_element_unwritten(inputs, outs, params, rms):
    """The last element of dx is never written (the NaN-poison control)."""
    skip_last(outs, norm_grads(inputs, params, rms), "dx")
