// Shared definitions for the comlrl-kernels native backends.
//
// The native side never sees a torch::Tensor: Python passes raw addresses (ints from
// Tensor.data_ptr()), sizes, row strides in elements, and one of the dtype codes below.
// Keep the codes in sync with src/comlrl/kernels/_dispatch.py (DTYPE_CODES).
#pragma once

#include <cstdint>

namespace comlrl {

enum DType : int {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
};

// Sentinel written by group_advantages when every reward is finite.
constexpr std::int64_t kNoBadIndex = -1;

}  // namespace comlrl
