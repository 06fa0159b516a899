// pybind11 module comlrl.kernels._cuda: bindings over cuda_kernels.h, compiled by the host
// compiler. The CUDA runtime is linked statically, so importing this module on a machine
// without a GPU or driver works; device_count() then reports 0 and why.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "cuda_kernels.h"

namespace py = pybind11;
using std::int64_t;
using std::uintptr_t;

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "comlrl-kernels CUDA backend; raw-pointer API, static cudart, no libtorch.";

  m.def(
      "token_logprobs_forward",
      [](uintptr_t logits, int dtype, int64_t n_rows, int64_t vocab, int64_t row_stride,
         uintptr_t targets, int64_t ignore_index, float temperature, uintptr_t logp,
         uintptr_t lse, uintptr_t entropy, int device, uintptr_t stream) {
        py::gil_scoped_release release;
        comlrl::cuda::token_logprobs_forward(logits, dtype, n_rows, vocab, row_stride, targets,
                                             ignore_index, temperature, logp, lse, entropy,
                                             device, stream);
      },
      py::arg("logits"), py::arg("dtype"), py::arg("n_rows"), py::arg("vocab"),
      py::arg("row_stride"), py::arg("targets"), py::arg("ignore_index"), py::arg("temperature"),
      py::arg("logp"), py::arg("lse"), py::arg("entropy"), py::arg("device"), py::arg("stream"));

  m.def(
      "token_logprobs_backward",
      [](uintptr_t logits, int dtype, int64_t n_rows, int64_t vocab, int64_t row_stride,
         uintptr_t targets, int64_t ignore_index, float temperature, uintptr_t lse,
         uintptr_t g_logp, uintptr_t g_entropy, uintptr_t entropy, uintptr_t grad,
         int64_t grad_row_stride, int device, uintptr_t stream) {
        py::gil_scoped_release release;
        comlrl::cuda::token_logprobs_backward(logits, dtype, n_rows, vocab, row_stride, targets,
                                              ignore_index, temperature, lse, g_logp, g_entropy,
                                              entropy, grad, grad_row_stride, device, stream);
      },
      py::arg("logits"), py::arg("dtype"), py::arg("n_rows"), py::arg("vocab"),
      py::arg("row_stride"), py::arg("targets"), py::arg("ignore_index"), py::arg("temperature"),
      py::arg("lse"), py::arg("g_logp"), py::arg("g_entropy"), py::arg("entropy"),
      py::arg("grad"), py::arg("grad_row_stride"), py::arg("device"), py::arg("stream"));

  m.def(
      "group_advantages",
      [](uintptr_t rewards, int dtype, int64_t m_, uintptr_t perm, uintptr_t offsets,
         int64_t num_groups, int64_t group_size, int baseline, int scale, double eps,
         uintptr_t out, uintptr_t bad_index, int device, uintptr_t stream) {
        py::gil_scoped_release release;
        comlrl::cuda::group_advantages(rewards, dtype, m_, perm, offsets, num_groups, group_size,
                                       baseline, scale, eps, out, bad_index, device, stream);
      },
      py::arg("rewards"), py::arg("dtype"), py::arg("m"), py::arg("perm"), py::arg("offsets"),
      py::arg("num_groups"), py::arg("group_size"), py::arg("baseline"), py::arg("scale"),
      py::arg("eps"), py::arg("out"), py::arg("bad_index"), py::arg("device"), py::arg("stream"));

  m.def(
      "device_count",
      []() {
        std::string error;
        int n = comlrl::cuda::device_count(&error);
        return py::make_tuple(n, error);
      },
      "Return (number of visible CUDA devices, error message or '').");
}
