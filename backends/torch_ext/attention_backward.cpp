// attention_backward for the torch extension: the op's schemas and its CPU kernel (plain loops,
// float accumulation, double for float64).  The CUDA launches are attention_backward_cuda.cu; the
// plan of both devices comes from Python (backends/torch_ext/attention_backward.py).
//
// Ops (namespace gradoracle; `dout` is the oracle's `do`, a Python keyword):
//   attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout, Tensor lse, float? softmax_scale,
//       bool causal, int[] window, float softcap) -> (Tensor dq, Tensor dk, Tensor dv)
//   attention_backward.out(<the same>, *, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv) -> ()
//   _attention_backward_run(q, k, v, o, dout, lse, Tensor plan, float scale, float softcap, *, dq, dk, dv) -> ()
//       (internal: checks the arguments against the plan, runs it)
// The public ops' kernels are Python: they make the plan, then call the run op.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "attention_backward.h"

namespace gradoracle {
namespace {

// One (batch, kv head) of the backward, by the oracle's formulas: every query head of the group,
// every query row's allowed keys (one band per row).  dk, dv accumulate in A over the group.
template <typename T, typename A>
void attn_cpu_group(const AttnParamsH& p, int64_t b, int64_t c, A scale, A softcap, const T* q, const T* k,
                    const T* v, const T* o, const T* dout, const A* lse, T* dq, T* dk, T* dv) {
  const int64_t D = p.D, off = p.Sk - p.Sq;
  std::vector<A> dk_acc(p.Sk * D, A(0)), dv_acc(p.Sk * D, A(0)), dq_row(D);
  for (int64_t h = c * p.G; h < (c + 1) * p.G; ++h) {
    for (int64_t i = 0; i < p.Sq; ++i) {
      const int64_t diag = i + off;
      const int64_t lo = p.left >= 0 ? std::max<int64_t>(diag - p.left, 0) : 0;
      const int64_t hi = p.right >= 0 ? std::min<int64_t>(diag + p.right, p.Sk - 1) : p.Sk - 1;
      std::fill(dq_row.begin(), dq_row.end(), A(0));
      const T* qi = q + b * p.q_b + i * p.q_s + h * p.q_h;
      const T* di = dout + b * p.do_b + i * p.do_s + h * p.do_h;
      if (lo <= hi) {
        const T* oi = o + b * p.o_b + i * p.o_s + h * p.o_h;
        A delta = 0;
        for (int64_t d = 0; d < D; ++d) delta += static_cast<A>(oi[d]) * static_cast<A>(di[d]);
        const A l = lse[b * p.lse_b + h * p.lse_h + i * p.lse_s];
        for (int64_t j = lo; j <= hi; ++j) {
          const T* kj = k + b * p.k_b + j * p.k_s + c * p.k_h;
          const T* vj = v + b * p.v_b + j * p.v_s + c * p.v_h;
          A s = 0, dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            s += static_cast<A>(qi[d]) * static_cast<A>(kj[d]);
            dp += static_cast<A>(di[d]) * static_cast<A>(vj[d]);
          }
          s *= scale;
          A dcap = 1;
          if (softcap != 0) {
            const A th = std::tanh(s / softcap);
            s = softcap * th;
            dcap = 1 - th * th;
          }
          const A pr = std::exp(s - l), ds = pr * (dp - delta) * dcap;
          A* dkj = dk_acc.data() + j * D;
          A* dvj = dv_acc.data() + j * D;
          for (int64_t d = 0; d < D; ++d) {
            dq_row[d] += ds * static_cast<A>(kj[d]);
            dkj[d] += ds * static_cast<A>(qi[d]);
            dvj[d] += pr * static_cast<A>(di[d]);
          }
        }
      }
      T* out = dq + b * p.dq_b + i * p.dq_s + h * p.dq_h;
      for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(scale * dq_row[d]);
    }
  }
  for (int64_t j = 0; j < p.Sk; ++j) {
    T* ok = dk + b * p.dk_b + j * p.dk_s + c * p.dk_h;
    T* ov = dv + b * p.dv_b + j * p.dv_s + c * p.dv_h;
    for (int64_t d = 0; d < D; ++d) {
      ok[d] = static_cast<T>(scale * dk_acc[j * D + d]);
      ov[d] = static_cast<T>(dv_acc[j * D + d]);
    }
  }
}

void attention_backward_run_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                                const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& plan, double scale,
                                double softcap, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  const int64_t* words = plan_words("attention_backward", plan, kAttnWords);
  AttnParamsH p;
  std::memcpy(&p, words + kAttnHeader, sizeof(p));
  attn_check(q, k, v, o, dout, lse, dq, dk, dv, p);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "attention_backward_cpu", [&] {
    using A = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t *qp = q.const_data_ptr<scalar_t>(), *kp = k.const_data_ptr<scalar_t>(),
                   *vp = v.const_data_ptr<scalar_t>(), *op = o.const_data_ptr<scalar_t>(),
                   *dp = dout.const_data_ptr<scalar_t>();
    const A* lp = lse.const_data_ptr<A>();
    scalar_t *dqp = dq.mutable_data_ptr<scalar_t>(), *dkp = dk.mutable_data_ptr<scalar_t>(),
             *dvp = dv.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, p.B * p.Hkv, 1, [&](int64_t begin, int64_t end) {
      for (int64_t bc = begin; bc < end; ++bc)
        attn_cpu_group<scalar_t, A>(p, bc / p.Hkv, bc % p.Hkv, static_cast<A>(scale), static_cast<A>(softcap), qp,
                                    kp, vp, op, dp, lp, dqp, dkp, dvp);
    });
  });
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout, Tensor lse, float? softmax_scale, "
        "bool causal, int[] window, float softcap) -> (Tensor, Tensor, Tensor)");
  m.def("attention_backward.out(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout, Tensor lse, "
        "float? softmax_scale, bool causal, int[] window, float softcap, *, Tensor(a!) dq, Tensor(b!) dk, "
        "Tensor(c!) dv) -> ()");
  m.def("_attention_backward_run(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout, Tensor lse, Tensor plan, "
        "float scale, float softcap, *, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv) -> ()");
}

TORCH_LIBRARY_IMPL(gradoracle, CPU, m) {
  m.impl("_attention_backward_run", TORCH_FN(gradoracle::attention_backward_run_cpu));
}
