// A CUDA stand-in for running kernels on the CPU (tests/cuda_host.py builds kernels against it).
//
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread; blocks run one after
// another, so `__shared__` (a function-local static here) is the block's shared memory.  A fiber
// runs until it reaches __syncthreads() or a warp shuffle, then the scheduler runs the next one.
// When every thread of the block waits at __syncthreads(), they all go on; when all 32 lanes of a
// warp wait at a shuffle, the values are exchanged and the lanes go on.  The scheduler reports,
// instead of hanging or guessing (see `schedule` for the orders threads run in):
//   * a barrier some threads of the block never reach (divergent __syncthreads, or threads that
//     exited while others wait), or threads of one block that passed different numbers of barriers;
//   * a shuffle not all 32 lanes take part in, with another mask than 0xffffffff, or with
//     different xor masks in one exchange;
//   * a deadlock (nothing can go on).
// Memory is plain host memory: a pointer is a host address.  atomicAdd is a plain add (one OS
// thread).  Dynamic shared memory (`dynamic_shared()`, the launch's `smem` bytes) starts every
// block filled with 0xff bytes (NaN in every float format).  Asynchronous copies (cp.async:
// `cp_async`, `cp_async_commit`, `cp_async_wait`) are deferred: the source is read when the copy
// is queued, the destination written only when a wait retires its group, so a thread that reads
// a slot before waiting for it sees the old bytes; copies still queued when a block ends are
// reported.  A grid-wide barrier cannot run here (blocks run one after another): `grid_sync`
// reports it.  Warp collectives beyond shuffles (backends/cuda/mma.cuh: ldmatrix, mma.sync) meet at
// the same rendezvous: every lane deposits its inputs and waits; once all 32 lanes of the warp are
// there, the collective is computed for all of them and they go on.  Lanes of one warp at different
// collectives, a collective some lanes never reach, and a misaligned ldmatrix row are reported.
// Shared-memory bank model (`BankStats`, S.banks): every ldmatrix and every warp-wide round of
// cp.async writes is counted in wavefronts against 32 banks of 4 bytes: an access phase (ldmatrix:
// one 8x8 matrix, its 8 rows of 16 bytes; 16-byte cp.async: 8 consecutive lanes) takes as many
// wavefronts as the most distinct 4-byte words any one bank holds in it; the excess over one per
// phase is a conflict.  Banks are taken from the offset into dynamic shared memory (the GPU places
// it 128-byte aligned), from the host address otherwise.  Plain loads and stores are not counted.
// Only what the kernels under test use is here.
#pragma once

#define CUHOST_RUNTIME 1

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

namespace cuhost {

enum State { RUN, AT_SYNC, AT_SHFL, DONE };

struct Copy {  // one queued asynchronous copy: the source's bytes as read when it was queued
  unsigned char* dst;
  unsigned char bytes[16];
  int n;
};

struct Fiber {
  ucontext_t ctx;
  char* stack = nullptr;
  State state = RUN;
  long long syncs = 0;     // __syncthreads() passed
  long long shfls = 0;     // shuffles taken part in
  uint64_t shfl_in = 0, shfl_out = 0;
  int shfl_xor = 0;
  unsigned shfl_mask = 0;
  int coll = 0;                 // which collective the lane waits at: kShfl, or a kLd* / kMma* below
  uint32_t coll_in[6] = {};     // mma: a[4], b[2]
  float coll_acc[4] = {};       // mma: the accumulators in and out
  const void* coll_ptr = nullptr;  // ldmatrix: this lane's row address
  uint32_t coll_out[4] = {};    // ldmatrix: the registers
  long long cp_seq = 0;                  // cp.async calls made (this lane's k-th joins the warp's k-th round)
  std::vector<std::pair<long long, uintptr_t>> cp_log;  // (cp_seq, bank offset) of this block's cp.async
  std::vector<Copy> open;                // queued since the last commit
  std::deque<std::vector<Copy>> groups;  // committed, not yet waited for (oldest first)
};

constexpr size_t kStack = 256 * 1024;

// Collective kinds (Fiber::coll).  ldmatrix: kLd + number of matrices (1, 2, 4), + kTrans for .trans.
enum : int { kShfl = 0, kLd = 0x10, kTrans = 0x08, kMmaBf16 = 0x40, kMmaF16 = 0x41 };

inline std::string coll_name(int c) {
  if (c == kShfl) return "__shfl_xor_sync";
  if (c == kMmaBf16) return "mma.m16n8k16.bf16";
  if (c == kMmaF16) return "mma.m16n8k16.f16";
  if (c & kLd) return "ldmatrix.x" + std::to_string(c & 7) + (c & kTrans ? ".trans" : "");
  return "collective " + std::to_string(c);
}

// Shared-memory wavefronts counted by the bank model (see the header comment), per access kind.
struct BankStats {
  long long ld_instr = 0, ld_phases = 0, ld_extra = 0;  // ldmatrix: instructions, 8-row phases, excess wavefronts
  long long cp_rounds = 0, cp_phases = 0, cp_extra = 0;  // cp.async: warp rounds, 8-lane phases, excess wavefronts
  std::string first;                                      // the first conflicting access, described
};

struct Scheduler {
  std::vector<Fiber> fibers;
  ucontext_t main;
  int cur = 0;
  std::function<void()> body;
  std::string error;
  std::vector<unsigned char> smem;  // dynamic shared memory of the running block
  size_t smem_bytes = 0;
  BankStats banks;  // accumulated over launches until reset
};

inline Scheduler S;
inline dim3 thread_idx, block_idx, block_dim, grid_dim;

inline void entry() {
  S.body();
  S.fibers[S.cur].state = DONE;  // then uc_link returns to the scheduler
}

inline void yield(State s) {
  Fiber& f = S.fibers[S.cur];
  f.state = s;
  swapcontext(&f.ctx, &S.main);
}

inline std::string where() {
  return "block (" + std::to_string(block_idx.x) + ", " + std::to_string(block_idx.y) + ")";
}

// The order fibers run in (set per launch with set_schedule):
//   0  round robin: every runnable thread runs until it blocks, in thread order;
//   1  warp-serial: the first warp with a runnable lane runs alone (its shuffles released as soon as
//      all its lanes arrive) until every lane waits at __syncthreads() or has exited; then the
//      next warp.  Warps get as far ahead of each other as barriers allow: a shared-memory
//      location reused before every warp has read it shows up as a wrong result;
//   2  warp-serial, last warp first.
inline int schedule = 0;

inline void run_fiber(unsigned i) {
  S.cur = (int)i;
  thread_idx.x = i;
  swapcontext(&S.main, &S.fibers[i].ctx);
}

inline float half_bits_to_float(uint16_t h, bool bf16) {
  if (bf16) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  _Float16 f;
  std::memcpy(&f, &h, 2);
  return (float)f;
}

// The address banks are taken from: the offset into the block's dynamic shared memory, or the
// host address (static __shared__ arrays are host statics here).
inline uintptr_t bank_offset(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(S.smem.data());
  return a >= base && a < base + S.smem.size() ? a - base - ((16 - base % 16) % 16) : a;
}

// Wavefronts of one access phase: `n` accesses of `bytes` bytes (a multiple of 4) at bank offsets
// `off`; the most distinct 4-byte words one of the 32 banks must deliver (at least 1).
inline int phase_wavefronts(const uintptr_t* off, int n, int bytes) {
  uintptr_t words[32][64];
  int count[32] = {};
  int worst = 1;
  for (int i = 0; i < n; ++i) {
    for (int b = 0; b < bytes; b += 4) {
      const uintptr_t w = (off[i] + b) / 4;
      const int bank = (int)(w % 32);
      bool seen = false;
      for (int k = 0; k < count[bank]; ++k) seen |= words[bank][k] == w;
      if (!seen && count[bank] < 64) words[bank][count[bank]++] = w;
      worst = count[bank] > worst ? count[bank] : worst;
    }
  }
  return worst;
}

inline std::string describe_phase(const char* what, unsigned w, const uintptr_t* off, int n, int waves) {
  std::string s = where() + " warp " + std::to_string(w) + " " + what + ": " + std::to_string(waves) +
                  " wavefronts for one phase, bank offsets";
  for (int i = 0; i < n; ++i) s += " " + std::to_string(off[i]);
  return s;
}

// Counts one ldmatrix of warp w (lane[l].coll_ptr: its row addresses).
inline void count_ldmatrix(Fiber* lane, unsigned w, int n) {
  S.banks.ld_instr++;
  for (int i = 0; i < n; ++i) {
    uintptr_t off[8];
    for (int r = 0; r < 8; ++r) off[r] = bank_offset(lane[8 * i + r].coll_ptr);
    const int waves = phase_wavefronts(off, 8, 16);
    S.banks.ld_phases++;
    S.banks.ld_extra += waves - 1;
    if (waves > 1 && S.banks.first.empty())
      S.banks.first = describe_phase(coll_name(lane[0].coll).c_str(), w, off, 8, waves);
  }
}

// Counts the cp.async writes of a finished block: each warp's k-th cp.async of every lane is one
// round, in phases of 8 consecutive lanes (16 bytes each: 128 bytes a phase).
inline void count_cp_async(unsigned n) {
  for (unsigned w0 = 0; w0 < n; w0 += 32) {
    const unsigned lanes = n - w0 < 32 ? n - w0 : 32;
    size_t pos[32] = {};
    for (;;) {
      long long seq = -1;  // the lowest round any lane has left
      for (unsigned l = 0; l < lanes; ++l) {
        const auto& log = S.fibers[w0 + l].cp_log;
        if (pos[l] < log.size() && (seq < 0 || log[pos[l]].first < seq)) seq = log[pos[l]].first;
      }
      if (seq < 0) break;
      S.banks.cp_rounds++;
      for (unsigned p = 0; p < lanes; p += 8) {
        uintptr_t off[8];
        int m = 0;
        for (unsigned l = p; l < p + 8 && l < lanes; ++l) {
          const auto& log = S.fibers[w0 + l].cp_log;
          if (pos[l] < log.size() && log[pos[l]].first == seq) off[m++] = log[pos[l]++].second;
        }
        if (!m) continue;
        const int waves = phase_wavefronts(off, m, 16);
        S.banks.cp_phases++;
        S.banks.cp_extra += waves - 1;
        if (waves > 1 && S.banks.first.empty()) S.banks.first = describe_phase("cp.async", w0 / 32, off, m, waves);
      }
    }
  }
}

// ldmatrix for the 32 lanes of a warp: matrix i's row r is at lane 8i + r's address.
inline bool run_ldmatrix(Fiber* lane, unsigned w) {
  const int n = lane[0].coll & 7;
  const bool trans = lane[0].coll & kTrans;
  for (int l = 0; l < 8 * n; ++l) {
    if (reinterpret_cast<uintptr_t>(lane[l].coll_ptr) % 16) {
      S.error = where() + " warp " + std::to_string(w) + " lane " + std::to_string(l) + ": " +
                coll_name(lane[0].coll) + " row address not 16-byte aligned";
      return false;
    }
  }
  count_ldmatrix(lane, w, n);
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < n; ++i) {
      uint16_t e[2];
      for (int h = 0; h < 2; ++h) {
        // element (row, col) of matrix i: plain (l/4, 2(l%4)+h); .trans (2(l%4)+h, l/4)
        const int row = trans ? 2 * (l % 4) + h : l / 4, col = trans ? l / 4 : 2 * (l % 4) + h;
        std::memcpy(&e[h], static_cast<const unsigned char*>(lane[8 * i + row].coll_ptr) + 2 * col, 2);
      }
      lane[l].coll_out[i] = (uint32_t)e[0] | ((uint32_t)e[1] << 16);
    }
  }
  return true;
}

// mma.m16n8k16 row.col with fp32 accumulators: the fragments gathered into A (16x16) and B (16x8),
// each D element = C + the 16 exact products summed in double, rounded once to float.
inline void run_mma(Fiber* lane) {
  const bool bf16 = lane[0].coll == kMmaBf16;
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    const uint32_t* a = lane[l].coll_in;
    for (int h = 0; h < 2; ++h) {
      const int sh = 16 * h;
      A[g][2 * t + h] = half_bits_to_float((uint16_t)(a[0] >> sh), bf16);
      A[g + 8][2 * t + h] = half_bits_to_float((uint16_t)(a[1] >> sh), bf16);
      A[g][2 * t + 8 + h] = half_bits_to_float((uint16_t)(a[2] >> sh), bf16);
      A[g + 8][2 * t + 8 + h] = half_bits_to_float((uint16_t)(a[3] >> sh), bf16);
      B[2 * t + h][g] = half_bits_to_float((uint16_t)(a[4] >> sh), bf16);
      B[2 * t + 8 + h][g] = half_bits_to_float((uint16_t)(a[5] >> sh), bf16);
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    for (int k = 0; k < 4; ++k) {
      const int row = g + 8 * (k >> 1), col = 2 * t + (k & 1);
      double acc = lane[l].coll_acc[k];
      for (int j = 0; j < 16; ++j) acc += (double)A[row][j] * (double)B[j][col];
      lane[l].coll_acc[k] = (float)acc;
    }
  }
}

// Warp w (lanes [32w, 32w + 32) of n): -1 fault, 0 nothing to release, 1 shuffle done (lanes run again).
inline int release_shuffle(unsigned n, unsigned w) {
  const unsigned w0 = 32 * w, lanes = n - w0 < 32 ? n - w0 : 32;
  unsigned waiting = 0, blocked = 0;
  for (unsigned l = 0; l < lanes; ++l) {
    waiting += S.fibers[w0 + l].state == AT_SHFL;
    blocked += S.fibers[w0 + l].state != RUN;
  }
  if (waiting == 0) return 0;
  if (waiting != 32) {
    if (blocked != lanes) return 0;  // the rest have not arrived yet
    S.error = where() + " warp " + std::to_string(w) + ": a shuffle or warp collective only " + std::to_string(waiting) +
              " of 32 lanes take part in (divergent collective, or a partial warp)";
    return -1;
  }
  Fiber* lane = &S.fibers[w0];
  for (unsigned l = 0; l < 32; ++l) {
    if (lane[l].coll != lane[0].coll) {
      S.error = where() + " warp " + std::to_string(w) + ": lanes at different collectives (lane 0 at " +
                coll_name(lane[0].coll) + ", lane " + std::to_string(l) + " at " + coll_name(lane[l].coll) + ")";
      return -1;
    }
    if (lane[l].shfl_mask != 0xffffffffu || lane[l].shfl_xor != lane[0].shfl_xor || lane[l].shfls != lane[0].shfls) {
      S.error = where() + " warp " + std::to_string(w) + " lane " + std::to_string(l) +
                ": shuffle mask / xor / count differs from lane 0's";
      return -1;
    }
  }
  if (lane[0].coll == kShfl) {
    for (unsigned l = 0; l < 32; ++l) lane[l].shfl_out = lane[l ^ lane[0].shfl_xor].shfl_in;
  } else if (lane[0].coll == kMmaBf16 || lane[0].coll == kMmaF16) {
    run_mma(lane);
  } else if (!run_ldmatrix(lane, w)) {
    return -1;
  }
  for (unsigned l = 0; l < 32; ++l) lane[l].state = RUN;
  return 1;
}

// Runs one block of `n` threads; returns false (S.error set) on a barrier or shuffle fault.
inline bool run_block(unsigned n) {
  if (S.fibers.size() < n) S.fibers.resize(n);
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = S.fibers[i];
    if (!f.stack) f.stack = static_cast<char*>(std::malloc(kStack));
    f.state = RUN;
    f.syncs = f.shfls = 0;
    f.coll = kShfl;
    f.open.clear();
    f.groups.clear();
    f.cp_seq = 0;
    f.cp_log.clear();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &S.main;
    makecontext(&f.ctx, entry, 0);
  }
  S.smem.assign(S.smem_bytes + 16, 0xff);
  const unsigned nwarps = (n + 31) / 32;
  for (;;) {
    bool moved = false;
    if (schedule == 0) {
      for (unsigned i = 0; i < n; ++i)
        if (S.fibers[i].state == RUN) run_fiber(i);
      for (unsigned w = 0; w < nwarps; ++w) {
        const int r = release_shuffle(n, w);
        if (r < 0) return false;
        moved |= r > 0;
      }
    } else {
      for (unsigned k = 0; k < nwarps && !moved; ++k) {
        const unsigned w = schedule == 1 ? k : nwarps - 1 - k;
        for (;;) {  // this warp alone, until none of its lanes can run
          bool ran = false;
          for (unsigned l = 32 * w; l < n && l < 32 * w + 32; ++l) {
            if (S.fibers[l].state == RUN) {
              run_fiber(l);
              ran = true;
            }
          }
          const int r = release_shuffle(n, w);
          if (r < 0) return false;
          if (!ran && r == 0) break;
          moved = true;
        }
      }
    }
    if (moved) continue;
    unsigned done = 0, at_sync = 0;
    for (unsigned i = 0; i < n; ++i) {
      done += S.fibers[i].state == DONE;
      at_sync += S.fibers[i].state == AT_SYNC;
    }
    if (done == n) {
      for (unsigned i = 0; i < n; ++i) {
        size_t queued = S.fibers[i].open.size();
        for (const auto& g : S.fibers[i].groups) queued += g.size();
        if (queued) {
          S.error = where() + " thread " + std::to_string(i) + ": exited with " + std::to_string(queued) +
                    " asynchronous copies never waited for";
          return false;
        }
      }
      count_cp_async(n);
      return true;
    }
    if (at_sync + done == n) {
      if (done) {
        S.error = where() + ": " + std::to_string(at_sync) + " threads wait at __syncthreads() while " +
                  std::to_string(done) + " have exited";
        return false;
      }
      for (unsigned i = 1; i < n; ++i) {
        if (S.fibers[i].syncs != S.fibers[0].syncs) {
          S.error = where() + ": thread " + std::to_string(i) + " is at barrier " +
                    std::to_string(S.fibers[i].syncs) + ", thread 0 at " + std::to_string(S.fibers[0].syncs);
          return false;
        }
      }
      for (unsigned i = 0; i < n; ++i) S.fibers[i].state = RUN;
      continue;
    }
    for (unsigned w = 0; w < nwarps; ++w) {  // a partial shuffle left when nothing else can move
      unsigned waiting = 0;
      for (unsigned l = 32 * w; l < n && l < 32 * w + 32; ++l) waiting += S.fibers[l].state == AT_SHFL;
      if (waiting) {
        S.error = where() + " warp " + std::to_string(w) + ": a shuffle or warp collective only " + std::to_string(waiting) +
                  " of 32 lanes take part in (divergent collective, or lanes waiting at __syncthreads())";
        return false;
      }
    }
    S.error = where() + ": deadlock (" + std::to_string(at_sync) + " threads at __syncthreads(), " +
              std::to_string(done) + " exited)";
    return false;
  }
}

// Runs `body` (a kernel call) over the grid with `smem` bytes of dynamic shared memory; 0 on
// success, else 1 with the fault in `err`.
inline int launch(dim3 grid, dim3 block, std::function<void()> body, char* err, int errlen, size_t smem = 0) {
  S.body = std::move(body);
  S.error.clear();
  S.smem_bytes = smem;
  grid_dim = grid;
  block_dim = block;
  if (block.y != 1 || block.z != 1 || grid.z != 1) {
    std::snprintf(err, errlen, "only 1-D blocks and 2-D grids are emulated");
    return 1;
  }
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      block_idx.x = bx;
      block_idx.y = by;
      if (!run_block(block.x)) {
        std::snprintf(err, errlen, "%s", S.error.c_str());
        return 1;
      }
    }
  }
  return 0;
}

// The block's dynamic shared memory, 16-byte aligned.
inline unsigned char* dynamic_shared() {
  const uintptr_t a = reinterpret_cast<uintptr_t>(S.smem.data());
  return S.smem.data() + ((16 - a % 16) % 16);
}

inline void cp_async(void* dst, const void* src, int bytes) {
  Copy c;
  c.dst = static_cast<unsigned char*>(dst);
  c.n = bytes;
  std::memcpy(c.bytes, src, bytes);
  S.fibers[S.cur].open.push_back(c);
}

// cp.async with a source size: the first src_bytes bytes of `src` are read (none when 0), the rest
// of the `bytes` written as zeros.
inline void cp_async_zfill(void* dst, const void* src, int bytes, int src_bytes) {
  if (src_bytes < 0 || src_bytes > bytes) {
    std::fprintf(stderr, "cuda_host: cp.async src_bytes %d outside [0, %d]\n", src_bytes, bytes);
    std::abort();
  }
  if (reinterpret_cast<uintptr_t>(dst) % bytes || (src_bytes && reinterpret_cast<uintptr_t>(src) % bytes)) {
    std::fprintf(stderr, "cuda_host: cp.async of %d bytes with a misaligned address\n", bytes);
    std::abort();
  }
  Copy c;
  c.dst = static_cast<unsigned char*>(dst);
  c.n = bytes;
  std::memset(c.bytes, 0, sizeof c.bytes);
  if (src_bytes) std::memcpy(c.bytes, src, src_bytes);
  Fiber& f = S.fibers[S.cur];
  if (bytes == 16) f.cp_log.emplace_back(f.cp_seq, bank_offset(dst));
  f.cp_seq++;
  f.open.push_back(c);
}

// Waits at warp collective `kind` (Fiber::coll's inputs filled in by the caller) until all 32 lanes arrive.
inline void collective(int kind) {
  Fiber& f = S.fibers[S.cur];
  f.coll = kind;
  f.shfl_mask = 0xffffffffu;
  f.shfl_xor = 0;
  f.shfls++;
  yield(AT_SHFL);
  S.fibers[S.cur].coll = kShfl;
}

inline void ldmatrix(unsigned* r, int n, bool trans, const void* row) {
  S.fibers[S.cur].coll_ptr = row;
  collective(kLd + n + (trans ? kTrans : 0));
  std::memcpy(r, S.fibers[S.cur].coll_out, 4 * n);
}

inline void mma16816(float* d, const unsigned* a, const unsigned* b, int kind) {
  Fiber& f = S.fibers[S.cur];
  std::memcpy(f.coll_in, a, 16);
  std::memcpy(f.coll_in + 4, b, 8);
  std::memcpy(f.coll_acc, d, 16);
  collective(kind ? kMmaF16 : kMmaBf16);
  std::memcpy(d, S.fibers[S.cur].coll_acc, 16);
}

inline void cp_async_commit() {
  Fiber& f = S.fibers[S.cur];
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

// Retires the oldest groups until at most `pending` are left (cp.async.wait_group pending).
inline void cp_async_wait(int pending) {
  Fiber& f = S.fibers[S.cur];
  while ((int)f.groups.size() > pending) {
    for (const Copy& c : f.groups.front()) std::memcpy(c.dst, c.bytes, c.n);
    f.groups.pop_front();
  }
}

inline void grid_sync() {
  std::fprintf(stderr, "cuda_host: a grid-wide barrier cannot run here (blocks run one after another)\n");
  std::abort();
}

}  // namespace cuhost

#define threadIdx (cuhost::thread_idx)
#define blockIdx (cuhost::block_idx)
#define blockDim (cuhost::block_dim)
#define gridDim (cuhost::grid_dim)

inline void __syncthreads() {
  cuhost::S.fibers[cuhost::S.cur].syncs++;
  cuhost::yield(cuhost::AT_SYNC);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffles of at most 8 bytes");
  cuhost::Fiber& f = cuhost::S.fibers[cuhost::S.cur];
  f.shfl_in = 0;
  std::memcpy(&f.shfl_in, &v, sizeof(T));
  f.shfl_xor = lane_mask;
  f.shfl_mask = mask;
  f.shfls++;
  cuhost::yield(cuhost::AT_SHFL);
  T r;
  std::memcpy(&r, &cuhost::S.fibers[cuhost::S.cur].shfl_out, sizeof(T));
  return r;
}

inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}

inline double atomicAdd(double* p, double v) {
  const double old = *p;
  *p = old + v;
  return old;
}

inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  const unsigned int old = *p;
  *p = old + v;
  return old;
}

inline unsigned int atomicExch(unsigned int* p, unsigned int v) {
  const unsigned int old = *p;
  *p = v;
  return old;
}

inline void __threadfence() {}
inline void __nanosleep(unsigned int) {}

template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}
