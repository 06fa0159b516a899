// Few-row float32 linear y[r, j] = sum_i x[r, i] * W[j, i] (+ b[j]): the GEMVs of a
// decode step, where the weight is read once per call and the rows are few.
//
// Compiled once per instruction set (see CMakeLists.txt): COMLRL_ISA=isa_base (the
// compiler's baseline, SSE2 on x86-64), isa_avx2 (-mavx2 -mfma) and isa_avx512
// (-mavx512f ...); cpu_kernels.cpp picks one at run time. Everything except the entry
// point has internal linkage, so no wide code leaks into the baseline path.
//
// Why not torch's GEMM: with few rows the op is bound by reading the weight from memory,
// and MKL's small-M path on this machine streams it at 4-11 GB/s where a plain sum reads
// 26 GB/s. Here a block of kNW consecutive weight rows is read once from memory into
// registers/L1 and multiplied with a tile of up to kNR rows of x at a time, kNW x kNR
// vector accumulators in registers (AVX2: 3 x 4 of 16 ymm registers; AVX-512: 4 x 4 of 32
// zmm), so each weight byte is loaded from memory once and each x vector load feeds kNW
// FMAs. x stays in L1/L2 (rows * k * 4 bytes). Order of the sum per output: kLanes
// interleaved partial sums over i (step kLanes), added as a tree, then the scalar tail
// i >= k - k % kLanes, then the bias: a different order from BLAS, so results match
// F.linear to rounding, not bit for bit.
#include <cstdint>

#include "cpu_linear.h"

#ifndef COMLRL_ISA
#error "compile cpu_linear.cpp with -DCOMLRL_ISA=isa_base, isa_avx2 or isa_avx512"
#endif

namespace comlrl::cpu::COMLRL_ISA {
namespace {

#if defined(__GNUC__)
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kNW = 4;
constexpr int kNR = 4;
#elif defined(__AVX2__)
constexpr int kLanes = 8;
constexpr int kNW = 3;
constexpr int kNR = 4;
#else
constexpr int kLanes = 4;
constexpr int kNW = 2;
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
typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
inline float hsum4(v4 v) { return (v[0] + v[2]) + (v[1] + v[3]); }
inline float hsum(vf v) {
  if constexpr (kLanes == 16) {
    v8 lo, hi;
    __builtin_memcpy(&lo, &v, sizeof lo);
    __builtin_memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    const v8 s8 = lo + hi;
    v4 a, b;
    __builtin_memcpy(&a, &s8, sizeof a);
    __builtin_memcpy(&b, reinterpret_cast<const char*>(&s8) + sizeof a, sizeof b);
    return hsum4(a + b);
  } else if constexpr (kLanes == 8) {
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
constexpr int kNW = 2;
constexpr int kNR = 4;
typedef float vf;
inline vf load(const float* p) { return *p; }
inline float hsum(vf v) { return v; }
#endif

// out[j][r] = dot(w[j], x[r]) for kNW weight rows and NR rows of x.
template <int NR>
inline void block(const float* const* w, const float* x, std::int64_t x_stride, std::int64_t k,
                  float (&out)[kNW][kNR]) {
  vf acc[kNW][NR];
  for (int j = 0; j < kNW; ++j)
    for (int r = 0; r < NR; ++r) acc[j][r] = vf{};
  std::int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    vf wv[kNW];
    for (int j = 0; j < kNW; ++j) wv[j] = load(w[j] + i);
    for (int r = 0; r < NR; ++r) {
      const vf xv = load(x + r * x_stride + i);
      for (int j = 0; j < kNW; ++j) acc[j][r] = acc[j][r] + wv[j] * xv;
    }
  }
  for (int j = 0; j < kNW; ++j)
    for (int r = 0; r < NR; ++r) {
      float s = hsum(acc[j][r]);
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
