"""matmul_backward mutants: a broadcast batch not summed or summed short, N and M tails dropped, a
16-bit accumulator, strides ignored, an unwritten row."""
from __future__ import annotations

import numpy as np

from mutants.common import HALF, as_contiguous, broadcast_axes, f64, fold, low_accumulator, plant, reference, write

OP = "matmul_backward"


def _mT(x):
    return np.swapaxes(x, -1, -2)


def products(inputs, params, *, read=f64, fold_a=None, fold_b=None, n_tile=None, m_tile=None, low=None) -> dict:
    """{da, db}: dy @ b^T and a^T @ dy over the broadcast batch, each summed over the batch axes its
    operand was broadcast along by fold_a / fold_b (common.fold's `how`).  n_tile (m_tile): da (db)
    sums over whole tiles of that many columns (rows) only.  low: the N (M) sums in that 16-bit dtype."""
    a, b, dy = (read(inputs[k]) for k in ("a", "b", "dy"))
    n, m = b.shape[-1], a.shape[-2]
    keep_n = n - n % n_tile if n_tile and n > n_tile else n
    keep_m = m - m % m_tile if m_tile and m > m_tile else m
    if low:  # terms (batch, M, K, N) and (batch, K, N, M), summed over their last axis in 16 bits
        acc = low_accumulator(low)
        ta = dy[..., :, None, :keep_n] * b[..., None, :, :keep_n]
        tb = _mT(a)[..., :, None, :keep_m] * _mT(dy)[..., None, :, :keep_m]
        pa = acc(ta.reshape(-1, keep_n)).reshape(ta.shape[:-1])
        pb = acc(tb.reshape(-1, keep_m)).reshape(tb.shape[:-1])
    else:
        pa = dy[..., :keep_n] @ _mT(b[..., :keep_n])
        pb = _mT(a[..., :keep_m, :]) @ dy[..., :keep_m, :]
    batch = pa.shape[:-2]
    return {"da": fold(pa, broadcast_axes(a.shape[:-2], batch), a.shape, fold_a),
            "db": fold(pb, broadcast_axes(b.shape[:-2], batch), b.shape, fold_b)}


@reference.impl(OP)
def correct(inputs, outs, params):
    write(outs, products(inputs, params))


@plant(OP, "db_not_summed_over_broadcast_batch")
def db_not_summed_over_broadcast_batch(inputs, outs, params):
    """db of a b broadcast over the batch is the first batch element's a^T @ dy, not the batch sum."""
    write(outs, products(inputs, params, fold_b=lambda t2: t2[:, 0]))


@plant(OP, "da_drops_last_batch_element")
def da_drops_last_batch_element(inputs, outs, params):
    """da of an a broadcast over the batch sums every batch element but the last."""
    write(outs, products(inputs, params, fold_a=lambda t2: t2[:, :-1].sum(axis=1) if t2.shape[1] > 1
                         else t2.sum(axis=1)))


@plant(OP, "da_drops_n_tail")
def da_drops_n_tail(inputs, outs, params):
    """da = dy @ b^T over whole tiles of 16 along N only: the last partial tile is skipped."""
    write(outs, products(inputs, params, n_tile=16))


@plant(OP, "db_drops_m_tail")
def db_drops_m_tail(inputs, outs, params):
    """db = a^T @ dy over whole tiles of 16 rows (M) only: the last partial tile is skipped."""
    write(outs, products(inputs, params, m_tile=16))


@plant(OP, "accumulate_in_input_dtype", HALF)
def accumulate_in_input_dtype(inputs, outs, params):
    """The N and M sums accumulate in the 16-bit input dtype (32 lanes, then a tree), not float32."""
    low = "bf16" if "bfloat16" in str(outs["da"].dtype) else "f16"
    write(outs, products(inputs, params, low=low))


@plant(OP, "strided_input_as_contiguous")
def strided_input_as_contiguous(inputs, outs, params):
    """Reads a, b and dy as if they were contiguous (b stored (N, K) as nn.Linear keeps it, read as (K, N))."""
    write(outs, products(inputs, params, read=as_contiguous))


@plant(OP, "da_last_row_unwritten")
def da_last_row_unwritten(inputs, outs, params):
    """The last row of da is never written (the NaN-poison control)."""
    values = products(inputs, params)
    write(outs, {"db": values["db"]})
    if outs["da"].shape[-2]:
        outs["da"][..., :-1, :] = values["da"][..., :-1, :]
