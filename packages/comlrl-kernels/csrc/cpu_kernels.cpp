// CPU kernels for comlrl-kernels: threading, argument checks, instruction-set dispatch
// and group advantages. See cpu_kernels.h for the contract of each entry point and
// cpu_rows.cpp for the per-row kernels.
//
// Threads: std::thread over contiguous row ranges; the count comes from the caller
// (Python passes torch.get_num_threads()), capped so each thread gets >= 256K elements.
// Instruction set: the AVX2+FMA+F16C build of the row kernels when the CPU has them
// (x86-64 builds only), else the baseline build. COMLRL_KERNELS_CPU_ISA=base forces the
// baseline (used by the tests to cover both).
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "cpu_linear.h"
#include "cpu_rows.h"

namespace comlrl::cpu {

const char* active_isa() {
#if COMLRL_HAVE_AVX2
  const char* forced = std::getenv("COMLRL_KERNELS_CPU_ISA");
  if (forced && std::strcmp(forced, "base") == 0) return "base";
  static const bool supported = __builtin_cpu_supports("avx2") &&
                                __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return supported ? "avx2" : "base";
#else
  return "base";
#endif
}

namespace {

bool use_avx2() { return std::strcmp(active_isa(), "avx2") == 0; }

// Starting a std::thread costs ~40-60 us here; give each thread >= 256K elements
// (~250 us of work for the log-prob rows) so that small calls stay on the caller.
constexpr std::int64_t kMinWorkPerThread = 1 << 18;

template <typename F>
void parallel_rows(std::int64_t n_rows, std::int64_t work_per_row, int num_threads, F&& fn,
                   std::int64_t min_work = kMinWorkPerThread) {
  std::int64_t max_useful = std::max<std::int64_t>(1, (n_rows * work_per_row) / min_work);
  std::int64_t nt = std::min<std::int64_t>({std::max(num_threads, 1), n_rows, max_useful});
  if (nt <= 1) {
    fn(0, n_rows);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(nt - 1);
  const std::int64_t per = (n_rows + nt - 1) / nt;
  for (std::int64_t t = 1; t < nt; ++t) {
    const std::int64_t lo = t * per, hi = std::min(n_rows, lo + per);
    if (lo >= hi) break;
    pool.emplace_back([&fn, lo, hi] { fn(lo, hi); });
  }
  fn(0, std::min(n_rows, per));
  for (auto& th : pool) th.join();
}

void check_targets(const std::int64_t* targets, std::int64_t n_rows, std::int64_t vocab,
                   std::int64_t ignore_index) {
  for (std::int64_t i = 0; i < n_rows; ++i) {
    const std::int64_t t = targets[i];
    if (t != ignore_index && (t < 0 || t >= vocab))
      throw std::invalid_argument("targets[" + std::to_string(i) + "] = " + std::to_string(t) +
                                  " is outside [0, " + std::to_string(vocab) +
                                  ") and is not ignore_index (" + std::to_string(ignore_index) +
                                  ")");
  }
}

std::string dtype_error(int dtype) {
  return "unsupported logits dtype code " + std::to_string(dtype) +
         " (expected 0=float32, 1=float16, 2=bfloat16)";
}

template <typename R>
std::int64_t advantages_impl(const R* r, std::int64_t m, const std::int64_t* gidx,
                             std::int64_t num_groups, std::int64_t group_size, int baseline,
                             int scale, double eps, R* out) {
  for (std::int64_t i = 0; i < m; ++i)
    if (!std::isfinite(static_cast<double>(r[i]))) return i;
  std::vector<double> count(num_groups, 0.0), sum(num_groups, 0.0),
      mx(num_groups, -std::numeric_limits<double>::infinity()), sq(num_groups, 0.0);
  auto group_of = [&](std::int64_t i) { return gidx ? gidx[i] : i / group_size; };
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int64_t g = group_of(i);
    const double v = r[i];
    count[g] += 1.0;
    sum[g] += v;
    mx[g] = std::max(mx[g], v);
  }
  for (std::int64_t g = 0; g < num_groups; ++g) sum[g] = count[g] > 0 ? sum[g] / count[g] : 0.0;
  if (scale == 1) {
    for (std::int64_t i = 0; i < m; ++i) {
      const std::int64_t g = group_of(i);
      const double d = double(r[i]) - sum[g];
      sq[g] += d * d;
    }
    for (std::int64_t g = 0; g < num_groups; ++g)
      sq[g] = count[g] > 0 ? std::sqrt(sq[g] / count[g]) : 0.0;  // population std
  }
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int64_t g = group_of(i);
    const double v = r[i], n = count[g];
    double a;
    switch (baseline) {
      case 0: a = v; break;
      case 1: a = v - sum[g]; break;
      case 2: a = n > 1.0 ? (v - sum[g]) * (n / (n - 1.0)) : 0.0; break;
      default: a = v - mx[g]; break;
    }
    if (scale == 1) a /= (sq[g] + eps);
    out[i] = static_cast<R>(a);
  }
  return kNoBadIndex;
}

}  // namespace

void token_logprobs_forward(const void* logits, int dtype, std::int64_t n_rows,
                            std::int64_t vocab, std::int64_t row_stride,
                            const std::int64_t* targets, std::int64_t ignore_index,
                            float temperature, float* logp, float* lse, float* entropy,
                            int num_threads) {
  if (dtype != kFloat32 && dtype != kFloat16 && dtype != kBFloat16)
    throw std::runtime_error(dtype_error(dtype));
  check_targets(targets, n_rows, vocab, ignore_index);
  const ForwardArgs args{logits, dtype, vocab, row_stride, targets, ignore_index,
                         1.0f / temperature, logp, lse, entropy};
  const bool avx2 = use_avx2();
  parallel_rows(n_rows, vocab, num_threads, [&](std::int64_t lo, std::int64_t hi) {
#if COMLRL_HAVE_AVX2
    if (avx2) {
      isa_avx2::forward_rows(args, lo, hi);
      return;
    }
#endif
    (void)avx2;
    isa_base::forward_rows(args, lo, hi);
  });
}

void token_logprobs_backward(const void* logits, int dtype, std::int64_t n_rows,
                             std::int64_t vocab, std::int64_t row_stride,
                             const std::int64_t* targets, std::int64_t ignore_index,
                             float temperature, const float* lse, const float* g_logp,
                             const float* g_entropy, const float* entropy, void* grad,
                             std::int64_t grad_row_stride, int num_threads) {
  if (dtype != kFloat32 && dtype != kFloat16 && dtype != kBFloat16)
    throw std::runtime_error(dtype_error(dtype));
  check_targets(targets, n_rows, vocab, ignore_index);
  const BackwardArgs args{logits, dtype, vocab, row_stride, targets, ignore_index,
                          1.0f / temperature, lse, g_logp, g_entropy, entropy, grad,
                          grad_row_stride};
  const bool avx2 = use_avx2();
  parallel_rows(n_rows, vocab, num_threads, [&](std::int64_t lo, std::int64_t hi) {
#if COMLRL_HAVE_AVX2
    if (avx2) {
      isa_avx2::backward_rows(args, lo, hi);
      return;
    }
#endif
    (void)avx2;
    isa_base::backward_rows(args, lo, hi);
  });
}

void linear_rows(const float* x, std::int64_t rows, std::int64_t k, std::int64_t x_stride,
                 const float* weight, std::int64_t n, std::int64_t w_stride, const float* bias,
                 float* y, int num_threads) {
  if (rows < 0 || k < 0 || n < 0 || x_stride < k || w_stride < k)
    throw std::invalid_argument("linear_rows: bad sizes rows=" + std::to_string(rows) +
                                " k=" + std::to_string(k) + " n=" + std::to_string(n) +
                                " x_stride=" + std::to_string(x_stride) +
                                " w_stride=" + std::to_string(w_stride));
  const LinearArgs args{x, x_stride, weight, w_stride, bias, y, n, rows, k};
  const bool avx2 = use_avx2();
  // A GEMV streams 4 bytes of weight per element at ~25 GB/s, ~160 us per 1M elements:
  // a thread gets >= 2M weight elements (8 MB) to be worth its start-up.
  parallel_rows(
      n, k, num_threads,
      [&](std::int64_t lo, std::int64_t hi) {
#if COMLRL_HAVE_AVX2
        if (avx2) return isa_avx2::linear_rows(args, lo, hi);
#endif
        (void)avx2;
        isa_base::linear_rows(args, lo, hi);
      },
      std::int64_t{1} << 21);
}

std::int64_t group_advantages(const void* rewards, int dtype, std::int64_t m,
                              const std::int64_t* group_index, std::int64_t num_groups,
                              std::int64_t group_size, int baseline, int scale, double eps,
                              void* out) {
  if (dtype == kFloat32)
    return advantages_impl(static_cast<const float*>(rewards), m, group_index, num_groups,
                           group_size, baseline, scale, eps, static_cast<float*>(out));
  if (dtype == kFloat64)
    return advantages_impl(static_cast<const double*>(rewards), m, group_index, num_groups,
                           group_size, baseline, scale, eps, static_cast<double*>(out));
  throw std::runtime_error("unsupported rewards dtype code " + std::to_string(dtype) +
                           " (expected 0=float32 or 3=float64)");
}

}  // namespace comlrl::cpu
