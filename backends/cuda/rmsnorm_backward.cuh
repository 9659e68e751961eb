// rmsnorm_backward: CUDA device code for the cupy backend (NVRTC; -I backends/cuda for
// norm_common.cuh).  Spec: oracle/rmsnorm_backward.py.  Host: backends/cupy/rmsnorm_backward.py
// and backends/cupy/_norm_plan.py.
//
// RMS norm is layer norm without the mean: xhat = x * rstd, dx = rstd * (g - xhat * mean(g *
// xhat)), dweight = sum over rows of dy * xhat, no dbias.  Its `best` variant is the layer
// norm's design (norm_common.cuh: nb_rows for rows held in registers, nb_chunked for
// long rows, nb_colsum for the deterministic second stage) instantiated with the policy below;
// the launch contract is the one documented there, with mean = nullptr (never read), flags =
// NB_HAS_W.
#pragma once

#include "norm_common.cuh"

struct NBRmsNorm {
  static constexpr bool kMean = false;
  static constexpr bool kBias = false;  // has a dbias
};
