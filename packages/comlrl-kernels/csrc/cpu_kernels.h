// CPU kernels (C++17, std::thread). Declarations shared by cpu_kernels.cpp and the
// pybind11 module. All pointers are host addresses; all offsets are 64-bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace comlrl::cpu {

// Per row i of logits [n_rows, vocab] (row stride `row_stride` elements, unit inner
// stride), with z = logits / temperature computed in fp32:
//   lse[i]  = logsumexp_j z[i, j]
//   logp[i] = z[i, targets[i]] - lse[i]     (0 when targets[i] == ignore_index)
//   entropy[i] = lse[i] - sum_j softmax(z)[i, j] * z[i, j]   (only if entropy != nullptr;
//                0 for ignored rows)
// Throws std::invalid_argument for a target outside [0, vocab) that is not ignore_index.
void token_logprobs_forward(const void* logits, int dtype, std::int64_t n_rows,
                            std::int64_t vocab, std::int64_t row_stride,
                            const std::int64_t* targets, std::int64_t ignore_index,
                            float temperature, float* logp, float* lse, float* entropy,
                            int num_threads);

// grad[i, j] = (g_logp[i] * (onehot - p) + g_entropy[i] * (-p * (log p + H))) / T
// with p = softmax(z[i]) recomputed from the saved lse; H recomputed likewise when
// g_entropy is given. Rows with an ignored target get a zero gradient. `grad` has the
// logits dtype and may alias `logits` (in-place backward).
void token_logprobs_backward(const void* logits, int dtype, std::int64_t n_rows,
                             std::int64_t vocab, std::int64_t row_stride,
                             const std::int64_t* targets, std::int64_t ignore_index,
                             float temperature, const float* lse, const float* g_logp,
                             const float* g_entropy, const float* entropy, void* grad,
                             std::int64_t grad_row_stride, int num_threads);

// Group advantages over rewards [m] (fp32 or fp64). Group of element i is
// group_index[i] (compact ids in [0, num_groups)) or, when group_index is null,
// i / group_size. baseline: 0 none, 1 mean, 2 loo, 3 max. scale: 0 none, 1 group std.
// Returns the first index holding a non-finite reward, or kNoBadIndex.
std::int64_t group_advantages(const void* rewards, int dtype, std::int64_t m,
                              const std::int64_t* group_index, std::int64_t num_groups,
                              std::int64_t group_size, int baseline, int scale, double eps,
                              void* out);

// y[r, j] = sum_i x[r, i] * weight[j, i] (+ bias[j]) for x [rows, k] (row stride x_stride),
// weight [n, k] (row stride w_stride), bias [n] or nullptr, y [rows, n] contiguous; all
// float32 with unit inner stride. The output columns are split over up to num_threads
// threads (>= 2M weight elements each). Throws std::invalid_argument for negative sizes
// or a row stride below k.
void linear_rows(const float* x, std::int64_t rows, std::int64_t k, std::int64_t x_stride,
                 const float* weight, std::int64_t n, std::int64_t w_stride, const float* bias,
                 float* y, int num_threads);

// Instruction set the row kernels run with now: "avx512", "avx2" or "base" (the best this
// build and CPU run, or COMLRL_KERNELS_CPU_ISA). Throws std::invalid_argument for an
// unknown COMLRL_KERNELS_CPU_ISA and std::runtime_error for one this CPU cannot run.
const char* active_isa();

// The instruction sets this build and CPU run, baseline first.
std::vector<std::string> runnable_isas();

}  // namespace comlrl::cpu
