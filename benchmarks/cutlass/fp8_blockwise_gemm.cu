// Block-scaled FP8 GEMMs on Hopper through CUTLASS 4: speed and correctness at the shapes
// of the BERT-large SQuAD-mix pass, with and without a bias + exact-GELU epilogue.
//
//   fp8_blockwise_gemm M N K [iterations]
//
// D[M, N] (fp16, row-major) = epilogue(sum_kb SFA[m, kb] SFB[n / 128, kb] (A[m, kb] . B[n, kb]))
// with A [M, K] e4m3 activations scaled per token per 128 input channels (1x128) and B
// [N, K] e4m3 weights scaled per 128x128 block: the scales a GEMM epilogue could produce
// for its own output tile (no whole-row amax), and finer than per-token scales. Two
// epilogues: plain (D = acc) and D = GELU(acc + bias[n]) (CUTLASS's erf GELU).
//
// Prints one line per epilogue: microseconds per call (median of `iterations` timed with
// CUDA events), TFLOP/s, and the largest error against a host reference over 4 rows
// (relative to the mean |D| of those rows). Random data from a hash; the scales are
// random positive numbers. Built by `engine/fused/cuda/build.sh bench` (nvcc, sm_90a).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../engine/fused/cuda/fp8_blockwise.cuh"
#include "cutlass/epilogue/thread/activation.h"

using namespace cute;
using qa_fp8::ScaleConfig;

#define CHECK_CUDA(x)                                                              \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)
#define CHECK_CUTLASS(x)                                                           \
  do {                                                                             \
    cutlass::Status s_ = (x);                                                      \
    if (s_ != cutlass::Status::kSuccess) {                                         \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cutlassGetStatusString(s_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

using ElementA = qa_fp8::ElementAB;
using ElementB = qa_fp8::ElementAB;
using ElementD = cutlass::half_t;
using ElementBias = cutlass::half_t;
using Plain = qa_fp8::Kernel<ElementD>;
using BiasGelu = qa_fp8::Kernel<ElementD, cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
    cutlass::epilogue::thread::GELU, ElementD, float, ElementBias, ElementD, float>>;

// ------------------------------------------------------------------------------ data

__host__ __device__ inline float hash_uniform(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31; x *= 0x94D049BB133111EBull; x ^= x >> 29;
  return float(x >> 40) / float(1ull << 24);  // [0, 1)
}

// e4m3 values in [-448, 448) spread like a quantized activation (|x| up to the max).
__global__ void fill_fp8(ElementA* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float u = hash_uniform(i, seed) * 2.f - 1.f;
    p[i] = ElementA(u * u * u * 448.f);
  }
}

__global__ void fill_float(float* p, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * hash_uniform(i, seed);
}

__global__ void fill_half(ElementBias* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = ElementBias(hash_uniform(i, seed) * 2.f - 1.f);
}

template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// ------------------------------------------------------------------------------ run

template <class K>
void run(const char* name, int m, int n, int k, int iters, const ElementA* a,
         const ElementB* b, const float* sfa, const float* sfb, const ElementBias* bias,
         ElementD* d, bool gelu) {
  using Gemm = typename K::Gemm;
  auto layout_sfa = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  auto layout_sfb = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  auto args = K::arguments(a, b, sfa, sfb, d, m, n, k);
  if constexpr (std::is_same_v<K, BiasGelu>) args.epilogue.thread.bias_ptr = bias;

  Gemm gemm;
  size_t ws = Gemm::get_workspace_size(args);
  void* workspace = nullptr;
  if (ws) CHECK_CUDA(cudaMalloc(&workspace, ws));
  CHECK_CUTLASS(gemm.can_implement(args));
  CHECK_CUTLASS(gemm.initialize(args, workspace));
  CHECK_CUTLASS(gemm.run());
  CHECK_CUDA(cudaDeviceSynchronize());

  std::vector<float> times;
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < iters + 3; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    CHECK_CUTLASS(gemm.run());
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 3) times.push_back(ms * 1e3f);
  }
  std::sort(times.begin(), times.end());
  float us = times[times.size() / 2];

  // Host reference for 4 rows (first, two inside, last), from the same e4m3 data and scales.
  auto ha = to_host(a, size_t(m) * k);
  auto hb = to_host(b, size_t(n) * k);
  auto hsfa = to_host(sfa, size_t(size(filter_zeros(layout_sfa))));
  auto hsfb = to_host(sfb, size_t(size(filter_zeros(layout_sfb))));
  auto hbias = to_host(bias, n);
  auto hd = to_host(d, size_t(m) * n);
  auto SFA = make_tensor(hsfa.data(), layout_sfa);
  auto SFB = make_tensor(hsfb.data(), layout_sfb);
  double max_err = 0, mean_abs = 0;
  int rows[4] = {0, m / 3, (2 * m) / 3, m - 1};
  for (int r : rows) {
    for (int c = 0; c < n; ++c) {
      double acc = 0;
      for (int kb = 0; kb < k; kb += 128) {
        double part = 0;
        for (int kk = kb; kk < std::min(k, kb + 128); ++kk)
          part += double(float(ha[size_t(r) * k + kk])) * double(float(hb[size_t(c) * k + kk]));
        acc += part * double(SFA(r, kb, 0)) * double(SFB(c, kb, 0));
      }
      if (gelu) {
        acc += double(float(hbias[c]));
        acc = 0.5 * acc * (1.0 + std::erf(acc / std::sqrt(2.0)));
      }
      double got = double(float(hd[size_t(r) * n + c]));
      max_err = std::max(max_err, std::fabs(got - acc));
      mean_abs += std::fabs(acc);
    }
  }
  mean_abs /= 4.0 * n;
  double tflops = 2.0 * m * n * double(k) / (us * 1e-6) / 1e12;
  std::printf("%s M=%d N=%d K=%d: %.1f us, %.0f TFLOP/s, max |err| / mean |D| = %.2e\n", name,
              m, n, k, us, tflops, max_err / mean_abs);
  if (workspace) CHECK_CUDA(cudaFree(workspace));
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s M N K [iterations]\n", argv[0]);
    return 2;
  }
  int m = std::atoi(argv[1]), n = std::atoi(argv[2]), k = std::atoi(argv[3]);
  int iters = argc > 4 ? std::atoi(argv[4]) : 20;
  if (n % 128 || k % 128) {
    std::fprintf(stderr, "N and K must be multiples of 128\n");
    return 2;
  }
  auto layout_sfa = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  auto layout_sfb = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  size_t n_sfa = size(filter_zeros(layout_sfa)), n_sfb = size(filter_zeros(layout_sfb));
  ElementA *a, *b;
  float *sfa, *sfb;
  ElementBias* bias;
  ElementD* d;
  CHECK_CUDA(cudaMalloc(&a, size_t(m) * k));
  CHECK_CUDA(cudaMalloc(&b, size_t(n) * k));
  CHECK_CUDA(cudaMalloc(&sfa, n_sfa * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&sfb, n_sfb * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&bias, n * sizeof(ElementBias)));
  CHECK_CUDA(cudaMalloc(&d, size_t(m) * n * sizeof(ElementD)));
  fill_fp8<<<1024, 256>>>(a, size_t(m) * k, 1);
  fill_fp8<<<1024, 256>>>(b, size_t(n) * k, 2);
  // Scales so that |D| is O(1): activations ~ 1/448 per unit, weights ~ 0.03/448.
  fill_float<<<256, 256>>>(sfa, n_sfa, 3, 0.5f / 448.f, 1.5f / 448.f);
  fill_float<<<256, 256>>>(sfb, n_sfb, 4, 0.015f / 448.f, 0.045f / 448.f);
  fill_half<<<64, 256>>>(bias, n, 5);
  CHECK_CUDA(cudaDeviceSynchronize());
  run<Plain>("blockwise fp8, plain", m, n, k, iters, a, b, sfa, sfb, bias, d, false);
  run<BiasGelu>("blockwise fp8, bias+GELU", m, n, k, iters, a, b, sfa, sfb, bias, d,
                        true);
  return 0;
}
