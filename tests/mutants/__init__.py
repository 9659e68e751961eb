"""Planted near-miss kernels: at least six realistic bugs per op, for `python -m harness mutate`.

Each mutant is a small numpy wrapper over the op's float64 reference (common.py) with one bug
kernel authors really make: a reduction that drops its last term or tail tile, a broadcast
axis not folded, a 16-bit accumulator, eps outside the square root, a mask edge off by one, a
strided view read as contiguous, and one output element never written (the NaN-poison
control) per op.  They are registered on `mutant` (and their unmutated references on
`mutant_reference`), two backends made with register=False: nothing runs them unless asked,
as tests/planted.py.  A mutant is caught when some case of the set FAILs on it.
"""
from mutants import attention_backward, binary_backward, conv, matmul_backward, norms, reduce_sum  # noqa: F401
from mutants.common import mutant, reference  # noqa: F401
