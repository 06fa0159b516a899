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
// Exponentials are float32 (one per vocabulary entry, shared by the log-sum-exp, the
// top-p masses and the CDF); sums are in double. Tokens therefore equal the Python
// path's except where u * total lies within float32 rounding of a CDF boundary.
#include "cpu_sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace comlrl::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Scratch {
  std::vector<float> s;     // tempered scores, then -inf where filtered
  std::vector<float> e;     // exp(s - max) before filtering
  std::vector<float> tmp;   // top-k selection
  std::vector<std::int32_t> order;
};

// Draw one row; returns the token and writes its full-softmax log-prob.
std::int64_t sample_row(const SampleArgs& a, std::int64_t row, Scratch& w, float* logp) {
  const std::int64_t v = a.vocab;
  const float* x = a.logits + row * a.row_stride;
  float* s = w.s.data();
  float* e = w.e.data();
  if (a.temperature == 1.0f) {
    std::copy(x, x + v, s);
  } else {
    for (std::int64_t i = 0; i < v; ++i) s[i] = x[i] / a.temperature;
  }
  float m = kNegInf;
  for (std::int64_t i = 0; i < v; ++i) m = std::max(m, s[i]);
  double z_full = 0.0;
  for (std::int64_t i = 0; i < v; ++i) {
    e[i] = std::exp(s[i] - m);
    z_full += e[i];
  }
  const double log_z = std::log(z_full);

  // top-k: threshold at the k-th largest score; ties with it are kept.
  if (a.top_k > 0 && a.top_k < v) {
    w.tmp.assign(s, s + v);
    std::nth_element(w.tmp.begin(), w.tmp.begin() + (a.top_k - 1), w.tmp.end(),
                     std::greater<float>());
    const float kth = w.tmp[a.top_k - 1];
    for (std::int64_t i = 0; i < v; ++i)
      if (s[i] < kth) s[i] = kNegInf;
  }

  // top-p over the kept tokens, walked in (score desc, index asc) order. Only a prefix
  // of that order is needed: sort the best n, grow n until the kept mass reaches top_p.
  if (a.top_p < 1.0f) {
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
      std::partial_sort(w.order.begin(), w.order.begin() + n, w.order.end(), before);
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
    for (std::int64_t j = keep; j < n_kept; ++j) s[w.order[j]] = kNegInf;
  }

  // Inverse CDF over the kept mass.
  double total = 0.0;
  for (std::int64_t i = 0; i < v; ++i)
    if (s[i] != kNegInf) total += e[i];
  const double target = static_cast<double>(a.uniforms[row]) * total;
  double cum = 0.0;
  std::int64_t token = v - 1;
  for (std::int64_t i = 0; i < v; ++i) {
    if (s[i] == kNegInf) continue;
    cum += e[i];
    if (cum > target) {
      token = i;
      break;
    }
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
