"""binary_backward's broadcast plan, the host-side decomposition every kernel backend of the op
starts from (triton; cupy and torch_ext through binary_backward_cuda.py).

Every dim d of the broadcast output O (after left-padding A and B to O's rank and
dropping size-1 dims of O) falls in exactly one class:

  K   both operands have O's size there: both gradients keep the dim;
  RA  A has size 1 there (A was broadcast): grad_a sums over it, grad_b keeps it;
  RB  B has size 1 there: grad_b sums over it, grad_a keeps it.

So O is, up to a permutation of dims, a K x RA x RB box, and
    grad_a[k, rb] = sum_ra t_a[k, ra, rb],    grad_b[k, ra] = sum_rb t_b[k, ra, rb].
A kernel can read grad_out once and reduce both gradients in one pass over tiles of
that box.  Adjacent dims of one class whose strides chain (in every tensor) are
merged, so a contiguous no-broadcast case becomes one K dim of numel(O).

Strides are in elements; grad_a and grad_b are contiguous with shapes A and B, and
have stride 0 along the dims they sum over.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

MAX_DIMS = 8  # kernels unravel at most this many dims per class

TENSORS = ("a", "b", "g", "ga", "gb")


@dataclass
class Group:
    sizes: list[int] = field(default_factory=list)
    strides: dict[str, list[int]] = field(default_factory=lambda: {t: [] for t in TENSORS})

    @property
    def numel(self) -> int:
        return prod(self.sizes)

    @property
    def ndim(self) -> int:
        return len(self.sizes)


@dataclass
class Plan:
    out_shape: tuple[int, ...]
    k: Group
    ra: Group
    rb: Group

    @property
    def numel(self) -> int:
        return prod(self.out_shape)

    @property
    def no_broadcast(self) -> bool:
        return self.ra.ndim == 0 and self.rb.ndim == 0

    def contiguous_fast_path(self) -> bool:
        """No broadcast and every tensor dense in the same order: one flat elementwise pass."""
        if not self.no_broadcast:
            return False
        return self.k.ndim == 0 or (self.k.ndim == 1 and all(s == [1] for s in self.k.strides.values()))


def broadcast_shape(a_shape, b_shape) -> tuple[int, ...]:
    rank = max(len(a_shape), len(b_shape))
    a = (1,) * (rank - len(a_shape)) + tuple(a_shape)
    b = (1,) * (rank - len(b_shape)) + tuple(b_shape)
    out = []
    for d, (x, y) in enumerate(zip(a, b)):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"binary_backward: shapes {tuple(a_shape)} and {tuple(b_shape)} do not broadcast "
                             f"(dim {d}: {x} vs {y})")
        out.append(y if x == 1 else x)
    return tuple(out)


def contiguous_strides(shape) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return strides[::-1]


def make_plan(a_shape, b_shape, a_strides, b_strides, g_strides) -> Plan:
    """a/b/g strides in elements, for tensors of shapes A, B and broadcast(A, B)."""
    out_shape = broadcast_shape(a_shape, b_shape)
    rank = len(out_shape)

    def pad(shape, strides):
        lead = rank - len(shape)
        return (1,) * lead + tuple(shape), (0,) * lead + tuple(strides)

    a_shape_p, a_str = pad(a_shape, a_strides)
    b_shape_p, b_str = pad(b_shape, b_strides)
    ga_str = pad(a_shape, contiguous_strides(a_shape))[1]
    gb_str = pad(b_shape, contiguous_strides(b_shape))[1]

    dims = []  # (class, size, {tensor: stride})
    for d, n in enumerate(out_shape):
        if n == 1:
            continue
        cls = "ra" if a_shape_p[d] == 1 else "rb" if b_shape_p[d] == 1 else "k"
        s = {
            "a": 0 if a_shape_p[d] == 1 else a_str[d],
            "b": 0 if b_shape_p[d] == 1 else b_str[d],
            "g": g_strides[d],
            "ga": 0 if cls == "ra" else ga_str[d],
            "gb": 0 if cls == "rb" else gb_str[d],
        }
        dims.append((cls, n, s))

    groups = {"k": Group(), "ra": Group(), "rb": Group()}
    for cls, n, s in dims:
        grp = groups[cls]
        # Merge into the previous (outer) dim of the same class when it chains in every tensor.
        if grp.ndim and all(grp.strides[t][-1] == s[t] * n for t in TENSORS):
            grp.sizes[-1] *= n
            for t in TENSORS:
                grp.strides[t][-1] = s[t]
        else:
            grp.sizes.append(n)
            for t in TENSORS:
                grp.strides[t].append(s[t])
    for name, grp in groups.items():
        if grp.ndim > MAX_DIMS:
            raise ValueError(f"binary_backward: {grp.ndim} {name} dims after merging exceed {MAX_DIMS}")
    return Plan(out_shape, groups["k"], groups["ra"], groups["rb"])
