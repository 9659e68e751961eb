// Broadcast plan for binary_backward kernels: a C++ port of backends/_bcast_plan.py.
//
// Every dim d of the broadcast output O (after left-padding A and B to O's rank and
// dropping size-1 dims of O) falls in exactly one class:
//
//   K   both operands have O's size there: both gradients keep the dim;
//   RA  A has size 1 there (A was broadcast): grad_a sums over it, grad_b keeps it;
//   RB  B has size 1 there: grad_b sums over it, grad_a keeps it.
//
// So O is, up to a permutation of dims, a K x RA x RB box, and
//     grad_a[k, rb] = sum_ra t_a[k, ra, rb],    grad_b[k, ra] = sum_rb t_b[k, ra, rb].
// Adjacent dims of one class whose strides chain in every tensor are merged, so a
// contiguous no-broadcast case becomes one K dim of numel(O).
//
// Strides are in elements; grad_a and grad_b are contiguous with shapes A and B and
// have stride 0 along the dims they sum over.  BcastPlan is a trivially copyable
// aggregate of fixed arrays, so a CUDA kernel can take it by value (~1.2 KB).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

namespace gradoracle {

constexpr int kMaxDims = 8;  // kernels unravel at most this many dims per class

// Slots of DimGroup::strides, in the order of TENSORS in _bcast_plan.py.
enum Operand : int { kA = 0, kB = 1, kG = 2, kGA = 3, kGB = 4 };
constexpr int kNumOperands = 5;

struct DimGroup {
  int64_t ndim;                                // merged dims in use, 0..kMaxDims
  int64_t sizes[kMaxDims];                     // outermost first
  int64_t strides[kNumOperands][kMaxDims];     // strides[op][d], elements

  C10_HOST_DEVICE int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= sizes[d];
    return n;
  }

  // Offset of element `linear` of this group (row-major, last dim fastest) in operand `op`.
  C10_HOST_DEVICE int64_t offset(int64_t linear, int op) const {
    int64_t off = 0;
    for (int d = static_cast<int>(ndim) - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      off += i * strides[op][d];
    }
    return off;
  }

  // Offsets of element `linear` in all five operands at once (one unravel).
  C10_HOST_DEVICE void offsets(int64_t linear, int64_t out[kNumOperands]) const {
    for (int t = 0; t < kNumOperands; ++t) out[t] = 0;
    for (int d = static_cast<int>(ndim) - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      for (int t = 0; t < kNumOperands; ++t) out[t] += i * strides[t][d];
    }
  }
};

struct BcastPlan {
  DimGroup k, ra, rb;
  int64_t numel;  // numel(O) = k.numel() * ra.numel() * rb.numel()

  C10_HOST_DEVICE bool no_broadcast() const { return ra.ndim == 0 && rb.ndim == 0; }

  // No broadcast and every tensor dense in the same order: one flat elementwise pass.
  C10_HOST_DEVICE bool contiguous_fast_path() const {
    if (!no_broadcast()) return false;
    if (k.ndim == 0) return true;
    if (k.ndim != 1) return false;
    for (int t = 0; t < kNumOperands; ++t)
      if (k.strides[t][0] != 1) return false;
    return true;
  }
};

// ----------------------------------------------------------------------------- host-only builders

// NumPy broadcast of two shapes; ValueError naming both shapes and the first bad dim.
inline std::vector<int64_t> broadcast_shape(c10::IntArrayRef a_shape, c10::IntArrayRef b_shape) {
  const size_t rank = std::max(a_shape.size(), b_shape.size());
  std::vector<int64_t> out(rank);
  for (size_t d = 0; d < rank; ++d) {
    const size_t la = rank - a_shape.size(), lb = rank - b_shape.size();
    const int64_t x = d < la ? 1 : a_shape[d - la];
    const int64_t y = d < lb ? 1 : b_shape[d - lb];
    TORCH_CHECK_VALUE(x == y || x == 1 || y == 1, "binary_backward: shapes ", a_shape, " and ", b_shape,
                      " do not broadcast (dim ", d, ": ", x, " vs ", y, ")");
    out[d] = x == 1 ? y : x;
  }
  return out;
}

inline std::vector<int64_t> contiguous_strides(c10::IntArrayRef shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t acc = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = acc;
    acc *= shape[d];
  }
  return strides;
}

namespace detail {

// Appends one output dim to `grp`, merging into its innermost dim when the strides chain
// in every tensor (outer stride == inner stride * inner size).
inline void push_dim(DimGroup& grp, const char* name, int64_t n, const int64_t (&s)[kNumOperands]) {
  if (grp.ndim > 0) {
    const int64_t last = grp.ndim - 1;
    bool chains = true;
    for (int t = 0; t < kNumOperands; ++t) chains = chains && grp.strides[t][last] == s[t] * n;
    if (chains) {
      grp.sizes[last] *= n;
      for (int t = 0; t < kNumOperands; ++t) grp.strides[t][last] = s[t];
      return;
    }
  }
  // Merging only ever touches the innermost dim, so overflowing here equals the Python
  // check after merging.
  TORCH_CHECK_VALUE(grp.ndim < kMaxDims, "binary_backward: more than ", kMaxDims, " ", name,
                    " dims after merging (kernels unravel at most ", kMaxDims, ")");
  for (int t = 0; t < kNumOperands; ++t) grp.strides[t][grp.ndim] = s[t];
  grp.sizes[grp.ndim++] = n;
}

}  // namespace detail

// a/b/g strides in elements, for tensors of shapes A, B and broadcast(A, B).
inline BcastPlan make_plan(c10::IntArrayRef a_shape, c10::IntArrayRef b_shape, c10::IntArrayRef a_strides,
                           c10::IntArrayRef b_strides, c10::IntArrayRef g_strides) {
  const std::vector<int64_t> out_shape = broadcast_shape(a_shape, b_shape);
  const size_t rank = out_shape.size();
  TORCH_CHECK_VALUE(a_strides.size() == a_shape.size() && b_strides.size() == b_shape.size() &&
                        g_strides.size() == rank,
                    "binary_backward: make_plan got strides of the wrong rank");
  const std::vector<int64_t> ga_contig = contiguous_strides(a_shape), gb_contig = contiguous_strides(b_shape);
  const size_t la = rank - a_shape.size(), lb = rank - b_shape.size();

  BcastPlan plan{};
  plan.numel = 1;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t n = out_shape[d];
    plan.numel *= n;
    if (n == 1) continue;
    const bool a_bcast = d < la || a_shape[d - la] == 1;
    const bool b_bcast = d < lb || b_shape[d - lb] == 1;
    // a_bcast and b_bcast cannot both hold: then O's size would be 1.
    const int64_t s[kNumOperands] = {
        a_bcast ? 0 : a_strides[d - la],
        b_bcast ? 0 : b_strides[d - lb],
        g_strides[d],
        a_bcast ? 0 : ga_contig[d - la],
        b_bcast ? 0 : gb_contig[d - lb],
    };
    if (a_bcast)
      detail::push_dim(plan.ra, "ra", n, s);
    else if (b_bcast)
      detail::push_dim(plan.rb, "rb", n, s);
    else
      detail::push_dim(plan.k, "k", n, s);
  }
  return plan;
}

}  // namespace gradoracle
