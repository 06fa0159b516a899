// CUDA kernels for comlrl-kernels (see cuda_kernels.h for the contracts).
//
// token_logprobs: one block per row. Each thread streams its share of the row once,
// 128-bit loads (two in flight) when the row is 16-byte aligned, keeping an online
// (max, sum, entropy) triple in fp32 in base 2 (one FFMA + one MUFU.EX2 per element, the
// max raised lazily); the triples are merged across the block with warp shuffles.
// Backward recomputes softmax from the saved log-sum-exp, one EX2 per element, and adds
// the target's one-hot term in the one thread that owns it. All offsets are 64-bit.
// group_advantages: one block per group, one launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common.h"
#include "cuda_kernels.h"

namespace comlrl::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr std::int64_t kMaxGrid = 1 << 30;

template <int D> struct CElem;
template <> struct CElem<kFloat32> {
  using T = float;
  __device__ static float load(T v) { return v; }
  __device__ static T store(float v) { return v; }
};
template <> struct CElem<kFloat16> {
  using T = __half;
  __device__ static float load(T v) { return __half2float(v); }
  __device__ static T store(float v) { return __float2half_rn(v); }
};
template <> struct CElem<kBFloat16> {
  using T = __nv_bfloat16;
  __device__ static float load(T v) { return __bfloat162float(v); }
  __device__ static T store(float v) { return __float2bfloat16_rn(v); }
};

// exp2 on the special-function unit: relative error about 2^-22, -inf -> +0, NaN -> NaN.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Running log-sum-exp state over raw logits x, scaled by c = log2(e) / temperature:
// m = max x (raw units), s = sum 2^(c x - c m), t = sum 2^(c x - c m) * (c x - c m).
// Working in base 2 lets every element cost one FFMA and one MUFU.EX2.
struct Online {
  float m, s, t;
};

__device__ __forceinline__ Online merge(Online a, Online b, float c) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float nm = fmaxf(a.m, b.m);
  const float da = (a.m - nm) * c, db = (b.m - nm) * c;
  const float ea = ex2(da), eb = ex2(db);
  return {nm, a.s * ea + b.s * eb, ea * fmaf(da, a.s, a.t) + eb * fmaf(db, b.s, b.t)};
}

// Adds N raw logits to the state. The max is raised lazily (rare after the first
// vectors), so the common case is one FFMA + one EX2 + one FADD per element (plus one
// FFMA and a select for the entropy term).
template <bool kEntropy, int N>
__device__ __forceinline__ void accumulate(Online& st, const float (&x)[N], float c) {
  float lm = x[0];
#pragma unroll
  for (int k = 1; k < N; ++k) lm = fmaxf(lm, x[k]);
  if (lm > st.m) {
    if (st.m != -INFINITY) {
      const float dm = (st.m - lm) * c;
      const float r = ex2(dm);
      st.t = r * fmaf(dm, st.s, st.t);
      st.s *= r;
    }
    st.m = lm;
  }
  if (st.m == -INFINITY) {
    // Only -inf so far: they contribute nothing, but fmaxf drops NaN, so a NaN among
    // them must still poison the row (as logsumexp does).
    bool nan = false;
#pragma unroll
    for (int k = 0; k < N; ++k) nan |= x[k] != x[k];
    if (nan) st = Online{NAN, NAN, NAN};
    return;
  }
  const float off = st.m * c;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float d = fmaf(x[k], c, -off);  // NaN in x (or in m) makes s NaN
    const float p = ex2(d);
    st.s += p;
    if (kEntropy) st.t += p > 0.0f ? p * d : 0.0f;  // -inf logits: p = 0, p * d undefined
  }
}

__device__ Online block_merge(Online st, Online* smem, float c) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    Online o{__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.s, off),
             __shfl_xor_sync(0xffffffffu, st.t, off)};
    st = merge(st, o, c);
  }
  if (lane == 0) smem[warp] = st;
  __syncthreads();
  if (warp == 0) {
    st = lane < kWarps ? smem[lane] : Online{-INFINITY, 0.0f, 0.0f};
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      Online o{__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.s, off),
               __shfl_xor_sync(0xffffffffu, st.t, off)};
      st = merge(st, o, c);
    }
  }
  __syncthreads();  // smem reusable by the next row
  return st;        // valid in thread 0
}

template <int D, int K>
__device__ __forceinline__ void unpack(const uint4& raw, float (&x)[K]) {
  using T = typename CElem<D>::T;
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < K; ++k) x[k] = CElem<D>::load(e[k]);
}

template <int D, bool kEntropy>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const typename CElem<D>::T* __restrict__ logits, std::int64_t n_rows,
                   std::int64_t vocab, std::int64_t row_stride,
                   const std::int64_t* __restrict__ targets, std::int64_t ignore_index,
                   float inv_t, float* __restrict__ logp, float* __restrict__ lse,
                   float* __restrict__ entropy) {
  using T = typename CElem<D>::T;
  constexpr int kVec = 16 / sizeof(T);
  const float c = inv_t * kLog2e;
  __shared__ Online smem[kWarps];
  for (std::int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
    const std::int64_t tgt = targets[row];
    if (tgt == ignore_index) {
      if (threadIdx.x == 0) {
        logp[row] = 0.0f;
        lse[row] = 0.0f;
        if (kEntropy) entropy[row] = 0.0f;
      }
      continue;
    }
    const T* x = logits + row * row_stride;
    Online st{-INFINITY, 0.0f, 0.0f};
    std::int64_t tail = 0;
    if ((reinterpret_cast<std::uintptr_t>(x) & 15u) == 0) {
      const std::int64_t nvec = vocab / kVec;
      const uint4* xv = reinterpret_cast<const uint4*>(x);
      std::int64_t v = threadIdx.x;
      // Two 16-byte loads in flight per thread before any arithmetic.
      for (; v + blockDim.x < nvec; v += 2 * blockDim.x) {
        const uint4 r0 = __ldg(xv + v), r1 = __ldg(xv + v + blockDim.x);
        float z[kVec];
        unpack<D>(r0, z);
        accumulate<kEntropy>(st, z, c);
        unpack<D>(r1, z);
        accumulate<kEntropy>(st, z, c);
      }
      if (v < nvec) {
        float z[kVec];
        unpack<D>(__ldg(xv + v), z);
        accumulate<kEntropy>(st, z, c);
      }
      tail = nvec * kVec;
    }
    for (std::int64_t j = tail + threadIdx.x; j < vocab; j += blockDim.x) {
      float z[1] = {CElem<D>::load(x[j])};
      accumulate<kEntropy>(st, z, c);
    }
    st = block_merge(st, smem, c);
    if (threadIdx.x == 0) {
      const float log2_s = log2f(st.s);
      const float l = fmaf(st.m, inv_t, log2_s * kLn2);
      lse[row] = l;
      logp[row] = (tgt >= 0 && tgt < vocab) ? fmaf(CElem<D>::load(x[tgt]), inv_t, -l) : NAN;
      if (kEntropy) entropy[row] = kLn2 * (log2_s - st.t / st.s);
    }
  }
}

// d logp[tgt] / d x[j] = inv_t * (1[j == tgt] - p_j) and d H / d x[j] = -inv_t * p_j (d_j + H)
// with d_j = x_j inv_t - lse (natural log units), p_j = exp(d_j) = 2^(c x_j - c lse).
template <bool kEntropy>
__device__ __forceinline__ float grad_at(float xv, float c, float l2, float gi, float ce,
                                         float h) {
  const float d2 = fmaf(xv, c, -l2);
  const float p = ex2(d2);
  float out = -gi * p;
  if (kEntropy && p > 0.0f) out = fmaf(ce * p, fmaf(d2, kLn2, h), out);
  return out;
}

// One vector (kVec elements) of the gradient, target fix-up included.
template <int D, bool kEntropy, int K>
__device__ __forceinline__ uint4 grad_vector(const uint4& raw, int v, int tvec, int tgt, float c,
                                             float l2, float gi, float ce, float h) {
  using T = typename CElem<D>::T;
  float z[K];
  unpack<D>(raw, z);
  float out[K];
#pragma unroll
  for (int k = 0; k < K; ++k) out[k] = grad_at<kEntropy>(z[k], c, l2, gi, ce, h);
  if (v == tvec) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (v * K + k == tgt) out[k] += gi;
  }
  uint4 outraw;
  T* o = reinterpret_cast<T*>(&outraw);
#pragma unroll
  for (int k = 0; k < K; ++k) o[k] = CElem<D>::store(out[k]);
  return outraw;
}

// 8 blocks of 256 threads per SM (full occupancy): at most 32 registers per thread.
template <int D, bool kEntropy>
__global__ void __launch_bounds__(kThreads, 2048 / kThreads)
    backward_kernel(const typename CElem<D>::T* logits, std::int64_t n_rows, std::int64_t vocab,
                    std::int64_t row_stride, const std::int64_t* __restrict__ targets,
                    std::int64_t ignore_index, float inv_t, const float* __restrict__ lse,
                    const float* __restrict__ g_logp, const float* __restrict__ g_entropy,
                    const float* __restrict__ entropy, typename CElem<D>::T* grad,
                    std::int64_t grad_row_stride) {
  // logits and grad may alias (in-place backward): every element is read and then
  // written by the same thread, so no synchronisation is needed.
  using T = typename CElem<D>::T;
  constexpr int kVec = 16 / sizeof(T);
  const float c = inv_t * kLog2e;
  for (std::int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
    const T* x = logits + row * row_stride;
    T* gr = grad + row * grad_row_stride;
    const std::int64_t tgt = targets[row];
    const bool ignored = tgt == ignore_index;
    const float l2 = lse[row] * kLog2e;
    const float gi = (ignored || !g_logp) ? 0.0f : g_logp[row] * inv_t;
    const float ce = (ignored || !g_entropy) ? 0.0f : -g_entropy[row] * inv_t;
    const float h = (entropy && g_entropy) ? entropy[row] : 0.0f;
    std::int64_t tail = 0;
    if (((reinterpret_cast<std::uintptr_t>(x) | reinterpret_cast<std::uintptr_t>(gr)) & 15u) == 0) {
      // Row-local indices fit in 32 bits (vocab < 2^31 is checked at launch).
      const int nvec = static_cast<int>(vocab / kVec);
      const uint4* xv = reinterpret_cast<const uint4*>(x);
      uint4* gv = reinterpret_cast<uint4*>(gr);
      const int step = static_cast<int>(blockDim.x);
      if (ignored) {
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);  // +0.0 in every dtype
        for (int v = threadIdx.x; v < nvec; v += step) gv[v] = zero;
      } else {
        // Vector holding the target (if any): its thread adds inv_t * g there.
        const bool in_vec = tgt >= 0 && tgt < static_cast<std::int64_t>(nvec) * kVec;
        const int t32 = in_vec ? static_cast<int>(tgt) : -1;
        const int tvec = in_vec ? t32 / kVec : -1;
        int v = threadIdx.x;
        for (; v + step < nvec; v += 2 * step) {  // two loads in flight
          const uint4 r0 = xv[v], r1 = xv[v + step];
          gv[v] = grad_vector<D, kEntropy, kVec>(r0, v, tvec, t32, c, l2, gi, ce, h);
          gv[v + step] = grad_vector<D, kEntropy, kVec>(r1, v + step, tvec, t32, c, l2, gi, ce, h);
        }
        if (v < nvec) gv[v] = grad_vector<D, kEntropy, kVec>(xv[v], v, tvec, t32, c, l2, gi, ce, h);
      }
      tail = static_cast<std::int64_t>(nvec) * kVec;
    }
    for (std::int64_t j = tail + threadIdx.x; j < vocab; j += blockDim.x) {
      float out = 0.0f;
      if (!ignored) {
        out = grad_at<kEntropy>(CElem<D>::load(x[j]), c, l2, gi, ce, h);
        if (j == tgt) out += gi;
      }
      gr[j] = CElem<D>::store(out);
    }
  }
}

// ---- group advantages ----
template <typename F>
__device__ double block_reduce(double v, double* smem, F op, double identity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = threadIdx.x < kWarps ? smem[threadIdx.x] : identity;
  if (warp == 0) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    if (lane == 0) smem[0] = v;
  }
  __syncthreads();
  const double result = smem[0];
  __syncthreads();
  return result;
}

struct Add {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct Max {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};

template <typename R>
__global__ void __launch_bounds__(kThreads)
    advantages_kernel(const R* __restrict__ r, const std::int64_t* __restrict__ perm,
                      const std::int64_t* __restrict__ offsets, std::int64_t num_groups,
                      std::int64_t group_size, int baseline, int scale, double eps,
                      R* __restrict__ out, unsigned long long* bad_index) {
  __shared__ double smem[kWarps];
  for (std::int64_t grp = blockIdx.x; grp < num_groups; grp += gridDim.x) {
    const std::int64_t begin = perm ? offsets[grp] : grp * group_size;
    const std::int64_t end = perm ? offsets[grp + 1] : begin + group_size;
    double sum = 0.0, mx = -INFINITY;
    for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
      const std::int64_t i = perm ? perm[k] : k;
      const double v = static_cast<double>(r[i]);
      if (!isfinite(v)) atomicMin(bad_index, static_cast<unsigned long long>(i));
      sum += v;
      mx = fmax(mx, v);
    }
    const double n = static_cast<double>(end - begin);
    const double mean = block_reduce(sum, smem, Add{}, 0.0) / n;
    const double gmax = block_reduce(mx, smem, Max{}, -INFINITY);
    double stdev = 0.0;
    if (scale == 1) {
      double sq = 0.0;
      for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
        const double d = static_cast<double>(r[perm ? perm[k] : k]) - mean;
        sq += d * d;
      }
      stdev = sqrt(block_reduce(sq, smem, Add{}, 0.0) / n);  // population std
    }
    for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
      const std::int64_t i = perm ? perm[k] : k;
      const double v = static_cast<double>(r[i]);
      double a;
      switch (baseline) {
        case 0: a = v; break;
        case 1: a = v - mean; break;
        case 2: a = n > 1.0 ? (v - mean) * (n / (n - 1.0)) : 0.0; break;
        default: a = v - gmax; break;
      }
      if (scale == 1) a /= (stdev + eps);
      out[i] = static_cast<R>(a);
    }
  }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("comlrl.kernels CUDA error in ") + what + ": " +
                             cudaGetErrorString(err));
}

void set_device(int device) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check(cudaSetDevice(device), "cudaSetDevice");
}

unsigned grid_for(std::int64_t n) { return static_cast<unsigned>(n < kMaxGrid ? n : kMaxGrid); }

std::string dtype_error(int dtype) {
  return "unsupported logits dtype code " + std::to_string(dtype) +
         " (expected 0=float32, 1=float16, 2=bfloat16)";
}

template <int D>
void launch_forward(std::uintptr_t logits, std::int64_t n_rows, std::int64_t vocab,
                    std::int64_t row_stride, std::uintptr_t targets, std::int64_t ignore_index,
                    float inv_t, std::uintptr_t logp, std::uintptr_t lse, std::uintptr_t entropy,
                    cudaStream_t stream) {
  using T = typename CElem<D>::T;
  auto x = reinterpret_cast<const T*>(logits);
  auto tg = reinterpret_cast<const std::int64_t*>(targets);
  if (entropy)
    forward_kernel<D, true><<<grid_for(n_rows), kThreads, 0, stream>>>(
        x, n_rows, vocab, row_stride, tg, ignore_index, inv_t, reinterpret_cast<float*>(logp),
        reinterpret_cast<float*>(lse), reinterpret_cast<float*>(entropy));
  else
    forward_kernel<D, false><<<grid_for(n_rows), kThreads, 0, stream>>>(
        x, n_rows, vocab, row_stride, tg, ignore_index, inv_t, reinterpret_cast<float*>(logp),
        reinterpret_cast<float*>(lse), nullptr);
}

template <int D>
void launch_backward(std::uintptr_t logits, std::int64_t n_rows, std::int64_t vocab,
                     std::int64_t row_stride, std::uintptr_t targets, std::int64_t ignore_index,
                     float inv_t, std::uintptr_t lse, std::uintptr_t g_logp,
                     std::uintptr_t g_entropy, std::uintptr_t entropy, std::uintptr_t grad,
                     std::int64_t grad_row_stride, cudaStream_t stream) {
  using T = typename CElem<D>::T;
  auto kernel = g_entropy ? backward_kernel<D, true> : backward_kernel<D, false>;
  kernel<<<grid_for(n_rows), kThreads, 0, stream>>>(
      reinterpret_cast<const T*>(logits), n_rows, vocab, row_stride,
      reinterpret_cast<const std::int64_t*>(targets), ignore_index, inv_t,
      reinterpret_cast<const float*>(lse), reinterpret_cast<const float*>(g_logp),
      reinterpret_cast<const float*>(g_entropy), reinterpret_cast<const float*>(entropy),
      reinterpret_cast<T*>(grad), grad_row_stride);
}

}  // namespace

void token_logprobs_forward(std::uintptr_t logits, int dtype, std::int64_t n_rows,
                            std::int64_t vocab, std::int64_t row_stride, std::uintptr_t targets,
                            std::int64_t ignore_index, float temperature, std::uintptr_t logp,
                            std::uintptr_t lse, std::uintptr_t entropy, int device,
                            std::uintptr_t stream) {
  if (n_rows <= 0) return;
  set_device(device);
  const float inv_t = 1.0f / temperature;
  auto s = reinterpret_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kFloat32:
      launch_forward<kFloat32>(logits, n_rows, vocab, row_stride, targets, ignore_index, inv_t,
                               logp, lse, entropy, s);
      break;
    case kFloat16:
      launch_forward<kFloat16>(logits, n_rows, vocab, row_stride, targets, ignore_index, inv_t,
                               logp, lse, entropy, s);
      break;
    case kBFloat16:
      launch_forward<kBFloat16>(logits, n_rows, vocab, row_stride, targets, ignore_index, inv_t,
                                logp, lse, entropy, s);
      break;
    default:
      throw std::runtime_error(dtype_error(dtype));
  }
  check(cudaGetLastError(), "token_logprobs forward launch");
}

void token_logprobs_backward(std::uintptr_t logits, int dtype, std::int64_t n_rows,
                             std::int64_t vocab, std::int64_t row_stride, std::uintptr_t targets,
                             std::int64_t ignore_index, float temperature, std::uintptr_t lse,
                             std::uintptr_t g_logp, std::uintptr_t g_entropy,
                             std::uintptr_t entropy, std::uintptr_t grad,
                             std::int64_t grad_row_stride, int device, std::uintptr_t stream) {
  if (n_rows <= 0) return;
  if (vocab > 0x7fffffffLL)
    throw std::runtime_error("token_logprobs: vocabulary size " + std::to_string(vocab) +
                             " exceeds 2^31 - 1 (the CUDA backward indexes a row in 32 bits)");
  set_device(device);
  const float inv_t = 1.0f / temperature;
  auto s = reinterpret_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kFloat32:
      launch_backward<kFloat32>(logits, n_rows, vocab, row_stride, targets, ignore_index, inv_t,
                                lse, g_logp, g_entropy, entropy, grad, grad_row_stride, s);
      break;
    case kFloat16:
      launch_backward<kFloat16>(logits, n_rows, vocab, row_stride, targets, ignore_index, inv_t,
                                lse, g_logp, g_entropy, entropy, grad, grad_row_stride, s);
      break;
    case kBFloat16:
      launch_backward<kBFloat16>(logits, n_rows, vocab, row_stride, targets, ignore_index, inv_t,
                                 lse, g_logp, g_entropy, entropy, grad, grad_row_stride, s);
      break;
    default:
      throw std::runtime_error(dtype_error(dtype));
  }
  check(cudaGetLastError(), "token_logprobs backward launch");
}

void group_advantages(std::uintptr_t rewards, int dtype, std::int64_t m, std::uintptr_t perm,
                      std::uintptr_t offsets, std::int64_t num_groups, std::int64_t group_size,
                      int baseline, int scale, double eps, std::uintptr_t out,
                      std::uintptr_t bad_index, int device, std::uintptr_t stream) {
  set_device(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  auto bad = reinterpret_cast<unsigned long long*>(bad_index);
  // 0xFF.. bytes: ULLONG_MAX for atomicMin, reads back as -1 (kNoBadIndex) as int64.
  check(cudaMemsetAsync(bad, 0xFF, sizeof(unsigned long long), s), "cudaMemsetAsync");
  if (m <= 0 || num_groups <= 0) return;
  auto p = reinterpret_cast<const std::int64_t*>(perm);
  auto o = reinterpret_cast<const std::int64_t*>(offsets);
  if (dtype == kFloat32)
    advantages_kernel<float><<<grid_for(num_groups), kThreads, 0, s>>>(
        reinterpret_cast<const float*>(rewards), p, o, num_groups, group_size, baseline, scale,
        eps, reinterpret_cast<float*>(out), bad);
  else if (dtype == kFloat64)
    advantages_kernel<double><<<grid_for(num_groups), kThreads, 0, s>>>(
        reinterpret_cast<const double*>(rewards), p, o, num_groups, group_size, baseline, scale,
        eps, reinterpret_cast<double*>(out), bad);
  else
    throw std::runtime_error("unsupported rewards dtype code " + std::to_string(dtype) +
                             " (expected 0=float32 or 3=float64)");
  check(cudaGetLastError(), "group_advantages launch");
}

int device_count(std::string* error) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (error) *error = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error state
    return 0;
  }
  return n;
}

}  // namespace comlrl::cuda
