# syntax=docker/dockerfile:1
# Triton Inference Server with the project's model repository (model `bert_qa`, python backend),
# the engine package it imports, the shipped checkpoint and its ONNX export, all baked in.
#
#   docker build -f docker/triton.Dockerfile --target runtime-cpu -t squad-serve/triton:dev-cpu .
#   docker build -f docker/triton.Dockerfile -t squad-serve/triton:dev-gpu .    # runtime-gpu
#
# Stages: export (runs `python -m training.export_onnx`, as `make model` does) -> runtime-cpu
# (ONNX Runtime engine) -> runtime-gpu (adds torch + OpenAI Triton for the fused engine, and
# its CUDA C++ libraries from cutlass-headers -> cuda-libs).

# ONNX Runtime that serves: 1.23.2 is the newest release with wheels for Python 3.10, the
# python backend's interpreter in the Triton image below.
ARG ORT_VERSION=1.23.2
# ONNX Runtime that exports: the dev venv's 1.32.0. Its BERT optimizer fuses Attention (x6) and
# EmbedLayerNormalization on this checkpoint; 1.23.2's finds neither (only SkipLayerNorm and
# BiasGelu) and gives a slower graph. Measured 2026-11-29: ORT 1.23.2 runs the 1.32.0 fused export
# within 8e-6 (max |logit| difference) of ORT 1.32.0 itself.
ARG EXPORT_ORT_VERSION=1.32.0
# numpy 1.x: the python backend of server 2.51 rejects output tensors built from numpy 2.x arrays
# ("output tensor shape does not match size"); 1.26.4 is what nvidia-pytriton pins.
ARG NUMPY_VERSION=1.26.4

# ---------------------------------------------------------------------------------------------
# export: checkpoint -> build/onnx/minilm-l6-squad/model-{fp32,fused,int8}.onnx (`make model`)
# Python 3.11 and the versions of the dev venv that `make model` is verified with; CPU-only torch
# (from PyTorch's CPU index) keeps this throw-away stage ~1 GB instead of ~5 GB.
FROM python:3.11-slim-bookworm AS export
ARG EXPORT_ORT_VERSION
ARG NUMPY_VERSION
ARG EXPORT_TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu \
        "torch==${EXPORT_TORCH_VERSION}" \
    && pip install --no-cache-dir \
        "transformers==5.24.0" \
        "safetensors==0.8.0" \
        "onnx==1.23.2" \
        "onnxruntime==${EXPORT_ORT_VERSION}" \
        "numpy==${NUMPY_VERSION}" \
        "rich==15.0.0"
WORKDIR /src
COPY service/ service/
COPY engine/ engine/
COPY training/ training/
COPY models/minilm-l6-squad/ models/minilm-l6-squad/
RUN python -m training.export_onnx \
        --model-dir models/minilm-l6-squad --out build/onnx/minilm-l6-squad \
    && test -s build/onnx/minilm-l6-squad/model-fused.onnx \
    && test -s build/onnx/minilm-l6-squad/model-int8.onnx

# ---------------------------------------------------------------------------------------------
# runtime-cpu: serves with the ONNX Runtime engine (BERT_QA_ENGINE=onnx).
# Base pin: 24.10 ships Triton server 2.51.0, the server the project develops and tests against
# (the tritonserver binary in the nvidia-pytriton 0.7.0 wheel), with the python backend whose
# stub runs Python 3.10 (Ubuntu 22.04) and CUDA 12.6 (host driver >= 560, or a data-center
# driver with forward compatibility). Moving to another release means re-running the
# integration tests on that server version first.
FROM nvcr.io/nvidia/tritonserver:24.10-py3 AS runtime-cpu
ARG ORT_VERSION
ARG NUMPY_VERSION
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The python backend stub runs model.py with the image's system python3, so the engine's
# dependencies go there (Ubuntu 22.04's pip predates PEP 668: no --break-system-packages).
RUN python3 -m pip install --no-cache-dir \
        "numpy==${NUMPY_VERSION}" \
        "onnxruntime==${ORT_VERSION}" \
    && groupadd --system --gid 10001 qa \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin qa
# Same layout as the repository, so repo-relative defaults (models/..., build/onnx/...) and
# model.py's import of the engine package resolve the same way as under the launcher.
WORKDIR /opt/qa
COPY engine/ engine/
COPY model_repository/ model_repository/
COPY models/minilm-l6-squad/ models/minilm-l6-squad/
# The served files: fused fp32 (the engine's default BERT_QA_ONNX) and its int8 quantisation
# (BERT_QA_ONNX=build/onnx/minilm-l6-squad/model-int8.onnx), plus the export report
# (fused-op counts, parity vs torch). The unfused fp32 export stays behind.
COPY --from=export /src/build/onnx/minilm-l6-squad/model-fused.onnx \
     /src/build/onnx/minilm-l6-squad/model-int8.onnx \
     /src/build/onnx/minilm-l6-squad/export.json \
     build/onnx/minilm-l6-squad/
# Byte-compile now: at run time the root filesystem is read-only.
RUN python3 -m compileall -q engine model_repository
# BERT_QA_MODEL_DIR and BERT_QA_ONNX are left to the engine's repo-relative defaults
# (engine/config.py), which resolve under /opt/qa here. HOME and the kernel caches point at /tmp
# (an emptyDir / tmpfs): the root filesystem is read-only, and OpenAI Triton and TorchInductor
# write compiled kernels under $HOME by default.
ENV PYTHONPATH=/opt/qa \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TRITON_CACHE_DIR=/tmp/triton-kernels \
    TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor \
    BERT_QA_ENGINE=onnx \
    BERT_QA_DEVICE=cpu \
    BERT_QA_THREADS=0
USER 10001:10001
EXPOSE 8000 8001 8002
# Kernel compilation and CUDA-graph capture at model load can take minutes: generous start period.
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2)"]
# The image's own entrypoint (nvidia_entrypoint.sh) stays: it sets up CUDA forward compatibility.
CMD ["tritonserver", \
     "--model-repository=/opt/qa/model_repository", \
     "--http-port=8000", \
     "--grpc-port=8001", \
     "--metrics-port=8002", \
     "--allow-metrics=true", \
     "--strict-readiness=true", \
     "--exit-on-error=true"]

# ---------------------------------------------------------------------------------------------
# cutlass-headers -> cuda-libs: the fused engine's CUDA C++ libraries, as
# `engine/fused/cuda/build.sh lib small` builds them in a checkout: block-wise FP8 GEMMs
# (`fp8_scaling="blocks"`) and the small-batch CUTLASS GEMMs that `cutlass_small_gemms="auto"`
# picks for models of hidden size 1024 and up (BERT-large). sm_90a (Hopper) only, the CUDA
# runtime linked statically; without them the engine runs its Triton kernels and says so.
# The headers come from the nvidia-cutlass wheel (pip: a Python stage). nvcc is CUDA 13.0's,
# the compiler the libraries are built and GPU-tested with (13.0.88); their static CUDA 13
# runtime needs the same host driver (>= 580) as the CUDA 13 torch wheels below.
FROM python:3.11-slim-bookworm AS cutlass-headers
ARG CUTLASS_VERSION=4.2.0.0
# (build.sh reads CUTLASS_VERSION; an ARG is in RUN's environment already.)
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY engine/fused/cuda/build.sh engine/fused/cuda/build.sh
RUN engine/fused/cuda/build.sh headers \
    && test -f build/cuda/cutlass/include/cutlass/cutlass.h

FROM nvidia/cuda:13.0.1-devel-ubuntu24.04 AS cuda-libs
# nvcc needs a host C++ compiler; the devel image's packages do not promise one. This stage
# only compiles (nothing of it ships but the two .so files), so the compiler follows the
# base image's Ubuntu release rather than a pinned version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY engine/fused/cuda/ engine/fused/cuda/
COPY --from=cutlass-headers /src/build/cuda/cutlass/ build/cuda/cutlass/
RUN engine/fused/cuda/build.sh lib small \
    && test -s build/cuda/libqa_fp8_blockwise.so \
    && test -s build/cuda/libqa_small_gemm.so

# ---------------------------------------------------------------------------------------------
# runtime-gpu (default target): adds the fused GPU engine's torch + OpenAI Triton.
# torch 2.11.0 / triton 3.6.0 are the versions the fused engine is developed and benchmarked with
# on the H200. Its PyPI wheels bundle their own CUDA 13 runtime (independent of the image's
# CUDA 12.6), which needs a host driver >= 580. For an older driver, rebuild with a CUDA 12 build
# of torch, e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 and a torch
# version published there, after checking the fused kernels on it.
FROM runtime-cpu AS runtime-gpu
ARG TORCH_VERSION=2.11.0
ARG TRITON_LANG_VERSION=3.6.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
USER 0:0
RUN python3 -m pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}" \
        "triton==${TRITON_LANG_VERSION}" \
    && python3 -m pip install --no-cache-dir "safetensors==0.8.0"
# Where the engine looks for them (engine/fused/native.py): build/cuda under /opt/qa.
COPY --from=cuda-libs /src/build/cuda/libqa_fp8_blockwise.so \
     /src/build/cuda/libqa_small_gemm.so \
     build/cuda/
# A C compiler and Python's headers: OpenAI Triton builds its kernel launcher (a Python
# extension) with them at run time, and the engine's compiled call path
# (engine/fused/staged_launch.py) is built with them now, against this image's Python and
# torch, into build/native (at run time the root filesystem is read-only; without it the
# engine would take its Python path). The packages follow the base image's Ubuntu release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ python3-dev \
    && python3 -c "from engine.fused import staged_launch; print(staged_launch.build())" \
    && rm -rf /var/lib/apt/lists/*
ENV BERT_QA_ENGINE=fused \
    BERT_QA_DEVICE=cuda
USER 10001:10001
