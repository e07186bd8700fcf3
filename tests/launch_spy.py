"""The arguments a Triton kernel is launched with, or a function called with, recorded
(tests only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any


@contextmanager
def _recording(module: ModuleType, name: str,
               record: Callable[[Any, dict[str, Any]], None],
               launch: bool = True) -> Iterator[None]:
    """While inside, every launch of the JIT function ``module.name`` (``kernel[grid](...)``)
    calls ``record(grid, keyword arguments)``; the launches still run unless ``launch`` is
    off. Patch the module that launches the kernel: another module's reference is not
    replaced."""
    kernel = getattr(module, name)

    class Recorder:
        def __getitem__(self, grid: Any) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                record(grid, kwargs)
                return kernel[grid](*args, **kwargs) if launch else None

            return run

    setattr(module, name, Recorder())
    try:
        yield
    finally:
        setattr(module, name, kernel)


@contextmanager
def launch_keywords(module: ModuleType, name: str, keyword: str) -> Iterator[list[Any]]:
    """The ``keyword`` argument of every launch of ``module.name`` while inside."""
    seen: list[Any] = []
    with _recording(module, name, lambda grid, kwargs: seen.append(kwargs[keyword])):
        yield seen


@contextmanager
def launch_grids(module: ModuleType, name: str) -> Iterator[list[Any]]:
    """The grid of every launch of ``module.name`` while inside."""
    seen: list[Any] = []
    with _recording(module, name, lambda grid, kwargs: seen.append(grid)):
        yield seen


@contextmanager
def launches_unrun(module: ModuleType, name: str) -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    """(grid, keyword arguments) of every launch of ``module.name`` while inside, which
    are *not* run: for what a wrapper asks of a kernel, where running it could not work
    (e.g. the timeline's timer reads under the interpreter, or no GPU)."""
    seen: list[tuple[Any, dict[str, Any]]] = []
    with _recording(module, name, lambda grid, kwargs: seen.append((grid, kwargs)),
                    launch=False):
        yield seen


@contextmanager
def calls(module: ModuleType, name: str) -> Iterator[list[tuple[Any, ...]]]:
    """The positional arguments of every call of the function ``module.name`` while
    inside; the calls still run. Patch the module its callers look it up in."""
    function = getattr(module, name)
    seen: list[tuple[Any, ...]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args)
        return function(*args, **kwargs)

    setattr(module, name, spy)
    try:
        yield seen
    finally:
        setattr(module, name, function)
