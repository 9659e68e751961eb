// matmul_backward: what host C++ shares with the device code (backends/cuda/matmul_backward.cuh):
// the tile constants, the GEMM parameter struct, and the launch record torch_ext's C++ op runs
// from (packed in Python by backends/_plans/matmul_backward_cuda.py).  Plain host C++ too.
#pragma once

#define MM_BLOCK 256
#define MM_V 4
#define MM_GROUP 8
#define MM_BM 128
#define MM_BN 128
#define MM_BK 32
#define MM_STAGES 4
#define MM_PAD 8  // elements of padding per shared row: ldmatrix rows land in distinct banks
#define MM_SG_BK 8  // mm_sgemm: k-step depth (shared rows: the tile's width + 4 floats)

// All long long, packed by the host as int64 words in this order (MM_GEMM_WORDS).
struct MMGemm {
  long long I, J, R, F, P;
  long long xi, xr, yr, yj;
  long long tiles_i, tiles_j;  // tile counts of the launch's kernel (0 for naive / regtile)
};
#define MM_GEMM_WORDS 11

// One GEMM of a call as torch_ext runs it: what to do, mm_mma's template flags, where its fold
// offsets start in the table tensor, the block tile's rows BM (mm_mma: 64 or 128; mm_smem: 128
// for its 128 x 128 8 x 8 tiles, 64 for the 64 x 64 4 x 4 ones), then MMGemm.  MMRecord: dA's, then dB's (MM_RECORD_WORDS).
enum { MM_EMPTY = 0, MM_ZERO = 1, MM_RUN = 2 };
struct MMLaunch {
  long long kind, xt, yt, vec, table_off, bm;
  MMGemm g;
};
struct MMRecord {
  MMLaunch gemm[2];
};
#define MM_LAUNCH_WORDS 17
#define MM_RECORD_WORDS 34
