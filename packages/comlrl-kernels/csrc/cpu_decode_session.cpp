// DecodeSession (cpu_decode.h): checks the sizes of a decode step's borrowed weights and
// cache once, owns the scratch buffer, and runs the step with the instruction set
// active_isa() names (cpu_decode.cpp is compiled once per instruction set).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_decode.h"
#include "cpu_kernels.h"

namespace comlrl::cpu {
namespace {

using i64 = std::int64_t;

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("DecodeSession: " + what);
}

std::string shape(i64 a, i64 b) { return "[" + std::to_string(a) + ", " + std::to_string(b) + "]"; }

void check_linear(const DecodeLinear& l, i64 n, i64 k, const std::string& name) {
  require(l.weight != nullptr, name + " weight is null");
  require(l.n == n && l.k == k,
          name + " weight is " + shape(l.n, l.k) + ", expected " + shape(n, k));
  require(l.w_stride >= k || n == 1,
          name + " weight row stride " + std::to_string(l.w_stride) + " < K = " + std::to_string(k));
}

}  // namespace

DecodeSession::DecodeSession(i64 hidden, i64 heads, i64 kv_heads, i64 head_dim, i64 vocab,
                             float scaling, const float* embed, i64 embed_stride,
                             const float* final_norm, float final_eps, const DecodeLinear& head) {
  require(hidden > 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && vocab > 0,
          "sizes must be positive: hidden=" + std::to_string(hidden) + " heads=" +
              std::to_string(heads) + " kv_heads=" + std::to_string(kv_heads) +
              " head_dim=" + std::to_string(head_dim) + " vocab=" + std::to_string(vocab));
  require(heads % kv_heads == 0, "heads=" + std::to_string(heads) +
                                     " is not a multiple of kv_heads=" + std::to_string(kv_heads));
  require(head_dim % 2 == 0, "head_dim=" + std::to_string(head_dim) + " is odd (rotary needs pairs)");
  require(embed != nullptr && final_norm != nullptr, "embedding or final norm is null");
  require(embed_stride >= hidden, "embedding row stride " + std::to_string(embed_stride) +
                                      " < hidden=" + std::to_string(hidden));
  check_linear(head, vocab, hidden, "lm_head");
  m_.hidden = hidden;
  m_.heads = heads;
  m_.kv_heads = kv_heads;
  m_.head_dim = head_dim;
  m_.vocab = vocab;
  m_.scaling = scaling;
  m_.embed = embed;
  m_.embed_stride = embed_stride;
  m_.final_norm = final_norm;
  m_.final_eps = final_eps;
  m_.head = head;
}

void DecodeSession::add_layer(const float* norm1, float eps1, const float* norm2, float eps2,
                              const std::vector<DecodeLinear>& lin) {
  const std::string at = "layer " + std::to_string(m_.layers.size()) + " ";
  require(lin.size() == 7, at + "needs 7 linears (q, k, v, o, gate, up, down), got " +
                               std::to_string(lin.size()));
  require(norm1 != nullptr && norm2 != nullptr, at + "norm weight is null");
  const i64 h = m_.hidden, qd = m_.heads * m_.head_dim, kvd = m_.kv_heads * m_.head_dim;
  const i64 inter = lin[4].n;
  check_linear(lin[0], qd, h, at + "q_proj");
  check_linear(lin[1], kvd, h, at + "k_proj");
  check_linear(lin[2], kvd, h, at + "v_proj");
  check_linear(lin[3], h, qd, at + "o_proj");
  require(inter > 0, at + "gate_proj has no rows");
  check_linear(lin[4], inter, h, at + "gate_proj");
  check_linear(lin[5], inter, h, at + "up_proj");
  check_linear(lin[6], h, inter, at + "down_proj");
  DecodeLayer l;
  l.norm1 = norm1;
  l.eps1 = eps1;
  l.norm2 = norm2;
  l.eps2 = eps2;
  l.q = lin[0];
  l.k = lin[1];
  l.v = lin[2];
  l.o = lin[3];
  l.gate = lin[4];
  l.up = lin[5];
  l.down = lin[6];
  m_.layers.push_back(l);
  started_ = false;
}

void DecodeSession::start(i64 prompts, i64 group, i64 prefix, i64 steps, const float* prefix_bias,
                          const float* cos, const float* sin, i64 rope_steps,
                          const std::vector<std::vector<float*>>& caches) {
  started_ = false;
  require(prompts > 0 && group > 0 && prefix >= 0 && steps > 0 && rope_steps > 0,
          "bad batch sizes prompts=" + std::to_string(prompts) + " group=" + std::to_string(group) +
              " prefix=" + std::to_string(prefix) + " steps=" + std::to_string(steps) +
              " rope_steps=" + std::to_string(rope_steps));
  require(!m_.layers.empty(), "no layers were added");
  require(caches.size() == m_.layers.size(),
          std::to_string(caches.size()) + " layer caches for " + std::to_string(m_.layers.size()) +
              " layers");
  require(cos != nullptr && sin != nullptr && (prefix == 0 || prefix_bias != nullptr),
          "rotary tables or prompt bias are null");
  for (size_t i = 0; i < caches.size(); ++i) {
    const auto& c = caches[i];
    require(c.size() == 4 && c[2] != nullptr && c[3] != nullptr &&
                (prefix == 0 || (c[0] != nullptr && c[1] != nullptr)),
            "layer " + std::to_string(i) + " cache needs 4 non-null buffers");
    m_.layers[i].prefix_keys = c[0];
    m_.layers[i].prefix_values = c[1];
    m_.layers[i].keys = c[2];
    m_.layers[i].values = c[3];
  }
  m_.prompts = prompts;
  m_.group = group;
  m_.prefix = prefix;
  m_.steps = steps;
  m_.prefix_bias = prefix_bias;
  m_.cos = cos;
  m_.sin = sin;
  m_.rope_steps = rope_steps;
  work_.assign(static_cast<size_t>(decode_workspace_floats(m_)), 0.f);
  transpose_weights();
  started_ = true;
}

void DecodeSession::transpose_weights() {
  std::vector<DecodeLinear*> all{&m_.head};
  for (auto& l : m_.layers)
    for (DecodeLinear* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) all.push_back(x);
  i64 total = 0;
  for (const DecodeLinear* l : all) total += l->n * l->k;
  transposed_.clear();
  for (DecodeLinear* l : all) l->wt = nullptr;
  if (total > kTransposeMaxElements) return;
  for (DecodeLinear* l : all) {
    const i64 np = (l->n + kTransposedTile - 1) / kTransposedTile * kTransposedTile;
    std::vector<float> buf(static_cast<size_t>(l->k * np + 16), 0.f);
    // 64-byte align the start so each 16-column tile row is one cache line.
    const auto addr = reinterpret_cast<std::uintptr_t>(buf.data());
    const size_t shift = ((64 - addr % 64) % 64) / sizeof(float);
    float* wt = buf.data() + shift;
    for (i64 j = 0; j < l->n; ++j)
      for (i64 i = 0; i < l->k; ++i) wt[i * np + j] = l->weight[j * l->w_stride + i];
    l->wt = wt;
    l->n_pad = np;
    transposed_.push_back(std::move(buf));  // moving a vector keeps its buffer
  }
}

void DecodeSession::step(const i64* tokens, i64 rows, i64 slot, float* logits, i64 logits_stride,
                         int num_threads) {
  require(started_, "step() before start()");
  require(rows == m_.prompts * m_.group,
          std::to_string(rows) + " tokens for " + std::to_string(m_.prompts * m_.group) +
              " rows (prompts x group)");
  require(logits_stride >= m_.vocab, "logits row stride " + std::to_string(logits_stride) +
                                         " < vocab " + std::to_string(m_.vocab));
  const char* isa = active_isa();
#if COMLRL_HAVE_AVX512
  if (std::strcmp(isa, "avx512") == 0)
    return isa_avx512::decode_step(m_, tokens, slot, logits, logits_stride, work_.data(),
                                   num_threads);
#endif
#if COMLRL_HAVE_AVX2
  if (std::strcmp(isa, "avx2") == 0)
    return isa_avx2::decode_step(m_, tokens, slot, logits, logits_stride, work_.data(), num_threads);
#endif
  (void)isa;
  isa_base::decode_step(m_, tokens, slot, logits, logits_stride, work_.data(), num_threads);
}

}  // namespace comlrl::cpu
