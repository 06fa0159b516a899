// Few-row float32 linear y[r, j] = sum_i x[r, i] * W[j, i] (+ b[j]): the GEMVs of a
// decode step, where the weight is read once per call and the rows are few.
//
// Compiled once per instruction set (see CMakeLists.txt): COMLRL_ISA=isa_base (the
// compiler's baseline, SSE2 on x86-64), isa_avx2 (-mavx2 -mfma) and isa_avx512
// (-mavx512f/vl/bw/dq); cpu_kernels.cpp picks one at run time. Everything except the entry
// point has internal linkage, so no AVX code leaks into the baseline path.
//
// Why not torch's GEMM: with few rows the op is bound by reading the weight from memory,
// and MKL's small-M path on this machine streams it at 4-12 GB/s where a plain sum reads
// 22-27 GB/s.
//
// Register tile: kNW weight rows x up to kNR = 4 rows of x per inner loop, one vector
// accumulator per (weight row, x row): per step of kLanes elements, kNW + NR loads feed
// kNW * NR FMAs (AVX-512: 4 x 4, 8 loads per 16 FMAs; AVX2: 3 x 4 in its 16 registers).
// The previous kernel took one weight row at a time (5 loads per 4 FMAs at 4 rows) and
// read 8-18 GB/s at 4 rows where one row read 19-28. The kNW weight rows are adjacent in
// memory, so a tile reads one contiguous block; the next tile's block is prefetched into
// L2 while this one is multiplied (kPrefetch). The accumulators are summed at the end by
// a tree of pairwise "horizontal adds" that leaves kLanes sums in order in one vector
// (hadd_tree). In cache (a 256 x 576 weight reused), 4 rows run at ~90 GFLOP/s on the
// build machine's Zen 4, which is about its peak of two 256-bit FMAs per cycle: from
// memory the kernel is bound by the weight read again.
//
// Order of the sum per output: kLanes interleaved partial sums over i (kU per lane when
// the tile has few outputs), added together and then as a tree, then the scalar tail of
// i, then the bias: a different order from BLAS, so results match F.linear to rounding,
// not bit for bit.
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu_linear.h"

#ifndef COMLRL_ISA
#error "compile cpu_linear.cpp with -DCOMLRL_ISA=isa_base, isa_avx2 or isa_avx512"
#endif

namespace comlrl::cpu::COMLRL_ISA {
namespace {

constexpr int kNR = 4;  // rows of x per tile (LinearArgs callers pass at most a few)

// kNW: weight rows per tile at 2-4 rows of x (kNW * 4 vector accumulators plus kNW weight
// vectors must fit the registers: 32 with AVX-512, 16 with AVX2 and SSE2). One row of x
// takes one weight row at a time (kNW1 = 1): one sequential stream, which the hardware
// prefetcher follows best, and the arithmetic is far below the memory time anyway.
#if defined(__GNUC__)
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kNW = 4;
#elif defined(__AVX2__)
constexpr int kLanes = 8;
constexpr int kNW = 3;
#else
constexpr int kLanes = 4;
constexpr int kNW = 2;
#endif
// Software prefetch of the next tile's weight block into L2 (prefetcht1). Measured on the
// build machine's Zen 4 (load 4-6, best of 4 interleaved rounds, 4 rows): without it the
// 4 x 4 tile read 8-14 GB/s, with prefetcht0 13-25 GB/s, with prefetcht1 13-26 GB/s and
// 20-24 GB/s (was ~12) on the down projection (K = 1536, whose x rows fill L1).
constexpr bool kPrefetch = true;
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));

inline vf load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}

// Lane indices of a "horizontal add" of a and b: out[i] = a[2i] + a[2i+1] for the first
// kLanes/2 lanes, b[2i'] + b[2i'+1] for the rest (shufflevector numbers b's lanes from
// kLanes on).
constexpr int even_lane(int i) { return i < kLanes / 2 ? 2 * i : kLanes + 2 * (i - kLanes / 2); }
template <std::size_t... I>
inline vf hadd_impl(vf a, vf b, std::index_sequence<I...>) {
#if defined(__clang__) || __GNUC__ >= 12
  return __builtin_shufflevector(a, b, even_lane(int(I))...) +
         __builtin_shufflevector(a, b, (even_lane(int(I)) + 1)...);
#else  // GCC before 12 has no __builtin_shufflevector; its __builtin_shuffle numbers alike
  typedef int vi __attribute__((vector_size(kLanes * sizeof(int))));
  return __builtin_shuffle(a, b, vi{even_lane(int(I))...}) +
         __builtin_shuffle(a, b, vi{(even_lane(int(I)) + 1)...});
#endif
}
inline vf hadd(vf a, vf b) { return hadd_impl(a, b, std::make_index_sequence<kLanes>{}); }

// v[0..kLanes) -> one vector whose lane t is the sum of v[t]'s lanes: log2(kLanes) levels
// of pairwise hadds (kLanes - 1 in all), each level halving the vectors and doubling the
// outputs per vector, the order of the inputs kept.
inline vf hadd_tree(vf (&v)[kLanes]) {
  for (int n = kLanes; n > 1; n /= 2)
    for (int t = 0; t < n / 2; ++t) v[t] = hadd(v[2 * t], v[2 * t + 1]);
  return v[0];
}

// The sum of one vector's lanes, as a tree (hadd with itself until lane 0 holds it).
inline float hsum(vf v) {
  for (int n = kLanes; n > 1; n /= 2) v = hadd(v, v);
  return v[0];
}
#else  // other compilers: scalar code through the same template
constexpr int kLanes = 1;
constexpr int kNW = 2;
constexpr bool kPrefetch = false;
typedef float vf;
inline vf load(const float* p) { return *p; }
inline vf hadd_tree(vf (&v)[1]) { return v[0]; }
inline float hsum(vf v) { return v; }
#endif

// out[j][r] = dot(w[j], x[r]) for NW weight rows and NR rows of x. `next`: the start of
// the next tile's weight block (NW * k floats, prefetched), or nullptr.
template <int NW, int NR>
inline void block(const float* const* w, const float* x, std::int64_t x_stride, std::int64_t k,
                  const float* next, float (&out)[kNW][kNR]) {
  // Few outputs: kU partial sums per output over consecutive vectors, so NW * NR * kU
  // chains hide the FMA latency; with 6 or more outputs NW * NR already do.
  constexpr int kU = NW * NR <= 2 ? 4 : (NW * NR <= 4 ? 2 : 1);
  vf acc[kU][NW][NR];
  for (int u = 0; u < kU; ++u)
    for (int j = 0; j < NW; ++j)
      for (int r = 0; r < NR; ++r) acc[u][j][r] = vf{};
  const float* xr[NR];
  for (int r = 0; r < NR; ++r) xr[r] = x + r * x_stride;
  // Prefetch: per step this tile reads NW * kU vectors; the next block (NW * k floats) is
  // fetched at the same pace, so it is in L2 when its tile starts.
  const std::int64_t step = std::int64_t{kLanes} * kU;
  std::int64_t i = 0;
  for (; i + step <= k; i += step) {
#if defined(__GNUC__)
    if constexpr (kPrefetch) {
      if (next != nullptr)
        for (int c = 0; c < NW * kU * kLanes; c += 16) __builtin_prefetch(next + i * NW + c, 0, 2);
    }
#endif
    for (int u = 0; u < kU; ++u) {
      vf wv[NW];
      for (int j = 0; j < NW; ++j) wv[j] = load(w[j] + i + u * kLanes);
      for (int r = 0; r < NR; ++r) {
        const vf xv = load(xr[r] + i + u * kLanes);
        for (int j = 0; j < NW; ++j) acc[u][j][r] += wv[j] * xv;
      }
    }
  }
  for (; i + kLanes <= k; i += kLanes) {
    vf wv[NW];
    for (int j = 0; j < NW; ++j) wv[j] = load(w[j] + i);
    for (int r = 0; r < NR; ++r) {
      const vf xv = load(xr[r] + i);
      for (int j = 0; j < NW; ++j) acc[0][j][r] += wv[j] * xv;
    }
  }
  // Sum the lanes of the NW * NR accumulators: kLanes at a time through hadd_tree (zero
  // vectors pad the last group), or one by one when there are only a few; then the
  // scalar tail of i.
  constexpr int kOut = NW * NR;
  float sums[kOut + kLanes];
  for (int o = 0; o < kOut; ++o) {
    vf s = acc[0][o / NR][o % NR];
    for (int u = 1; u < kU; ++u) s += acc[u][o / NR][o % NR];
    acc[0][o / NR][o % NR] = s;
  }
  if constexpr (kOut <= 2) {
    for (int o = 0; o < kOut; ++o) sums[o] = hsum(acc[0][o / NR][o % NR]);
  } else {
    for (int o0 = 0; o0 < kOut; o0 += kLanes) {
      vf v[kLanes];
      for (int t = 0; t < kLanes; ++t)
        v[t] = o0 + t < kOut ? acc[0][(o0 + t) / NR][(o0 + t) % NR] : vf{};
      const vf h = hadd_tree(v);
      std::memcpy(sums + o0, &h, sizeof h);
    }
  }
  for (int j = 0; j < NW; ++j)
    for (int r = 0; r < NR; ++r) {
      float s = sums[j * NR + r];
      for (std::int64_t t = i; t < k; ++t) s += w[j][t] * xr[r][t];
      out[j][r] = s;
    }
}

// Output columns [lo, hi) in tiles of NW weight rows.
template <int NW>
void tiles(const LinearArgs& a, std::int64_t lo, std::int64_t hi) {
  float out[kNW][kNR];
  for (std::int64_t j0 = lo; j0 < hi; j0 += NW) {
    // The last tile may be short: its missing rows repeat row hi-1 (read from L1,
    // results dropped) so the kernel keeps one shape.
    const float* w[NW];
    const std::int64_t valid = hi - j0 < NW ? hi - j0 : NW;
    for (int j = 0; j < NW; ++j) w[j] = a.weight + (j0 + (j < valid ? j : valid - 1)) * a.w_stride;
    // Prefetch the next tile when it is whole and its rows follow this tile's without a
    // gap (one row at a time is one stream: the hardware prefetcher follows it).
    const bool ahead = NW > 1 && a.w_stride == a.k && j0 + 2 * NW <= hi;
    const float* next = ahead ? a.weight + (j0 + NW) * a.w_stride : nullptr;
    for (std::int64_t r0 = 0; r0 < a.rows; r0 += kNR) {
      const float* x = a.x + r0 * a.x_stride;
      const std::int64_t nr = a.rows - r0 < kNR ? a.rows - r0 : kNR;
      const float* pf = r0 == 0 ? next : nullptr;  // later row tiles find it in cache
      switch (nr) {
        case 1: block<NW, 1>(w, x, a.x_stride, a.k, pf, out); break;
        case 2: block<NW, 2>(w, x, a.x_stride, a.k, pf, out); break;
        case 3: block<NW, 3>(w, x, a.x_stride, a.k, pf, out); break;
        default: block<NW, kNR>(w, x, a.x_stride, a.k, pf, out); break;
      }
      for (std::int64_t r = 0; r < nr; ++r) {
        float* y = a.y + (r0 + r) * a.y_stride + j0;
        for (std::int64_t j = 0; j < valid; ++j)
          y[j] = a.bias ? out[j][r] + a.bias[j0 + j] : out[j][r];
      }
    }
  }
}

}  // namespace

void linear_rows(const LinearArgs& a, std::int64_t lo, std::int64_t hi) {
#if defined(__AVX512F__)
  // One row streams 15-25% faster with 256-bit loads (4 interleaved rounds per shape,
  // 19-26 vs 23-29 GB/s, the build machine's Zen 4 under load 2-5): the AVX2 build serves
  // it (built beside this one, see CMakeLists.txt; every AVX-512 CPU runs AVX2).
  if (a.rows == 1) return isa_avx2::linear_rows(a, lo, hi);
#endif
  if (a.rows == 1) return tiles<1>(a, lo, hi);
  tiles<kNW>(a, lo, hi);
}

}  // namespace comlrl::cpu::COMLRL_ISA
