// pybind11 module comlrl.kernels._cpu: thin bindings over cpu_kernels.h.
// Arguments are plain integers (addresses from Tensor.data_ptr(), sizes, strides, dtype
// codes); a null pointer (0) marks an optional buffer as absent. The GIL is released
// while kernels run.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "cpu_decode.h"
#include "cpu_kernels.h"
#include "cpu_sample.h"

namespace py = pybind11;
using std::int64_t;
using std::uintptr_t;

namespace {
template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// (weight, weight row stride, bias or 0, n, k) -> DecodeLinear
using LinearTuple = std::tuple<uintptr_t, int64_t, uintptr_t, int64_t, int64_t>;
comlrl::cpu::DecodeLinear to_linear(const LinearTuple& t) {
  comlrl::cpu::DecodeLinear l;
  l.weight = ptr<const float>(std::get<0>(t));
  l.w_stride = std::get<1>(t);
  l.bias = ptr<const float>(std::get<2>(t));
  l.n = std::get<3>(t);
  l.k = std::get<4>(t);
  return l;
}
}  // namespace

PYBIND11_MODULE(_cpu, m) {
  m.doc() = "comlrl-kernels CPU backend (C++17, std::thread); raw-pointer API, no libtorch.";

  m.def(
      "token_logprobs_forward",
      [](uintptr_t logits, int dtype, int64_t n_rows, int64_t vocab, int64_t row_stride,
         uintptr_t targets, int64_t ignore_index, float temperature, uintptr_t logp,
         uintptr_t lse, uintptr_t entropy, int num_threads) {
        py::gil_scoped_release release;
        comlrl::cpu::token_logprobs_forward(ptr<const void>(logits), dtype, n_rows, vocab,
                                            row_stride, ptr<const int64_t>(targets), ignore_index,
                                            temperature, ptr<float>(logp), ptr<float>(lse),
                                            ptr<float>(entropy), num_threads);
      },
      py::arg("logits"), py::arg("dtype"), py::arg("n_rows"), py::arg("vocab"),
      py::arg("row_stride"), py::arg("targets"), py::arg("ignore_index"), py::arg("temperature"),
      py::arg("logp"), py::arg("lse"), py::arg("entropy"), py::arg("num_threads"));

  m.def(
      "token_logprobs_backward",
      [](uintptr_t logits, int dtype, int64_t n_rows, int64_t vocab, int64_t row_stride,
         uintptr_t targets, int64_t ignore_index, float temperature, uintptr_t lse,
         uintptr_t g_logp, uintptr_t g_entropy, uintptr_t entropy, uintptr_t grad,
         int64_t grad_row_stride, int num_threads) {
        py::gil_scoped_release release;
        comlrl::cpu::token_logprobs_backward(
            ptr<const void>(logits), dtype, n_rows, vocab, row_stride,
            ptr<const int64_t>(targets), ignore_index, temperature, ptr<const float>(lse),
            ptr<const float>(g_logp), ptr<const float>(g_entropy), ptr<const float>(entropy),
            ptr<void>(grad), grad_row_stride, num_threads);
      },
      py::arg("logits"), py::arg("dtype"), py::arg("n_rows"), py::arg("vocab"),
      py::arg("row_stride"), py::arg("targets"), py::arg("ignore_index"), py::arg("temperature"),
      py::arg("lse"), py::arg("g_logp"), py::arg("g_entropy"), py::arg("entropy"),
      py::arg("grad"), py::arg("grad_row_stride"), py::arg("num_threads"));

  m.def(
      "group_advantages",
      [](uintptr_t rewards, int dtype, int64_t m_, uintptr_t group_index, int64_t num_groups,
         int64_t group_size, int baseline, int scale, double eps, uintptr_t out) {
        py::gil_scoped_release release;
        return comlrl::cpu::group_advantages(ptr<const void>(rewards), dtype, m_,
                                             ptr<const int64_t>(group_index), num_groups,
                                             group_size, baseline, scale, eps, ptr<void>(out));
      },
      py::arg("rewards"), py::arg("dtype"), py::arg("m"), py::arg("group_index"),
      py::arg("num_groups"), py::arg("group_size"), py::arg("baseline"), py::arg("scale"),
      py::arg("eps"), py::arg("out"));

  m.def(
      "linear_rows",
      [](uintptr_t x, int64_t rows, int64_t k, int64_t x_stride, uintptr_t weight, int64_t n,
         int64_t w_stride, uintptr_t bias, uintptr_t y, int num_threads) {
        py::gil_scoped_release release;
        comlrl::cpu::linear_rows(ptr<const float>(x), rows, k, x_stride, ptr<const float>(weight),
                                 n, w_stride, ptr<const float>(bias), ptr<float>(y), num_threads);
      },
      py::arg("x"), py::arg("rows"), py::arg("k"), py::arg("x_stride"), py::arg("weight"),
      py::arg("n"), py::arg("w_stride"), py::arg("bias"), py::arg("y"), py::arg("num_threads"));

  using comlrl::cpu::DecodeSession;
  py::class_<DecodeSession>(m, "DecodeSession",
                            "One Llama-family decode step over borrowed float32 weights and "
                            "KV cache (csrc/cpu_decode.h); sizes checked once.")
      .def(py::init([](int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                       int64_t vocab, float scaling, uintptr_t embed, int64_t embed_stride,
                       uintptr_t final_norm, float final_eps, const LinearTuple& head) {
             return new DecodeSession(hidden, heads, kv_heads, head_dim, vocab, scaling,
                                      ptr<const float>(embed), embed_stride,
                                      ptr<const float>(final_norm), final_eps, to_linear(head));
           }),
           py::arg("hidden"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("vocab"), py::arg("scaling"), py::arg("embed"), py::arg("embed_stride"),
           py::arg("final_norm"), py::arg("final_eps"), py::arg("head"))
      .def(
          "add_layer",
          [](DecodeSession& s, uintptr_t norm1, float eps1, uintptr_t norm2, float eps2,
             const std::vector<LinearTuple>& linears) {
            std::vector<comlrl::cpu::DecodeLinear> lin;
            for (const auto& t : linears) lin.push_back(to_linear(t));
            s.add_layer(ptr<const float>(norm1), eps1, ptr<const float>(norm2), eps2, lin);
          },
          py::arg("norm1"), py::arg("eps1"), py::arg("norm2"), py::arg("eps2"), py::arg("linears"))
      .def(
          "start",
          [](DecodeSession& s, int64_t prompts, int64_t group, int64_t prefix, int64_t steps,
             uintptr_t prefix_bias, uintptr_t cos, uintptr_t sin, int64_t rope_steps,
             const std::vector<std::vector<uintptr_t>>& caches) {
            std::vector<std::vector<float*>> c;
            for (const auto& layer : caches) {
              std::vector<float*> bufs;
              for (uintptr_t a : layer) bufs.push_back(ptr<float>(a));
              c.push_back(bufs);
            }
            s.start(prompts, group, prefix, steps, ptr<const float>(prefix_bias),
                    ptr<const float>(cos), ptr<const float>(sin), rope_steps, c);
          },
          py::arg("prompts"), py::arg("group"), py::arg("prefix"), py::arg("steps"),
          py::arg("prefix_bias"), py::arg("cos"), py::arg("sin"), py::arg("rope_steps"),
          py::arg("caches"))
      .def(
          "step",
          [](DecodeSession& s, uintptr_t tokens, int64_t rows, int64_t slot, uintptr_t logits,
             int64_t logits_stride, int num_threads) {
            py::gil_scoped_release release;
            s.step(ptr<const int64_t>(tokens), rows, slot, ptr<float>(logits), logits_stride,
                   num_threads);
          },
          py::arg("tokens"), py::arg("rows"), py::arg("slot"), py::arg("logits"),
          py::arg("logits_stride"), py::arg("num_threads"))
      .def_property_readonly("num_layers", &DecodeSession::num_layers);

  m.def(
      "sample_rows",
      [](uintptr_t logits, int64_t rows, int64_t vocab, int64_t row_stride, uintptr_t uniforms,
         float temperature, int64_t top_k, float top_p, uintptr_t eos, int64_t n_eos,
         int64_t pad, uintptr_t done, uintptr_t tokens, uintptr_t logp) {
        comlrl::cpu::SampleArgs a;
        a.logits = ptr<const float>(logits);
        a.rows = rows;
        a.vocab = vocab;
        a.row_stride = row_stride;
        a.uniforms = ptr<const float>(uniforms);
        a.temperature = temperature;
        a.top_k = top_k;
        a.top_p = top_p;
        a.eos = ptr<const int64_t>(eos);
        a.n_eos = n_eos;
        a.pad = pad;
        a.done = ptr<bool>(done);
        a.tokens = ptr<int64_t>(tokens);
        a.logp = ptr<float>(logp);
        py::gil_scoped_release release;
        return comlrl::cpu::sample_rows(a);
      },
      py::arg("logits"), py::arg("rows"), py::arg("vocab"), py::arg("row_stride"),
      py::arg("uniforms"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
      py::arg("eos"), py::arg("n_eos"), py::arg("pad"), py::arg("done"), py::arg("tokens"),
      py::arg("logp"));

  m.def("isa", &comlrl::cpu::active_isa,
        "Instruction set of the row kernels now: 'avx512', 'avx2' or 'base' "
        "(COMLRL_KERNELS_CPU_ISA=base|avx2|avx512 forces one).");
  m.def("isas", &comlrl::cpu::runnable_isas,
        "Instruction sets this build and CPU run (cpuid + xgetbv), baseline first.");
}
