// CPU kernels for comlrl-kernels: threading, argument checks, instruction-set dispatch
// and group advantages. See cpu_kernels.h for the contract of each entry point and
// cpu_rows.cpp for the per-row kernels.
//
// Threads: std::thread over contiguous row ranges; the count comes from the caller
// (Python passes torch.get_num_threads()), capped so each thread gets >= 256K elements.
// Instruction set: the AVX-512 build of the few-row linear and decode step, else the
// AVX2+FMA+F16C build of the row kernels, when the CPU and OS run them (x86-64 builds
// only; cpuid + xgetbv), else the baseline build. COMLRL_KERNELS_CPU_ISA=base|avx2|avx512
// forces one (the tests cover each this machine runs); forcing one it cannot run raises.
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

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "common.h"
#include "cpu_linear.h"
#include "cpu_rows.h"

namespace comlrl::cpu {

namespace {

// What this CPU and OS can run, from cpuid and xgetbv (not the compiler's view): AVX2 needs
// cpuid's AVX2/AVX/FMA/F16C bits and the OS saving the YMM state (XCR0 bits 1-2); AVX-512
// also needs the F/DQ/BW/VL bits and the OS saving the opmask and all 32 ZMM registers
// (XCR0 bits 5-7). A CPU may report AVX-512 while the OS leaves the ZMM state off.
struct CpuIsas {
  bool avx2 = false;
  bool avx512 = false;
};

CpuIsas detect_isas() {
  CpuIsas out;
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7 || !__get_cpuid(1, &a, &b, &c, &d)) return out;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  const bool fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave || !avx) return out;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x6u) == 0x6u;
  const bool zmm_state = (xcr0_lo & 0xE6u) == 0xE6u;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5);
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));
  out.avx2 = ymm_state && avx2 && fma && f16c;
  out.avx512 = out.avx2 && zmm_state && avx512;
#endif
  return out;
}

const CpuIsas& cpu_isas() {
  static const CpuIsas isas = detect_isas();
  return isas;
}

bool built_and_runs(const char* isa) {
  if (std::strcmp(isa, "base") == 0) return true;
#if COMLRL_HAVE_AVX2
  if (std::strcmp(isa, "avx2") == 0) return cpu_isas().avx2;
#endif
#if COMLRL_HAVE_AVX512
  if (std::strcmp(isa, "avx512") == 0) return cpu_isas().avx512;
#endif
  return false;
}

}  // namespace

std::vector<std::string> runnable_isas() {
  std::vector<std::string> out;
  for (const char* isa : {"base", "avx2", "avx512"})
    if (built_and_runs(isa)) out.emplace_back(isa);
  return out;
}

const char* active_isa() {
  const char* forced = std::getenv("COMLRL_KERNELS_CPU_ISA");
  if (forced && *forced && std::strcmp(forced, "auto") != 0) {
    for (const char* isa : {"base", "avx2", "avx512"}) {
      if (std::strcmp(forced, isa) != 0) continue;
      if (!built_and_runs(isa))
        throw std::runtime_error(std::string("COMLRL_KERNELS_CPU_ISA=") + forced +
                                 ": this build or CPU cannot run it (runnable: base" +
                                 (built_and_runs("avx2") ? ", avx2" : "") +
                                 (built_and_runs("avx512") ? ", avx512" : "") + ")");
      return isa;
    }
    throw std::invalid_argument(std::string("COMLRL_KERNELS_CPU_ISA=") + forced +
                                " is not one of auto, base, avx2, avx512");
  }
  if (built_and_runs("avx512")) return "avx512";
  if (built_and_runs("avx2")) return "avx2";
  return "base";
}

namespace {

// The log-prob row kernels have no AVX-512 build: they run the AVX2 one there.
bool use_avx2() { return std::strcmp(active_isa(), "base") != 0; }

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
  const char* isa = active_isa();
  const bool avx2 = std::strcmp(isa, "avx2") == 0;
  const bool avx512 = std::strcmp(isa, "avx512") == 0;
  // A GEMV streams 4 bytes of weight per element at ~25 GB/s, ~160 us per 1M elements:
  // a thread gets >= 2M weight elements (8 MB) to be worth its start-up.
  parallel_rows(
      n, k, num_threads,
      [&](std::int64_t lo, std::int64_t hi) {
#if COMLRL_HAVE_AVX512
        if (avx512) return isa_avx512::linear_rows(args, lo, hi);
#endif
#if COMLRL_HAVE_AVX2
        if (avx2) return isa_avx2::linear_rows(args, lo, hi);
#endif
        (void)avx2;
        (void)avx512;
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
