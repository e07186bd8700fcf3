"""The gateway app in-process, with the real CPU engine behind the backend Protocol."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine.onnx_cpu import OnnxEngine
from service.app import create_app
from service.backend import EngineBackend
from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]
ONNX = REPO / "build" / "onnx" / "minilm-l6-squad" / "model-fused.onnx"


@pytest.fixture(scope="session")
def engine() -> OnnxEngine:
    if not ONNX.exists():
        pytest.skip(f"{ONNX} missing: run `make model` (make test builds it)")
    return OnnxEngine(ONNX, threads=2)


def make_client(engine: OnnxEngine, **settings: object) -> TestClient:
    # a slow, shared 2-core CI machine must not turn behaviour tests into deadline tests
    settings.setdefault("request_timeout_ms", 60_000)
    app = create_app(Settings(**settings), backend=EngineBackend(engine))  # type: ignore[arg-type]
    return TestClient(app)


@pytest.fixture
def client(engine: OnnxEngine) -> Iterator[TestClient]:
    with make_client(engine) as c:
        yield c
