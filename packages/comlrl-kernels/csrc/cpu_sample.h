// One sampling step over float32 logits rows (CPU): temperature, top-k, top-p, an
// inverse-CDF draw from caller-supplied uniforms, the behaviour log-prob of the full
// tempered softmax, and the done/EOS bookkeeping of a decode loop. See cpu_sample.cpp.
#pragma once

#include <cstdint>

namespace comlrl::cpu {

struct SampleArgs {
  const float* logits;       // [rows, vocab], rows `row_stride` floats apart
  std::int64_t rows;
  std::int64_t vocab;
  std::int64_t row_stride;
  const float* uniforms;     // [rows] in [0, 1)
  float temperature;         // > 0
  std::int64_t top_k;        // <= 0 or >= vocab: off
  float top_p;               // >= 1: off
  const std::int64_t* eos;   // [n_eos]
  std::int64_t n_eos;
  std::int64_t pad;
  bool* done;                // [rows], read and updated in place
  std::int64_t* tokens;      // [rows] out: the sampled token, `pad` on rows done before
  float* logp;               // [rows] out: log_softmax(logits / T) at the sampled token
};

// Returns true when every row is done after this step.
bool sample_rows(const SampleArgs& args);

}  // namespace comlrl::cpu
