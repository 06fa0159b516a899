// CUDA launchers for comlrl-kernels. Plain C++ declarations (no CUDA headers) so the
// pybind11 module can be compiled by the host compiler. Addresses are device pointers
// passed as integers; `stream` is a cudaStream_t as an integer (0 = legacy default);
// `device` is the CUDA device index the pointers live on. Contracts match cpu_kernels.h,
// except: a target outside [0, vocab) that is not ignore_index yields NaN (no exception).
#pragma once

#include <cstdint>
#include <string>

namespace comlrl::cuda {

void token_logprobs_forward(std::uintptr_t logits, int dtype, std::int64_t n_rows,
                            std::int64_t vocab, std::int64_t row_stride, std::uintptr_t targets,
                            std::int64_t ignore_index, float temperature, std::uintptr_t logp,
                            std::uintptr_t lse, std::uintptr_t entropy, int device,
                            std::uintptr_t stream);

void token_logprobs_backward(std::uintptr_t logits, int dtype, std::int64_t n_rows,
                             std::int64_t vocab, std::int64_t row_stride, std::uintptr_t targets,
                             std::int64_t ignore_index, float temperature, std::uintptr_t lse,
                             std::uintptr_t g_logp, std::uintptr_t g_entropy,
                             std::uintptr_t entropy, std::uintptr_t grad,
                             std::int64_t grad_row_stride, int device, std::uintptr_t stream);

// One launch, one block per group. Members of group g are perm[offsets[g] .. offsets[g+1])
// when perm/offsets are given (non-zero), else the contiguous range
// [g * group_size, (g + 1) * group_size). bad_index (int64, 1 element) receives the
// smallest index of a non-finite reward, or -1 (it is reset on `stream` first).
void group_advantages(std::uintptr_t rewards, int dtype, std::int64_t m, std::uintptr_t perm,
                      std::uintptr_t offsets, std::int64_t num_groups, std::int64_t group_size,
                      int baseline, int scale, double eps, std::uintptr_t out,
                      std::uintptr_t bad_index, int device, std::uintptr_t stream);

// Number of visible devices; 0 (and *error set) when the driver/runtime is unusable.
int device_count(std::string* error);

}  // namespace comlrl::cuda
