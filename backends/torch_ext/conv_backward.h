// conv_backward_data / conv_backward_weight: what conv_backward.cpp (schemas, checks, CPU kernels)
// and conv_backward_cuda.cu (CUDA launches) share.  Spec: oracle/conv_backward_{data,weight}.py.
//
// Both devices run gradoracle::_conv_backward_{data,weight}_run(..., plan, ...), whose `plan` is a
// ConvRecordH made in Python (backends/torch_ext/conv_backward.py) by the planner cupy@best uses
// (backends/_plans/conv_cuda.py): the C++ checks and runs, never plans.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace gradoracle {

// A host copy of backends/cuda/conv_common.cuh's ConvParams (all int64, same order: the .cu
// static_asserts that the sizes agree and copies the bytes).
struct ConvParamsH {
  int64_t n, cin, cout, groups, cig, cog;
  int64_t in[3], out[3], k[3], s[3], p[3], d[3];
  int64_t sa[5], sb[5], sc[5];
  int64_t rows, mblocks, cblocks, splits, chunk, taps, phases, trow, cfast;
  int64_t magic[6];
};

// Kernel kinds of a record (the plan's expression, conv_backward.py KINDS).
// CONV_SMALLC / CONV_SMALLC_VEC: dgrad's cv_dgrad_smallc with dy read element by element / as 16-byte words.
enum ConvKind : int64_t {
  CONV_CPU = 0, CONV_GEMM = 1, CONV_VEC = 2, CONV_DIRECT = 3, CONV_TAPS = 4, CONV_SMALLC = 5, CONV_SMALLC_VEC = 6
};

struct ConvRecordH {
  int64_t op;         // 0 dgrad, 1 wgrad
  int64_t kind;       // ConvKind
  int64_t gx, gy, block;
  int64_t finish_grid;  // wgrad: blocks of the finishing kernel (0: none, one chunk)
  int64_t ws_elems;     // wgrad: workspace elements in the accumulator type
  int64_t table_len;    // dgrad: int32 words of the phase table
  int64_t bm;           // wgrad GEMM kinds: tile rows (64 or 128); dgrad small-Cin kinds: channel slots CP
  ConvParamsH p;
};
constexpr int64_t kConvRecordWords = sizeof(ConvRecordH) / sizeof(int64_t);

void check_conv_run(const char* op, const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name,
                    const at::Tensor& out, const char* out_name, const at::Tensor& plan, ConvRecordH& rec);

}  // namespace gradoracle
