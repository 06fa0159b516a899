// One decode step of a Llama-family causal LM (Llama, Qwen2, Mistral) on CPU float32:
// the whole token -> logits computation for R rows in one call (see cpu_decode.cpp).
// The model and the KV cache are borrowed through raw pointers; the caller (Python,
// comlrl/kernels/_decode_step.py) keeps the tensors alive and checks their shapes.
#pragma once

#include <cstdint>
#include <vector>

namespace comlrl::cpu {

// y = x W^T (+ b) for W [n, k] (row stride w_stride, unit inner stride), b [n] or null.
// `wt`: optionally the same weight transposed, [k, n_pad] with n_pad a multiple of
// kTransposedTile (zero columns past n), 64-byte aligned; the step then uses the
// register-blocked small-model kernel instead of the streaming GEMV.
struct DecodeLinear {
  const float* weight = nullptr;
  std::int64_t w_stride = 0;
  const float* bias = nullptr;
  std::int64_t n = 0;
  std::int64_t k = 0;
  const float* wt = nullptr;
  std::int64_t n_pad = 0;
};

// Columns per tile of the transposed-weight kernel (two 8-float vectors).
constexpr std::int64_t kTransposedTile = 16;
// Models whose linears hold at most this many weight elements in all get transposed
// copies (made by DecodeSession::start, so a start after an optimizer step sees the new
// weights): their weights sit in cache, and the step is bound by arithmetic, where the
// streaming GEMV spends a horizontal sum per output.
constexpr std::int64_t kTransposeMaxElements = std::int64_t{1} << 22;

// One decoder layer: weights plus this batch's KV cache, in FastDecoder's layout
// (comlrl/algos/rollout/sampling/decode.py): keys are stored transposed.
struct DecodeLayer {
  const float* norm1 = nullptr;  // [H]
  float eps1 = 0.f;
  DecodeLinear q, k, v, o;       // q [Hq*D, H], k/v [Hkv*D, H], o [H, Hq*D]
  const float* norm2 = nullptr;  // [H]
  float eps2 = 0.f;
  DecodeLinear gate, up, down;   // gate/up [I, H], down [H, I]
  const float* prefix_keys = nullptr;    // [P, Hkv, D, S]   prompt keys (after rotary)
  const float* prefix_values = nullptr;  // [P, Hkv, S, D]
  float* keys = nullptr;                 // [P, Hkv, G, D, T] completion keys, written here
  float* values = nullptr;               // [P, Hkv, G, T, D]
};

struct DecodeModel {
  std::int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  float scaling = 1.f;                   // softmax scale, usually head_dim^-1/2
  const float* embed = nullptr;          // [V, H], row stride embed_stride
  std::int64_t embed_stride = 0;
  std::vector<DecodeLayer> layers;
  const float* final_norm = nullptr;     // [H]
  float final_eps = 0.f;
  DecodeLinear head;                     // [V, H]
  // The batch (set by start): R = prompts * group rows, prompt-major.
  std::int64_t prompts = 0, group = 0, prefix = 0, steps = 0;  // P, G, S, T
  const float* prefix_bias = nullptr;    // [P, S] additive: 0 on tokens, -inf on padding
  const float* cos = nullptr;            // [R, rope_steps, D]
  const float* sin = nullptr;            // [R, rope_steps, D], rotate_half's sign folded in
  std::int64_t rope_steps = 0;
};

// Query heads whose attention scores one pass computes (over their shared kv head's keys).
constexpr std::int64_t kScoreHeads = 4;

// Floats of scratch one step needs (rows = P * G).
inline std::int64_t decode_workspace_floats(const DecodeModel& m) {
  std::int64_t inter = 0;
  for (const auto& l : m.layers) inter = l.gate.n > inter ? l.gate.n : inter;
  const std::int64_t rows = m.prompts * m.group;
  const std::int64_t qd = m.heads * m.head_dim, kvd = m.kv_heads * m.head_dim;
  return rows * (2 * m.hidden + 2 * qd + 2 * kvd + 2 * inter) +
         kScoreHeads * (m.prefix + m.steps);
}

// Runs one step: feeds tokens [R] (checked to lie in [0, V)) at completion slot `slot`
// (the slot's keys/values are written into the cache; attention covers the prompt and
// slots [0, slot]) with rotary row `slot` of cos/sin, and writes logits [R, V]
// (row stride logits_stride). `work` holds decode_workspace_floats(m) floats.
namespace isa_base {
void decode_step(const DecodeModel& m, const std::int64_t* tokens, std::int64_t slot,
                 float* logits, std::int64_t logits_stride, float* work, int num_threads);
}
namespace isa_avx2 {
void decode_step(const DecodeModel& m, const std::int64_t* tokens, std::int64_t slot,
                 float* logits, std::int64_t logits_stride, float* work, int num_threads);
}
namespace isa_avx512 {
void decode_step(const DecodeModel& m, const std::int64_t* tokens, std::int64_t slot,
                 float* logits, std::int64_t logits_stride, float* work, int num_threads);
}

}  // namespace comlrl::cpu

namespace comlrl::cpu {

// The model's borrowed weights and a batch's cache, checked once; step() runs the
// instruction set active_isa() names. Not thread-safe per object (one scratch buffer);
// separate objects may step concurrently.
class DecodeSession {
 public:
  // Throws std::invalid_argument naming the bad size.
  DecodeSession(std::int64_t hidden, std::int64_t heads, std::int64_t kv_heads,
                std::int64_t head_dim, std::int64_t vocab, float scaling, const float* embed,
                std::int64_t embed_stride, const float* final_norm, float final_eps,
                const DecodeLinear& head);
  // linears: q, k, v, o, gate, up, down.
  void add_layer(const float* norm1, float eps1, const float* norm2, float eps2,
                 const std::vector<DecodeLinear>& linears);
  // caches: per layer {prefix_keys, prefix_values, keys, values} (layouts in DecodeLayer).
  void start(std::int64_t prompts, std::int64_t group, std::int64_t prefix, std::int64_t steps,
             const float* prefix_bias, const float* cos, const float* sin,
             std::int64_t rope_steps, const std::vector<std::vector<float*>>& caches);
  void step(const std::int64_t* tokens, std::int64_t rows, std::int64_t slot, float* logits,
            std::int64_t logits_stride, int num_threads);
  std::int64_t num_layers() const { return static_cast<std::int64_t>(m_.layers.size()); }

 private:
  void transpose_weights();
  DecodeModel m_;
  std::vector<float> work_;
  std::vector<std::vector<float>> transposed_;  // owned copies the `wt` pointers point into
  bool started_ = false;
};

}  // namespace comlrl::cpu
