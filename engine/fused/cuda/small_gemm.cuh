// CUTLASS 4 SM90 GEMMs for batch-1 sizes (D[M, N] = A[M, K] . B[N, K]^T, fp16 operands, M ~
// 128 tokens): the TMA warp-specialized kernel, with programmatic dependent launch when
// built with CUTLASS_ENABLE_GDC_FOR_SM90 (each CTA waits on griddepcontrol before its first
// load). Shared by the engine's library (engine/fused/cuda/small_gemm.cu) and the
// benchmark's cluster and pass variants (benchmarks/cutlass/small_gemm.cu). Measured in
// engine/fused/NOTES.md, v16.

#pragma once

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

namespace qa_small {

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

// The engine's small-batch kernels (64x64x64, no cluster): plain (QKV) and bias + exact
// GELU (FFN1); ``kEarly`` variants for the benchmark (benchmarks/cutlass/small_gemm.cu).
template <bool kEarly>
using PassPlain = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _1, _1>, Element,
                            cutlass::epilogue::fusion::LinearCombination<Element, float>, false,
                            kEarly>;
template <bool kEarly>
using PassBiasGelu = SmallGemm<Shape<_64, _64, _64>, Shape<_1, _1, _1>, Element,
                               cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
                                   cutlass::epilogue::thread::GELU, Element, float, float>,
                               true, kEarly>;

}  // namespace qa_small
