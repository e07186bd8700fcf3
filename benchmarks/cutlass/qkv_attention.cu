// QKV projection and attention of one layer in one kernel, for small batches (<= 128
// tokens, head size 64): an experiment on whether a layer with one kernel fewer, at the
// same parallelism, beats the engine's two (benchmarks/qkv_attention.py measures it).
//
// One cluster of CL = 8 CTAs per head (96 CTAs for BERT-base, 128 for BERT-large):
//   0. before griddepcontrol.wait, each CTA loads its weight slice (the head's 192 Q|K|V
//      rows, K columns rank*KS .. +KS, KS = hidden / 8) into shared memory: weights never
//      depend on the kernel ahead;
//   1. after it, its activation slice (all rows, the same K columns) and a split-K partial
//      C = x[:, slice] W[rows, slice]^T of all rows (mma.sync through wmma, float32);
//   2. cluster barrier; CTA `rank` owns rows rank*16 .. +16 and sums their 8 partials
//      through distributed shared memory, then applies the epilogue: with FOLD the
//      deferred LayerNorm r * (acc - mean * u) (moments from the rows' sums), rounding
//      to fp16 as the engine's QKV output; Q gets its bias and the softmax scale;
//   3. cluster barrier; each CTA gathers every row's K and V (fp16) from the owners;
//   4. attention of its 16 query rows over all keys of their sequence (one-shot softmax:
//      at most 128 keys), V's bias added after normalisation; output [M, hidden] fp16.
// With FOLD it also zeroes the float32 `zero` buffer between the CTAs, as the engine's
// folded QKV GEMM does.
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

namespace cg = cooperative_groups;
using namespace nvcuda;

namespace {

constexpr int CL = 8;            // CTAs per head: the cluster
constexpr int HD = 64;           // head size
constexpr int ROWS = 128;        // tokens at most
constexpr int RB = ROWS / CL;    // rows each CTA owns after the reduction
constexpr int NC = 3 * HD;       // a head's Q|K|V columns
constexpr int THREADS = 256;
constexpr int CS_LD = NC + 4;    // float partial C
constexpr int QS_LD = HD + 8;    // fp16 Q rows
constexpr int KV_LD = 2 * HD + 8;  // fp16 K|V rows owned
constexpr int KA_LD = HD + 8;    // fp16 gathered K / V
constexpr int SS_LD = ROWS + 4;  // float scores
constexpr int PS_LD = ROWS + 8;  // fp16 probabilities
constexpr int OS_LD = HD + 4;    // float output halves
constexpr int STAMPS = 9;

struct Params {
  const half* x;        // [m, d] (FOLD: un-normalised rows)
  const half* w;        // [3d, d] Q|K|V rows (FOLD: W diag(gamma))
  const float* u;       // [3d] row sums of w (FOLD)
  const float* stats;   // [m, 2] rows' (sum, sum of squares) (FOLD)
  const float* bias;    // [3d] (FOLD: already W beta + b)
  const int* cu;        // [n_seqs + 1]
  half* out;            // [m, d]
  float* zero;          // FOLD: zeroed here
  long long zero_numel;
  long long* timing;    // [gridDim.y][CL][STAMPS] clock64 stamps, or null
  int m, d, n_seqs;
  float eps, qk_scale;
};

__device__ __forceinline__ void gdc_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void gdc_launch() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

template <int KS>
struct Smem {
  static constexpr int A_LD = KS + 8;
  static constexpr int B_BYTES = NC * A_LD * 2;
  static constexpr int A_BYTES = ROWS * A_LD * 2;
  static constexpr int C_BYTES = ROWS * CS_LD * 4;
  static constexpr int KALL = 0;                                   // after phase 2
  static constexpr int VALL = KALL + ROWS * KA_LD * 2;
  static constexpr int SS = VALL + ROWS * KA_LD * 2;
  static constexpr int PS = SS + RB * SS_LD * 4;
  static constexpr int OS = PS + RB * PS_LD * 2;
  static constexpr int LATE = OS + 2 * RB * OS_LD * 4;
  static constexpr int REGION = (B_BYTES + A_BYTES > C_BYTES ? B_BYTES + A_BYTES : C_BYTES) > LATE
      ? (B_BYTES + A_BYTES > C_BYTES ? B_BYTES + A_BYTES : C_BYTES) : LATE;
  static constexpr int QS = REGION;
  static constexpr int KVL = QS + RB * QS_LD * 2;
  static constexpr int VEC = KVL + RB * KV_LD * 2;                 // u[192], bq[64], bv[64]
  static constexpr int ROWINFO = VEC + (NC + 2 * HD) * 4;          // s0, s1, mean, rstd, l
  static constexpr int BYTES = ROWINFO + 5 * RB * 4;
};

template <int KS, bool FOLD>
__global__ void __launch_bounds__(THREADS, 1) qkv_attention_kernel(const Params p) {
  using S = Smem<KS>;
  extern __shared__ __align__(128) unsigned char smem[];
  half* Bs = reinterpret_cast<half*>(smem);
  half* As = reinterpret_cast<half*>(smem + S::B_BYTES);
  float* Cs = reinterpret_cast<float*>(smem);
  half* Kall = reinterpret_cast<half*>(smem + S::KALL);
  half* Vall = reinterpret_cast<half*>(smem + S::VALL);
  float* Ss = reinterpret_cast<float*>(smem + S::SS);
  half* Ps = reinterpret_cast<half*>(smem + S::PS);
  float* Os = reinterpret_cast<float*>(smem + S::OS);
  half* Qs = reinterpret_cast<half*>(smem + S::QS);
  half* KVloc = reinterpret_cast<half*>(smem + S::KVL);
  float* us = reinterpret_cast<float*>(smem + S::VEC);
  float* bq = us + NC;
  float* bv = bq + HD;
  int* s0s = reinterpret_cast<int*>(smem + S::ROWINFO);
  int* s1s = s0s + RB;
  float* means = reinterpret_cast<float*>(s1s + RB);
  float* rstds = means + RB;
  float* ls = rstds + RB;

  cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int rank = static_cast<int>(cluster.block_rank());
  const int head = blockIdx.y;
  const int m = p.m, d = p.d;
  const int k0 = rank * KS;
  const int own0 = rank * RB;  // first row this CTA owns
  long long* stamp = p.timing ? p.timing + (static_cast<long long>(head) * CL + rank) * STAMPS
                              : nullptr;
  auto mark = [&](int i) {
    if (stamp && tid == 0) stamp[i] = clock64();
  };
  mark(0);

  // 0. Weights and vectors: nothing ahead writes them.
  constexpr int CHUNKS = KS / 8;  // 16-byte pieces of a row slice
  for (int idx = tid; idx < NC * CHUNKS; idx += THREADS) {
    const int row = idx / CHUNKS, c = idx % CHUNKS;
    const int wrow = (row / HD) * d + head * HD + row % HD;
    __pipeline_memcpy_async(Bs + row * S::A_LD + c * 8, p.w + static_cast<long long>(wrow) * d + k0 + c * 8, 16);
  }
  __pipeline_commit();
  for (int c = tid; c < NC; c += THREADS) {
    const int n = (c / HD) * d + head * HD + c % HD;
    if (FOLD) us[c] = p.u[n];
    if (c < HD) bq[c] = p.bias[n];
    if (c >= 2 * HD) bv[c - 2 * HD] = p.bias[n];
  }
  if (tid < RB) {  // the sequence of each owned row (cu_seqlens is written long before)
    const int g = own0 + tid;
    int s0 = g, s1 = g;  // a row outside every sequence sees no key
    for (int s = 0; s < p.n_seqs; ++s) {
      const int a = p.cu[s], b = p.cu[s + 1];
      if (g >= a && g < b) { s0 = a; s1 = b; break; }
    }
    s0s[tid] = s0;
    s1s[tid] = s1;
  }
  gdc_wait();
  gdc_launch();
  mark(1);

  // 1. Activation slice, then the split-K partial of every row.
  for (int idx = tid; idx < m * CHUNKS; idx += THREADS) {
    const int row = idx / CHUNKS, c = idx % CHUNKS;
    __pipeline_memcpy_async(As + row * S::A_LD + c * 8, p.x + static_cast<long long>(row) * d + k0 + c * 8, 16);
  }
  __pipeline_commit();
  if (FOLD) {
    const int ctas = gridDim.y * CL;
    const int me = head * CL + rank;
    for (long long i = static_cast<long long>(me) * THREADS * 4 + tid; i < p.zero_numel;
         i += static_cast<long long>(ctas) * THREADS * 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (i + j * THREADS < p.zero_numel) p.zero[i + j * THREADS] = 0.f;
    }
    if (tid < RB && own0 + tid < m) {
      const int g = own0 + tid;
      const float mean = p.stats[2 * g] / d;
      const float var = fmaxf(p.stats[2 * g + 1] / d - mean * mean, 0.f);
      means[tid] = mean;
      rstds[tid] = 1.f / sqrtf(var + p.eps);
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  mark(2);
  {
    const int wr = warp / 4, wc = warp % 4;  // 64-row half, 48-column quarter
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][3];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 3; ++j) wmma::fill_fragment(acc[i][j], 0.f);
#pragma unroll
    for (int kk = 0; kk < KS / 16; ++kk) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[3];
#pragma unroll
      for (int j = 0; j < 3; ++j)
        wmma::load_matrix_sync(b[j], Bs + (wc * 48 + j * 16) * S::A_LD + kk * 16, S::A_LD);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r0 = wr * 64 + i * 16;
        if (r0 < m) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;
          wmma::load_matrix_sync(a, As + r0 * S::A_LD + kk * 16, S::A_LD);
#pragma unroll
          for (int j = 0; j < 3; ++j) wmma::mma_sync(acc[i][j], a, b[j], acc[i][j]);
        }
      }
    }
    __syncthreads();  // Cs overwrites As/Bs
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r0 = wr * 64 + i * 16;
      if (r0 < m) {
#pragma unroll
        for (int j = 0; j < 3; ++j)
          wmma::store_matrix_sync(Cs + r0 * CS_LD + wc * 48 + j * 16, acc[i][j], CS_LD,
                                  wmma::mem_row_major);
      }
    }
  }
  mark(3);
  cluster.sync();
  mark(4);

  // 2. Sum the owned rows' partials across the cluster; epilogue into Q and K|V.
  for (int e = tid; e < RB * (NC / 4); e += THREADS) {
    const int i = e / (NC / 4), col = (e % (NC / 4)) * 4;
    const int g = own0 + i;
    if (g >= m) continue;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < CL; ++r) {
      const float* peer = cluster.map_shared_rank(Cs, r);
      const float4 v = *reinterpret_cast<const float4*>(peer + g * CS_LD + col);
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    const float vals[4] = {s.x, s.y, s.z, s.w};
    const int part = col / HD, dc = col % HD;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      float y = vals[t];
      if (FOLD) y = rstds[i] * (y - means[i] * us[col + t]);
      const half yh = __float2half_rn(y);
      if (part == 0)
        Qs[i * QS_LD + dc + t] = __float2half_rn((__half2float(yh) + bq[dc + t]) * p.qk_scale);
      else
        KVloc[i * KV_LD + (part - 1) * HD + dc + t] = yh;
    }
  }
  mark(5);
  cluster.sync();
  mark(6);

  // 3. Every row's K and V from its owner.
  const int nk = (m + 15) / 16 * 16;
  for (int e = tid; e < nk * 16; e += THREADS) {
    const int j = e / 16, c = e % 16;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (j < m) {
      const half* src = cluster.map_shared_rank(KVloc, j / RB) + (j % RB) * KV_LD + c * 8;
      v = *reinterpret_cast<const uint4*>(src);
    }
    half* dst = (c < 8 ? Kall : Vall) + j * KA_LD + (c % 8) * 8;
    *reinterpret_cast<uint4*>(dst) = v;
  }
  cluster_arrive();  // done reading the other CTAs' shared memory
  __syncthreads();
  mark(7);

  // 4. Attention of the owned query rows.
  if (own0 < m) {
    const int nkb = nk / 16;
    if (warp < nkb) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> q;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> k;
        wmma::load_matrix_sync(q, Qs + kk * 16, QS_LD);
        wmma::load_matrix_sync(k, Kall + warp * 16 * KA_LD + kk * 16, KA_LD);
        wmma::mma_sync(s, q, k, s);
      }
      wmma::store_matrix_sync(Ss + warp * 16, s, SS_LD, wmma::mem_row_major);
    }
    __syncthreads();
    {  // softmax: 16 threads a row
      const int i = tid / 16, lane = tid % 16;
      const int s0 = s0s[i], s1 = s1s[i];
      float mx = -INFINITY;
      for (int j = lane; j < nk; j += 16)
        if (j >= s0 && j < s1) mx = fmaxf(mx, Ss[i * SS_LD + j]);
#pragma unroll
      for (int o = 8; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      float l = 0.f;
      for (int j = lane; j < nk; j += 16) {
        const float pj = (j >= s0 && j < s1) ? exp2f(Ss[i * SS_LD + j] - mx) : 0.f;
        l += pj;
        Ps[i * PS_LD + j] = __float2half_rn(pj);
      }
#pragma unroll
      for (int o = 8; o > 0; o /= 2) l += __shfl_xor_sync(0xffffffffu, l, o);
      if (lane == 0) ls[i] = l;
    }
    __syncthreads();
    {  // P V: warp -> 16 output columns, one of two interleaved key halves
      const int f = warp % 4, half_k = warp / 4;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::fill_fragment(o, 0.f);
      for (int kb = half_k; kb < nkb; kb += 2) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, Ps + kb * 16, PS_LD);
        wmma::load_matrix_sync(vb, Vall + kb * 16 * KA_LD + f * 16, KA_LD);
        wmma::mma_sync(o, pa, vb, o);
      }
      wmma::store_matrix_sync(Os + half_k * RB * OS_LD + f * 16, o, OS_LD, wmma::mem_row_major);
    }
    __syncthreads();
    {
      const int i = tid / 16, c = (tid % 16) * 4;
      const int g = own0 + i;
      if (g < m) {
        const float inv = 1.f / fmaxf(ls[i], 1.f);
        __align__(8) half o4[4];
#pragma unroll
        for (int t = 0; t < 4; ++t)
          o4[t] = __float2half_rn((Os[i * OS_LD + c + t] + Os[(RB + i) * OS_LD + c + t]) * inv
                                  + bv[c + t]);
        *reinterpret_cast<uint2*>(p.out + static_cast<long long>(g) * d + head * HD + c) =
            *reinterpret_cast<const uint2*>(o4);
      }
    }
  }
  mark(STAMPS - 1);  // before the last barrier (the others may still read our K|V)
  cluster_wait();
}

template <int KS, bool FOLD>
int launch(const Params& p, int heads, int pdl, cudaStream_t stream) {
  constexpr int bytes = Smem<KS>::BYTES;
  static bool configured = false;
  if (!configured) {
    if (cudaFuncSetAttribute(qkv_attention_kernel<KS, FOLD>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
      return 3;
    configured = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(CL, heads, 1);
  cfg.blockDim = dim3(THREADS, 1, 1);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = CL;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, qkv_attention_kernel<KS, FOLD>, p) == cudaSuccess ? 0 : 4;
}

}  // namespace

extern "C" {

// 0 on success; 1 a shape it does not take (m 0..128, head size 64, hidden 768 or 1024),
// 3 the shared-memory opt-in failed, 4 the launch failed.
int qa_qkv_attention(const void* x, const void* w, const void* u, const void* stats,
                     const void* bias, const void* cu, void* out, void* zero,
                     long long zero_numel, void* timing, int m, int d, int heads, int n_seqs,
                     float eps, float qk_scale, int fold, int pdl, void* stream) {
  if (m < 0 || m > ROWS || heads * HD != d || (fold && (!u || !stats))) return 1;
  if (m == 0) return 0;
  Params p{static_cast<const half*>(x), static_cast<const half*>(w),
           static_cast<const float*>(u), static_cast<const float*>(stats),
           static_cast<const float*>(bias), static_cast<const int*>(cu),
           static_cast<half*>(out), static_cast<float*>(zero), zero ? zero_numel : 0,
           static_cast<long long*>(timing), m, d, n_seqs, eps, qk_scale};
  auto s = static_cast<cudaStream_t>(stream);
  if (d == 768) return fold ? launch<96, true>(p, heads, pdl, s) : launch<96, false>(p, heads, pdl, s);
  if (d == 1024) return fold ? launch<128, true>(p, heads, pdl, s) : launch<128, false>(p, heads, pdl, s);
  return 1;
}

int qa_qkv_attention_smem(int d) {
  return d == 768 ? Smem<96>::BYTES : d == 1024 ? Smem<128>::BYTES : -1;
}

}  // extern "C"
