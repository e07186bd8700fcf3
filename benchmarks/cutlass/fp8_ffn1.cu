// FFN1 of the calibrated FP8 engine as CUTLASS 4 kernels, behind a C API for ctypes: the
// experiment of NOTES' next step 1 (does a ping-pong kernel, whose epilogue overlaps the
// other warp group's main loop, beat cuBLASLt's cooperative bias + GELU + e4m3 kernel?).
//
//   D[M, N] e4m3 = saturate(scale_d * GELU_tanh(scale_a * scale_b * (A[M, K] . B[N, K]^T)
//                                                + bias[N]))
//
// A: activations e4m3 row-major (the LayerNorm's static-scale copy), B: weights e4m3
// row-major ([N, K], per-tensor scale), bias bf16, scale_a/scale_b/scale_d float32 [1] on the
// device (the calibrated scales; scale_d is 1 / FFN2's input scale): what the engine's
// cuBLASLt call (`fp8.calibrated_ffn1`) computes, with fast accumulation as there.
// Variants (compile-time) differ in kernel schedule, tile, cluster and activation math;
// `qa_ffn1_name` names them. Activations: CUTLASS's GELU_taylor in float32 (one
// tanh.approx.f32 per element, as cuBLASLt's), `GeluHalf2` (the same tanh form in packed
// half2 math) and, as a diagnostic of what the GELU
// costs, none (Identity: a different output). Timed against cuBLASLt by
// benchmarks/cutlass_ffn1.py (NOTES v15, v37). Built by engine/fused/cuda/build.sh ffn1
// (nvcc, sm_90a). Return codes: 0 ok, 1 bad shape or variant, 2 CUTLASS refused the
// problem, 3 workspace too small, 4 launch failed.

#include <cstddef>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include <cuda_fp16.h>

namespace {

using namespace cute;

using ElementAB = cutlass::float_e4m3_t;
using ElementD = cutlass::float_e4m3_t;
using ElementBias = cutlass::bfloat16_t;

// GELU_tanh(z) = 0.5 z (1 + tanh(z (k0 + k1 z^2))) with the epilogue's float32 fragment
// rounded to half2: per two elements one cvt, three HMUL2/HFMA2 for the argument, one
// tanh.approx.f16x2, one HMUL2 + HFMA2 for the product, and the widening back. Written to
// halve the multi-function unit's work; it does not: sm_90a runs tanh.approx.f16x2 as two
// MUFU.TANH.F16, as many as float32's two tanh.approx.f32 (NOTES v37). Half's range
// is safe here: past |z| ~ 150 the argument overflows to +-inf, tanh gives +-1 and the
// result is z or 0, as GELU's; |z| > 65504 would not be (FFN1's pre-activations are O(10)).
// The output is e4m3 (3 mantissa bits), so half's 10 bits lose nothing that survives.
template <class T>
struct GeluHalf2 {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& z) const {
    return cutlass::epilogue::thread::GELU_taylor<T>{}(z);
  }
};

template <int N>
struct GeluHalf2<cutlass::Array<float, N>> {
  static const bool kIsHeavy = true;
  static_assert(N % 2 == 0, "GeluHalf2 works on pairs");
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& v) const {
    cutlass::Array<float, N> y;
    const __half2 k0 = __float2half2_rn(0.7978845608f);
    const __half2 k1 = __float2half2_rn(0.7978845608f * 0.044715f);
    const __half2 half = __float2half2_rn(0.5f);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; i += 2) {
      const __half2 z = __floats2half2_rn(v[i], v[i + 1]);
      const __half2 u = __hmul2(z, __hfma2(__hmul2(k1, z), z, k0));
      __half2 t;
      asm("tanh.approx.f16x2 %0, %1;"
          : "=r"(*reinterpret_cast<uint32_t*>(&t))
          : "r"(*reinterpret_cast<const uint32_t*>(&u)));
      const __half2 hz = __hmul2(half, z);
      const float2 g = __half22float2(__hfma2(hz, t, hz));
      y[i] = g.x;
      y[i + 1] = g.y;
    }
    return y;
  }
};

template <template <class> class Act>
using Fusion = cutlass::epilogue::fusion::ScaledLinCombPerColBiasEltAct<Act, ElementD, float,
                                                                       ElementBias>;
using cutlass::epilogue::thread::GELU_taylor;
using cutlass::epilogue::thread::Identity;

template <class Tile, class Cluster, class MainSchedule, class EpiSchedule,
          template <class> class Act = GELU_taylor>
struct Ffn1 {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor, 16, ElementD, cutlass::layout::RowMajor, 16, EpiSchedule,
      Fusion<Act>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor,
      16, ElementAB, cutlass::layout::ColumnMajor, 16, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const void* a, const void* b, const void* bias,
                                            const float* sa, const float* sb, const float* sd,
                                            void* d, int m, int n, int k) {
    auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(m, k, 1));
    auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(n, k, 1));
    auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(m, n, 1));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const ElementAB*>(a), stride_a, static_cast<const ElementAB*>(b), stride_b},
        {{}, nullptr, stride_d, static_cast<ElementD*>(d), stride_d}};
    auto& t = args.epilogue.thread;
    t.alpha = 1.f;
    t.beta = 0.f;
    t.scale_a_ptr = sa;
    t.scale_b_ptr = sb;
    t.scale_d_ptr = sd;
    t.bias_ptr = static_cast<const ElementBias*>(bias);
    return args;
  }

  static int run(const void* a, const void* b, const void* bias, const float* sa,
                 const float* sb, const float* sd, void* d, int m, int n, int k, void* ws,
                 size_t ws_bytes, cudaStream_t stream) {
    auto args = arguments(a, b, bias, sa, sb, sd, d, m, n, k);
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 2;
    if (Gemm::get_workspace_size(args) > ws_bytes) return 3;
    if (gemm.initialize(args, ws, stream) != cutlass::Status::kSuccess) return 4;
    return gemm.run(stream) == cutlass::Status::kSuccess ? 0 : 4;
  }

  static size_t workspace(int m, int n, int k) {
    return Gemm::get_workspace_size(
        arguments(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, m, n, k));
  }
};

using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
using EpiPingpong = cutlass::epilogue::TmaWarpSpecialized;
using EpiCooperative = cutlass::epilogue::TmaWarpSpecializedCooperative;

using V0 = Ffn1<Shape<_64, _128, _128>, Shape<_1, _2, _1>, Pingpong, EpiPingpong>;
using V1 = Ffn1<Shape<_64, _256, _128>, Shape<_1, _1, _1>, Pingpong, EpiPingpong>;
using V2 = Ffn1<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Pingpong, EpiPingpong>;
using V3 = Ffn1<Shape<_128, _256, _128>, Shape<_2, _1, _1>, Cooperative, EpiCooperative>;
using V4 = Ffn1<Shape<_256, _128, _128>, Shape<_1, _2, _1>, Cooperative, EpiCooperative>;
using V5 = Ffn1<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Pingpong, EpiPingpong, Identity>;
using V6 = Ffn1<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Pingpong, EpiPingpong, GeluHalf2>;
using V7 = Ffn1<Shape<_128, _256, _128>, Shape<_2, _1, _1>, Cooperative, EpiCooperative,
                GeluHalf2>;
using V8 = Ffn1<Shape<_128, _256, _128>, Shape<_2, _1, _1>, Cooperative, EpiCooperative,
                Identity>;

const char* const kNames[] = {
    "pingpong 64x128x128 cluster 1x2", "pingpong 64x256x128 cluster 1x1",
    "pingpong 128x128x128 cluster 1x2", "cooperative 128x256x128 cluster 2x1",
    "cooperative 256x128x128 cluster 1x2",
    "pingpong 128x128x128 cluster 1x2, no GELU (diagnostic)",
    "pingpong 128x128x128 cluster 1x2, half2 GELU",
    "cooperative 128x256x128 cluster 2x1, half2 GELU",
    "cooperative 128x256x128 cluster 2x1, no GELU (diagnostic)"};
constexpr int kVariants = 9;

bool shape_ok(int m, int n, int k) { return m > 0 && n > 0 && k > 0 && n % 16 == 0 && k % 16 == 0; }

}  // namespace

extern "C" {

int qa_ffn1_variants() { return kVariants; }

const char* qa_ffn1_name(int variant) {
  return variant >= 0 && variant < kVariants ? kNames[variant] : "";
}

// Bytes of workspace the variant needs for this shape (0 for a bad shape or variant).
size_t qa_ffn1_workspace(int variant, int m, int n, int k) {
  if (!shape_ok(m, n, k)) return 0;
  switch (variant) {
    case 0: return V0::workspace(m, n, k);
    case 1: return V1::workspace(m, n, k);
    case 2: return V2::workspace(m, n, k);
    case 3: return V3::workspace(m, n, k);
    case 4: return V4::workspace(m, n, k);
    case 5: return V5::workspace(m, n, k);
    case 6: return V6::workspace(m, n, k);
    case 7: return V7::workspace(m, n, k);
    case 8: return V8::workspace(m, n, k);
    default: return 0;
  }
}

// D = scale_d * GELU_tanh(scale_a * scale_b * A B^T + bias) in e4m3. See the file comment.
int qa_ffn1_gemm(int variant, const void* a, const void* b, const void* bias, const float* sa,
                 const float* sb, const float* sd, void* d, int m, int n, int k, void* ws,
                 size_t ws_bytes, void* stream) {
  if (!shape_ok(m, n, k)) return 1;
  auto s = static_cast<cudaStream_t>(stream);
  switch (variant) {
    case 0: return V0::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    case 1: return V1::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    case 2: return V2::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    case 3: return V3::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    case 4: return V4::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    case 5: return V5::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    case 6: return V6::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    case 7: return V7::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    case 8: return V8::run(a, b, bias, sa, sb, sd, d, m, n, k, ws, ws_bytes, s);
    default: return 1;
  }
}

}  // extern "C"
