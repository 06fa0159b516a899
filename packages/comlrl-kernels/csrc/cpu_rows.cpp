// Row kernels of the CPU backend: the only code compiled per instruction set.
//
// This file is compiled twice (see CMakeLists.txt): with COMLRL_ISA=isa_base for the
// baseline target, and with COMLRL_ISA=isa_avx2 plus -mavx2 -mfma -mf16c; cpu_kernels.cpp
// picks one at run time. Everything except the two entry points has internal linkage
// and no standard-library templates are used, so no AVX2 code can leak into the baseline
// path through the linker merging inline functions.
//
// Each row of logits is streamed once in blocks of kBlock elements: the block is converted
// to fp32 (times 1/temperature) into a stack buffer, its max is found, and its exp-sum is
// merged into the running (max, sum) of the row: a blocked online log-sum-exp. Reductions
// use `#pragma omp simd` (built with -fopenmp-simd: no OpenMP runtime) so they vectorize
// without -ffast-math, which would break inf/NaN semantics; exp() is a branch-free
// polynomial that vectorizes (fast_exp_nonpos).
#include <math.h>

#include <cstdint>
#include <cstring>

#include "common.h"
#include "cpu_rows.h"

#ifndef COMLRL_ISA
#error "compile cpu_rows.cpp with -DCOMLRL_ISA=isa_base or isa_avx2"
#endif

namespace comlrl::cpu::COMLRL_ISA {
namespace {

constexpr std::int64_t kBlock = 2048;
constexpr float kNegInf = -__builtin_huge_valf();
// Below this exponent exp(x) is treated as 0 (exp(-87) ~ 1.6e-38, the smallest normal).
constexpr float kExpFloor = -87.0f;

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// ---- dtype conversion -------------------------------------------------------------
inline float bf16_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t(h) << 16); }

inline std::uint16_t float_to_bf16(float f) {  // round to nearest even
  std::uint32_t u = float_to_bits(f);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return std::uint16_t(f != f ? 0x7FC0u : rounded);  // branch-free so loops vectorize
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t shifted_exp = 0x7C00u << 13;
  std::uint32_t o = (std::uint32_t(h) & 0x7FFFu) << 13;
  const std::uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  float f;
  if (exp == shifted_exp) {  // inf / nan
    o += (128u - 16u) << 23;
    f = bits_to_float(o);
  } else if (exp == 0) {  // zero / subnormal
    o += 1u << 23;
    f = bits_to_float(o) - bits_to_float(113u << 23);
  } else {
    f = bits_to_float(o);
  }
  return bits_to_float(float_to_bits(f) | ((std::uint32_t(h) & 0x8000u) << 16));
}

inline std::uint16_t float_to_fp16(float value) {  // round to nearest even
  const std::uint32_t f32infty = 255u << 23;
  const std::uint32_t f16max = (127u + 16u) << 23;
  const std::uint32_t denorm_magic_u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t u = float_to_bits(value);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  std::uint16_t o;
  if (u >= f16max) {
    o = (u > f32infty) ? 0x7E00 : 0x7C00;
  } else if (u < (113u << 23)) {
    float f = bits_to_float(u) + bits_to_float(denorm_magic_u);
    o = std::uint16_t(float_to_bits(f) - denorm_magic_u);
  } else {
    const std::uint32_t mant_odd = (u >> 13) & 1u;
    u += (std::uint32_t(15 - 127) << 23) + 0xFFFu;
    u += mant_odd;
    o = std::uint16_t(u >> 13);
  }
  return std::uint16_t(o | (sign >> 16));
}

template <int D> struct Elem;
template <> struct Elem<kFloat32> {
  using T = float;
  static float load(T v) { return v; }
  static T store(float v) { return v; }
};
template <> struct Elem<kFloat16> {
  using T = std::uint16_t;
  static float load(T v) { return fp16_to_float(v); }
  static T store(float v) { return float_to_fp16(v); }
};
template <> struct Elem<kBFloat16> {
  using T = std::uint16_t;
  static float load(T v) { return bf16_to_float(v); }
  static T store(float v) { return float_to_bf16(v); }
};

// exp(x) for x <= ~0; x below kExpFloor is clamped (callers zero those lanes).
// Cephes-style range reduction + degree-6 polynomial, ~2 ulp; branch-free so it
// vectorizes. NaN propagates.
inline float fast_exp_nonpos(float x) {
  x = x < kExpFloor ? kExpFloor : x;
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: round-to-nearest trick
  float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  std::int32_t ni = std::int32_t(n);
  std::uint32_t scale = std::uint32_t(ni + 127) << 23;
  return y * bits_to_float(scale);
}

// ---- row kernels ------------------------------------------------------------------
struct RowStats {
  float lse;
  float entropy;
};

template <int D>
RowStats row_forward(const typename Elem<D>::T* row, std::int64_t vocab,
                                         float inv_t, bool want_entropy) {
  alignas(64) float buf[kBlock];
  float m = kNegInf, s = 0.0f, t = 0.0f;  // running max, sum exp(z-m), sum exp(z-m)(z-m)
  for (std::int64_t off = 0; off < vocab; off += kBlock) {
    const std::int64_t len = (vocab - off < kBlock ? vocab - off : kBlock);
    for (std::int64_t j = 0; j < len; ++j) buf[j] = Elem<D>::load(row[off + j]) * inv_t;
    // block max, then block sums relative to it (omp simd: vectorized reductions
    // without -ffast-math; needs only -fopenmp-simd, no OpenMP runtime)
    float bm = kNegInf;
#pragma omp simd reduction(max : bm)
    for (std::int64_t j = 0; j < len; ++j) bm = buf[j] > bm ? buf[j] : bm;
    if (bm == kNegInf) {  // block entirely -inf (or NaN): contributes nothing, unless NaN
      bool has_nan = false;
      for (std::int64_t j = 0; j < len; ++j) has_nan |= (buf[j] != buf[j]);
      if (has_nan) {
        const float nan = __builtin_nanf("");
        return {nan, nan};
      }
      continue;
    }
    float bs = 0.0f, bt = 0.0f;
#pragma omp simd reduction(+ : bs, bt)
    for (std::int64_t j = 0; j < len; ++j) {
      float d = buf[j] - bm;
      float dc = d < kExpFloor ? kExpFloor : d;
      const float e = fast_exp_nonpos(dc);
      float p = d < kExpFloor ? 0.0f : e;
      bs += p;
      bt += p * dc;
    }
    if (bs != bs || bm != bm) {
      const float nan = __builtin_nanf("");
      return {nan, nan};
    }
    if (m == kNegInf) {
      m = bm;
      s = bs;
      t = bt;
    } else {
      const float nm = m > bm ? m : bm;
      const float a = expf(m - nm), b = expf(bm - nm);
      t = a * (t + (m - nm) * s) + b * (bt + (bm - nm) * bs);
      s = a * s + b * bs;
      m = nm;
    }
  }
  RowStats out;
  const float log_s = logf(s);
  out.lse = m + log_s;
  out.entropy = want_entropy ? (log_s - t / s) : 0.0f;
  return out;
}

template <int D>
void row_backward(const typename Elem<D>::T* row, typename Elem<D>::T* grad,
                                      std::int64_t vocab, std::int64_t target, float inv_t,
                                      float lse, float g_lp, float g_h, float h) {
  using T = typename Elem<D>::T;
  const float x_target = Elem<D>::load(row[target]);  // read before a possible in-place write
  const float a = -g_lp * inv_t;                       // coefficient of p
  const float c = -g_h * inv_t;                        // coefficient of p * (log p + H)
  alignas(64) float buf[kBlock];
  for (std::int64_t off = 0; off < vocab; off += kBlock) {
    const std::int64_t len = (vocab - off < kBlock ? vocab - off : kBlock);
    for (std::int64_t j = 0; j < len; ++j) buf[j] = Elem<D>::load(row[off + j]);
#pragma omp simd
    for (std::int64_t j = 0; j < len; ++j) {
      float d = buf[j] * inv_t - lse;
      float dc = d < kExpFloor ? kExpFloor : d;
      const float e = fast_exp_nonpos(dc);
      float p = d < kExpFloor ? 0.0f : e;
      buf[j] = a * p + c * p * (dc + h);  // c == 0 without an entropy gradient
    }
    for (std::int64_t j = 0; j < len; ++j) grad[off + j] = Elem<D>::store(buf[j]);
  }
  // One-hot term, recomputed exactly in fp32 so the target element is rounded once.
  const float d = x_target * inv_t - lse;
  const float p = expf(d);
  T out = Elem<D>::store(g_lp * inv_t * (1.0f - p) + c * p * (d + h));
  grad[target] = out;
}

template <int D>
void forward_range(const ForwardArgs& a, std::int64_t lo, std::int64_t hi) {
  using T = typename Elem<D>::T;
  const T* base = static_cast<const T*>(a.logits);
  for (std::int64_t i = lo; i < hi; ++i) {
    const T* row = base + i * a.row_stride;
    const std::int64_t tgt = a.targets[i];
    if (tgt == a.ignore_index) {
      a.logp[i] = 0.0f;
      a.lse[i] = 0.0f;
      if (a.entropy) a.entropy[i] = 0.0f;
      continue;
    }
    RowStats st = row_forward<D>(row, a.vocab, a.inv_t, a.entropy != nullptr);
    a.lse[i] = st.lse;
    a.logp[i] = Elem<D>::load(row[tgt]) * a.inv_t - st.lse;
    if (a.entropy) a.entropy[i] = st.entropy;
  }
}

template <int D>
void backward_range(const BackwardArgs& a, std::int64_t lo, std::int64_t hi) {
  using T = typename Elem<D>::T;
  const T* base = static_cast<const T*>(a.logits);
  T* gbase = static_cast<T*>(a.grad);
  for (std::int64_t i = lo; i < hi; ++i) {
    const T* row = base + i * a.row_stride;
    T* grow = gbase + i * a.grad_row_stride;
    const std::int64_t tgt = a.targets[i];
    if (tgt == a.ignore_index) {
      const T zero = Elem<D>::store(0.0f);
      for (std::int64_t j = 0; j < a.vocab; ++j) grow[j] = zero;
      continue;
    }
    const float gh = a.g_entropy ? a.g_entropy[i] : 0.0f;
    const float h = (a.g_entropy && a.entropy) ? a.entropy[i] : 0.0f;
    row_backward<D>(row, grow, a.vocab, tgt, a.inv_t, a.lse[i], a.g_logp ? a.g_logp[i] : 0.0f,
                    gh, h);
  }
}

}  // namespace

bool forward_rows(const ForwardArgs& a, std::int64_t lo, std::int64_t hi) {
  switch (a.dtype) {
    case kFloat32: forward_range<kFloat32>(a, lo, hi); return true;
    case kFloat16: forward_range<kFloat16>(a, lo, hi); return true;
    case kBFloat16: forward_range<kBFloat16>(a, lo, hi); return true;
    default: return false;
  }
}

bool backward_rows(const BackwardArgs& a, std::int64_t lo, std::int64_t hi) {
  switch (a.dtype) {
    case kFloat32: backward_range<kFloat32>(a, lo, hi); return true;
    case kFloat16: backward_range<kFloat16>(a, lo, hi); return true;
    case kBFloat16: backward_range<kBFloat16>(a, lo, hi); return true;
    default: return false;
  }
}

}  // namespace comlrl::cpu::COMLRL_ISA
