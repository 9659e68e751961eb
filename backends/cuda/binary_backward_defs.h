// binary_backward: what host C++ and the CUDA device code share, written once.
//
//   * the list of fns (the FN template argument of every kernel is an index into it),
//   * their partial derivatives (df/da, df/db), for the CPU kernel and the GPU kernels alike,
//   * the parameter structs the host packs: BBGroup / BBParams (the kernels' by-value
//     argument) and BBLaunch (a whole launch, as torch_ext's C++ op receives it).
//
// Included by binary_backward.cuh (device code: NVRTC for cupy, nvcc for torch_ext) and by
// backends/torch_ext/binary_backward.cpp (the CPU kernel, a host C++ compiler).  So it compiles
// under all three: no standard header under NVRTC, only `long long` integer types in structs.
// Spec: oracle/binary_backward.py.  The Python side mirrors the fn list (oracle FNS) and the
// struct sizes and kinds (backends/_plans/binary_backward_cuda.py); tests/test_cuda_compile.py
// checks that they agree.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define BB_HD __host__ __device__ __forceinline__
#else
#include <math.h>
#define BB_HD inline
#endif

// ============================================================================ fns

// The fns in the order of oracle/binary_backward.py's FNS: BB_ADD = 0, BB_SUB = 1, ...
#define BB_FNS(X) X(ADD, add) X(SUB, sub) X(MUL, mul) X(DIV, div) X(POW, pow) X(MAXIMUM, maximum) X(MINIMUM, minimum)

#define BB_FN_ENUM_(UPPER, lower) BB_##UPPER,
enum : int { BB_FNS(BB_FN_ENUM_) BB_NUM_FNS };
#undef BB_FN_ENUM_

#ifndef __CUDACC_RTC__
// Host code parses fn names with these ("add" -> BB_ADD, ...).
#define BB_FN_NAME_(UPPER, lower) #lower,
inline constexpr const char* bb_fn_names[BB_NUM_FNS] = {BB_FNS(BB_FN_NAME_)};
#undef BB_FN_NAME_
#endif

// ============================================================================ partials

// Explicit float / double overloads: the same names exist on the host (math.h) and the device.
BB_HD float bb_pow(float x, float y) { return powf(x, y); }
BB_HD double bb_pow(double x, double y) { return pow(x, y); }
BB_HD float bb_log(float x) { return logf(x); }
BB_HD double bb_log(double x) { return log(x); }

// add and sub never read a or b, so kernels skip those loads.
template <int FN> struct BBUsesOperands { static constexpr bool value = FN >= BB_MUL; };

// df/da, df/db at (a, b) in A (float, or double for float64 inputs), exactly as the oracle's
// docstring defines them.
template <int FN, typename A>
BB_HD void bb_partials(A a, A b, A& da, A& db) {
  if (FN == BB_ADD) {
    da = A(1); db = A(1);
  } else if (FN == BB_SUB) {
    da = A(1); db = A(-1);
  } else if (FN == BB_MUL) {
    da = b; db = a;
  } else if (FN == BB_DIV) {
    da = A(1) / b; db = -a / (b * b);
  } else if (FN == BB_POW) {
    da = b * bb_pow(a, b - A(1));
    // a**b * ln(a) -> 0 as a -> 0 for b >= 0, where IEEE would give 0 * -inf = NaN.
    db = (a == A(0) && b >= A(0)) ? A(0) : bb_pow(a, b) * bb_log(a);
  } else {
    const bool wins = FN == BB_MAXIMUM ? a > b : a < b;
    da = a == b ? A(0.5) : (wins ? A(1) : A(0));  // ties split the gradient
    db = A(1) - da;
  }
}

// ============================================================================ parameter structs

#define BB_MAX_DIMS 8  // dims per group the kernels unravel (the plan merges dims first)
#define BB_NT 5        // tensor slots per group

// Tensor slots of a group's strides.  With swap = 0 (always, for the CPU kernel and bb_ew /
// bb_naive) P is a and Q is b, so the slots are a, b, grad_out, grad_a, grad_b.
enum : int { BB_P = 0, BB_Q = 1, BB_G = 2, BB_DP = 3, BB_DQ = 4 };

struct BBGroup {
  long long ndim;                              // dims in use, 0..BB_MAX_DIMS
  long long numel;                             // product of size[0..ndim) (1 when ndim == 0)
  long long size[BB_MAX_DIMS];                 // outer -> inner; unused entries are 1
  long long stride[BB_NT][BB_MAX_DIMS];        // elements, per slot
};

struct BBParams {
  BBGroup grp[3];
  long long lanes;         // lanes per row segment (bb_ew: tile columns); a power of two
  long long lanes_log2;
  long long chunk[3];      // chunk length along each group
  long long nchunk[3];     // chunks (tiles) along each group
  long long ntiles;        // tiles (bb_lr_stream: tasks)
  long long swap;          // 1: P is b and Q is a
  long long numel_out[2];  // numel of dP, dQ: the row length of their partial buffers
};

#define BB_GROUP_WORDS (2 + BB_MAX_DIMS + BB_NT * BB_MAX_DIMS)
#define BB_PARAMS_WORDS (3 * BB_GROUP_WORDS + 12)
static_assert(sizeof(BBGroup) == BB_GROUP_WORDS * 8, "BBGroup must be packed long longs");
static_assert(sizeof(BBParams) == BB_PARAMS_WORDS * 8, "BBParams must be packed long longs");

// The @opt2 rung's by-value argument: a thread per element i of O (row-major over O's size > 1
// dims), and for each tensor slot (a, b, grad_out, grad_a, grad_b) O's dims collapsed for that
// tensor: dims along which it does not move dropped, neighbours whose strides chain (in the tensor
// and in O) merged.  Its offset is the sum over its collapsed dims j of
//     ((i / div[j]) % size[j]) * stride[j]    (the % skipped where div[j] * size[j] == numel),
// one divide per remaining dim.  direct[0] (direct[1]): grad_a (grad_b) is not reduced, so its
// element is written once, in T; otherwise its terms are atomically added to an A accumulator.
struct BBCollapsed {
  long long numel;
  long long direct[2];
  long long ndim[BB_NT];
  long long div[BB_NT][BB_MAX_DIMS];
  long long size[BB_NT][BB_MAX_DIMS];
  long long stride[BB_NT][BB_MAX_DIMS];
};

#define BB_COLLAPSED_WORDS (3 + BB_NT + 3 * BB_NT * BB_MAX_DIMS)
static_assert(sizeof(BBCollapsed) == BB_COLLAPSED_WORDS * 8, "BBCollapsed must be packed long longs");

// What a launch is (the kernel, for the CUDA kinds; see the .cuh's contract).  BB_KIND_BOX is
// the CPU kernel's: the plan's K, RA, RB groups as they are (grp[0..2], swap = 0), to be walked
// on the host; ZERO, FAST and EW mean the same on the CPU as on the GPU.
enum : int {
  BB_KIND_ZERO = 0,   // numel(grad_out) == 0: both gradients are sums over nothing
  BB_KIND_FAST,       // no broadcast, all dense alike: flat elementwise
  BB_KIND_EW,         // no broadcast, strided
  BB_KIND_LK1,
  BB_KIND_LK8,
  BB_KIND_LR_STREAM,
  BB_KIND_LR_BATCHED,
  BB_KIND_BOX,
  BB_KIND_COLS,       // @best: bb_cols (vectorized = 1: 16-byte packs)
  BB_KIND_ROWS,       // @best: bb_rows (vectorized = 1: 16-byte packs)
  BB_KIND_BATCH,      // @best: bb_batch (vectorized = 1: 16-byte packs)
  BB_KIND_BOTH,       // @best: bb_both (vectorized = 1: 16-byte packs)
  BB_NUM_KINDS
};

// One launch, planned on the host in Python (backends/_plans/binary_backward_cuda.py) and
// passed whole, as int64 words in field order, to a C++ host that only launches.
struct BBLaunch {
  long long kind;          // BB_KIND_*
  long long grid;          // blocks (CUDA kinds)
  long long vectorized;    // FAST and the @best kinds: 16-byte packs (a host still checks the pointers)
  long long numel;         // numel(grad_out)
  long long nchunks[2];    // partial rows of dP, dQ (1: written final by stage 1)
  long long numel_out[2];  // numel of dP, dQ
  long long finalize_grid[2];  // blocks of bb_finalize for dP, dQ (when nchunks > 1)
  BBParams params;
};

#define BB_LAUNCH_WORDS (10 + BB_PARAMS_WORDS)
static_assert(sizeof(BBLaunch) == BB_LAUNCH_WORDS * 8, "BBLaunch must be packed long longs");
