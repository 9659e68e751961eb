"""reduce_sum mutants: sums that lose their last element, their tail tile or an odd element of a tree,
a 16-bit accumulator, an axis not folded, torch's empty-dims reading, strides ignored, an unwritten element."""
from __future__ import annotations

import numpy as np

from mutants.common import (HALF, as_contiguous, drop_last, drop_tail, f64, fold, low_accumulator, plant, reference,
                            skip_last, tree_drops_odd, write)
from oracle.reduce_sum import out_shape, reduced_axes

OP = "reduce_sum"


def total(inputs, params, read=f64, how=None) -> dict:
    x = read(inputs["x"])
    return {"y": fold(x, reduced_axes(x.shape, params), out_shape(x.shape, params), how)}


def _dtype(outs) -> str:
    return "bf16" if "bfloat16" in str(outs["y"].dtype) else "f16"


@reference.impl(OP)
def correct(inputs, outs, params):
    write(outs, total(inputs, params))


@plant(OP, "drops_last_element")
def drops_last_element(inputs, outs, params):
    """Each sum stops one element short (`i < n - 1`)."""
    write(outs, total(inputs, params, how=drop_last))


@plant(OP, "drops_tail_tile")
def drops_tail_tile(inputs, outs, params):
    """Each sum covers whole tiles of 256 elements only (a block's loop without its tail)."""
    write(outs, total(inputs, params, how=drop_tail(256)))


@plant(OP, "tree_drops_odd_element")
def tree_drops_odd_element(inputs, outs, params):
    """A shared-memory tree `a[i] += a[i + s]`, s = n/2, n/4, ..., that loses the odd element of each level."""
    write(outs, total(inputs, params, how=tree_drops_odd))


@plant(OP, "accumulate_in_input_dtype", HALF)
def accumulate_in_input_dtype(inputs, outs, params):
    """Accumulates in the 16-bit input dtype (32 lanes, then a tree) instead of float32."""
    write(outs, total(inputs, params, how=low_accumulator(_dtype(outs))))


@plant(OP, "folds_one_axis_too_few")
def folds_one_axis_too_few(inputs, outs, params):
    """With several reduced axes the outermost one is not summed: the kernel reads its index 0 only."""
    x = f64(inputs["x"])
    axes = reduced_axes(x.shape, params)
    if len(axes) > 1 and x.shape[axes[0]]:
        x = np.take(x, [0], axis=axes[0])
    write(outs, {"y": fold(x, axes, out_shape(inputs["x"].shape, params))})


@plant(OP, "empty_axes_sum_everything")
def empty_axes_sum_everything(inputs, outs, params):
    """axes = [] reads as 'every axis' (torch's x.sum(dim=[])), not 'none'; the total fills y."""
    if "target" not in params and params.get("axes") == []:
        outs["y"][...] = f64(inputs["x"]).sum()
        return
    write(outs, total(inputs, params))


@plant(OP, "strided_input_as_contiguous")
def strided_input_as_contiguous(inputs, outs, params):
    """Reads x as if it were contiguous (a transposed or sliced view's strides ignored)."""
    write(outs, total(inputs, params, read=as_contiguous))


@plant(OP, "last_element_unwritten")
def last_element_unwritten(inputs, outs, params):
    """The last element of y is never written (the NaN-poison control)."""
    skip_last(outs, total(inputs, params), "y")
