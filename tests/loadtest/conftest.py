"""Fixtures for the load-generator tests: a real local HTTP server with known behaviour."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.loadtest.fakegateway import Behaviour, FakeGateway

StartGateway = Callable[..., FakeGateway]


@pytest.fixture
def start_gateway() -> Iterator[StartGateway]:
    """Start fake gateways with a given Behaviour; all are stopped after the test."""
    started: list[FakeGateway] = []

    def start(**behaviour: object) -> FakeGateway:
        gateway = FakeGateway(Behaviour(**behaviour)).start()  # type: ignore[arg-type]
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()
