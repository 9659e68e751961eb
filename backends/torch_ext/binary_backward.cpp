// binary_backward for the torch extension: the op's schemas, its argument checks (shared by
// both devices) and its CPU kernel.  The CUDA launches are binary_backward_cuda.cu; the plans
// of both devices come from Python (backends/torch_ext/binary_backward.py).
//
// Ops (namespace gradoracle):
//   binary_backward(Tensor a, Tensor b, Tensor grad_out, str fn) -> (Tensor, Tensor)
//   binary_backward.out(..., *, Tensor(a!) grad_a, Tensor(b!) grad_b) -> (Tensor(a!), Tensor(b!))
//       the public ops; their CPU and CUDA kernels are Python (they make the plan, then call:)
//   _binary_backward_run(Tensor a, Tensor b, Tensor grad_out, str fn, Tensor plan, *,
//                        Tensor(a!) grad_a, Tensor(b!) grad_b) -> ()
//       checks every argument and runs the plan (a BBLaunch, backends/cuda/binary_backward_defs.h).
//
// The CPU kernel: one pass over grad_out, organised by the broadcast plan.  The output box O is
// K x RA x RB (backends/_plans/binary_backward.py).  With no broadcast every output element
// is independent and we run a flat (or strided) elementwise loop.  Otherwise the box is cut
// into work items: a block of K times a chunk of one reduce group S (the "split" group).
// Each item walks its sub-box once, with the innermost loop along the group where grad_out
// is densest, and accumulates the terms into item-local scratch in acc_t (a gradient that
// sums over nothing is stored straight to the output instead).  The gradient that does not
// sum over S is complete inside the item and is written at its end; the one that sums over
// S is complete only when S is not chunked, else each chunk stashes its partial sums and a
// second pass adds the chunks in chunk order.
//
// Determinism: the item decomposition depends only on the shapes (never on the thread
// count), each item sums in a fixed order, and no two items write the same output, so the
// result is bitwise reproducible with no atomics.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "binary_backward.h"
#include "common.h"

namespace gradoracle {
namespace {

constexpr int64_t kElementwiseGrain = 1 << 15;  // elements per parallel_for chunk, elementwise paths
constexpr int64_t kItemVolume = 1 << 16;        // target box elements per reduction work item
constexpr int64_t kMinChunkVolume = 1 << 13;    // never split an item below this many elements
constexpr int64_t kTargetItems = 64;            // split S until this many items exist (size-only rule)
constexpr int64_t kMinKRun = 64;                // K block bounds when the innermost loop walks K
constexpr int64_t kMaxKRun = 4096;
constexpr int kLanes = 8;                       // independent partial sums in a scalar reduction

// The plan's tensor slots (swap = 0: a, b, grad_out, grad_a, grad_b) and limits.
enum Operand : int { kA = BB_P, kB = BB_Q, kG = BB_G, kGA = BB_DP, kGB = BB_DQ };
constexpr int kNumOperands = BB_NT;
constexpr int kMaxDims = BB_MAX_DIMS;

// The broadcast plan as the CPU kernel walks it: the K, RA, RB groups of a BB_KIND_BOX launch.
struct BcastPlan {
  const BBGroup& k;
  const BBGroup& ra;
  const BBGroup& rb;
  int64_t numel;
};

enum Grp : int { kK = 0, kRA = 1, kRB = 2 };

// What the innermost loop does with one gradient's terms:
//   kSum    the gradient sums over the inner group: reduce the run, add to one scratch cell;
//   kAcc    add each term to its own scratch cell (stride 1);
//   kStore  the gradient sums over nothing (its reduce group is empty): store straight to the output.
enum Mode : int { kSum, kAcc, kStore };

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

int64_t inner_stride(const BBGroup& g, int op) { return g.ndim ? g.stride[op][g.ndim - 1] : 0; }

// A range [lo, hi) of a group's row-major linear index.
struct Span {
  const BBGroup* g;
  int64_t lo, hi;
  int64_t size() const { return hi - lo; }
};

// Calls f(local, off, len) for each run of the span along the group's innermost dim: span
// elements [local, local + len) start at operand offsets off[] and step by inner_stride.
// An odometer advances between runs, so there is one division per dim per span, not per element.
template <typename Fn>
void for_each_run(const Span& s, Fn&& f) {
  const BBGroup& g = *s.g;
  int64_t off[kNumOperands] = {0, 0, 0, 0, 0};
  if (s.lo >= s.hi) return;
  if (g.ndim == 0) return f(int64_t(0), static_cast<const int64_t*>(off), int64_t(1));  // one element
  const int last = static_cast<int>(g.ndim) - 1;
  int64_t idx[kMaxDims];
  int64_t rem = s.lo;
  for (int d = last; d >= 0; --d) {
    idx[d] = rem % g.size[d];
    rem /= g.size[d];
    for (int t = 0; t < kNumOperands; ++t) off[t] += idx[d] * g.stride[t][d];
  }
  for (int64_t l = s.lo; l < s.hi;) {
    const int64_t len = std::min<int64_t>(g.size[last] - idx[last], s.hi - l);
    f(l - s.lo, static_cast<const int64_t*>(off), len);
    l += len;
    idx[last] += len;
    for (int t = 0; t < kNumOperands; ++t) off[t] += len * g.stride[t][last];
    for (int d = last; d > 0 && idx[d] == g.size[d]; --d) {  // carry
      idx[d] = 0;
      ++idx[d - 1];
      for (int t = 0; t < kNumOperands; ++t) off[t] += g.stride[t][d - 1] - g.size[d] * g.stride[t][d];
    }
  }
}

// Calls f(local, off) for every element of the span.
template <typename Fn>
void for_each_elem(const Span& s, Fn&& f) {
  int64_t step[kNumOperands];
  for (int t = 0; t < kNumOperands; ++t) step[t] = inner_stride(*s.g, t);
  for_each_run(s, [&](int64_t local, const int64_t* off, int64_t len) {
    int64_t o[kNumOperands];
    std::copy(off, off + kNumOperands, o);
    for (int64_t i = 0; i < len; ++i) {
      f(local + i, static_cast<const int64_t*>(o));
      for (int t = 0; t < kNumOperands; ++t) o[t] += step[t];
    }
  });
}

// Pairwise combination of the lanes: a fixed tree, so the order never depends on the data.
template <typename acc_t>
acc_t sum_lanes(const acc_t (&l)[kLanes]) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

template <typename scalar_t>
struct Ptrs {
  const scalar_t* a;
  const scalar_t* b;
  const scalar_t* g;
  scalar_t* ga;
  scalar_t* gb;
};

// One run of the innermost loop (see Kernel::run), its targets type-erased so the reduction
// machinery is compiled once per dtype and picks a run per plan.
template <typename scalar_t>
using RunFn = void (*)(const scalar_t* a, const scalar_t* b, const scalar_t* g, int64_t n, void* pa, void* pb);

// Everything that depends on fn: the elementwise loops and the innermost runs.
template <int FN, typename scalar_t>
struct Kernel : Ptrs<scalar_t> {
  using acc_t = at::opmath_type<scalar_t>;
  using Ptrs<scalar_t>::a;
  using Ptrs<scalar_t>::b;
  using Ptrs<scalar_t>::g;
  using Ptrs<scalar_t>::ga;
  using Ptrs<scalar_t>::gb;

  // grad_out times both partials at one box element.
  static void terms(scalar_t av, scalar_t bv, scalar_t gv, acc_t& ta, acc_t& tb) {
    acc_t da, db;
    bb_partials<FN, acc_t>(static_cast<acc_t>(av), static_cast<acc_t>(bv), da, db);
    ta = static_cast<acc_t>(gv) * da;
    tb = static_cast<acc_t>(gv) * db;
  }

  // ------------------------------------------------------------------ no broadcast

  void elementwise_contiguous(int64_t n) const {
    at::parallel_for(0, n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        acc_t ta, tb;
        terms(a[i], b[i], g[i], ta, tb);
        ga[i] = static_cast<scalar_t>(ta);
        gb[i] = static_cast<scalar_t>(tb);
      }
    });
  }

  void elementwise_strided(const BBGroup& k) const {
    const int64_t s[kNumOperands] = {inner_stride(k, kA), inner_stride(k, kB), inner_stride(k, kG),
                                     inner_stride(k, kGA), inner_stride(k, kGB)};
    at::parallel_for(0, k.numel, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      for_each_run(Span{&k, lo, hi}, [&](int64_t, const int64_t* o, int64_t len) {
        for (int64_t i = 0; i < len; ++i) {
          acc_t ta, tb;
          terms(a[o[kA] + i * s[kA]], b[o[kB] + i * s[kB]], g[o[kG] + i * s[kG]], ta, tb);
          ga[o[kGA] + i * s[kGA]] = static_cast<scalar_t>(ta);
          gb[o[kGB] + i * s[kGB]] = static_cast<scalar_t>(tb);
        }
      });
    });
  }

  // ------------------------------------------------------------------ one run of the innermost loop

  // Where each gradient's terms go in the innermost loop.
  template <Mode M>
  using target_t = std::conditional_t<M == kStore, scalar_t, acc_t>;

  template <Mode M>
  static void put(target_t<M>* __restrict p, int64_t i, acc_t t) {
    if constexpr (M == kAcc) p[i] += t;
    else if constexpr (M == kStore) p[i] = static_cast<scalar_t>(t);
  }

  // Handles `n` consecutive box elements along the inner group's innermost dim, all operands
  // at unit stride except the one summed over (stride 0): constant strides let the compiler
  // vectorise.  `pa` / `pb` receive the grad_a / grad_b terms as `MA` / `MB` say; a kSum run
  // is reduced in kLanes independent registers, then added to its one scratch cell.
  template <Mode MA, Mode MB>
  static void run(const scalar_t* __restrict a, const scalar_t* __restrict b, const scalar_t* __restrict g,
                  int64_t n, void* pa_, void* pb_) {
    static_assert(!(MA == kSum && MB == kSum), "a run sums over one group only");
    constexpr int64_t sa = MA == kSum ? 0 : 1, sb = MB == kSum ? 0 : 1;
    target_t<MA>* __restrict pa = static_cast<target_t<MA>*>(pa_);
    target_t<MB>* __restrict pb = static_cast<target_t<MB>*>(pb_);
    if constexpr (MA != kSum && MB != kSum) {
      for (int64_t i = 0; i < n; ++i) {
        acc_t ta, tb;
        terms(a[i], b[i], g[i], ta, tb);
        put<MA>(pa, i, ta);
        put<MB>(pb, i, tb);
      }
    } else {
      acc_t lanes[kLanes] = {};
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          acc_t ta, tb;
          terms(a[(i + l) * sa], b[(i + l) * sb], g[i + l], ta, tb);
          if constexpr (MA == kSum) lanes[l] += ta; else put<MA>(pa, i + l, ta);
          if constexpr (MB == kSum) lanes[l] += tb; else put<MB>(pb, i + l, tb);
        }
      }
      for (int l = 0; i < n; ++i, ++l) {
        acc_t ta, tb;
        terms(a[i * sa], b[i * sb], g[i], ta, tb);
        if constexpr (MA == kSum) lanes[l] += ta; else put<MA>(pa, i, ta);
        if constexpr (MB == kSum) lanes[l] += tb; else put<MB>(pb, i, tb);
      }
      if constexpr (MA == kSum) *pa += sum_lanes(lanes);
      if constexpr (MB == kSum) *pb += sum_lanes(lanes);
    }
  }

  // The run for these modes (a run sums over at most one group; both kStore is the
  // elementwise path).
  static RunFn<scalar_t> pick_run(Mode ma, Mode mb) {
    if (ma == kAcc && mb == kAcc) return &run<kAcc, kAcc>;
    if (ma == kStore && mb == kAcc) return &run<kStore, kAcc>;
    if (ma == kAcc && mb == kStore) return &run<kAcc, kStore>;
    if (ma == kSum && mb == kAcc) return &run<kSum, kAcc>;
    if (ma == kSum && mb == kStore) return &run<kSum, kStore>;
    if (ma == kAcc && mb == kSum) return &run<kAcc, kSum>;
    if (ma == kStore && mb == kSum) return &run<kStore, kSum>;
    TORCH_CHECK(false, "binary_backward: internal error: no run for modes ", int(ma), ", ", int(mb));
  }
};

// ----------------------------------------------------------------------------- reduction plan

// How the box is cut into work items; a function of the shapes only.
struct Decomp {
  Grp inner;          // group walked by the innermost loop
  Grp outer[2];       // the other two groups, outermost first
  Grp split;          // kRA or kRB: the reduce group chunked across items
  int64_t k_block;    // K elements per item
  int64_t n_kblocks;
  int64_t chunk_len;  // S elements per item
  int64_t n_chunks;
  int64_t items() const { return n_kblocks * n_chunks; }
};

const BBGroup& group(const BcastPlan& p, Grp g) { return g == kK ? p.k : g == kRA ? p.ra : p.rb; }

// The group whose innermost dim walks grad_out with the smallest stride, preferring dims of
// at least 16 elements (a short innermost loop costs more in overhead than locality saves).
Grp pick_inner(const BcastPlan& p) {
  Grp best = kK;
  bool found = false, best_long = false;
  int64_t best_stride = 0, best_size = 0;
  for (Grp c : {kK, kRA, kRB}) {
    const BBGroup& g = group(p, c);
    if (g.ndim == 0) continue;
    const int64_t size = g.size[g.ndim - 1], stride = std::abs(g.stride[kG][g.ndim - 1]);
    const bool is_long = size >= 16;
    const bool better = !found || (is_long != best_long ? is_long
                                   : is_long        ? stride < best_stride
                                                    : size > best_size);
    if (better) found = true, best = c, best_long = is_long, best_stride = stride, best_size = size;
  }
  return best;
}

Decomp make_decomp(const BcastPlan& p) {
  Decomp d{};
  d.inner = pick_inner(p);
  const int64_t nk = p.k.numel, nra = p.ra.numel, nrb = p.rb.numel, per_k = nra * nrb;

  // Outer loops: the remaining groups, the one with the larger grad_out stride outermost.
  int j = 0;
  for (Grp c : {kK, kRA, kRB})
    if (c != d.inner) d.outer[j++] = c;
  if (std::abs(inner_stride(group(p, d.outer[0]), kG)) < std::abs(inner_stride(group(p, d.outer[1]), kG)))
    std::swap(d.outer[0], d.outer[1]);

  // Split a reduce group that is not the innermost when it offers enough chunks (runs stay
  // long), else the larger one.
  const Grp other = d.inner == kRA ? kRB : kRA;
  const int64_t n_other = other == kRA ? nra : nrb;
  const Grp larger = nra >= nrb ? kRA : kRB;
  d.split = d.inner != kK && n_other >= kTargetItems ? other : larger;
  const int64_t ns = d.split == kRA ? nra : nrb;

  // When the innermost loop walks K, a block spans a whole innermost K dim (up to kMaxKRun):
  // short K runs across many rows would touch a new page per run and defeat the prefetcher.
  const int64_t min_kb = d.inner == kK ? std::max(kMinKRun, std::min<int64_t>(kMaxKRun, p.k.size[p.k.ndim - 1])) : 1;
  d.k_block = std::min(nk, std::max(min_kb, ceil_div(kItemVolume, per_k)));
  d.n_kblocks = ceil_div(nk, d.k_block);

  const int64_t volume = d.k_block * per_k;
  const int64_t for_memory = ceil_div(volume, 4 * kItemVolume);  // bound item scratch
  const int64_t for_threads =
      std::min(ceil_div(kTargetItems, d.n_kblocks), std::max<int64_t>(1, volume / kMinChunkVolume));
  const int64_t chunks = std::clamp<int64_t>(std::max(for_memory, for_threads), 1, ns);
  d.chunk_len = ceil_div(ns, chunks);
  d.n_chunks = ceil_div(ns, d.chunk_len);
  return d;
}

// ----------------------------------------------------------------------------- reduction pass

template <typename scalar_t>
struct Reducer {
  using acc_t = at::opmath_type<scalar_t>;
  using PickFn = RunFn<scalar_t> (*)(Mode, Mode);

  Ptrs<scalar_t> ker;
  PickFn pick_run;  // Kernel<fn, scalar_t>::pick_run
  const BcastPlan& p;
  const Decomp& d;
  acc_t* partial;  // [n_chunks][nK][n_kept] sums of the split gradient, when n_chunks > 1

  static Grp kept(Grp r) { return r == kRA ? kRB : kRA; }

  // One gradient within one work item: grad_a (reduce = kRA) or grad_b (reduce = kRB).
  struct Out {
    Grp reduce;
    Mode mode;
    int op;                  // kGA or kGB: its stride slot in the plan
    scalar_t* out;
    std::vector<acc_t> acc;  // one cell per (k, kept) in the item; empty for kStore
    int64_t s[3];            // scratch stride per group, 0 along `reduce`
  };

  // Scratch is y-fastest unless the innermost loop walks K, so the innermost loop always
  // touches it at stride 1 (kAcc) or 0 (kSum).
  Out make_out(Grp r, const Span (&span)[3]) const {
    Out o;
    o.reduce = r;
    o.op = r == kRA ? kGA : kGB;
    o.out = r == kRA ? ker.ga : ker.gb;
    o.mode = mode(r);
    const Grp y = kept(r);
    const bool k_fast = d.inner == kK;
    const int64_t nk = span[kK].size(), ny = span[y].size();
    o.s[kK] = k_fast ? 1 : ny;
    o.s[y] = k_fast ? nk : 1;
    o.s[r] = 0;
    if (o.mode != kStore) o.acc.assign(nk * ny, acc_t(0));
    return o;
  }

  // Where the run at local indices (l0, l1, l2) of (outer[0], outer[1], inner) starts.
  void* target(Out& o, int64_t l0, int64_t l1, int64_t l2, const int64_t* off0, const int64_t* off1,
               const int64_t* off2) const {
    if (o.mode == kStore) return o.out + off0[o.op] + off1[o.op] + off2[o.op];
    return o.acc.data() + l0 * o.s[d.outer[0]] + l1 * o.s[d.outer[1]] + l2 * o.s[d.inner];
  }

  // A strided run, packed into unit-stride stack buffers (and kStore results unpacked), so
  // the one vectorised run per mode pair serves every layout.
  static void run_packed(RunFn<scalar_t> run, const scalar_t* a, const scalar_t* b, const scalar_t* g,
                         const int64_t* s, int64_t n, Mode ma, void* pa, Mode mb, void* pb) {
    constexpr int64_t kPack = 256;
    scalar_t buf_a[kPack], buf_b[kPack], buf_g[kPack], out_a[kPack], out_b[kPack];
    auto pack = [](scalar_t* dst, const scalar_t* src, int64_t stride, int64_t m) {
      for (int64_t i = 0; i < m; ++i) dst[i] = src[i * stride];
      return dst;
    };
    auto place = [](Mode mode, void* p, int64_t i0, scalar_t* out) -> void* {
      if (mode == kStore) return out;
      return mode == kAcc ? static_cast<acc_t*>(p) + i0 : p;  // kSum: the one cell
    };
    for (int64_t i0 = 0; i0 < n; i0 += kPack) {
      const int64_t m = std::min(kPack, n - i0);
      run(ma == kSum ? a : pack(buf_a, a + i0 * s[kA], s[kA], m),
          mb == kSum ? b : pack(buf_b, b + i0 * s[kB], s[kB], m), pack(buf_g, g + i0 * s[kG], s[kG], m), m,
          place(ma, pa, i0, out_a), place(mb, pb, i0, out_b));
      for (int64_t i = 0; ma == kStore && i < m; ++i) static_cast<scalar_t*>(pa)[(i0 + i) * s[kGA]] = out_a[i];
      for (int64_t i = 0; mb == kStore && i < m; ++i) static_cast<scalar_t*>(pb)[(i0 + i) * s[kGB]] = out_b[i];
    }
  }

  Mode mode(Grp r) const { return group(p, r).ndim == 0 ? kStore : d.inner == r ? kSum : kAcc; }

  void item(int64_t index) const {
    const int64_t kb = index / d.n_chunks, chunk = index % d.n_chunks;
    Span span[3] = {{&p.k, kb * d.k_block, std::min<int64_t>(p.k.numel, (kb + 1) * d.k_block)},
                    {&p.ra, 0, p.ra.numel},
                    {&p.rb, 0, p.rb.numel}};
    span[d.split].lo = chunk * d.chunk_len;
    span[d.split].hi = std::min(span[d.split].hi, (chunk + 1) * d.chunk_len);
    Out oa = make_out(kRA, span), ob = make_out(kRB, span);

    const BBGroup& in = group(p, d.inner);
    int64_t s[kNumOperands];
    for (int t = 0; t < kNumOperands; ++t) s[t] = inner_stride(in, t);
    const RunFn<scalar_t> run = pick_run(oa.mode, ob.mode);
    const bool unit = s[kG] == 1 && (oa.mode == kSum || s[kA] == 1) && (ob.mode == kSum || s[kB] == 1) &&
                      (oa.mode != kStore || s[kGA] == 1) && (ob.mode != kStore || s[kGB] == 1);
    for_each_elem(span[d.outer[0]], [&](int64_t l0, const int64_t* off0) {
      for_each_elem(span[d.outer[1]], [&](int64_t l1, const int64_t* off1) {
        const scalar_t* a = ker.a + off0[kA] + off1[kA];
        const scalar_t* b = ker.b + off0[kB] + off1[kB];
        const scalar_t* g = ker.g + off0[kG] + off1[kG];
        for_each_run(span[d.inner], [&](int64_t l2, const int64_t* o, int64_t len) {
          void* pa = target(oa, l0, l1, l2, off0, off1, o);
          void* pb = target(ob, l0, l1, l2, off0, off1, o);
          if (unit)
            run(a + o[kA], b + o[kB], g + o[kG], len, pa, pb);
          else
            run_packed(run, a + o[kA], b + o[kB], g + o[kG], s, len, oa.mode, pa, ob.mode, pb);
        });
      });
    });
    finish(oa, span, chunk);
    finish(ob, span, chunk);
  }

  // Writes the item's sums of one gradient, or stashes them as this chunk's partial sums when
  // that gradient also receives other chunks.
  void finish(const Out& o, const Span (&span)[3], int64_t chunk) const {
    if (o.mode == kStore) return;  // already written
    const Grp y = kept(o.reduce);
    if (d.split == o.reduce && d.n_chunks > 1) {
      const int64_t ny = span[y].size();  // y is not split: the span is the whole group
      acc_t* dst = partial + (chunk * p.k.numel + span[kK].lo) * ny;
      for (int64_t kk = 0; kk < span[kK].size(); ++kk)
        for (int64_t j = 0; j < ny; ++j) dst[kk * ny + j] = o.acc[kk * o.s[kK] + j * o.s[y]];
      return;
    }
    // Walk the scratch in its own order (inner stride 1) so the copy streams.
    const Grp outer = d.inner == kK ? y : kK, inner = d.inner == kK ? kK : y;
    const int64_t so = inner_stride(*span[inner].g, o.op);
    for_each_elem(span[outer], [&](int64_t lo, const int64_t* oo) {
      for_each_run(span[inner], [&](int64_t li, const int64_t* oi, int64_t len) {
        scalar_t* dst = o.out + oo[o.op] + oi[o.op];
        const acc_t* src = o.acc.data() + lo * o.s[outer] + li;
        for (int64_t i = 0; i < len; ++i) dst[i * so] = static_cast<scalar_t>(src[i]);
      });
    });
  }

  // Adds the chunks' partial sums of the split gradient in chunk order and writes it.
  void combine() const {
    const Grp r = d.split, y = kept(r);
    const int out_op = r == kRA ? kGA : kGB;
    scalar_t* out = r == kRA ? ker.ga : ker.gb;
    const int64_t nk = p.k.numel, ny = group(p, y).numel, stride_c = nk * ny;
    const int64_t so = inner_stride(group(p, y), out_op);
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (ny * d.n_chunks));
    at::parallel_for(0, nk, grain, [&](int64_t lo, int64_t hi) {
      for_each_elem(Span{&p.k, lo, hi}, [&](int64_t kl, const int64_t* ok) {
        for_each_run(Span{&group(p, y), 0, ny}, [&](int64_t j0, const int64_t* oy, int64_t len) {
          scalar_t* dst = out + ok[out_op] + oy[out_op];
          const acc_t* src = partial + (lo + kl) * ny + j0;
          for (int64_t i = 0; i < len; ++i) {
            acc_t sum = src[i];
            for (int64_t c = 1; c < d.n_chunks; ++c) sum += src[c * stride_c + i];
            dst[i * so] = static_cast<scalar_t>(sum);
          }
        });
      });
    });
  }

  void run_all() const {
    at::parallel_for(0, d.items(), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) item(i);
    });
    if (d.n_chunks > 1) combine();
  }
};

template <int FN, typename scalar_t>
void launch(const BcastPlan& plan, int64_t kind, const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
            at::Tensor& grad_a, at::Tensor& grad_b) {
  using acc_t = at::opmath_type<scalar_t>;
  const Ptrs<scalar_t> ptrs{a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(),
                            grad_out.const_data_ptr<scalar_t>(), grad_a.mutable_data_ptr<scalar_t>(),
                            grad_b.mutable_data_ptr<scalar_t>()};
  const Kernel<FN, scalar_t> ker{ptrs};
  if (kind == BB_KIND_FAST) return ker.elementwise_contiguous(plan.numel);
  if (kind == BB_KIND_EW) return ker.elementwise_strided(plan.k);

  const Decomp d = make_decomp(plan);
  std::vector<acc_t> partial;
  if (d.n_chunks > 1) {
    const int64_t n_kept = (d.split == kRA ? plan.rb : plan.ra).numel;
    partial.resize(d.n_chunks * plan.k.numel * n_kept);
  }
  Reducer<scalar_t>{ptrs, &Kernel<FN, scalar_t>::pick_run, plan, d, partial.data()}.run_all();
}

}  // namespace

// ----------------------------------------------------------------------------- checks

namespace {

constexpr const char* kOp = "binary_backward";

// NumPy broadcast of two shapes; ValueError naming both shapes and the first bad dim.
std::vector<int64_t> broadcast_shape(c10::IntArrayRef a_shape, c10::IntArrayRef b_shape) {
  const size_t rank = std::max(a_shape.size(), b_shape.size());
  std::vector<int64_t> out(rank);
  for (size_t d = 0; d < rank; ++d) {
    const size_t la = rank - a_shape.size(), lb = rank - b_shape.size();
    const int64_t x = d < la ? 1 : a_shape[d - la];
    const int64_t y = d < lb ? 1 : b_shape[d - lb];
    TORCH_CHECK_VALUE(x == y || x == 1 || y == 1, kOp, ": shapes ", a_shape, " and ", b_shape,
                      " do not broadcast (dim ", d, ": ", x, " vs ", y, ")");
    out[d] = x == 1 ? y : x;
  }
  return out;
}


// The plan must be a BBLaunch made for these shapes, of a kind this device runs (a plan made for
// other strides is not caught: the plan is private to backends/torch_ext).  The kind is checked
// last, so a CPU test can pass a CUDA launch through every other check.
void check_plan(const BBLaunch& l, const at::Tensor& grad_out, const at::Tensor& grad_a, const at::Tensor& grad_b) {
  TORCH_CHECK_VALUE(l.kind >= 0 && l.kind < BB_NUM_KINDS, kOp, ": plan has kind ", l.kind, ", expected 0..",
                    BB_NUM_KINDS - 1);
  TORCH_CHECK_VALUE(l.numel == grad_out.numel(), kOp, ": plan is for ", l.numel, " elements of grad_out, got ",
                    grad_out.numel());
  int64_t box = 1;
  for (const BBGroup& g : l.params.grp) {
    int64_t n = 1;
    TORCH_CHECK_VALUE(g.ndim >= 0 && g.ndim <= BB_MAX_DIMS, kOp, ": plan has a group of ", g.ndim, " dims");
    for (int d = 0; d < g.ndim; ++d) n *= g.size[d];
    TORCH_CHECK_VALUE(n == g.numel, kOp, ": plan has a group of ", g.numel, " elements whose sizes multiply to ", n);
    box *= n;
  }
  // Every kind's three groups tile the box K x RA x RB (in some role order).
  TORCH_CHECK_VALUE(box == l.numel, kOp, ": plan's groups hold ", box, " elements, grad_out ", l.numel);
  const bool launches = (l.kind > BB_KIND_EW && l.kind < BB_KIND_BOX) || l.kind == BB_KIND_COLS ||
                        l.kind == BB_KIND_ROWS || l.kind == BB_KIND_BATCH ||
                        l.kind == BB_KIND_BOTH;  // the CUDA reduction kernels
  if (launches) {  // outputs in role order: P's, then Q's
    const at::Tensor& d_p = l.params.swap ? grad_b : grad_a;
    const at::Tensor& d_q = l.params.swap ? grad_a : grad_b;
    bool stages_ok = l.grid >= 1;
    for (int i = 0; i < 2; ++i) stages_ok = stages_ok && l.nchunks[i] >= 1 && (l.nchunks[i] == 1 || l.finalize_grid[i] >= 1);
    TORCH_CHECK_VALUE(l.numel_out[0] == d_p.numel() && l.numel_out[1] == d_q.numel() && stages_ok,
                      kOp, ": plan's outputs (", l.numel_out[0], ", ", l.numel_out[1], " elements) do not match ",
                      "grad_a and grad_b");
  }
  const bool cpu = grad_out.device().is_cpu();
  const bool both = l.kind == BB_KIND_ZERO || l.kind == BB_KIND_FAST || l.kind == BB_KIND_EW;
  TORCH_CHECK_VALUE(both || (cpu ? l.kind == BB_KIND_BOX : launches), kOp, ": plan has kind ", l.kind,
                    ", which ", grad_out.device(), " does not run");
}

}  // namespace

int parse_binary_fn(c10::string_view fn) {
  const std::string_view name_in(fn.data(), fn.size());
  std::string names;
  for (int i = 0; i < BB_NUM_FNS; ++i) {
    if (name_in == bb_fn_names[i]) return i;
    names += (i ? ", " : "") + std::string(bb_fn_names[i]);
  }
  TORCH_CHECK_VALUE(false, kOp, ": fn is '", std::string(fn.data(), fn.size()), "', expected one of ", names);
}

int check_binary_backward_run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                              c10::string_view fn, const at::Tensor& plan, const at::Tensor& grad_a,
                              const at::Tensor& grad_b, BBLaunch& launch) {
  const int parsed = parse_binary_fn(fn);
  check_float_input(kOp, a, "a");
  check_float_input(kOp, b, "b");
  check_float_input(kOp, grad_out, "grad_out");
  check_like(kOp, b, "b", a, "a");
  check_like(kOp, grad_out, "grad_out", a, "a");

  const std::vector<int64_t> out_shape = broadcast_shape(a.sizes(), b.sizes());
  TORCH_CHECK_VALUE(out_shape.size() <= static_cast<size_t>(BB_MAX_DIMS), kOp, ": broadcast of a ", a.sizes(),
                    " and b ", b.sizes(), " has rank ", out_shape.size(), ", expected at most ", BB_MAX_DIMS);
  TORCH_CHECK_VALUE(grad_out.sizes() == c10::IntArrayRef(out_shape), kOp, ": grad_out has shape ",
                    grad_out.sizes(), ", expected ", c10::IntArrayRef(out_shape), " (broadcast of a ", a.sizes(),
                    " and b ", b.sizes(), ")");

  check_output(kOp, grad_a, "grad_a", a, "a", a, "a");
  check_output(kOp, grad_b, "grad_b", b, "b", a, "a");
  check_no_overlap(kOp, grad_a, "grad_a", grad_b, "grad_b");
  for (const auto& [out, out_name] : {std::pair{&grad_a, "grad_a"}, std::pair{&grad_b, "grad_b"}}) {
    check_no_overlap(kOp, *out, out_name, a, "a");
    check_no_overlap(kOp, *out, out_name, b, "b");
    check_no_overlap(kOp, *out, out_name, grad_out, "grad_out");
  }

  std::memcpy(&launch, plan_words(kOp, plan, BB_LAUNCH_WORDS), sizeof(BBLaunch));
  check_plan(launch, grad_out, grad_a, grad_b);
  return parsed;
}

// ----------------------------------------------------------------------------- CPU

namespace {

void binary_backward_run_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                             c10::string_view fn, const at::Tensor& plan, at::Tensor& grad_a, at::Tensor& grad_b) {
  BBLaunch l;
  const int f = check_binary_backward_run(a, b, grad_out, fn, plan, grad_a, grad_b, l);
  TORCH_CHECK_VALUE(a.device().is_cpu(), "binary_backward: a is on device ", a.device(),
                    ", expected cpu (this is the CPU kernel)");
  if (l.kind == BB_KIND_ZERO) {  // nothing to sum: broadcast operands get 0, empty ones stay empty
    grad_a.zero_();
    grad_b.zero_();
    return;
  }
  const BcastPlan box{l.params.grp[0], l.params.grp[1], l.params.grp[2], l.numel};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "binary_backward_cpu", [&] {
    dispatch_binary_fn(f, [&](auto tag) {
      launch<decltype(tag)::value, scalar_t>(box, l.kind, a, b, grad_out, grad_a, grad_b);
    });
  });
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("binary_backward(Tensor a, Tensor b, Tensor grad_out, str fn) -> (Tensor, Tensor)");
  m.def(
      "binary_backward.out(Tensor a, Tensor b, Tensor grad_out, str fn, *, Tensor(a!) grad_a, Tensor(b!) grad_b) "
      "-> (Tensor(a!), Tensor(b!))");
  m.def(
      "_binary_backward_run(Tensor a, Tensor b, Tensor grad_out, str fn, Tensor plan, *, Tensor(a!) grad_a, "
      "Tensor(b!) grad_b) -> ()");
  // Resident BB_BLOCK-thread blocks per SM of the kernel a launch of `kind` runs for like's dtype and
  // fn (the driver's figure, as cupy asks it): the Python planner sizes the grid with it.  CUDA only.
  m.def("_binary_backward_blocks_per_sm(Tensor like, str fn, int kind, bool vectorized) -> int");
}

TORCH_LIBRARY_IMPL(gradoracle, CPU, m) {
  m.impl("_binary_backward_run", TORCH_FN(gradoracle::binary_backward_run_cpu));
}
