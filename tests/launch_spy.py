"""The arguments a Triton kernel is launched with, recorded (tests only)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any


@contextmanager
def launch_keywords(module: ModuleType, name: str, keyword: str) -> Iterator[list[Any]]:
    """While inside, every launch of the JIT function ``module.name`` (``kernel[grid](...)``)
    appends its ``keyword`` argument to the yielded list; the launches still run. Patch the
    module that launches the kernel: another module's reference is not replaced."""
    kernel = getattr(module, name)
    seen: list[Any] = []

    class Recorder:
        def __getitem__(self, grid: Any) -> Any:
            launch = kernel[grid]

            def run(*args: Any, **kwargs: Any) -> Any:
                seen.append(kwargs[keyword])
                return launch(*args, **kwargs)

            return run

    setattr(module, name, Recorder())
    try:
        yield seen
    finally:
        setattr(module, name, kernel)
