"""The fused engine's optional CUDA C++ libraries (CUTLASS kernels built with nvcc by
``engine/fused/cuda/build.sh`` into ``build/cuda``), loaded through ctypes on first use.

Each library is found at an environment variable's path, else in ``build/cuda``; a missing
one is a clear error naming the build command, and :meth:`NativeLibrary.available` says
whether it can be loaded. Their kernels run on torch's current stream, so they join the
engine's CUDA graphs like any kernel.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path

BUILD_DIR = Path(__file__).resolve().parents[2] / "build" / "cuda"


def load_library(path: Path, declare: Callable[[ctypes.CDLL], None], feature: str,
                 hint: str) -> ctypes.CDLL:
    """The library at ``path`` with ``declare`` run on it; RuntimeError naming ``hint`` (the
    build) if it is missing, cannot be loaded, or lacks the functions ``declare`` names
    (built from other sources). Also for the benchmarks' own libraries."""
    if not path.is_file():
        raise RuntimeError(f"{feature} needs {path}: {hint}")
    try:
        lib = ctypes.CDLL(str(path))
        declare(lib)  # AttributeError: a stale or foreign library
    except (OSError, AttributeError) as exc:
        raise RuntimeError(f"{feature} could not load {path} ({exc}): rebuild it; {hint}"
                           ) from exc
    return lib


class NativeLibrary:
    """One library: ``name`` in ``build/cuda`` (or at ``$env``), needed by ``feature``;
    ``declare`` sets the C functions' argument and result types once it is loaded."""

    def __init__(self, name: str, env: str, feature: str, hint: str,
                 declare: Callable[[ctypes.CDLL], None]) -> None:
        self.name, self.env, self.feature, self.hint = name, env, feature, hint
        self._declare = declare
        self._lib: ctypes.CDLL | None = None
        self._lock = threading.Lock()

    def path(self) -> Path:
        """Where it is looked for: ``$env``, else ``build/cuda/name``."""
        value = os.environ.get(self.env)
        return Path(value) if value else BUILD_DIR / self.name

    def load(self) -> ctypes.CDLL:
        """The loaded library, loaded once (:func:`load_library`'s errors)."""
        with self._lock:
            if self._lib is None:
                self._lib = load_library(self.path(), self._declare, self.feature, self.hint)
            return self._lib

    def available(self) -> bool:
        """True when the library can be loaded."""
        try:
            self.load()
        except (RuntimeError, OSError):
            return False
        return True

    def forget(self) -> None:
        """Drop the loaded handle, so the next use looks again (tests)."""
        with self._lock:
            self._lib = None
