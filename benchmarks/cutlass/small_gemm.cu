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
// and lets the next kernel launch after its main loop). Timed by
// benchmarks/cutlass_small.py against the engine's Triton GEMM. Built by
// engine/fused/cuda/build.sh small (nvcc, sm_90a). Return codes: 0 ok, 1 bad shape or
// variant, 2 CUTLASS refused the problem, 3 needs a workspace, 4 launch failed.

#include <cstddef>
#include <cstdint>

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

template <class Tile, class Cluster>
struct SmallGemm {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor, 8, Element, cutlass::layout::RowMajor, 8,
      cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor,
      8, Element, cutlass::layout::ColumnMajor, 8, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const void* a, const void* b, void* d, int m, int n,
                                            int k) {
    auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(m, k, 1));
    auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(n, k, 1));
    auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(m, n, 1));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const Element*>(a), stride_a, static_cast<const Element*>(b), stride_b},
        {{}, nullptr, stride_d, static_cast<Element*>(d), stride_d}};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
    return args;
  }

  static int run(const void* a, const void* b, void* d, int m, int n, int k, bool pdl,
                 cudaStream_t stream) {
    auto args = arguments(a, b, d, m, n, k);
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 2;
    if (Gemm::get_workspace_size(args) != 0) return 3;
    if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return 4;
    return gemm.run(stream, nullptr, pdl) == cutlass::Status::kSuccess ? 0 : 4;
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

}  // extern "C"
