// One decode step of a Llama-family causal LM on CPU float32, for R rows in one call.
//
// Why: a decode step of a small model (the built-in stories260k: dim 64, 5 layers) is
// ~0.5 MFLOP per row, but run from Python it is ~165 tensor ops of ~9 us of dispatch
// each (~1.4 ms). Here the same maths runs as plain loops over the borrowed weights and
// KV cache: embedding, then per layer RMSNorm, q/k/v projections (+ optional biases),
// rotary embedding, cache append, grouped-query attention over the row's prompt (its
// padding masked by an additive bias) and completion slots, o projection and residual,
// RMSNorm, SwiGLU MLP and residual; final RMSNorm and LM head.
//
// Maths (Touvron et al. 2023; Qwen2 technical report 2024), per layer and row:
//   x = n1(h); q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv
//   q, k = rope(q), rope(k) with rope(x)_i = x_i cos_i + x_{(i + D/2) mod D} sin'_i
//     (sin' = sin with rotate_half's sign folded in, given by the caller)
//   a_h = softmax(scaling * q_h K_kv(h)^T + bias) V_kv(h),  kv(h) = h / (Hq / Hkv)
//   h += a Wo^T (+ bo);  x = n2(h);  h += (silu(x Wg^T) * (x Wu^T)) Wd^T
//   n(x) = w * x / sqrt(mean(x^2) + eps);  logits = n_f(h) W_head^T
// Summation orders differ from torch's (dots as interleaved partial sums, see
// cpu_linear.cpp), exp is a polynomial (Cephes-style, ~2 ulp), so results equal the
// Python step to float32 rounding, not bit for bit.
//
// Compiled once per instruction set, like cpu_linear.cpp (COMLRL_ISA = isa_base or
// isa_avx2); the linears go to that instruction set's few-row GEMV.
// Threads: single-threaded unless a linear has >= 2M weight elements per thread or the
// attention >= 1M multiply-adds per thread (std::thread start-up is ~50 us here).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu_decode.h"
#include "cpu_linear.h"

#ifndef COMLRL_ISA
#error "compile cpu_decode.cpp with -DCOMLRL_ISA=isa_base or isa_avx2"
#endif

namespace comlrl::cpu::COMLRL_ISA {
namespace {

using i64 = std::int64_t;

constexpr i64 kLinearWorkPerThread = i64{1} << 21;     // weight elements
constexpr i64 kAttentionWorkPerThread = i64{1} << 20;  // multiply-adds

template <typename F>
void parallel_for(i64 n, i64 work_per_item, i64 min_work, int num_threads, F&& fn) {
  const i64 useful = std::max<i64>(1, n * work_per_item / min_work);
  const i64 nt = std::min<i64>({std::max(num_threads, 1), n, useful});
  if (nt <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(nt - 1);
  const i64 per = (n + nt - 1) / nt;
  for (i64 t = 1; t < nt; ++t) {
    const i64 lo = t * per, hi = std::min(n, lo + per);
    if (lo >= hi) break;
    pool.emplace_back([&fn, lo, hi] { fn(lo, hi); });
  }
  fn(0, std::min(n, per));
  for (auto& th : pool) th.join();
}

// exp(x) for the softmax and SiLU, vectorizable (no libm call): n = round(x log2 e),
// r = x - n ln 2 (two-part ln 2), exp(r) by Cephes' degree-6 polynomial (relative error
// ~1e-7), scaled by 2^n through the exponent bits. Exactly 0 below -87 (so exp(-inf) = 0
// for masked positions), clamped at 88 above; NaN stays NaN.
inline float exp_poly(float x) {
  const float xc = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (xc * 1.44269504088896341f + magic) - magic;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float out = y * scale;
  return x < -87.f ? 0.f : (x == x ? out : x);
}

void rms_norm(const float* x, const float* w, float eps, float* y, i64 rows, i64 h) {
  for (i64 r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    float* yr = y + r * h;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (i64 i = 0; i < h; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(h) + eps);
#pragma omp simd
    for (i64 i = 0; i < h; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

#if defined(__GNUC__)
typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// NR rows of y, columns [j, j + 16), from the transposed weight: acc[r] += x[r, i] *
// wt[i, j:j+16] for i in order (one FMA chain per output, no horizontal sums).
template <int NR>
void tile_t(const DecodeLinear& l, const float* x, float* y, i64 y_stride, i64 j) {
  v8 acc[NR][2];
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = v8{};
  const i64 k = l.k, np = l.n_pad;
  const float* w = l.wt + j;
  for (i64 i = 0; i < k; ++i, w += np) {
    const v8 w0 = load8(w), w1 = load8(w + 8);
    for (int r = 0; r < NR; ++r) {
      const float xv = x[r * k + i];
      acc[r][0] += xv * w0;
      acc[r][1] += xv * w1;
    }
  }
  const i64 valid = std::min<i64>(kTransposedTile, l.n - j);
  const v8 b0 = l.bias && valid == kTransposedTile ? load8(l.bias + j) : v8{};
  const v8 b1 = l.bias && valid == kTransposedTile ? load8(l.bias + j + 8) : v8{};
  for (int r = 0; r < NR; ++r) {
    float* yr = y + r * y_stride + j;
    if (valid == kTransposedTile) {  // whole tile: two vector stores (fixed-size memcpy)
      const v8 y0 = acc[r][0] + b0, y1 = acc[r][1] + b1;
      std::memcpy(yr, &y0, sizeof y0);
      std::memcpy(yr + 8, &y1, sizeof y1);
      continue;
    }
    float out[kTransposedTile];
    std::memcpy(out, &acc[r][0], sizeof acc[r][0]);
    std::memcpy(out + 8, &acc[r][1], sizeof acc[r][1]);
    for (i64 c = 0; c < valid; ++c) yr[c] = l.bias ? out[c] + l.bias[j + c] : out[c];
  }
}

void linear_t(const DecodeLinear& l, const float* x, i64 rows, float* y, i64 y_stride) {
  for (i64 r0 = 0; r0 < rows; r0 += 4) {
    const float* xr = x + r0 * l.k;
    float* yr = y + r0 * y_stride;
    const i64 nr = std::min<i64>(4, rows - r0);
    for (i64 j = 0; j < l.n; j += kTransposedTile) {
      switch (nr) {
        case 1: tile_t<1>(l, xr, yr, y_stride, j); break;
        case 2: tile_t<2>(l, xr, yr, y_stride, j); break;
        case 3: tile_t<3>(l, xr, yr, y_stride, j); break;
        default: tile_t<4>(l, xr, yr, y_stride, j); break;
      }
    }
  }
}
#endif

// x [rows, k] (row stride k) -> y [rows, n] (row stride y_stride).
void linear(const DecodeLinear& l, const float* x, i64 rows, float* y, i64 y_stride,
            int num_threads) {
#if defined(__GNUC__)
  if (l.wt != nullptr) return linear_t(l, x, rows, y, y_stride);
#endif
  const LinearArgs args{x, l.k, l.weight, l.w_stride, l.bias, y, y_stride, rows, l.k};
  parallel_for(l.n, l.k, kLinearWorkPerThread, num_threads,
               [&](i64 lo, i64 hi) { linear_rows(args, lo, hi); });
}

// x [rows, heads, D] in place: x_i cos_i + x_{(i + D/2) mod D} sin_i, with row r's
// cos/sin at cos + r * row_stride.
void rope(float* x, i64 rows, i64 heads, i64 d, const float* cos, const float* sin,
          i64 row_stride) {
  const i64 half = d / 2;
  for (i64 r = 0; r < rows; ++r) {
    const float* c = cos + r * row_stride;
    const float* s = sin + r * row_stride;
    for (i64 hh = 0; hh < heads; ++hh) {
      float* v = x + (r * heads + hh) * d;
#pragma omp simd
      for (i64 i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] + b * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}

// o = inv * (sum_s w[s] pv[s] + sum_t wn[t] vc[t]) over rows of d floats (the zero
// weights of masked padding included, as in the Python step's matmul). For d a multiple
// of 8 known at compile time (GCC/Clang) the accumulators are vector registers, with
// several positions in flight when d is small so the adds do not wait on each other;
// otherwise plain loops.
#if defined(__GNUC__)
// acc[u] += w[s] * rows[s] for s = u mod kU: kU positions in flight, kC vectors per row.
template <int kU, int kC>
void accumulate_rows(const float* w, const float* rows, i64 n, v8 (&acc)[kU][kC]) {
  constexpr int DD = 8 * kC;
  i64 s = 0;
  for (; s + kU <= n; s += kU)
    for (int u = 0; u < kU; ++u)
      for (int c = 0; c < kC; ++c) acc[u][c] += w[s + u] * load8(rows + (s + u) * DD + 8 * c);
  for (; s < n; ++s)
    for (int c = 0; c < kC; ++c) acc[0][c] += w[s] * load8(rows + s * DD + 8 * c);
}
#endif

template <int DD>
void weighted_values(const float* w, const float* pv, i64 s_len, const float* wn,
                     const float* vc, i64 n_new, i64 d, float inv, float* o) {
#if defined(__GNUC__)
  if constexpr (DD > 0 && DD % 8 == 0) {
    constexpr int kC = DD / 8, kU = DD > 32 ? 1 : 32 / DD;
    v8 acc[kU][kC];
    for (int u = 0; u < kU; ++u)
      for (int c = 0; c < kC; ++c) acc[u][c] = v8{};
    accumulate_rows(w, pv, s_len, acc);
    accumulate_rows(wn, vc, n_new, acc);
    for (int c = 0; c < kC; ++c) {
      v8 y = acc[0][c];
      for (int u = 1; u < kU; ++u) y += acc[u][c];
      y *= inv;
      std::memcpy(o + 8 * c, &y, sizeof y);
    }
    return;
  }
#endif
  for (i64 e = 0; e < d; ++e) o[e] = 0.f;
  for (i64 s = 0; s < s_len; ++s) {
    const float* row = pv + s * d;
    for (i64 e = 0; e < d; ++e) o[e] += w[s] * row[e];
  }
  for (i64 t = 0; t < n_new; ++t) {
    const float* row = vc + t * d;
    for (i64 e = 0; e < d; ++e) o[e] += wn[t] * row[e];
  }
  for (i64 e = 0; e < d; ++e) o[e] *= inv;
}

#if defined(__GNUC__)
// out[h][s] = scaling * sum_e q[h][e] * keys[e * stride + s] (+ bias[s]) for NH query heads
// that share these keys (transposed, [d, positions]) and positions s in [0, n). The keys
// are read once, row e after row e (for the prompt's keys stride == n: one contiguous
// block, which the hardware prefetcher streams), and each row is added into out[h][0, n)
// (in L1: NH * n floats). The previous order (blocks of 32 positions x all d rows, so 64
// rows 1240 bytes apart per block) waited on memory: in a 4-row SmolLM2-135M step (prompts
// of 310 tokens, 28.6 MB of prompt keys per step) these scores took 5.4-6.1 ms (~5 GB/s),
// now 2.7-3.3 ms (phase timers, machine at load 2-5). The sum over e is in order, as in
// the plain loop below.
template <int NH>
void score_rows(const float* const* q, const float* keys, i64 stride, i64 n, i64 d, float scaling,
                const float* bias, float* const* out) {
  const i64 nv = n - n % 8;
  for (int h = 0; h < NH; ++h) std::memset(out[h], 0, static_cast<size_t>(n) * sizeof(float));
  for (i64 e = 0; e < d; ++e) {
    const float* kr = keys + e * stride;
    float qv[NH];
    for (int h = 0; h < NH; ++h) qv[h] = q[h][e];
    for (i64 s = 0; s < nv; s += 8) {
      const v8 kv = load8(kr + s);
      for (int h = 0; h < NH; ++h) {
        const v8 y = load8(out[h] + s) + qv[h] * kv;
        std::memcpy(out[h] + s, &y, sizeof y);
      }
    }
    for (i64 s = nv; s < n; ++s)
      for (int h = 0; h < NH; ++h) out[h][s] += qv[h] * kr[s];
  }
  for (int h = 0; h < NH; ++h)
    for (i64 s = 0; s < n; ++s) out[h][s] = out[h][s] * scaling + (bias != nullptr ? bias[s] : 0.f);
}
#endif

// Scores of `nh` query heads (q[h] each d floats) over n positions of transposed keys.
void scores_any(int nh, const float* const* q, const float* keys, i64 stride, i64 n, i64 d,
                float scaling, const float* bias, float* const* out) {
#if defined(__GNUC__)
  switch (nh) {
    case 1: return score_rows<1>(q, keys, stride, n, d, scaling, bias, out);
    case 2: return score_rows<2>(q, keys, stride, n, d, scaling, bias, out);
    case 3: return score_rows<3>(q, keys, stride, n, d, scaling, bias, out);
    default: return score_rows<4>(q, keys, stride, n, d, scaling, bias, out);
  }
#else
  for (int h = 0; h < nh; ++h)
    for (i64 s = 0; s < n; ++s) {
      float a = 0.f;
      for (i64 e = 0; e < d; ++e) a += q[h][e] * keys[e * stride + s];
      out[h][s] = a * scaling + (bias != nullptr ? bias[s] : 0.f);
    }
#endif
}

// Attention of row r's query heads of kv head kh over the prompt and slots [0, slot].
// DD > 0: the head dimension as a compile-time constant (the common sizes, so the loops
// over it unroll into whole vectors); DD = 0: any head dimension. `sc` holds
// kScoreHeads * (prefix + steps) floats.
template <int DD>
void attend(const DecodeModel& m, const DecodeLayer& l, const float* q, float* out, i64 r,
            i64 kh, i64 slot, float* sc) {
  const i64 g = m.group, s_len = m.prefix, t_cap = m.steps;
  const i64 d = DD > 0 ? DD : m.head_dim;
  const i64 rep = m.heads / m.kv_heads;
  const i64 p = r / g, gi = r % g;
  const float* pk = l.prefix_keys + (p * m.kv_heads + kh) * d * s_len;
  const float* pv = l.prefix_values + (p * m.kv_heads + kh) * s_len * d;
  const float* kc = l.keys + ((p * m.kv_heads + kh) * g + gi) * d * t_cap;
  const float* vc = l.values + ((p * m.kv_heads + kh) * g + gi) * t_cap * d;
  const float* bias = m.prefix_bias + p * s_len;
  const i64 n_new = slot + 1, n = s_len + n_new;
  const i64 sc_stride = s_len + t_cap;
  // The query heads of this kv head, kScoreHeads at a time: their scores over the shared
  // keys in one pass, then each head's softmax and weighted sum of values.
  for (i64 j0 = 0; j0 < rep; j0 += kScoreHeads) {
    const int nh = static_cast<int>(std::min<i64>(kScoreHeads, rep - j0));
    const float* qh[kScoreHeads];
    float* so[kScoreHeads];
    float* sn[kScoreHeads];
    for (int h = 0; h < nh; ++h) {
      qh[h] = q + (r * m.heads + kh * rep + j0 + h) * d;
      so[h] = sc + h * sc_stride;
      sn[h] = so[h] + s_len;
    }
    scores_any(nh, qh, pk, s_len, s_len, d, m.scaling, bias, so);
    scores_any(nh, qh, kc, t_cap, n_new, d, m.scaling, nullptr, sn);
    for (int h = 0; h < nh; ++h) {
      float* row = so[h];
      float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
      for (i64 i = 0; i < n; ++i) mx = row[i] > mx ? row[i] : mx;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (i64 i = 0; i < n; ++i) {
        const float e = exp_poly(row[i] - mx);
        row[i] = e;
        sum += e;
      }
      const float inv = 1.f / sum;
      float* o = out + (r * m.heads + kh * rep + j0 + h) * d;
      weighted_values<DD>(row, pv, s_len, sn[h], vc, n_new, d, inv, o);
    }
  }
}

using AttendFn = void (*)(const DecodeModel&, const DecodeLayer&, const float*, float*, i64, i64,
                          i64, float*);

AttendFn attend_for(i64 head_dim) {
  switch (head_dim) {
    case 8: return attend<8>;
    case 16: return attend<16>;
    case 32: return attend<32>;
    case 64: return attend<64>;
    case 128: return attend<128>;
    default: return attend<0>;
  }
}

}  // namespace

void decode_step(const DecodeModel& m, const std::int64_t* tokens, std::int64_t slot,
                 float* logits, std::int64_t logits_stride, float* work, int num_threads) {
  const i64 rows = m.prompts * m.group, hd = m.hidden, d = m.head_dim;
  const i64 qd = m.heads * d, kvd = m.kv_heads * d;
  if (slot < 0 || slot >= m.steps || slot >= m.rope_steps)
    throw std::invalid_argument("decode_step: slot " + std::to_string(slot) +
                                " is outside the " + std::to_string(std::min(m.steps, m.rope_steps)) +
                                " completion slots given to start");
  for (i64 r = 0; r < rows; ++r)
    if (tokens[r] < 0 || tokens[r] >= m.vocab)
      throw std::invalid_argument("decode_step: tokens[" + std::to_string(r) + "] = " +
                                  std::to_string(tokens[r]) + " is outside [0, " +
                                  std::to_string(m.vocab) + ")");
  i64 inter = 0;
  for (const auto& l : m.layers) inter = std::max(inter, l.gate.n);
  float* h = work;
  float* x = h + rows * hd;
  float* q = x + rows * hd;
  float* kb = q + rows * qd;
  float* vb = kb + rows * kvd;
  float* att = vb + rows * kvd;
  float* gb = att + rows * qd;
  float* ub = gb + rows * inter;
  float* sc = ub + rows * inter;
  for (i64 r = 0; r < rows; ++r)
    std::memcpy(h + r * hd, m.embed + tokens[r] * m.embed_stride,
                static_cast<size_t>(hd) * sizeof(float));
  const float* cos = m.cos + slot * d;
  const float* sin = m.sin + slot * d;
  const i64 rope_stride = m.rope_steps * d;
  const i64 n_pos = m.prefix + slot + 1;
  const i64 attn_work = (m.heads / m.kv_heads) * n_pos * d * 2;
  const AttendFn attend_fn = attend_for(d);
  for (const DecodeLayer& l : m.layers) {
    rms_norm(h, l.norm1, l.eps1, x, rows, hd);
    linear(l.q, x, rows, q, qd, num_threads);
    linear(l.k, x, rows, kb, kvd, num_threads);
    linear(l.v, x, rows, vb, kvd, num_threads);
    rope(q, rows, m.heads, d, cos, sin, rope_stride);
    rope(kb, rows, m.kv_heads, d, cos, sin, rope_stride);
    for (i64 r = 0; r < rows; ++r) {  // append this step's keys/values at `slot`
      const i64 p = r / m.group, gi = r % m.group;
      for (i64 kh = 0; kh < m.kv_heads; ++kh) {
        const i64 base = ((p * m.kv_heads + kh) * m.group + gi) * d * m.steps;
        const float* kr = kb + (r * m.kv_heads + kh) * d;
        for (i64 e = 0; e < d; ++e) l.keys[base + e * m.steps + slot] = kr[e];
        std::memcpy(l.values + base + slot * d, vb + (r * m.kv_heads + kh) * d,
                    static_cast<size_t>(d) * sizeof(float));
      }
    }
    const i64 tasks = rows * m.kv_heads;
    parallel_for(tasks, attn_work, kAttentionWorkPerThread, num_threads, [&](i64 lo, i64 hi) {
      std::vector<float> own;
      float* scores = sc;
      if (lo != 0) {  // another thread: its own scores buffer
        own.resize(static_cast<size_t>(kScoreHeads * (m.prefix + m.steps)));
        scores = own.data();
      }
      for (i64 t = lo; t < hi; ++t)
        attend_fn(m, l, q, att, t / m.kv_heads, t % m.kv_heads, slot, scores);
    });
    linear(l.o, att, rows, x, hd, num_threads);
    for (i64 i = 0; i < rows * hd; ++i) h[i] += x[i];
    rms_norm(h, l.norm2, l.eps2, x, rows, hd);
    const i64 ni = l.gate.n;
    linear(l.gate, x, rows, gb, ni, num_threads);
    linear(l.up, x, rows, ub, ni, num_threads);
#pragma omp simd
    for (i64 i = 0; i < rows * ni; ++i) gb[i] = gb[i] / (1.f + exp_poly(-gb[i])) * ub[i];
    linear(l.down, gb, rows, x, hd, num_threads);
    for (i64 i = 0; i < rows * hd; ++i) h[i] += x[i];
  }
  rms_norm(h, m.final_norm, m.final_eps, x, rows, hd);
  linear(m.head, x, rows, logits, logits_stride, num_threads);
}

}  // namespace comlrl::cpu::COMLRL_ISA
