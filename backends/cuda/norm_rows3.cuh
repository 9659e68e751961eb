// nb_rows3 (cupy@v7; GRADORACLE_CUPY_NORMS=kernel=rows3): the rows kernel of the normalisation
// backwards for dense, 16-byte aligned rows, with small blocks capped at 64 registers and the
// loads decoupled from the registers.  Included at the end of norm_common.cuh (it uses its
// params, math, reductions, loads and stores); the cp.async wrappers and the grid barrier below are
// its own.  Host: backends/cupy/_norm_plan.py (rows3_config, plan_rows3).
//
// Why this shape (H100 profiles of cupy@best and cupy@v6, results/h100/bench-2/profile/05-*, 06-*):
// both kept their loads in registers, so the bytes in flight per SM were bounded by the registers
// a thread could spare (one row ahead), and a 512- or 1024-thread block met at a barrier every
// row: 31-39% of DRAM peak.  The Triton kernel that reaches 82-93% of copy on the same shapes
// runs one row at a time per program too, but its loads are software-pipelined through shared
// memory several rows ahead.  nb_rows3 does that in CUDA:
//   * x / dy vectors and the row's mean / rstd are copied into shared memory STAGES - 1 rows
//     ahead with cp.async (no registers held, the copies keep going through the arithmetic and
//     the barriers).  Each thread copies and reads only its own slots, so the pipeline itself
//     needs no barrier.  bf16 N = 4096 with the defaults: a 512-thread block, 3 rows x 16 KiB =
//     48 KiB in flight per block, above the ~25-30 KiB per SM that Little's law asks of the H100.
//   * The row is read from shared memory twice (row sums, then dx) instead of being held in
//     registers, so a thread's registers hold only its columns' dweight / dbias sums, and the
//     launch bounds cap the kernel at NB_ROWS3_REGS = 64 registers: 1024 threads per SM where
//     shared memory allows.  The elements per thread are what fits that cap without spills
//     (_norm_plan.ROWS3_ELEMS; ptxas -v on sm_90, asserted by tests/test_cuda_norms.py): one
//     16-byte vector of x and dy per row in 16-bit types, two in float, two in double (8, 8
//     and 4 elements: 16 sum registers).  16 elements in 16-bit or 32-bit types (32 sum
//     registers) spill 24-80 bytes at 64 registers, and holding the row itself in registers
//     (nb_rows) costs 96-128.  The weight sits in shared memory too (each thread's own vectors),
//     and the row's vectors are laundered between the passes so that the compiler keeps the
//     packed vectors, not their converted elements.
//   * Groups of GW threads (a power of two) take one row each per step.  GW <= 32 (rows of up
//     to 32 threads' elements): a warp or part of one per row, row sums by shuffles only, no
//     barrier anywhere in the row loop.  GW > 32: warp sums through shared memory, one block
//     barrier per step (the copies in flight do not wait for it).  The block is max(256, GW)
//     threads: 16-bit N = 4096 is a 512-thread block of one row a step, N = 8192 a 1024-thread
//     one; the longest rows it takes are 1024 threads' (8192 elements, 4096 in double).
//   * dweight / dbias partials stay in registers across the block's rows, are combined once per
//     block (the groups in group order) and leave as one partial row per block (16-byte stores);
//     with NB_PHASE_COLS the same launch then sums the partial rows after a grid-wide barrier
//     (a cooperative launch: every block resident), every block taking 32-column tiles, so no
//     second launch and no float atomics.
//
//   nb_rows3<Norm,T,VPT,GW,STAGES>(p, x, dy, w, mean, rstd, dx, part, dw, db, bar)
//       VEC = 16 / sizeof(T); requires N % VEC == 0, col_stride 1 for x, dy, dx (and w), every
//       row of x, dy, dx 16-byte aligned (the host's vector_width > 1).  blockDim = NB_ROWS3_BLOCK
//       (GW) = max(256, GW), NBRows3Smem<T,VPT,GW,STAGES>::BYTES of dynamic shared memory
//       (_norm_plan.rows3_smem_bytes).  Block b takes rows [b * rows_per_block, min(rows,
//       (b+1) * rows_per_block)) (rows_per_block a multiple of BLOCK / GW), group g of it rows
//       r_lo + g, r_lo + g + BLOCK / GW, ...; thread `lane` of a group owns vectors lane,
//       lane + GW, ... (VPT of them; VPT * VEC * GW >= N).  p.gw = GW.  flags: NB_HAS_W /
//       NB_HAS_B, and the phases: NB_PHASE_ROWS: dx, and dw / db final when nparts == 1, else
//       row b of part ([2][nparts][N] A); NB_PHASE_COLS: the column sums of part into dw / db;
//       both: rows, nb_grid_sync(bar), sums -- a cooperative launch only (the CPU stand-in runs
//       the two phases as two launches).
#pragma once

#define NB_ROWS3_REGS 64       // registers per thread the launch bounds allow
#define NB_ROWS3_MIN_BLOCK 256 // threads per block at least (several groups when GW is smaller)
#define NB_ROWS3_BLOCK(GW) ((GW) < NB_ROWS3_MIN_BLOCK ? NB_ROWS3_MIN_BLOCK : (GW))
#define NB_PHASE_ROWS 4        // flags: the rows (dx, partial rows)
#define NB_PHASE_COLS 8        // flags: the column sums of the partial rows

// cp.async (sm_80+): global -> shared copies that take no registers and complete in commit-group
// order; a thread sees its own copies after cp.async.wait_group (another thread's only after a
// barrier as well).  Under the CPU stand-in (tests/cuda_host) the copies are deferred until the
// wait that retires their group, so a read before its wait sees stale shared memory.
#ifdef CUHOST_RUNTIME
template <int BYTES>
__device__ __forceinline__ void nb_cp_async(void* smem, const void* gmem) { cuhost::cp_async(smem, gmem, BYTES); }
__device__ __forceinline__ void nb_cp_commit() { cuhost::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void nb_cp_wait() { cuhost::cp_async_wait(N); }
#define NB_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(cuhost::dynamic_shared())
#else
template <int BYTES>
__device__ __forceinline__ void nb_cp_async(void* smem, const void* gmem) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
  if (BYTES == 16)  // .cg: L2 only (streamed once)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem), "n"(BYTES) : "memory");
}
__device__ __forceinline__ void nb_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void nb_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
#define NB_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

// Every block of a cooperative launch (all resident at once) meets here.  bar[0] counts arrivals
// and returns to 0; bar[1] is a generation number the last arrival advances (both zero when the
// buffer is allocated; any generation works after that).  Fences make each block's earlier
// writes visible to every block that passes the barrier after it.
__device__ __forceinline__ void nb_grid_sync(unsigned int* bar) {
#ifdef CUHOST_RUNTIME
  cuhost::grid_sync();  // the stand-in runs blocks one after another: the host splits the phases
#endif
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int gen = atomicAdd(bar + 1, 0u);  // read before arriving: the barrier's generation
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x * gridDim.y - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (atomicAdd(bar + 1, 0u) == gen) __nanosleep(128);
    }
    __threadfence();
  }
  __syncthreads();
}


// nb_rows3's shared memory: STAGES stages of [x | dy][VPT][BLOCK] 16-byte vectors then
// [mean | rstd][BLOCK] statistics, then [VPT][BLOCK] weight vectors; after the rows the first
// bytes hold the threads' dweight / dbias sums ([2][VPT][VEC][BLOCK] A), after the grid barrier
// the column sums' slices ([BLOCK / 32][32] A).
template <typename T, int VPT, int GW, int STAGES>
struct NBRows3Smem {
  typedef nb_acc_t<T> A;
  static constexpr int BLOCK = NB_ROWS3_BLOCK(GW);
  static constexpr int VEC = 16 / (int)sizeof(T);
  static constexpr int VECS = 2 * VPT * BLOCK;                                   // 16-byte slots a stage
  static constexpr int STAGE = VECS * 16 + 2 * BLOCK * (int)sizeof(A);          // bytes a stage
  static constexpr int WOFF = STAGES * STAGE;                                    // the weight's slots
  static constexpr int PIPE = WOFF + VPT * BLOCK * 16;
  static constexpr int ACC = 2 * VPT * VEC * BLOCK * (int)sizeof(A);
  static constexpr int BYTES = PIPE > ACC ? PIPE : ACC;
};

// The fused finish: out[j * stride] = T(sum over part rows r < nparts of src[r * n + j]) for the
// 32-column tiles of dweight then dbias, dealt out over the grid.  Thread (slice, lane) sums rows
// slice, slice + SLICES, ... of column j in increasing order, then slice 0 adds the slices in
// slice order: one fixed order whichever block takes a tile.  Reads through L2 (__ldcg): other
// blocks of this launch wrote the rows.  Block-uniform; red: [BLOCK / 32][32] A.
template <typename T, int BLOCK>
__device__ __forceinline__ void nb_rows3_colsum(const NBParams& p, const nb_acc_t<T>* __restrict__ part,
                                                T* __restrict__ dw, T* __restrict__ db, nb_acc_t<T>* red) {
  typedef nb_acc_t<T> A;
  constexpr int SLICES = BLOCK / 32;
  constexpr int BATCH = 8;  // loads in flight per thread before their adds
  const long long n = p.n, np = p.nparts, tiles = (n + 31) / 32;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = (p.flags & NB_HAS_B) != 0;
  const long long total = tiles * ((has_w ? 1 : 0) + (has_b ? 1 : 0));
  const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
  for (long long t = blockIdx.x; t < total; t += gridDim.x) {  // block-uniform
    const int which = (t >= tiles || !has_w) ? 1 : 0;
    const long long j = (t % tiles) * 32 + lane;
    const A* src = part + (long long)which * np * n;
    A s = A(0);
    if (j < n) {
      // One pointer stepped by SLICES rows (64-bit addresses per load would cost registers).
      const A* q = src + slice * n + j;
      const long long step = SLICES * n;
      for (int r0 = slice; r0 < (int)np; r0 += SLICES * BATCH, q += BATCH * step) {
        A v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) v[b] = r0 + b * SLICES < (int)np ? __ldcg(q + b * step) : A(0);
#pragma unroll
        for (int b = 0; b < BATCH; ++b) s += v[b];
      }
    }
    red[slice * 32 + lane] = s;
    __syncthreads();
    if (slice == 0 && j < n) {
      A u = red[lane];
#pragma unroll
      for (int i = 1; i < SLICES; ++i) u += red[i * 32 + lane];
      (which ? db : dw)[j * p.out_stride[which]] = nb_from_acc<T>(u);
    }
    __syncthreads();  // red is rewritten by the next tile
  }
}

// One pass of nb_rows3 over this thread's vectors of a staged row (vs: its first x slot of the
// stage, ws: its first weight slot): per vector k in the row, x / dy (and the weight, when given)
// read from the slots and laundered, so that each pass converts the packed vectors afresh rather
// than keeping the converted elements live across the row sums; then elem(k, e, x-hat, dy,
// weight * dy) for its elements in order, and done(k).
template <class Norm, typename T, int VEC, int VPT, int BLOCK, class Elem, class Done>
__device__ __forceinline__ void nb_rows3_pass(const NBVec<T, VEC>* vs, const NBVec<T, VEC>* ws, const bool* cok,
                                              bool has_w, nb_acc_t<T> m, nb_acc_t<T> r, Elem elem, Done done) {
  typedef nb_acc_t<T> A;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (!cok[k]) continue;
    NBVec<T, VEC> xv = vs[k * BLOCK], dv = vs[(VPT + k) * BLOCK], wv;
    if (has_w) wv = ws[k * BLOCK];
    nb_launder(xv);
    nb_launder(dv);
    nb_launder(wv);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const A xh = nb_xhat<Norm, A>(nb_to_acc(xv.v[e]), m, r);
      const A d = nb_to_acc(dv.v[e]);
      const A g = has_w ? nb_to_acc(wv.v[e]) * d : d;
      elem(k, e, xh, d, g);
    }
    done(k);
  }
}

template <class Norm, typename T, int VPT, int GW, int STAGES>
__global__ void __launch_bounds__(NB_ROWS3_BLOCK(GW), (65536 / NB_ROWS3_REGS) / NB_ROWS3_BLOCK(GW))
nb_rows3(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
         const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
         T* __restrict__ dx, nb_acc_t<T>* __restrict__ part, T* __restrict__ dw, T* __restrict__ db,
         unsigned int* __restrict__ bar) {
  typedef nb_acc_t<T> A;
  typedef NBRows3Smem<T, VPT, GW, STAGES> L;
  constexpr int BLOCK = L::BLOCK, VEC = L::VEC, NGRP = BLOCK / GW;
  typedef NBVec<T, VEC> V;
  static_assert(GW >= 1 && (GW & (GW - 1)) == 0 && GW <= 1024, "nb_rows3: GW a power of two <= 1024");
  static_assert(STAGES >= 2 && VPT >= 1, "nb_rows3: two stages at least");
  NB_DYNAMIC_SHARED(unsigned char, smem);
  __shared__ A red[2][BLOCK / 32][2];  // GW > 32: per-warp row sums, double-buffered by step

  const long long phases = p.flags & (NB_PHASE_ROWS | NB_PHASE_COLS);
  const int tid = threadIdx.x;
  const int lane = tid % GW, grp = tid / GW;
  const int n = (int)p.n;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = Norm::kBias && (p.flags & NB_HAS_B) != 0;

  if (phases & NB_PHASE_ROWS) {
    const A inv_n = A(1) / A(n);
    V* const vslot = reinterpret_cast<V*>(smem) + tid;                 // + s * SV + k * BLOCK
    A* const sslot = reinterpret_cast<A*>(smem + L::VECS * 16) + tid;  // + s * SA (mean), + BLOCK (rstd)
    V* const wslot = reinterpret_cast<V*>(smem + L::WOFF) + tid;       // + k * BLOCK
    constexpr int SV = L::STAGE / 16, SA = L::STAGE / (int)sizeof(A);

    // This thread's columns (N % VEC == 0: a vector is all in or all out), its weight vectors
    // (into its own slots, with the first step's copies) and its dweight / dbias sums.
    int col[VPT];
    bool cok[VPT];
    A accw[VPT][VEC], accb[VPT][VEC];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      col[k] = (k * GW + lane) * VEC;
      cok[k] = col[k] < n;
      if (has_w && cok[k]) nb_cp_async<16>(wslot + k * BLOCK, w + col[k]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) accw[k][e] = accb[k][e] = A(0);
    }

    // Rows fit in 31 bits (the host checks): 32-bit row indices spare registers.
    const int r_lo = (int)nb_min(p.rows, (long long)blockIdx.x * p.rows_per_block);
    const int r_hi = (int)nb_min(p.rows, (long long)r_lo + p.rows_per_block);
    const int nsteps = (r_hi - r_lo + NGRP - 1) / NGRP;  // block-uniform

    // Queue step i's copies (none past the block's rows), then close the group: one group per
    // step, empty or not, so that wait_group counts steps.
    auto issue = [&](int i) {
      const int row = r_lo + i * NGRP + grp;
      if (i < nsteps && row < r_hi) {
        long long off[NB_NT];
        nb_row_offsets(p, row, off);
        const int s = i % STAGES;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          if (cok[k]) {
            nb_cp_async<16>(vslot + s * SV + k * BLOCK, x + off[NB_X] + col[k]);
            nb_cp_async<16>(vslot + s * SV + (VPT + k) * BLOCK, dy + off[NB_DY] + col[k]);
          }
        }
        if (Norm::kMean) nb_cp_async<(int)sizeof(A)>(sslot + s * SA, mean + off[NB_MEAN]);
        nb_cp_async<(int)sizeof(A)>(sslot + s * SA + BLOCK, rstd + off[NB_RSTD]);
      }
      nb_cp_commit();
    };

#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) issue(i);
    int buf = 0;
    for (int i = 0; i < nsteps; ++i) {
      issue(i + STAGES - 1);
      nb_cp_wait<STAGES - 1>();  // step i's group (and the weight's, in the first) is done
      const int row = r_lo + i * NGRP + grp;
      const bool rok = row < r_hi;
      const int s = i % STAGES;
      A m = A(0), r = A(0), s1 = A(0), s2 = A(0);
      if (rok) {
        if (Norm::kMean) m = sslot[s * SA];
        r = sslot[s * SA + BLOCK];
        nb_rows3_pass<Norm, T, VEC, VPT, BLOCK>(
            vslot + s * SV, wslot, cok, has_w, m, r,
            [&](int, int, A xh, A, A g) {
              s1 += g;
              s2 += g * xh;
            },
            [](int) {});
      }
      if (GW > 32) {
        s1 = nb_warp_sum(s1);
        s2 = nb_warp_sum(s2);
        if ((tid & 31) == 0) {
          red[buf][tid >> 5][0] = s1;
          red[buf][tid >> 5][1] = s2;
        }
        // One barrier per step: a buffer is rewritten two steps later, after every thread has
        // passed the next step's barrier, so after it has read this one.
        __syncthreads();
        const int w0 = (grp * GW) >> 5;
        s1 = s2 = A(0);
#pragma unroll
        for (int j = 0; j < (GW > 32 ? GW / 32 : 1); ++j) {  // the same order in every thread of the group
          s1 += red[buf][w0 + j][0];
          s2 += red[buf][w0 + j][1];
        }
        buf ^= 1;
      } else {
        s1 = nb_group_sum(s1, GW);
        s2 = nb_group_sum(s2, GW);
      }
      const A a = s1 * inv_n, b = s2 * inv_n;
      if (rok) {
        long long off[NB_NT];
        nb_row_offsets(p, row, off);
        V out;
        nb_rows3_pass<Norm, T, VEC, VPT, BLOCK>(
            vslot + s * SV, wslot, cok, has_w, m, r,
            [&](int k, int e, A xh, A d, A g) {
              out.v[e] = nb_from_acc<T>(nb_dx<Norm, A>(g, xh, r, a, b));
              accw[k][e] += d * xh;
              accb[k][e] += d;
            },
            [&](int k) { nb_store_vec<T, VEC>(dx + off[NB_DX], col[k], 1, out); });
      }
    }
    nb_cp_wait<0>();  // only empty groups are left (and the weight's, when there were no steps)
    __syncthreads();  // every thread is done with its slots: the memory now takes the sums

    // dweight / dbias: the groups' sums of each column added in group order, then written final
    // (nparts == 1) or as row blockIdx.x of the partial rows.  Thread t takes the vectors
    // t, t + BLOCK, ... of the row: conflict-free shared reads, 16-byte runs out.
    A* const acc = reinterpret_cast<A*>(smem);  // [2][VPT][VEC][BLOCK]
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        acc[((0 * VPT + k) * VEC + e) * BLOCK + tid] = accw[k][e];
        acc[((1 * VPT + k) * VEC + e) * BLOCK + tid] = accb[k][e];
      }
    }
    __syncthreads();
    const long long np = p.nparts;
    // Not unrolled (nor the groups' loop): the register cap is the kernel's, and this runs once.
#pragma unroll 1
    for (int v = tid; v < n / VEC; v += BLOCK) {
      const int k = v / GW, l = v % GW;
#pragma unroll
      for (int which = 0; which < 2; ++which) {
        if (which == 0 ? !has_w : !has_b) continue;
        const A* src = acc + (which * VPT + k) * VEC * BLOCK + l;
        A sum[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          sum[e] = src[e * BLOCK];
#pragma unroll 1
          for (int g2 = 1; g2 < NGRP; ++g2) sum[e] += src[e * BLOCK + g2 * GW];
        }
        if (np == 1) {
          T* out = which == 0 ? dw : db;
          const long long os = p.out_stride[which];
#pragma unroll
          for (int e = 0; e < VEC; ++e) out[((long long)v * VEC + e) * os] = nb_from_acc<T>(sum[e]);
        } else {
          nb_store_acc<A, VEC>(part + ((long long)which * np + blockIdx.x) * n + (long long)v * VEC, sum);
        }
      }
    }
  }
  if (phases == (NB_PHASE_ROWS | NB_PHASE_COLS)) nb_grid_sync(bar);
  if (phases & NB_PHASE_COLS) {
    __syncthreads();  // the rows phase's last reads of the shared memory are done
    nb_rows3_colsum<T, BLOCK>(p, part, dw, db, reinterpret_cast<A*>(smem));
  }
}
