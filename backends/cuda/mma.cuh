// Tensor-core and asynchronous-copy primitives shared by the tensor-core kernels (matmul, conv,
// attention backward).  Thin wrappers over the sm_80+ PTX instructions, one meaning each:
//
//   tc_mma16816<T>(d, a, b)    mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32, d += A * B
//                              (T = __nv_bfloat16 or __half; fp32 accumulate).  Per lane l,
//                              g = l >> 2, t = l & 3; every 32-bit register holds 2 consecutive
//                              16-bit elements, the lower index in the low half:
//                                A 16x16: a0 = A[g][2t..2t+1],   a1 = A[g+8][2t..2t+1],
//                                         a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9]
//                                B 16x8:  b0 = B[2t..2t+1][g],   b1 = B[2t+8..2t+9][g]
//                                D 16x8:  d0, d1 = D[g][2t], D[g][2t+1]; d2, d3 = D[g+8][2t], D[g+8][2t+1]
//   tc_ldmatrix_x{1,2,4}[_trans](r, row)
//                              ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: lane l gives
//                              the shared address of row l % 8 of matrix l / 8 (16 contiguous,
//                              16-byte aligned bytes).  r[i] of lane l = matrix i's elements
//                              (row l/4, cols 2(l%4), 2(l%4)+1); with .trans (rows 2(l%4),
//                              2(l%4)+1, col l/4).  x2 reads lanes 0-15's addresses, x1 lanes 0-7's;
//                              the other lanes must still pass a valid pointer.
//   tc_cp_async16(smem, gmem, src_bytes = 16)
//                              cp.async.cg 16 bytes global -> shared; bytes past src_bytes are
//                              zero-filled (src_bytes 0: all zeros, gmem not read but valid).
//   tc_cp_commit(), tc_cp_wait<N>()
//                              cp.async.commit_group / cp.async.wait_group N.
//
// All of these are warp-collective or per-thread exactly as the PTX is.  Under the CPU stand-in
// (tests/cuda_host, CUHOST_RUNTIME) the collectives run through cuhost's warp rendezvous, which
// reports a collective not all 32 lanes reach, lanes at different collectives, and misaligned
// ldmatrix rows; cp.async copies are deferred until the wait that retires their group.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---------------------------------------------------------------------------------- mma.sync

template <typename T>
struct tc_mma_type;  // only the two 16-bit float types have an m16n8k16 f32-accumulate mma
template <>
struct tc_mma_type<__nv_bfloat16> {
  static constexpr int kind = 0;
};
template <>
struct tc_mma_type<__half> {
  static constexpr int kind = 1;
};

template <typename T>
__device__ __forceinline__ void tc_mma16816(float d[4], const unsigned a[4], const unsigned b[2]) {
  constexpr int kind = tc_mma_type<T>::kind;
#ifdef CUHOST_RUNTIME
  cuhost::mma16816(d, a, b, kind);
#else
  if (kind == 0) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// ---------------------------------------------------------------------------------- ldmatrix

#ifdef CUHOST_RUNTIME
#define TC_LDMATRIX(N, TRANS) cuhost::ldmatrix(r, N, TRANS, smem_row)
#else
__device__ __forceinline__ unsigned tc_smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
#endif

__device__ __forceinline__ void tc_ldmatrix_x4(unsigned r[4], const void* smem_row) {
#ifdef CUHOST_RUNTIME
  TC_LDMATRIX(4, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(tc_smem_addr(smem_row))
               : "memory");
#endif
}

__device__ __forceinline__ void tc_ldmatrix_x2(unsigned r[2], const void* smem_row) {
#ifdef CUHOST_RUNTIME
  TC_LDMATRIX(2, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(tc_smem_addr(smem_row))
               : "memory");
#endif
}

__device__ __forceinline__ void tc_ldmatrix_x1(unsigned r[1], const void* smem_row) {
#ifdef CUHOST_RUNTIME
  TC_LDMATRIX(1, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(tc_smem_addr(smem_row))
               : "memory");
#endif
}

__device__ __forceinline__ void tc_ldmatrix_x4_trans(unsigned r[4], const void* smem_row) {
#ifdef CUHOST_RUNTIME
  TC_LDMATRIX(4, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(tc_smem_addr(smem_row))
               : "memory");
#endif
}

__device__ __forceinline__ void tc_ldmatrix_x2_trans(unsigned r[2], const void* smem_row) {
#ifdef CUHOST_RUNTIME
  TC_LDMATRIX(2, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(tc_smem_addr(smem_row))
               : "memory");
#endif
}

__device__ __forceinline__ void tc_ldmatrix_x1_trans(unsigned r[1], const void* smem_row) {
#ifdef CUHOST_RUNTIME
  TC_LDMATRIX(1, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(tc_smem_addr(smem_row))
               : "memory");
#endif
}

#ifdef CUHOST_RUNTIME
#undef TC_LDMATRIX
#endif

// ---------------------------------------------------------------------------------- cp.async

__device__ __forceinline__ void tc_cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
#ifdef CUHOST_RUNTIME
  cuhost::cp_async_zfill(smem, gmem, 16, src_bytes);
#else
  // .cg: cached in L2 only (tiles are streamed through shared memory, not reused from L1).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(tc_smem_addr(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void tc_cp_commit() {
#ifdef CUHOST_RUNTIME
  cuhost::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void tc_cp_wait() {
#ifdef CUHOST_RUNTIME
  cuhost::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
