// Few-row float32 linear y[r, j] = sum_i x[r, i] * W[j, i] (+ b[j]): the GEMVs of a
// decode step, where the weight is read once per call and the rows are few.
//
// Compiled once per instruction set (see CMakeLists.txt): COMLRL_ISA=isa_base (the
// compiler's baseline, SSE2 on x86-64) and isa_avx2 (-mavx2 -mfma); cpu_kernels.cpp picks
// one at run time. Everything except the entry point has internal linkage, so no AVX2
// code leaks into the baseline path.
//
// Why not torch's GEMM: with few rows the op is bound by reading the weight from memory,
// and MKL's small-M path on this machine streams it at 4-12 GB/s where a plain sum reads
// 22-27 GB/s. Here one weight row at a time is streamed once from memory and multiplied
// with a tile of up to kNR = 4 rows of x (in L1/L2: rows * k * 4 bytes), with kU
// independent partial sums per output over consecutive vectors, so the loop is not held
// up by the FMA latency and each weight byte is read once. (Blocks of 3-4 weight rows at a
// time, streamed side by side, read at about half the rate on the build machine's Zen 4,
// as did an AVX-512 build: measured, see the package README.) Order of the sum per
// output: kLanes x kU interleaved partial sums over i, added together and then as a tree,
// then the vector and scalar tails, then the bias: a different order from BLAS, so results
// match F.linear to rounding, not bit for bit.
#include <cstdint>

#include "cpu_linear.h"

#ifndef COMLRL_ISA
#error "compile cpu_linear.cpp with -DCOMLRL_ISA=isa_base or isa_avx2"
#endif

namespace comlrl::cpu::COMLRL_ISA {
namespace {

#if defined(__GNUC__)
#if defined(__AVX2__)
constexpr int kLanes = 8;
constexpr int kNW = 1;
constexpr int kU = 2;
constexpr int kNR = 4;
#else
constexpr int kLanes = 4;
constexpr int kNW = 1;
constexpr int kU = 2;
constexpr int kNR = 4;
#endif
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));

inline vf load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}
// Sum of the lanes as a tree (halves added until 4 lanes remain): a few shuffles and
// adds, where a lane-by-lane loop costs kLanes - 1 dependent adds per output.
typedef float v4 __attribute__((vector_size(4 * sizeof(float))));
inline float hsum4(v4 v) { return (v[0] + v[2]) + (v[1] + v[3]); }
inline float hsum(vf v) {
  if constexpr (kLanes == 8) {
    v4 a, b;
    __builtin_memcpy(&a, &v, sizeof a);
    __builtin_memcpy(&b, reinterpret_cast<const char*>(&v) + sizeof a, sizeof b);
    return hsum4(a + b);
  } else {
    v4 a;
    __builtin_memcpy(&a, &v, sizeof a);
    return hsum4(a);
  }
}
#else  // other compilers: scalar code through the same template
constexpr int kLanes = 1;
constexpr int kNW = 1;
constexpr int kU = 2;
constexpr int kNR = 4;
typedef float vf;
inline vf load(const float* p) { return *p; }
inline float hsum(vf v) { return v; }
#endif

// out[j][r] = dot(w[j], x[r]) for kNW weight rows and NR rows of x; kU independent
// partial sums per (j, r) over consecutive vectors so the FMA latency is hidden.
template <int NR>
inline void block(const float* const* w, const float* x, std::int64_t x_stride, std::int64_t k,
                  float (&out)[kNW][kNR]) {
  vf acc[kNW][kU][NR];
  for (int j = 0; j < kNW; ++j)
    for (int u = 0; u < kU; ++u)
      for (int r = 0; r < NR; ++r) acc[j][u][r] = vf{};
  std::int64_t i = 0;
  for (; i + kLanes * kU <= k; i += kLanes * kU) {
    for (int u = 0; u < kU; ++u) {
      vf wv[kNW];
      for (int j = 0; j < kNW; ++j) wv[j] = load(w[j] + i + u * kLanes);
      for (int r = 0; r < NR; ++r) {
        const vf xv = load(x + r * x_stride + i + u * kLanes);
        for (int j = 0; j < kNW; ++j) acc[j][u][r] = acc[j][u][r] + wv[j] * xv;
      }
    }
  }
  for (; i + kLanes <= k; i += kLanes) {
    for (int j = 0; j < kNW; ++j) {
      const vf wv = load(w[j] + i);
      for (int r = 0; r < NR; ++r) acc[j][0][r] = acc[j][0][r] + wv * load(x + r * x_stride + i);
    }
  }
  for (int j = 0; j < kNW; ++j)
    for (int r = 0; r < NR; ++r) {
      vf v = acc[j][0][r];
      for (int u = 1; u < kU; ++u) v = v + acc[j][u][r];
      float s = hsum(v);
      const float* xr = x + r * x_stride;
      for (std::int64_t t = i; t < k; ++t) s += w[j][t] * xr[t];
      out[j][r] = s;
    }
}

}  // namespace

void linear_rows(const LinearArgs& a, std::int64_t lo, std::int64_t hi) {
  float out[kNW][kNR];
  for (std::int64_t j0 = lo; j0 < hi; j0 += kNW) {
    // The last block may be short: its missing rows repeat row hi-1 (read from L1,
    // results dropped) so the kernel keeps one shape.
    const float* w[kNW];
    const std::int64_t valid = hi - j0 < kNW ? hi - j0 : kNW;
    for (int j = 0; j < kNW; ++j) w[j] = a.weight + (j0 + (j < valid ? j : valid - 1)) * a.w_stride;
    for (std::int64_t r0 = 0; r0 < a.rows; r0 += kNR) {
      const float* x = a.x + r0 * a.x_stride;
      const std::int64_t nr = a.rows - r0 < kNR ? a.rows - r0 : kNR;
      switch (nr) {
        case 1: block<1>(w, x, a.x_stride, a.k, out); break;
        case 2: block<2>(w, x, a.x_stride, a.k, out); break;
        case 3: block<3>(w, x, a.x_stride, a.k, out); break;
        default: block<kNR>(w, x, a.x_stride, a.k, out); break;
      }
      for (std::int64_t r = 0; r < nr; ++r) {
        float* y = a.y + (r0 + r) * a.y_stride + j0;
        for (std::int64_t j = 0; j < valid; ++j)
          y[j] = a.bias ? out[j][r] + a.bias[j0 + j] : out[j][r];
      }
    }
  }
}

}  // namespace comlrl::cpu::COMLRL_ISA
