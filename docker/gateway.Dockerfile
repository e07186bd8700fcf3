# syntax=docker/dockerfile:1
# The QA gateway (service/): FastAPI + uvicorn, tokenizer, span decoding, Triton client.
# It owns text only, so it needs neither Triton's server, nor ONNX Runtime, nor torch.
#
#   docker build -f docker/gateway.Dockerfile -t squad-serve/gateway:dev .
#
# Base image pin: python:3.11-slim-bookworm, by tag. 3.11 is the interpreter the gateway is
# typed, linted and tested against (pyproject: ruff target py311, mypy 3.11; the dev venv);
# bookworm is Debian 12, the same glibc and OpenSSL as the dev and CI machines, so the wheels
# below are the ones the tests ran. The tag floats only over 3.11 patch releases and Debian
# security updates. For bit-for-bit rebuilds, append the digest the registry reports
# (python:3.11-slim-bookworm@sha256:...) when promoting a release.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The gateway's runtime dependencies only (pyproject's "gateway" block), pinned to the versions
# the gateway's tests ran with. tritonclient takes only its gRPC extra: QA_TRITON_URL is Triton's
# gRPC port; tests/deploy fails if service/ starts importing tritonclient.http.
# numpy<2 keeps the binary tensors identical to what the python backend (numpy 1.26) expects.
RUN pip install --no-cache-dir \
        "fastapi==0.165.0" \
        "uvicorn[standard]==0.54.0" \
        "pydantic==2.14.4" \
        "pydantic-settings==2.16.3" \
        "tokenizers==0.23.3" \
        "tritonclient[grpc]==2.73.0" \
        "prometheus-client==0.26.0" \
        "numpy==1.26.4"
WORKDIR /app
COPY service/ service/
# service/backend.py types its in-process backend with engine.base.QAEngine (a Protocol, numpy only).
COPY engine/__init__.py engine/base.py engine/
# The tokenizer files only: the weights (model.safetensors) live in the Triton image.
COPY models/minilm-l6-squad/config.json \
     models/minilm-l6-squad/special_tokens_map.json \
     models/minilm-l6-squad/tokenizer.json \
     models/minilm-l6-squad/tokenizer_config.json \
     models/minilm-l6-squad/vocab.txt \
     models/minilm-l6-squad/
# Byte-compile now: at run time the root filesystem is read-only.
RUN python -m compileall -q service engine

FROM python:3.11-slim-bookworm AS runtime
RUN groupadd --system --gid 10001 qa \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin qa
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    QA_HOST=0.0.0.0 \
    QA_PORT=8080 \
    QA_MODEL_DIR=/app/models/minilm-l6-squad
USER 10001:10001
EXPOSE 8080
# Liveness of the process only; readiness (/health/ready) follows Triton and is the orchestrator's.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health/live' % os.environ.get('QA_PORT', '8080'), timeout=2)"]
CMD ["python", "-m", "service"]
