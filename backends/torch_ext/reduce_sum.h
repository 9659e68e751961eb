// reduce_sum: what reduce_sum.cpp (schemas, checks, CPU kernel) and reduce_sum_cuda.cu (CUDA
// launches) share.  Spec: oracle/reduce_sum.py.
//
// Both devices run gradoracle::_reduce_sum_run(x, plan, *, y), whose `plan` is an RSRecord made in
// Python (backends/torch_ext/reduce_sum.py) from the cupy backend's pure-Python planner
// (backends/cupy/reduce_sum.py: make_plan collapses the request into (outer, reduced, inner)
// groups, plan_launch picks the kernel, grid and chunks): the C++ checks and runs, never plans.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace gradoracle {

// A host copy of backends/cuda/reduce_sum.cuh's RSGroup / RSParams (all int64, same order: the
// .cu static_asserts that the sizes agree and copies the bytes).
constexpr int kRsMaxDims = 8;

struct RSGroupH {
  int64_t ndim, numel;
  int64_t size[kRsMaxDims], xs[kRsMaxDims], ys[kRsMaxDims];
};

struct RSParamsH {
  RSGroupH outer, red;
  int64_t nseg, run, run_xs, nvec, units, tail, inner, inner_xs, inner_ys, lanes, lanes_log2, nchunk, chunk,
      ctiles, ntiles, vec_store;
};

// What the plan asks for: nothing (y empty), zeros (sums over nothing), the CPU loops, or one launch
// of a best kernel of reduce_sum.cuh.
enum RSKind : int64_t { RS_EMPTY = 0, RS_ZERO = 1, RS_CPU = 2, RS_ROW_TEAM = 3, RS_ROW_BLOCK = 4, RS_COL = 5 };

struct RSRecord {
  int64_t kind;       // RSKind
  int64_t col;        // the plan's mode: 0 row (a reduced dim is x's fastest), 1 col
  int64_t vec;        // 16-byte loads (the kernels' VEC)
  int64_t simple;     // the kernels' SIMPLE
  int64_t grid;       // blocks
  int64_t n_part;     // accumulator elements of partials the launch needs (0: none)
  int64_t n_ticket;   // zeroed tickets it needs
  int64_t out_numel;  // elements of y
  RSParamsH p;
};

constexpr int64_t kRsRecordWords = sizeof(RSRecord) / sizeof(int64_t);
static_assert(sizeof(RSRecord) == (8 + 2 * (2 + 3 * kRsMaxDims) + 16) * 8, "RSRecord must be packed int64");

// Validates x (a float tensor), y (contiguous, x's dtype and device, no overlap with x) and the
// plan (an RSRecord for y's element count, of a kind this device runs); fills `rec`.
void check_reduce_sum_run(const at::Tensor& x, const at::Tensor& plan, const at::Tensor& y, RSRecord& rec);

}  // namespace gradoracle
