// Per-row kernels, compiled once per instruction set (see cpu_rows.cpp).
#pragma once

#include <cstdint>

namespace comlrl::cpu {

struct ForwardArgs {
  const void* logits;
  int dtype;
  std::int64_t vocab;
  std::int64_t row_stride;
  const std::int64_t* targets;
  std::int64_t ignore_index;
  float inv_t;
  float* logp;
  float* lse;
  float* entropy;  // nullptr: no entropy
};

struct BackwardArgs {
  const void* logits;
  int dtype;
  std::int64_t vocab;
  std::int64_t row_stride;
  const std::int64_t* targets;
  std::int64_t ignore_index;
  float inv_t;
  const float* lse;
  const float* g_logp;     // nullptr: zero
  const float* g_entropy;  // nullptr: no entropy term
  const float* entropy;
  void* grad;  // logits dtype; may alias logits
  std::int64_t grad_row_stride;
};

// Rows [lo, hi). Return false for an unknown dtype code.
namespace isa_base {
bool forward_rows(const ForwardArgs& args, std::int64_t lo, std::int64_t hi);
bool backward_rows(const BackwardArgs& args, std::int64_t lo, std::int64_t hi);
}  // namespace isa_base

namespace isa_avx2 {
bool forward_rows(const ForwardArgs& args, std::int64_t lo, std::int64_t hi);
bool backward_rows(const BackwardArgs& args, std::int64_t lo, std::int64_t hi);
}  // namespace isa_avx2

}  // namespace comlrl::cpu
