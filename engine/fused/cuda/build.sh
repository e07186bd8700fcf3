#!/usr/bin/env bash
# Build the fused engine's CUDA C++ parts for Hopper (sm_90a) with nvcc, against CUTLASS's
# headers from the nvidia-cutlass wheel (PyPI):
#   build/cuda/libqa_fp8_blockwise.so    engine/fused/cuda/fp8_blockwise.cu (ctypes C API)
#   build/cuda/fp8_blockwise_gemm        benchmarks/cutlass/fp8_blockwise_gemm.cu (with "bench")
#   build/cuda/libqa_fp8_ffn1.so         benchmarks/cutlass/fp8_ffn1.cu (with "ffn1")
#   build/cuda/libqa_small_gemm.so       engine/fused/cuda/small_gemm.cu (with "small")
#   build/cuda/libqa_small_gemm_bench.so benchmarks/cutlass/small_gemm.cu (with "small-bench")
#   build/cuda/libqa_qkv_attention.so    benchmarks/cutlass/qkv_attention.cu (with "qkv-attn")
# Needs nvcc from CUDA 12.8+ (NVCC=... to choose one), no GPU; the outputs run on a Hopper
# GPU. The CUTLASS headers land in build/cuda/cutlass first (python3 and pip, once); the
# target "headers" stops there (no nvcc needed: docker/triton.Dockerfile fetches them in a
# Python stage and compiles in a CUDA one).
# Usage: engine/fused/cuda/build.sh [headers] [lib] [bench] [ffn1] [small] [small-bench]
# [qkv-attn] (default: lib)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
out="$repo/build/cuda"
version="${CUTLASS_VERSION:-4.2.0.0}"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
targets=("${@:-lib}")
mkdir -p "$out"
if [ ! -d "$out/cutlass/include/cutlass" ]; then
  python3 -m pip download --quiet --no-deps "nvidia-cutlass==$version" -d "$out/wheel"
  python3 - "$out" <<'PY'
import pathlib, sys, zipfile
out = pathlib.Path(sys.argv[1])
wheel = next((out / "wheel").glob("nvidia_cutlass-*.whl"))
prefixes = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefixes) and not name.endswith("/"):
            dest = out / "cutlass" / name[len("cutlass_library/source/"):]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(name))
PY
fi
flags=(-std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG
       -I"$out/cutlass/include" -I"$out/cutlass/tools/util/include")
for t in "${targets[@]}"; do
  case "$t" in
    headers) echo "CUTLASS headers in $out/cutlass" ;;
    lib) "$nvcc" "${flags[@]}" -shared -Xcompiler -fPIC -cudart static \
           -o "$out/libqa_fp8_blockwise.so" "$repo/engine/fused/cuda/fp8_blockwise.cu"
         echo "built $out/libqa_fp8_blockwise.so" ;;
    bench) "$nvcc" "${flags[@]}" -o "$out/fp8_blockwise_gemm" \
             "$repo/benchmarks/cutlass/fp8_blockwise_gemm.cu"
           echo "built $out/fp8_blockwise_gemm" ;;
    ffn1) "$nvcc" "${flags[@]}" -shared -Xcompiler -fPIC -cudart static \
            -o "$out/libqa_fp8_ffn1.so" "$repo/benchmarks/cutlass/fp8_ffn1.cu"
          echo "built $out/libqa_fp8_ffn1.so" ;;
    small) "$nvcc" "${flags[@]}" -DCUTLASS_ENABLE_GDC_FOR_SM90 -shared -Xcompiler -fPIC \
             -cudart static -o "$out/libqa_small_gemm.so" "$repo/engine/fused/cuda/small_gemm.cu"
           echo "built $out/libqa_small_gemm.so" ;;
    small-bench) "$nvcc" "${flags[@]}" -DCUTLASS_ENABLE_GDC_FOR_SM90 -I"$repo/engine/fused/cuda" \
                   -shared -Xcompiler -fPIC -cudart static -o "$out/libqa_small_gemm_bench.so" \
                   "$repo/benchmarks/cutlass/small_gemm.cu"
                 echo "built $out/libqa_small_gemm_bench.so" ;;
    qkv-attn) "$nvcc" "${flags[@]}" -shared -Xcompiler -fPIC -cudart static \
                -o "$out/libqa_qkv_attention.so" "$repo/benchmarks/cutlass/qkv_attention.cu"
              echo "built $out/libqa_qkv_attention.so" ;;
    *) echo "unknown target $t (headers, lib, bench, ffn1, small, small-bench, qkv-attn)" >&2
       exit 2 ;;
  esac
done
