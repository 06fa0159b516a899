// Few-row float32 linear (y = x W^T + b), compiled once per instruction set
// (see cpu_linear.cpp). Declarations shared with cpu_kernels.cpp.
#pragma once

#include <cstdint>

namespace comlrl::cpu {

struct LinearArgs {
  const float* x;        // [rows, k], row stride x_stride, unit inner stride
  std::int64_t x_stride;
  const float* weight;   // [n, k], row stride w_stride, unit inner stride
  std::int64_t w_stride;
  const float* bias;     // [n] contiguous, or nullptr
  float* y;              // [rows, n], row stride y_stride
  std::int64_t y_stride;
  std::int64_t rows;
  std::int64_t k;
};

// Output columns (weight rows) [lo, hi) of y.
namespace isa_base {
void linear_rows(const LinearArgs& args, std::int64_t lo, std::int64_t hi);
}
namespace isa_avx2 {
void linear_rows(const LinearArgs& args, std::int64_t lo, std::int64_t hi);
}
namespace isa_avx512 {
void linear_rows(const LinearArgs& args, std::int64_t lo, std::int64_t hi);
}

}  // namespace comlrl::cpu
