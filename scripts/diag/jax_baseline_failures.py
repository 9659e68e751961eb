"""The two JAX baseline failures of the H100 `full` run (results/h100/baselines-full), explained.

1. mul[bf16,A=8x2048x4096,B=8x1x4096], grad_b (a sum over 2048 terms per element): JAX's
   result against emulations of where the rounding happens.  Each term g*a rounded to
   bfloat16 and summed in float32 is what torch eager does (and passes); if JAX misses by
   much more than that emulation, XLA kept part of the sum in bfloat16, which the spec
   ("accumulate in at least float32") rules out.
2. dgrad2d[f32,...,HW=9x9,k=3x3,s=4,p=0]: with stride 4 > kernel 3 the forward never reads
   rows/cols 3, 7, 8 of x, so dx there is exactly 0 (no term).  Prints the largest |dx| JAX
   and torch write there, and the largest elsewhere.

    python scripts/diag/jax_baseline_failures.py
"""
from __future__ import annotations

import os

import numpy as np

from cases import select
from harness import frameworks
from harness.compare import compare
from harness.registry import discover, find_impl, get_op, timed_callable
from harness.runner import prepare

BF16_MUL = "mul[bf16,A=8x2048x4096,B=8x1x4096]"
DEVICE = os.environ.get("DEVICE", "cuda")
DGRAD = "dgrad2d[f32,N=8,C=128->64,HW=9x9,k=3x3,s=4,p=0,d=1,g=1,nchw]"


def bf16(x):
    import ml_dtypes

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def run(impl_id, case, prep, device=None):
    device = device or DEVICE
    impl = find_impl(case.op, impl_id)
    fw = frameworks.adapter(impl.backend.framework)
    shapes = get_op(case.op).shapes(case)
    inputs = {k: fw.view(fw.upload(t, device), t) for k, t in prep.inputs.items()}
    outs = {o: fw.poisoned(shapes[o], case.dtype, device) for o in get_op(case.op).outputs_of(case)}
    got = impl.fn(inputs, outs, case.params) or outs
    fw.sync(device)
    return {k: fw.to_host64(v) for k, v in got.items()}


def main():
    discover()
    cases = {c.id: c for c in select("full")}
    case = cases[BF16_MUL]
    prep = prepare(case, 0, "auto", DEVICE)
    scale, n = prep.scale["grad_b"]
    a, g = prep.inputs64["a"], prep.inputs64["grad_out"]
    terms = bf16(g * np.broadcast_to(a, g.shape))  # each product rounded to bf16, as both frameworks form it
    emul = {
        "terms bf16, sum f32 (torch eager)": bf16(terms.astype(np.float32).sum(axis=1, keepdims=True, dtype=np.float32)),
        "terms bf16, sum bf16 sequential": None,
    }
    acc = np.zeros((terms.shape[0], 1, terms.shape[2]))
    for i in range(terms.shape[1]):
        acc = bf16(acc + terms[:, i:i + 1, :])
    emul["terms bf16, sum bf16 sequential"] = acc
    print(case.id, "grad_b reduction length", n, "oracle", prep.oracle)
    for label, value in emul.items():
        rep = compare("grad_b", value, prep.ref["grad_b"], scale, n, case.dtype)
        print(f"  {label:36} err/tol={rep.worst_ratio:8.3f} rel_l2={rep.rel_l2:.3e} mismatches={rep.mismatches}")
    for impl_id in ("jax", "torch"):
        got = run(impl_id, case, prep)["grad_b"]
        rep = compare("grad_b", got, prep.ref["grad_b"], scale, n, case.dtype)
        near = {lab: float(np.abs(got - v).max()) for lab, v in emul.items()}
        print(f"  {impl_id:36} err/tol={rep.worst_ratio:8.3f} rel_l2={rep.rel_l2:.3e} mismatches={rep.mismatches}"
              f"  max |got - emulation|: {near}")

    case = cases[DGRAD]
    prep = prepare(case, 0, "auto", DEVICE)
    read = np.zeros(9, bool)
    for o in range(2):  # output positions 0, 1 read x at 4*o + 0..2
        read[4 * o:4 * o + 3] = True
    unread = ~(read[:, None] & read[None, :])
    print(case.id, "unread positions per plane:", int(unread.sum()), "oracle there: max |dx| =",
          float(np.abs(prep.ref["dx"][..., unread]).max()))
    for impl_id in ("jax", "torch"):
        dx = run(impl_id, case, prep)["dx"]
        print(f"  {impl_id:6} max |dx| unread {np.abs(dx[..., unread]).max():.3e}, read {np.abs(dx[..., ~unread]).max():.3e},"
              f" nonzero unread {int((dx[..., unread] != 0).sum())}/{dx[..., unread].size}")


if __name__ == "__main__":
    main()
