"""binary_backward mutants: broadcast reductions that lose terms, a 16-bit accumulator, strides ignored,
ties not split, an unwritten element."""
from __future__ import annotations

import numpy as np

from mutants.common import (HALF, as_contiguous, broadcast_axes, drop_last, drop_tail, f64, fold, low_accumulator,
                            plant, reference, skip_last, write)
from oracle.binary_backward import partials
from oracle.broadcast import broadcast_shape

OP = "binary_backward"


def grads(inputs, params, read=f64, how=None, ties_to_a=False) -> dict:
    """{grad_a, grad_b}: the partials times grad_out, each summed over its operand's broadcast axes by
    `how` (common.fold), in float64."""
    a, b, g = (read(inputs[k]) for k in ("a", "b", "grad_out"))
    fn = params["fn"]
    da, db = partials(fn, a, b)
    if ties_to_a and fn in ("maximum", "minimum"):  # a >= b (a <= b) takes the whole gradient
        a_, b_ = np.broadcast_arrays(a, b)
        da = (a_ >= b_ if fn == "maximum" else a_ <= b_).astype(np.float64)
        db = 1.0 - da
    out = broadcast_shape(a.shape, b.shape)
    return {name: fold(g * d, broadcast_axes(x.shape, out), x.shape, how)
            for name, x, d in (("grad_a", a, da), ("grad_b", b, db))}


@reference.impl(OP, dtypes=("f32", "f16", "bf16", "f64"))
def correct(inputs, outs, params):
    write(outs, grads(inputs, params))


@plant(OP, "reduce_drops_last_term")
def reduce_drops_last_term(inputs, outs, params):
    """Each broadcast reduction stops one term short (an off-by-one loop bound)."""
    write(outs, grads(inputs, params, how=drop_last))


@plant(OP, "reduce_drops_tail_tile")
def reduce_drops_tail_tile(inputs, outs, params):
    """Each broadcast reduction sums whole tiles of 8 terms only: the remainder loop is missing."""
    write(outs, grads(inputs, params, how=drop_tail(8)))


@plant(OP, "reduce_folds_one_axis_too_few")
def reduce_folds_one_axis_too_few(inputs, outs, params):
    """An operand broadcast along several axes is summed over all of them but the outermost, where the
    kernel reads only index 0 (its grid covers one slice of that axis)."""
    a, b, g = (f64(inputs[k]) for k in ("a", "b", "grad_out"))
    da, db = partials(params["fn"], a, b)
    out = broadcast_shape(a.shape, b.shape)
    result = {}
    for name, x, d in (("grad_a", a, da), ("grad_b", b, db)):
        t, axes = g * d, broadcast_axes(x.shape, out)
        if len(axes) > 1 and t.shape[axes[0]]:
            t = np.take(t, [0], axis=axes[0])
        result[name] = fold(t, axes, x.shape)
    write(outs, result)


@plant(OP, "accumulate_in_input_dtype", HALF)
def accumulate_in_input_dtype(inputs, outs, params):
    """Broadcast reductions accumulate in the 16-bit input dtype (32 lanes, then a tree), not float32."""
    dtype = "bf16" if "bfloat16" in str(outs["grad_a"].dtype) else "f16"
    write(outs, grads(inputs, params, how=low_accumulator(dtype)))


@plant(OP, "strided_input_as_contiguous")
def strided_input_as_contiguous(inputs, outs, params):
    """Reads a, b and grad_out as if they were contiguous (a transposed or sliced view's strides ignored)."""
    write(outs, grads(inputs, params, read=as_contiguous))


@plant(OP, "tie_not_split")
def tie_not_split(inputs, outs, params):
    """maximum/minimum give a tie's whole gradient to a (a >= b) instead of half to each."""
    write(outs, grads(inputs, params, ties_to_a=True))


@plant(OP, "last_element_unwritten")
def last_element_unwritten(inputs, outs, params):
    """The last element of grad_a is never written (the NaN-poison control)."""
    skip_last(outs, grads(inputs, params), "grad_a")
