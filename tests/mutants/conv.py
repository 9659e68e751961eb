"""conv_backward_data and conv_backward_weight mutants, on one tap-matrix formulation of both.

Along each spatial dim j, kernel offset k_j connects output position o to input position
i = o*s + k_j*d - p (nothing when i falls in the padding).  `taps` builds that (O_j, I_j) 0/1 matrix;
dgrad scatters dy @ w[:, k] through it (the transpose), wgrad gathers x through it.  A mutant
changes the rule (a phase off by one, the last output position dropped, padding read as the edge),
the batch, the groups, the accumulator or the strides.
"""
from __future__ import annotations

from itertools import product
from math import prod

import numpy as np

from mutants.common import HALF, as_contiguous, f64, low_accumulator, plant, reference, skip_last, write
from oracle import conv_common as cc

DGRAD, WGRAD = "conv_backward_data", "conv_backward_weight"


def correct_tap(geo: cc.Geometry, j: int, o: int, k: int) -> int:
    """The input position that output position o reads at kernel offset k along dim j."""
    return o * geo.stride[j] + k * geo.dilation[j] - geo.padding[j]


def taps(geo: cc.Geometry, k: tuple[int, ...], rule=correct_tap) -> list[np.ndarray]:
    """Per spatial dim j, the (O_j, I_j) matrix with a 1 where output o reads input rule(geo, j, o, k_j)."""
    mats = []
    for j, (size, out) in enumerate(zip(geo.spatial, geo.out)):
        m = np.zeros((out, size))
        for o in range(out):
            i = rule(geo, j, o, k[j])
            if i is not None and 0 <= i < size:
                m[o, i] = 1.0
        mats.append(m)
    return mats


def _along(x: np.ndarray, mats, transpose: bool) -> np.ndarray:
    """x (N, *S, C) with each spatial axis j mapped through mats[j] (O->I when transpose, else I->O)."""
    for j, m in enumerate(mats):
        x = np.moveaxis(np.tensordot(x, m, axes=([1 + j], [0 if transpose else 1])), -1, 1 + j)
    return x


def _group_blocks(geo, wrong_group: bool):
    blocks = cc._blocks(geo)
    return [(co, blocks[0][1]) for co, _ in blocks] if wrong_group else blocks


def dgrad(inputs, params, *, read=f64, rule=correct_tap, wrong_group=False, low=None) -> dict:
    geo = cc.geometry(params, DGRAD)
    dy, w = (cc.to_internal(read(inputs[k]), geo) for k in ("dy", "w"))
    dx = np.zeros((geo.n, *geo.spatial, geo.cin))
    terms = []
    for k in product(*(range(n) for n in geo.kernel)):
        mats = taps(geo, k, rule)
        for co, ci in _group_blocks(geo, wrong_group):
            if low:  # one term per output channel, accumulated below in 16 bits
                for c in range(co.start, co.stop):
                    full = np.zeros_like(dx)
                    full[..., ci] = _along(dy[..., c:c + 1] * w[(c, *k)], mats, True)
                    terms.append(full.reshape(-1))
            else:
                dx[..., ci] += _along(dy[..., co] @ w[(co, *k)], mats, True)
    if low:
        dx = low_accumulator(low)(np.stack(terms, axis=1)).reshape(dx.shape) if terms else dx
    return {"dx": cc.from_internal(dx, geo)}


def wgrad(inputs, params, *, read=f64, rule=correct_tap, wrong_group=False, low=None, batch=slice(None)) -> dict:
    geo = cc.geometry(params, WGRAD)
    dy, x = (cc.to_internal(read(inputs[k]), geo)[batch] for k in ("dy", "x"))
    dw = np.zeros((geo.cout, *geo.kernel, geo.cin // geo.groups))
    rows = dy.shape[0] * prod(geo.out)
    dy2 = dy.reshape(rows, geo.cout)
    for k in product(*(range(n) for n in geo.kernel)):
        xs = _along(x, taps(geo, k, rule), False).reshape(rows, geo.cin)
        for co, ci in _group_blocks(geo, wrong_group):
            if low:  # (Cout/g, Cin/g) sums of `rows` terms, in 16 bits
                t = dy2[:, co].T[:, None, :] * xs[:, ci].T[None, :, :]
                dw[(co, *k)] = low_accumulator(low)(t.reshape(-1, rows)).reshape(t.shape[:2])
            else:
                dw[(co, *k)] = dy2[:, co].T @ xs[:, ci]
    return {"dw": cc.from_internal(dw, geo)}


def _low(outs) -> str:
    return "bf16" if "bfloat16" in str(next(iter(outs.values())).dtype) else "f16"


def phase_off_by_one(geo, j, o, k):
    """Strided dims: every tap lands one input position late (the phase of i = o*s + k*d - p off by one)."""
    return correct_tap(geo, j, o, k) + (1 if geo.stride[j] > 1 else 0)


def last_output_dropped(geo, j, o, k):
    """The output size computed as (I + 2p - d(k-1)) // s: one short whenever s does not divide that."""
    short = (geo.spatial[j] + 2 * geo.padding[j] - geo.dilation[j] * (geo.kernel[j] - 1)) // geo.stride[j]
    return None if o >= short else correct_tap(geo, j, o, k)


def clamped_padding(geo, j, o, k):
    """Taps in the padding read (or write) the edge element instead of a zero."""
    return min(max(correct_tap(geo, j, o, k), 0), geo.spatial[j] - 1)


for _op, _fn in ((DGRAD, dgrad), (WGRAD, wgrad)):
    reference.impl(_op)(lambda inputs, outs, params, _f=_fn: write(outs, _f(inputs, params)))


# ----------------------------------------------------------------------------- dgrad


@plant(DGRAD, "strided_phase_off_by_one")
def dgrad_phase_off_by_one(inputs, outs, params):
    """Along strided dims every contribution lands one input row late: the phase i mod s is off by one."""
    write(outs, dgrad(inputs, params, rule=phase_off_by_one))


@plant(DGRAD, "drops_last_output_position")
def dgrad_drops_last_output(inputs, outs, params):
    """Loops over O = (I + 2p - d(k-1)) // s output positions: one short whenever s does not divide it."""
    write(outs, dgrad(inputs, params, rule=last_output_dropped))


@plant(DGRAD, "padding_folded_into_edge")
def dgrad_padding_folded(inputs, outs, params):
    """Contributions that land in the padding are added to the edge row instead of being dropped."""
    write(outs, dgrad(inputs, params, rule=clamped_padding))


@plant(DGRAD, "groups_share_first_input_channels")
def dgrad_wrong_group(inputs, outs, params):
    """Every group scatters into group 0's input channels (the group offset of dx is missing)."""
    write(outs, dgrad(inputs, params, wrong_group=True))


@plant(DGRAD, "accumulate_in_input_dtype", HALF)
def dgrad_low(inputs, outs, params):
    """Accumulates the (output channel, tap) terms in the 16-bit input dtype instead of float32."""
    write(outs, dgrad(inputs, params, low=_low(outs)))


@plant(DGRAD, "strided_input_as_contiguous")
def dgrad_contiguous(inputs, outs, params):
    """Reads dy and w as if they were contiguous (a transposed or sliced view's strides ignored)."""
    write(outs, dgrad(inputs, params, read=as_contiguous))


@plant(DGRAD, "last_element_unwritten")
def dgrad_unwritten(inputs, outs, params):
    """The last element of dx is never written (the NaN-poison control)."""
    skip_last(outs, dgrad(inputs, params), "dx")


# ----------------------------------------------------------------------------- wgrad


@plant(WGRAD, "misses_last_batch_element")
def wgrad_misses_last_batch(inputs, outs, params):
    """Sums over the batch n < N - 1: the last batch element is left out."""
    n = cc.geometry(params, WGRAD).n
    write(outs, wgrad(inputs, params, batch=slice(0, n - 1) if n > 1 else slice(None)))


@plant(WGRAD, "drops_last_output_position")
def wgrad_drops_last_output(inputs, outs, params):
    """Loops over O = (I + 2p - d(k-1)) // s output positions: one short whenever s does not divide it."""
    write(outs, wgrad(inputs, params, rule=last_output_dropped))


@plant(WGRAD, "padding_reads_edge")
def wgrad_padding_reads_edge(inputs, outs, params):
    """Taps in the padding read the edge element of x (a clamped index) instead of zero."""
    write(outs, wgrad(inputs, params, rule=clamped_padding))


@plant(WGRAD, "groups_read_first_input_channels")
def wgrad_wrong_group(inputs, outs, params):
    """Every group reads group 0's input channels of x (the group offset of x is missing)."""
    write(outs, wgrad(inputs, params, wrong_group=True))


@plant(WGRAD, "accumulate_in_input_dtype", HALF)
def wgrad_low(inputs, outs, params):
    """Accumulates the N * prod(O) terms of each weight in the 16-bit input dtype instead of float32."""
    write(outs, wgrad(inputs, params, low=_low(outs)))


@plant(WGRAD, "strided_input_as_contiguous")
def wgrad_contiguous(inputs, outs, params):
    """Reads dy and x as if they were contiguous (a transposed or sliced view's strides ignored)."""
    write(outs, wgrad(inputs, params, read=as_contiguous))


@plant(WGRAD, "last_element_unwritten")
def wgrad_unwritten(inputs, outs, params):
    """The last element of dw is never written (the NaN-poison control)."""
    skip_last(outs, wgrad(inputs, params), "dw")
