// The small-batch layer's QKV and FFN1 GEMMs as CUTLASS kernels, behind a C API for ctypes
// (engine/fused/small_gemm.py; engine option ``cutlass_small_gemms``):
//
//   kind 0:  D[M, N] fp16 = A[M, K] . B[N, K]^T
//   kind 1:  D[M, N] fp16 = GELU_erf(A[M, K] . B[N, K]^T + bias[N])   (bias float32)
//
// A, B fp16 row-major, float accumulation, 64x64x64 tiles, no cluster; launched with
// programmatic dependent launch when ``pdl`` (the kernel waits on griddepcontrol before its
// first load). On BERT-large at 128 tokens these made the seven-kernel layer's pass 5.5-6%
// faster than the engine's Triton GEMMs (H200, engine/fused/NOTES.md, v16). Built by
// engine/fused/cuda/build.sh small (nvcc, sm_90a). Return codes: 0 ok, 1 bad shape or kind,
// 2 CUTLASS refused the problem, 3 needs a workspace, 4 launch failed.

#include "small_gemm.cuh"

extern "C" {

int qa_small_gemm_linear(int kind, const void* a, const void* b, const void* bias, void* d,
                         int m, int n, int k, int pdl, void* stream) {
  if (m <= 0 || n <= 0 || k <= 0 || n % 8 || k % 8) return 1;
  auto s = static_cast<cudaStream_t>(stream);
  switch (kind) {
    case 0: return qa_small::PassPlain<false>::run(a, b, nullptr, d, m, n, k, 1, pdl != 0, s);
    case 1: return qa_small::PassBiasGelu<false>::run(a, b, bias, d, m, n, k, 1, pdl != 0, s);
    default: return 1;
  }
}

}  // extern "C"
