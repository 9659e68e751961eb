// matmul_backward: what matmul_backward.cpp (schemas, checks, CPU kernel) and
// matmul_backward_cuda.cu (CUDA launches) share.  Spec: oracle/matmul_backward.py.
//
// Both devices run gradoracle::_matmul_backward_run(a, b, dy, plan, table, *, da, db): `plan` is
// an MMRecord (backends/cuda/matmul_backward_defs.h) made in Python, `table` the folds' int64
// offsets on a's device (backends/_plans/matmul_backward_cuda.py `record`).  The C++ checks the
// arguments and runs the record; it never plans.
#pragma once

#include <ATen/core/Tensor.h>

#include "../cuda/matmul_backward_defs.h"

namespace gradoracle {

// Validates every argument (dtypes, devices, shapes, dense outputs, no overlap, the record and
// table against the shapes); errors are ValueError / TypeError naming the op and the argument.
MMRecord check_matmul_backward_run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& dy,
                                   const at::Tensor& plan, const at::Tensor& table, const at::Tensor& da,
                                   const at::Tensor& db);

}  // namespace gradoracle
