// conv_backward_data and conv_backward_weight for the torch extension: the ops' schemas, their
// argument checks (shared by both devices) and their CPU kernels.  The CUDA launches are
// conv_backward_cuda.cu; the plans of both devices come from Python (backends/torch_ext/conv_backward.py).
//
// Ops (namespace gradoracle):
//   conv_backward_data(Tensor dy, Tensor w, int[] spatial, int[] stride, int[] padding, int[] dilation,
//                      int groups, bool channels_last) -> Tensor
//   conv_backward_data.out(..., *, Tensor(a!) dx) -> ()
//   conv_backward_weight(Tensor dy, Tensor x, int[] kernel, int[] stride, int[] padding, int[] dilation,
//                        int groups, bool channels_last) -> Tensor
//   conv_backward_weight.out(..., *, Tensor(a!) dw) -> ()
//       the public ops; their kernels are Python (they make the plan, then call:)
//   _conv_backward_data_run(Tensor dy, Tensor w, Tensor plan, Tensor? table, *, Tensor(a!) dx) -> ()
//   _conv_backward_weight_run(Tensor dy, Tensor x, Tensor plan, *, Tensor(a!) dw) -> ()
//       check every argument and run the plan (a ConvRecordH, conv_backward.h).
//
// CPU kernels: plain loops over the output through the plan's element strides, each element
// summed by one thread in a fixed order (taps, then channels; wgrad: n, then output positions),
// accumulating in float (double for float64).
#include <algorithm>
#include <cstring>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "common.h"
#include "conv_backward.h"

namespace gradoracle {

void check_conv_run(const char* op, const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name,
                    const at::Tensor& out, const char* out_name, const at::Tensor& plan, ConvRecordH& rec) {
  check_float_input(op, a, a_name);
  check_float_input(op, b, b_name);
  check_like(op, b, b_name, a, a_name);
  TORCH_CHECK_VALUE(out.defined() && out.layout() == at::kStrided, op, ": ", out_name, " must be a strided tensor");
  check_like(op, out, out_name, a, a_name);
  TORCH_CHECK_VALUE(out.is_contiguous(), op, ": ", out_name, " must be contiguous, got strides ", out.strides(),
                    " for shape ", out.sizes());
  TORCH_CHECK_VALUE(a.dim() >= 3 && a.dim() <= 5 && b.dim() == a.dim() && out.dim() == a.dim(), op, ": ", a_name,
                    ", ", b_name, ", ", out_name, " must have one rank in 3..5, got ", a.dim(), ", ", b.dim(), ", ",
                    out.dim());
  check_no_overlap(op, out, out_name, a, a_name);
  check_no_overlap(op, out, out_name, b, b_name);
  std::memcpy(&rec, plan_words(op, plan, kConvRecordWords), sizeof(ConvRecordH));
  const bool cpu = a.device().is_cpu();
  TORCH_CHECK_VALUE(cpu == (rec.kind == CONV_CPU), op, ": plan has kind ", rec.kind, ", which ", a.device(),
                    " does not run");
  // The plan's sizes must be these tensors' (the strides it holds are theirs by construction in
  // Python; the sizes are checked here so a stale plan cannot index out of bounds).
  const ConvParamsH& p = rec.p;
  const int64_t r = a.dim() - 2;
  int64_t o = 1, i = 1, k = 1;
  for (int64_t j = 3 - r; j < 3; ++j) {
    o *= p.out[j];
    i *= p.in[j];
    k *= p.k[j];
  }
  TORCH_CHECK_VALUE(a.size(0) == p.n && a.numel() == p.n * p.cout * o, op, ": plan is for ", a_name, " of ",
                    p.n * p.cout * o, " elements, got shape ", a.sizes());
  if (rec.op == 0) {
    TORCH_CHECK_VALUE(b.numel() == p.cout * p.cig * k && out.numel() == p.n * p.cin * i, op, ": plan does not match ",
                      b_name, " ", b.sizes(), " / ", out_name, " ", out.sizes());
  } else {
    TORCH_CHECK_VALUE(b.numel() == p.n * p.cin * i && out.numel() == p.cout * p.cig * k, op,
                      ": plan does not match ", b_name, " ", b.sizes(), " / ", out_name, " ", out.sizes());
  }
}

namespace {

constexpr const char* kData = "conv_backward_data";
constexpr const char* kWeight = "conv_backward_weight";

// dx[n, c, i] = sum over taps k with i + p - k*d = o*s (0 <= o < O), co in group(c), of dy * w.
template <typename scalar_t>
void dgrad_cpu(const ConvParamsH& p, const scalar_t* dy, const scalar_t* w, scalar_t* dx) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t positions = p.in[0] * p.in[1] * p.in[2];
  at::parallel_for(0, p.n * positions, 16, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t n = e / positions, q = e % positions;
      const int64_t i[3] = {q / (p.in[1] * p.in[2]), (q / p.in[2]) % p.in[1], q % p.in[2]};
      for (int64_t c = 0; c < p.cin; ++c) {
        const int64_t g = c / p.cig, cl = c % p.cig;
        acc_t acc = 0;
        for (int64_t kd = 0; kd < p.k[0]; ++kd) {
          const int64_t td = i[0] + p.p[0] - kd * p.d[0];
          if (td < 0 || td % p.s[0] || td / p.s[0] >= p.out[0]) continue;
          for (int64_t kh = 0; kh < p.k[1]; ++kh) {
            const int64_t th = i[1] + p.p[1] - kh * p.d[1];
            if (th < 0 || th % p.s[1] || th / p.s[1] >= p.out[1]) continue;
            for (int64_t kw = 0; kw < p.k[2]; ++kw) {
              const int64_t tw = i[2] + p.p[2] - kw * p.d[2];
              if (tw < 0 || tw % p.s[2] || tw / p.s[2] >= p.out[2]) continue;
              const scalar_t* yp = dy + n * p.sa[0] + td / p.s[0] * p.sa[2] + th / p.s[1] * p.sa[3] +
                                   tw / p.s[2] * p.sa[4];
              const scalar_t* wp = w + cl * p.sb[1] + kd * p.sb[2] + kh * p.sb[3] + kw * p.sb[4];
              for (int64_t co = g * p.cog; co < (g + 1) * p.cog; ++co)
                acc += static_cast<acc_t>(yp[co * p.sa[1]]) * static_cast<acc_t>(wp[co * p.sb[0]]);
            }
          }
        }
        dx[n * p.sc[0] + c * p.sc[1] + i[0] * p.sc[2] + i[1] * p.sc[3] + i[2] * p.sc[4]] = static_cast<scalar_t>(acc);
      }
    }
  });
}

// dw[co, c, k] = sum over n, o of dy[n, co, o] * x[n, first(co) + c, o*s + k*d - p] (padding reads 0).
template <typename scalar_t>
void wgrad_cpu(const ConvParamsH& p, const scalar_t* dy, const scalar_t* x, scalar_t* dw) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t taps = p.k[0] * p.k[1] * p.k[2];
  at::parallel_for(0, p.cout * taps, 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const int64_t co = e / taps, t = e % taps;
      const int64_t k[3] = {t / (p.k[1] * p.k[2]), (t / p.k[2]) % p.k[1], t % p.k[2]};
      const int64_t g = co / p.cog;
      for (int64_t c = 0; c < p.cig; ++c) {
        acc_t acc = 0;
        for (int64_t n = 0; n < p.n; ++n)
          for (int64_t od = 0; od < p.out[0]; ++od) {
            const int64_t id = od * p.s[0] + k[0] * p.d[0] - p.p[0];
            if (id < 0 || id >= p.in[0]) continue;
            for (int64_t oh = 0; oh < p.out[1]; ++oh) {
              const int64_t ih = oh * p.s[1] + k[1] * p.d[1] - p.p[1];
              if (ih < 0 || ih >= p.in[1]) continue;
              for (int64_t ow = 0; ow < p.out[2]; ++ow) {
                const int64_t iw = ow * p.s[2] + k[2] * p.d[2] - p.p[2];
                if (iw < 0 || iw >= p.in[2]) continue;
                acc += static_cast<acc_t>(dy[n * p.sa[0] + co * p.sa[1] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4]]) *
                       static_cast<acc_t>(x[n * p.sb[0] + (g * p.cig + c) * p.sb[1] + id * p.sb[2] + ih * p.sb[3] +
                                            iw * p.sb[4]]);
              }
            }
          }
        dw[co * p.sc[0] + c * p.sc[1] + k[0] * p.sc[2] + k[1] * p.sc[3] + k[2] * p.sc[4]] = static_cast<scalar_t>(acc);
      }
    }
  });
}

void dgrad_run_cpu(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& plan,
                   const std::optional<at::Tensor>& table, at::Tensor& dx) {
  ConvRecordH r;
  check_conv_run(kData, dy, "dy", w, "w", dx, "dx", plan, r);
  (void)table;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dy.scalar_type(), kData, [&] {
    dgrad_cpu<scalar_t>(r.p, dy.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                        dx.mutable_data_ptr<scalar_t>());
  });
}

void wgrad_run_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& plan, at::Tensor& dw) {
  ConvRecordH r;
  check_conv_run(kWeight, dy, "dy", x, "x", dw, "dw", plan, r);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dy.scalar_type(), kWeight, [&] {
    wgrad_cpu<scalar_t>(r.p, dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                        dw.mutable_data_ptr<scalar_t>());
  });
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("conv_backward_data(Tensor dy, Tensor w, int[] spatial, int[] stride, int[] padding, int[] dilation, "
        "int groups, bool channels_last) -> Tensor");
  m.def("conv_backward_data.out(Tensor dy, Tensor w, int[] spatial, int[] stride, int[] padding, int[] dilation, "
        "int groups, bool channels_last, *, Tensor(a!) dx) -> ()");
  m.def("_conv_backward_data_run(Tensor dy, Tensor w, Tensor plan, Tensor? table, *, Tensor(a!) dx) -> ()");
  m.def("conv_backward_weight(Tensor dy, Tensor x, int[] kernel, int[] stride, int[] padding, int[] dilation, "
        "int groups, bool channels_last) -> Tensor");
  m.def("conv_backward_weight.out(Tensor dy, Tensor x, int[] kernel, int[] stride, int[] padding, int[] dilation, "
        "int groups, bool channels_last, *, Tensor(a!) dw) -> ()");
  m.def("_conv_backward_weight_run(Tensor dy, Tensor x, Tensor plan, *, Tensor(a!) dw) -> ()");
}

TORCH_LIBRARY_IMPL(gradoracle, CPU, m) {
  m.impl("_conv_backward_data_run", TORCH_FN(gradoracle::dgrad_run_cpu));
  m.impl("_conv_backward_weight_run", TORCH_FN(gradoracle::wgrad_run_cpu));
}
