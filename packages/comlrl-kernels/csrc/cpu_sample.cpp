// The per-token sampling step of comlrl.algos' NativeSampler as one call (CPU, float32).
//
// Per row (the semantics of comlrl.algos.rollout.sampling.native.filtered_scores and
// sample_next, which remain the Python path and the spec):
//   s = logits / T (skipped at T == 1, as in Python);
//   top-k: drop s_i < (k-th largest s) -- ties with the k-th value are kept;
//   top-p: over the kept tokens sorted by score (descending, then by index), drop a token
//          when the renormalised mass strictly before it already reaches top_p;
//   draw: the first token whose cumulative kept mass exceeds u * (total kept mass), i.e.
//          torch.searchsorted(cdf, u * cdf[-1], right=True), clamped to V - 1;
//   logp: log_softmax(s) at the drawn token over the *full* vocabulary (not renormalised
//          by the filters: the policy the update recomputes).
//   Rows done before the step get `pad` (their drawn log-prob is still written, as in
//   Python); a row whose written token is an EOS id becomes done.
// Exponentials are float32 (a vectorizing polynomial, one per vocabulary entry, shared
// by the log-sum-exp, the top-p masses and the CDF); sums are float32 within blocks of
// 256 entries and double across them, the top-p masses and the CDF scan double. Tokens
// therefore equal the Python path's except where u * total lies within float32 rounding
// of a CDF boundary (measured: 1 draw in 7680 of the default run at batch size 1).
#include "cpu_sample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace comlrl::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Below this exponent exp(x) is taken as 0 (exp(-87) ~ 1.6e-38, the smallest normal).
constexpr float kExpFloor = -87.0f;

// exp(x) for x <= 0 (0 below kExpFloor): Cephes-style range reduction and a degree-6
// polynomial, ~2 ulp, branch-free so the loops over the vocabulary vectorize (glibc's
// expf does not; it was ~70% of the step at V = 49152). The same polynomial as
// fast_exp_nonpos in cpu_rows.cpp, which is compiled per instruction set and so is not
// shared through a header (one inline definition per ISA would break the ODR).
inline float exp_nonpos(float x) {
  const bool under = !(x >= kExpFloor);  // also catches -inf (NaN input propagates below)
  const float xc = under ? kExpFloor : x;
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: round-to-nearest trick
  const float n = (xc * 1.44269504088896341f + kMagic) - kMagic;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const std::uint32_t bits = std::uint32_t(std::int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return (under && x == x) ? 0.0f : y * scale;
}

// Sums run in float32 over blocks of kBlock entries (vectorized) and in double across
// blocks; the draw finds its block from the block sums, then scans inside it.
constexpr std::int64_t kBlock = 256;

struct Scratch {
  std::vector<float> s;     // tempered scores, then -inf where filtered
  std::vector<float> e;     // exp(s - max), then 0 where filtered
  std::vector<float> tmp;   // top-k selection
  std::vector<std::int32_t> order;
  std::vector<float> block;  // per-block sums of e
};

// Fills w.block with the per-block sums of e[0, v); returns their total.
double block_sums(const float* e, std::int64_t v, std::vector<float>& block) {
  block.clear();
  double total = 0.0;
  for (std::int64_t lo = 0; lo < v; lo += kBlock) {
    const std::int64_t hi = std::min(v, lo + kBlock);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t i = lo; i < hi; ++i) sum += e[i];
    block.push_back(sum);
    total += sum;
  }
  return total;
}

// Draw one row; returns the token and writes its full-softmax log-prob.
std::int64_t sample_row(const SampleArgs& a, std::int64_t row, Scratch& w, float* logp) {
  const std::int64_t v = a.vocab;
  const float* x = a.logits + row * a.row_stride;
  float* s = w.s.data();
  float* e = w.e.data();
  if (a.temperature == 1.0f) {
    std::copy(x, x + v, s);
  } else {
    const float t = a.temperature;
#pragma omp simd
    for (std::int64_t i = 0; i < v; ++i) s[i] = x[i] / t;
  }
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (std::int64_t i = 0; i < v; ++i) m = std::max(m, s[i]);
#pragma omp simd
  for (std::int64_t i = 0; i < v; ++i) e[i] = exp_nonpos(s[i] - m);
  const double z_full = block_sums(e, v, w.block);
  bool filtered = false;
  const double log_z = std::log(z_full);

  // top-k: threshold at the k-th largest score; ties with it are kept.
  if (a.top_k > 0 && a.top_k < v) {
    w.tmp.assign(s, s + v);
    std::nth_element(w.tmp.begin(), w.tmp.begin() + (a.top_k - 1), w.tmp.end(),
                     std::greater<float>());
    const float kth = w.tmp[a.top_k - 1];
    filtered = true;
    for (std::int64_t i = 0; i < v; ++i) {
      if (s[i] < kth) {
        s[i] = kNegInf;
        e[i] = 0.0f;
      }
    }
  }

  // top-p over the kept tokens, walked in (score desc, index asc) order. Only a prefix
  // of that order is needed: sort the best n, grow n until the kept mass reaches top_p.
  if (a.top_p < 1.0f) {
    filtered = true;
    w.order.clear();
    double z_kept = 0.0;
    for (std::int64_t i = 0; i < v; ++i) {
      if (s[i] != kNegInf) {
        w.order.push_back(static_cast<std::int32_t>(i));
        z_kept += e[i];
      }
    }
    auto before = [s](std::int32_t i, std::int32_t j) {
      return s[i] > s[j] || (s[i] == s[j] && i < j);
    };
    const auto n_kept = static_cast<std::int64_t>(w.order.size());
    std::int64_t n = std::min<std::int64_t>(64, n_kept);
    std::int64_t keep = n_kept;  // tokens [0, keep) of the order survive
    for (;;) {
      std::nth_element(w.order.begin(), w.order.begin() + (n - 1), w.order.end(), before);
      std::sort(w.order.begin(), w.order.begin() + n, before);
      double mass = 0.0;
      std::int64_t j = 0;
      for (; j < n; ++j) {
        if (mass >= a.top_p) break;
        mass += e[w.order[j]] / z_kept;
      }
      if (j < n || n == n_kept) {
        keep = j;
        break;
      }
      n = std::min<std::int64_t>(2 * n, n_kept);
    }
    for (std::int64_t j = keep; j < n_kept; ++j) {
      s[w.order[j]] = kNegInf;
      e[w.order[j]] = 0.0f;
    }
  }

  // Inverse CDF over the kept mass (filtered tokens have e = 0, so they are never drawn).
  const double total = filtered ? block_sums(e, v, w.block) : z_full;
  const double target = static_cast<double>(a.uniforms[row]) * total;
  double cum = 0.0;
  std::int64_t lo = 0;
  for (std::size_t b = 0; b + 1 < w.block.size() && cum + w.block[b] <= target; ++b) {
    cum += w.block[b];
    lo += kBlock;
  }
  std::int64_t token = -1;
  for (std::int64_t i = lo; i < v; ++i) {
    cum += e[i];
    if (cum > target) {
      token = i;
      break;
    }
  }
  if (token < 0) {  // u ~ 1 and the two summation orders of the total differ in the last bit
    token = v - 1;
    while (token > 0 && !(e[token] > 0.0f)) --token;
  }
  const float st = a.temperature == 1.0f ? x[token] : x[token] / a.temperature;
  *logp = static_cast<float>(static_cast<double>(st) - m - log_z);
  return token;
}

}  // namespace

bool sample_rows(const SampleArgs& a) {
  Scratch w;
  w.s.resize(static_cast<std::size_t>(a.vocab));
  w.e.resize(static_cast<std::size_t>(a.vocab));
  bool all_done = true;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    std::int64_t token = sample_row(a, r, w, a.logp + r);
    if (a.done[r]) token = a.pad;
    a.tokens[r] = token;
    bool is_eos = false;
    for (std::int64_t k = 0; k < a.n_eos; ++k) is_eos = is_eos || a.eos[k] == token;
    a.done[r] = a.done[r] || is_eos;
    all_done = all_done && a.done[r];
  }
  return all_done;
}

}  // namespace comlrl::cpu
