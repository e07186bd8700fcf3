// The block-scaled FP8 GEMM's CUTLASS types, shared by the engine's library
// (fp8_blockwise.cu) and its standalone benchmark (benchmarks/cutlass/fp8_blockwise_gemm.cu).
// See fp8_blockwise.cu for the operands and scale layouts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace qa_fp8 {

using namespace cute;

using ElementAB = cutlass::float_e4m3_t;
using ElementAcc = float;
using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_1, _2, _1>;
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN,
                                                             cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

// The epilogue: D = acc by default; benchmarks also try bias + GELU.
template <class ElementD, class Fusion = cutlass::epilogue::fusion::LinearCombination<
                              ElementD, float, ElementD, float>>
struct Kernel {
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignD = 8;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, ElementD, LayoutD,
      kAlignD, ElementD, LayoutD, kAlignD, cutlass::epilogue::TmaWarpSpecializedCooperative,
      Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, 16, ElementAB,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, 16, ElementAcc, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                          Epilogue,
                                                          cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments arguments(const void* a, const void* b, const float* sfa,
                                            const float* sfb, void* d, int m, int n, int k) {
    using GK = typename Gemm::GemmKernel;
    auto stride_a = cutlass::make_cute_packed_stride(typename GK::StrideA{}, make_shape(m, k, 1));
    auto stride_b = cutlass::make_cute_packed_stride(typename GK::StrideB{}, make_shape(n, k, 1));
    auto stride_d = cutlass::make_cute_packed_stride(typename GK::StrideD{}, make_shape(m, n, 1));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const ElementAB*>(a), stride_a, static_cast<const ElementAB*>(b), stride_b,
         sfa, ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1)), sfb,
         ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1))},
        {{}, static_cast<ElementD*>(d), stride_d, static_cast<ElementD*>(d), stride_d}};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;  // C (= D) is never read
    return args;
  }
};

}  // namespace qa_fp8
