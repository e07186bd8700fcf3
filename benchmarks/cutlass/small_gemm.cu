// Batch-1 GEMMs (D[M, N] fp16 = A[M, K] . B[N, K]^T, M ~ 128 tokens) as CUTLASS 4 SM90
// TMA warp-specialized kernels with thread-block clusters, behind a C API for ctypes: the
// experiment of NOTES' next step 2 (does sharing operand tiles across a cluster through TMA
// multicast shorten the small-batch GEMMs?).
//
// At 128 tokens a GEMM's programs together pull several times the weight bytes out of L2:
// every column tile re-reads its row block of A, every row tile re-reads its weight tile.
// In a cluster of (cm, cn) CTAs, CUTLASS loads each A tile once for the cn CTAs that share
// it (multicast along N) and each B tile once for the cm CTAs (along M). Variants differ
// only in tile and cluster. Launched with programmatic dependent launch when asked (built
// with CUTLASS_ENABLE_GDC_FOR_SM90: each CTA waits on griddepcontrol before its first load
// and lets the next kernel launch after its main loop, or, for the pass kinds 3-5, as its
// loads start: EarlyTrigger). Timed by
// benchmarks/cutlass_small.py against the engine's Triton GEMM. Built by
// engine/fused/cuda/build.sh small-bench (nvcc, sm_90a). Return codes: 0 ok, 1 bad shape or
// variant, 2 CUTLASS refused the problem, 3 needs a workspace, 4 launch failed.
// ``qa_small_gemm_pass`` runs the three kinds a small-batch pass needs (plain, bias + GELU,
// split-K partials); ``cutlass_small.install`` swaps them into the engine's seven-kernel
// small-batch layer (``ab_replay.py --setup``) and ``cutlass_small.py --check-pass``
// checks them against torch. The kernel templates are in engine/fused/cuda/small_gemm.cuh.

#include "small_gemm.cuh"

namespace {

using namespace qa_small;

// Float32 split-K partials (the out-projection's and FFN2's, as the engine's Triton GEMMs
// leave them): a batched GEMM over K slices (SmallGemm::arguments).
template <bool kEarly>
using PassPartial = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _1, _1>, float,
                              cutlass::epilogue::fusion::LinearCombination<float, float>,
                              false, kEarly>;

using V0 = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _1, _1>>;
using V1 = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _2, _1>>;
using V2 = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _4, _1>>;
using V3 = SmallGemm<Shape<_64, _64, _64>, Shape<_2, _2, _1>>;
using V4 = SmallGemm<Shape<_64, _64, _64>, Shape<_2, _4, _1>>;
using V5 = SmallGemm<Shape<_64, _128, _64>, Shape<_1, _1, _1>>;
using V6 = SmallGemm<Shape<_64, _128, _64>, Shape<_2, _2, _1>>;
using V7 = SmallGemm<Shape<_128, _64, _64>, Shape<_1, _4, _1>>;

const char* const kNames[] = {
    "64x64x64 cluster 1x1", "64x64x64 cluster 1x2", "64x64x64 cluster 1x4",
    "64x64x64 cluster 2x2", "64x64x64 cluster 2x4", "64x128x64 cluster 1x1",
    "64x128x64 cluster 2x2", "128x64x64 cluster 1x4"};
constexpr int kVariants = 8;

bool shape_ok(int m, int n, int k) { return m > 0 && n > 0 && k > 0 && n % 8 == 0 && k % 8 == 0; }

}  // namespace

extern "C" {

int qa_small_gemm_variants() { return kVariants; }

const char* qa_small_gemm_name(int variant) {
  return variant >= 0 && variant < kVariants ? kNames[variant] : "";
}

// D = A B^T in fp16 (float accumulation). See the file comment.
int qa_small_gemm(int variant, const void* a, const void* b, void* d, int m, int n, int k,
                  int pdl, void* stream) {
  if (!shape_ok(m, n, k)) return 1;
  auto s = static_cast<cudaStream_t>(stream);
  bool p = pdl != 0;
  switch (variant) {
    case 0: return V0::run(a, b, d, m, n, k, p, s);
    case 1: return V1::run(a, b, d, m, n, k, p, s);
    case 2: return V2::run(a, b, d, m, n, k, p, s);
    case 3: return V3::run(a, b, d, m, n, k, p, s);
    case 4: return V4::run(a, b, d, m, n, k, p, s);
    case 5: return V5::run(a, b, d, m, n, k, p, s);
    case 6: return V6::run(a, b, d, m, n, k, p, s);
    case 7: return V7::run(a, b, d, m, n, k, p, s);
    default: return 1;
  }
}

// One GEMM of a small-batch pass: kind 0 D = A B^T (fp16), kind 1 D = GELU_erf(A B^T + bias)
// (fp16, bias float32 [N], as the engine keeps its biases), kind 2 D[s] = A[:, s-th K slice] B[:, s-th K slice]^T for s <
// splits (float32 [splits, M, N]); kinds 3-5 are 0-2 with the early trigger (EarlyTrigger).
int qa_small_gemm_pass(int kind, const void* a, const void* b, const void* bias, void* d,
                       int m, int n, int k, int splits, int pdl, void* stream) {
  if (!shape_ok(m, n, k)) return 1;
  auto s = static_cast<cudaStream_t>(stream);
  bool p = pdl != 0;
  switch (kind) {
    case 0: return splits == 1 ? PassPlain<false>::run(a, b, nullptr, d, m, n, k, 1, p, s) : 1;
    case 1: return splits == 1 ? PassBiasGelu<false>::run(a, b, bias, d, m, n, k, 1, p, s) : 1;
    case 2: return PassPartial<false>::run(a, b, nullptr, d, m, n, k, splits, p, s);
    case 3: return splits == 1 ? PassPlain<true>::run(a, b, nullptr, d, m, n, k, 1, p, s) : 1;
    case 4: return splits == 1 ? PassBiasGelu<true>::run(a, b, bias, d, m, n, k, 1, p, s) : 1;
    case 5: return PassPartial<true>::run(a, b, nullptr, d, m, n, k, splits, p, s);
    default: return 1;
  }
}

}  // extern "C"
