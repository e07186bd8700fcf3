// Block-scaled FP8 GEMM for the fused engine (Hopper, CUTLASS 4), behind a C API for ctypes.
//
//   D[M, N] = sum_kb SFA[m, kb] * SFB[n / 128, kb] * (A[m, kb-block] . B[n, kb-block])
//
// A [M, K] e4m3 row-major (activations, one float32 scale per token per 128 columns),
// B [N, K] e4m3 row-major (weights, one scale per 128x128 block), D [M, N] fp16 or bf16
// row-major. Scale layouts (what CUTLASS's Sm90BlockwiseScaleConfig<1, 128, 128, MN, K>
// reads): SFA is M-major, ``sfa[kb * M + m]``; SFB is K-major, ``sfb[nb * (K / 128) + kb]``
// (``qa_fp8_sf_offsets`` reports both, so Python can check them). M must be a multiple of
// 4 (TMA reads the M-major scales in 16-byte rows); N and K multiples of 128.
//
// Measured (H200, 2026-11-30, M = 47,392, benchmarks/fp8_scaling.py, the same operands for
// every scheme, graph of 24 calls): QKV 358 us, FFN1 481, FFN2 377, against cuBLAS
// row-wise 316 / 440 / 372 and cuBLAS block-wise (_scaled_mm) 290 / 425 / 398. Alone on
// other data (benchmarks/cutlass/fp8_blockwise_gemm.cu) it had timed 316 / 413 / 330.
//
// Built by engine/fused/cuda/build.sh (nvcc, sm_90a, -DNDEBUG: with asserts ptxas
// serialises the wgmma pipeline). Return codes: 0 ok, 1 bad shape, 2 CUTLASS refused the
// problem, 3 workspace too small, 4 launch failed.

#include <cstddef>
#include <cstdint>

#include "fp8_blockwise.cuh"

namespace {

using qa_fp8::Kernel;
using qa_fp8::ScaleConfig;
using namespace cute;

bool shape_ok(int m, int n, int k) {
  return m > 0 && n > 0 && k > 0 && m % 4 == 0 && n % 128 == 0 && k % 128 == 0;
}

template <class ElementD>
int run(const void* a, const void* b, const float* sfa, const float* sfb, void* d, int m, int n,
        int k, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using K = Kernel<ElementD>;
  if (!shape_ok(m, n, k)) return 1;
  auto args = K::arguments(a, b, sfa, sfb, d, m, n, k);
  typename K::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 2;
  if (K::Gemm::get_workspace_size(args) > workspace_bytes) return 3;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return 4;
  return gemm.run(stream) == cutlass::Status::kSuccess ? 0 : 4;
}

}  // namespace

extern "C" {

// Bytes of workspace the GEMM needs for this shape (0 for a bad shape).
size_t qa_fp8_workspace(int m, int n, int k) {
  if (!shape_ok(m, n, k)) return 0;
  auto args = Kernel<cutlass::half_t>::arguments(nullptr, nullptr, nullptr, nullptr, nullptr, m,
                                                 n, k);
  auto bf = Kernel<cutlass::bfloat16_t>::arguments(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                   m, n, k);
  size_t a = Kernel<cutlass::half_t>::Gemm::get_workspace_size(args);
  size_t b = Kernel<cutlass::bfloat16_t>::Gemm::get_workspace_size(bf);
  return a > b ? a : b;
}

// out[0..1]: offsets of SFA at (m=1, kb=0) and (m=0, kb=1); out[2..3]: of SFB at
// (nb=1, kb=0) and (nb=0, kb=1). Host only: lets Python check the layouts it writes.
void qa_fp8_sf_offsets(int m, int n, int k, long long* out) {
  auto sfa = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  auto sfb = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  out[0] = sfa(1, 0, 0);
  out[1] = sfa(0, 128, 0);
  out[2] = sfb(128, 0, 0);
  out[3] = sfb(0, 128, 0);
}

// D = A B^T with block scales; out_dtype 0: fp16, 1: bf16. See the file comment.
int qa_fp8_gemm(const void* a, const void* b, const float* sfa, const float* sfb, void* d, int m,
                int n, int k, int out_dtype, void* workspace, size_t workspace_bytes,
                void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (out_dtype == 0)
    return run<cutlass::half_t>(a, b, sfa, sfb, d, m, n, k, workspace, workspace_bytes, s);
  if (out_dtype == 1)
    return run<cutlass::bfloat16_t>(a, b, sfa, sfb, d, m, n, k, workspace, workspace_bytes, s);
  return 1;
}

}  // extern "C"
