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
// engine/fused/cuda/build.sh small (nvcc, sm_90a). Return codes: 0 ok, 1 bad shape or
// variant, 2 CUTLASS refused the problem, 3 needs a workspace, 4 launch failed.
// ``qa_small_gemm_pass`` runs the three kinds a small-batch pass needs (plain, bias + GELU,
// split-K partials); ``cutlass_small.install`` swaps them into the engine's seven-kernel
// small-batch layer (``ab_replay.py --setup``) and ``cutlass_small.py --check-pass``
// checks them against torch.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace {

using namespace cute;

using Element = cutlass::half_t;

// CUTLASS's kernel lets the next kernel launch (griddepcontrol.launch_dependents) only
// after its main loop; the engine's Triton kernels do it right after their wait, so the
// next kernel's weight prefetch overlaps this one. This main loop does the same: it
// triggers as its producer warp starts loading (after the wait).
template <class Base>
struct EarlyTrigger : Base {
  template <class... Args>
  CUTLASS_DEVICE void load(Args&&... args) {
    cutlass::arch::launch_dependent_grids();
    Base::load(static_cast<Args&&>(args)...);
  }
};

template <class Tile, class Cluster, class ElementD = Element,
          class Fusion = cutlass::epilogue::fusion::LinearCombination<ElementD, float>,
          bool kBias = false, bool kEarly = false>
struct SmallGemm {
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
      cutlass::epilogue::TmaWarpSpecialized, Fusion>::CollectiveOp;
  using BaseMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor,
      8, Element, cutlass::layout::ColumnMajor, 8, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp;
  using Mainloop = std::conditional_t<kEarly, EarlyTrigger<BaseMainloop>, BaseMainloop>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // Batch l of L multiplies K slice l of A and B (columns l*ks .. l*ks+ks of both) into
  // D[l] ([M, N]): split-K as a batched GEMM, so each batch's D is one split's partial.
  static typename Gemm::Arguments arguments(const void* a, const void* b, const void* bias,
                                            void* d, int m, int n, int k, int splits) {
    int ks = k / splits;
    typename Kernel::StrideA stride_a{};
    typename Kernel::StrideB stride_b{};
    typename Kernel::StrideD stride_d{};
    cute::get<0>(stride_a) = k;
    cute::get<2>(stride_a) = ks;
    cute::get<0>(stride_b) = k;
    cute::get<2>(stride_b) = ks;
    cute::get<0>(stride_d) = n;
    cute::get<2>(stride_d) = static_cast<int64_t>(m) * n;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kBatched,
        {m, n, ks, splits},
        {static_cast<const Element*>(a), stride_a, static_cast<const Element*>(b), stride_b},
        {{}, nullptr, stride_d, static_cast<ElementD*>(d), stride_d}};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
    if constexpr (kBias) {
      args.epilogue.thread.bias_ptr = static_cast<const typename Fusion::ElementBias*>(bias);
    }
    return args;
  }

  static int run(const void* a, const void* b, const void* bias, void* d, int m, int n, int k,
                 int splits, bool pdl, cudaStream_t stream) {
    if (splits < 1 || k % splits || (k / splits) % 8) return 1;
    auto args = arguments(a, b, bias, d, m, n, k, splits);
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 2;
    if (Gemm::get_workspace_size(args) != 0) return 3;
    if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return 4;
    return gemm.run(stream, nullptr, pdl) == cutlass::Status::kSuccess ? 0 : 4;
  }

  static int run(const void* a, const void* b, void* d, int m, int n, int k, bool pdl,
                 cudaStream_t stream) {
    return run(a, b, nullptr, d, m, n, k, 1, pdl, stream);
  }
};

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

// The kernels a small-batch pass can swap in (``qa_small_gemm_pass``), 64x64x64, no cluster:
// plain (QKV), bias + exact GELU (FFN1), float32 split-K partials (out-projection, FFN2);
// each also with the early trigger.
template <bool kEarly>
using PassPlain = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _1, _1>, Element,
                            cutlass::epilogue::fusion::LinearCombination<Element, float>, false,
                            kEarly>;
template <bool kEarly>
using PassBiasGelu = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _1, _1>, Element,
                               cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
                                   cutlass::epilogue::thread::GELU, Element, float, float>,
                               true, kEarly>;
template <bool kEarly>
using PassPartial = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _1, _1>, float,
                              cutlass::epilogue::fusion::LinearCombination<float, float>,
                              false, kEarly>;


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
