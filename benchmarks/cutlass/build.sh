#!/usr/bin/env bash
# Build benchmarks/cutlass/fp8_blockwise_gemm for sm_90a with nvcc, against CUTLASS's headers
# from the nvidia-cutlass wheel (PyPI). Output: build/cutlass/fp8_blockwise_gemm.
# Needs nvcc (CUDA 12.8+); no GPU: the binary runs on a Hopper machine.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
out="$repo/build/cutlass"
version="${CUTLASS_VERSION:-4.2.0.0}"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
mkdir -p "$out"
if [ ! -d "$out/source/include/cutlass" ]; then
  python3 -m pip download --quiet --no-deps "nvidia-cutlass==$version" -d "$out/wheel"
  python3 - "$out" <<'EOF'
import sys, zipfile, pathlib
out = pathlib.Path(sys.argv[1])
wheel = next((out / "wheel").glob("nvidia_cutlass-*.whl"))
prefixes = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefixes) and not name.endswith("/"):
            dest = out / "source" / name[len("cutlass_library/source/"):]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(name))
EOF
fi
"$nvcc" -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
  -DNDEBUG -I"$out/source/include" -I"$out/source/tools/util/include" \
  -o "$out/fp8_blockwise_gemm" "$repo/benchmarks/cutlass/fp8_blockwise_gemm.cu"
echo "built $out/fp8_blockwise_gemm"
