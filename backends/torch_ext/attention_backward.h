// What attention_backward.cpp (schemas, checks, CPU kernel) and attention_backward_cuda.cu (the
// launches of backends/cuda/attention_backward.cuh) share: the plan's layout and the checks.
//
// The plan (made in Python by backends/torch_ext/attention_backward.py from the cupy planner,
// backends/cupy/attention_backward.py) is kAttnHeader header words, then AttnParams' words in
// field order (the .cuh's struct; AttnParamsH is its host copy, all int64):
//   kind      0 fa2_lean (atomic dq), 1 fa2_lean_det (dq kernel), 2 SIMT (f32 / f64)
//   dp bm bn wd qs qbm qbn npl  template parameters of the kernels (checked against what is built)
//   lpr       attn_pre_vec's lanes per row (0: attn_pre and attn_dq_convert, the scalar pair)
//   g0x       the preprocess grid;  g1x g1y  the main (or attn_simt_dq) grid;  g2x g2y  the third launch's;
//   g3x       attn_split_sum's grid (0: no split, AttnParams.split == 1)
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common.h"

namespace gradoracle {

constexpr int64_t kAttnHeader = 16;
enum AttnKind : int64_t { kAttnLean = 0, kAttnLeanDet = 1, kAttnSimt = 2 };

struct AttnParamsH {
  int64_t B, Sq, Sk, Hq, Hkv, D, G, left, right, aligned;
  int64_t q_b, q_s, q_h, k_b, k_s, k_h, v_b, v_s, v_h, o_b, o_s, o_h, do_b, do_s, do_h;
  int64_t lse_b, lse_h, lse_s, dq_b, dq_s, dq_h, dk_b, dk_s, dk_h, dv_b, dv_s, dv_h;
  int64_t split;
};
constexpr int64_t kAttnWords = kAttnHeader + static_cast<int64_t>(sizeof(AttnParamsH) / sizeof(int64_t));

struct AttnHeader {
  int64_t kind, dp, bm, bn, wd, qs, qbm, qbn, npl, lpr, g0x, g1x, g1y, g2x, g2y, g3x;
};
static_assert(sizeof(AttnHeader) == kAttnHeader * sizeof(int64_t), "AttnHeader words");

// Every argument of _attention_backward_run: q, k, v, o, dout, dq, dk, dv of one float dtype and
// device with head-dim stride 1 and shapes of the plan, lse float32 (float64 for float64 inputs),
// outputs not overlapping inputs or each other.
inline void attn_check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                       const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
                       const at::Tensor& dv, const AttnParamsH& p) {
  const char* op = "attention_backward";
  check_float_input(op, q, "q");
  const at::Tensor* ts[] = {&k, &v, &o, &dout, &dq, &dk, &dv};
  const char* names[] = {"k", "v", "o", "do", "dq", "dk", "dv"};
  for (int i = 0; i < 7; ++i) {
    check_float_input(op, *ts[i], names[i]);
    check_like(op, *ts[i], names[i], q, "q");
  }
  const at::Tensor* all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
  const char* all_names[] = {"q", "k", "v", "o", "do", "dq", "dk", "dv"};
  const int64_t* strides[] = {&p.q_b, &p.k_b, &p.v_b, &p.o_b, &p.do_b, &p.dq_b, &p.dk_b, &p.dv_b};
  for (int i = 0; i < 8; ++i) {
    const bool is_q = i == 0 || i == 3 || i == 4 || i == 5;
    const std::vector<int64_t> got = {all[i]->dim() == 4 ? all[i]->stride(0) : -1,
                                      all[i]->dim() == 4 ? all[i]->stride(1) : -1,
                                      all[i]->dim() == 4 ? all[i]->stride(2) : -1};
    const std::vector<int64_t> plan_s = {strides[i][0], strides[i][1], strides[i][2]};
    TORCH_CHECK_VALUE(got == plan_s, op, ": ", all_names[i], " has strides ", all[i]->strides(),
                      ", expected the plan's (", plan_s[0], ", ", plan_s[1], ", ", plan_s[2], ", 1)");
    const std::vector<int64_t> want = {p.B, is_q ? p.Sq : p.Sk, is_q ? p.Hq : p.Hkv, p.D};
    TORCH_CHECK_VALUE(all[i]->dim() == 4 && all[i]->sizes() == at::IntArrayRef(want), op, ": ", all_names[i],
                      " has shape ", all[i]->sizes(), ", expected ", at::IntArrayRef(want), " (from the plan)");
    TORCH_CHECK_VALUE(all[i]->stride(3) == 1, op, ": ", all_names[i], " has head-dim stride ", all[i]->stride(3),
                      ", expected 1");
  }
  const at::ScalarType acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_TYPE(lse.scalar_type() == acc, op, ": lse has dtype ", dtype_name(lse.scalar_type()), ", expected ",
                   dtype_name(acc));
  TORCH_CHECK_VALUE(lse.device() == q.device(), op, ": lse is on device ", lse.device(), ", expected ", q.device());
  const std::vector<int64_t> lwant = {p.B, p.Hq, p.Sq};
  TORCH_CHECK_VALUE(lse.dim() == 3 && lse.sizes() == at::IntArrayRef(lwant), op, ": lse has shape ", lse.sizes(),
                    ", expected ", at::IntArrayRef(lwant));
  TORCH_CHECK_VALUE(lse.stride(0) == p.lse_b && lse.stride(1) == p.lse_h && lse.stride(2) == p.lse_s, op,
                    ": lse has strides ", lse.strides(), ", expected the plan's");
  for (int i = 5; i < 8; ++i) {
    for (int j = 0; j < 8; ++j)
      if (j != i) check_no_overlap(op, *all[i], all_names[i], *all[j], all_names[j]);
    check_no_overlap(op, *all[i], all_names[i], lse, "lse");
  }
}

}  // namespace gradoracle
