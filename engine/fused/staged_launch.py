"""A staged call's path to its graph in compiled code (``cpp/staged_launch.cpp``).

:meth:`GraphCache.replay_into` checks the caller's tensors, names them to the graph (the
first kernel's input arguments, the last kernel's output argument, where they changed) and
launches it. In Python that path took ~5.5 µs of host time before the launch on the H200's
host, about twice that right after a wait on the GPU (``benchmarks/call_pieces.py``, v33),
and each of those µs delays the GPU's start. :class:`StagedLaunch` (the extension's type)
does the same in one call: the tensors' metadata read in C++ (torch's headers), the
driver reached through the addresses of ctypes' libcuda functions, so the extension links
no CUDA library and builds on any machine with a C++ compiler and torch.

``StagedLaunch.call`` (v35) is the engine's path for a batch size it has served before
(``GraphCache.routes``): with the current stream read through torch's own function, the
launch made on the spare output the object keeps (named after the previous call's
launch), and the next spare made and named after it, no Python runs between the route
lookup and the launch (2.5-3 µs off a call's path on the H200's host, v35). Anything in
its way before the launch (another stream, a misfit, a driver failure) hands the call
back to ``launch``'s checked path, which orders, refuses or raises.

The extension is compiled on first use (:func:`load`: ~10-25 s, once per source, Python and
torch version) into ``build/native``, with the compiler the environment names (``CXX``,
else ``c++``). Where it cannot be built or loaded, :func:`make` warns once and returns None,
and the engine keeps the Python path, which stays the reference.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

SOURCE = Path(__file__).resolve().parent / "cpp" / "staged_launch.cpp"
BUILD_DIR = Path(__file__).resolve().parents[2] / "build" / "native"
MODULE = "qa_staged_launch"
NOT_IN_BUCKET, TENSORS_MISFIT = -1, -2  # StagedLaunch.launch's refusals (else a CUresult)
COMPILE_TIMEOUT_S = 300  # ~10-25 s measured; a compile this slow is stuck

_lock = threading.Lock()
_module: ModuleType | None = None
_failure: str | None = None  # why the last attempt to build or load failed


def compile_command(source: Path, target: Path) -> list[str]:
    """The compiler command that builds ``source`` into the extension ``target``, against
    this process's Python and torch (torch's own include and library paths and C++ ABI)."""
    import torch
    from torch.utils import cpp_extension

    compiler = shlex.split(os.environ.get("CXX", "c++"))
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libraries = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [*compiler, "-O2", "-std=c++20", "-shared", "-fPIC", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{d}" for d in includes),
            str(source), "-o", str(target), *(f"-L{d}" for d in libraries),
            *(f"-Wl,-rpath,{d}" for d in libraries), "-ltorch_python", "-ltorch",
            "-ltorch_cpu", "-lc10"]


def target_path(build_dir: Path = BUILD_DIR, source: Path = SOURCE) -> Path:
    """Where the extension of this source, Python, torch and compiler command lives: a
    name per build."""
    import torch

    key = hashlib.sha1(source.read_bytes())
    command = compile_command(Path("source.cpp"), Path("target.so"))
    key.update(f"{sys.version}|{torch.__version__}|{shlex.join(command)}".encode())
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return build_dir / f"{MODULE}-{key.hexdigest()[:12]}{suffix}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive across processes (two test workers, two engines' first captures)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(build_dir: Path = BUILD_DIR, source: Path = SOURCE) -> Path:
    """The extension's path, compiled first where it is missing. RuntimeError with the
    compiler's output where compiling fails."""
    target = target_path(build_dir, source)
    if target.is_file():
        return target
    with _file_lock(target.with_suffix(".lock")):
        if target.is_file():  # built by another process meanwhile
            return target
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        command = compile_command(source, partial)
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False,
                                  timeout=COMPILE_TIMEOUT_S)
            if done.returncode != 0:
                raise RuntimeError(f"compiling {source.name} failed ({shlex.join(command)}):"
                                   f"\n{(done.stderr or done.stdout)[-2000:]}")
            os.replace(partial, target)
        except OSError as exc:  # no compiler at all
            raise RuntimeError(f"cannot run the C++ compiler {command[0]!r}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"compiling {source.name} took over {COMPILE_TIMEOUT_S} s"
                               ) from exc
        finally:
            partial.unlink(missing_ok=True)  # whatever a failed or stopped compile left
    return target


def load(build_dir: Path = BUILD_DIR) -> ModuleType:
    """The extension module, built where needed and loaded once per process."""
    global _module
    with _lock:
        if _module is None:
            path = build(build_dir)
            spec = importlib.util.spec_from_file_location(MODULE, path)
            if spec is None or spec.loader is None:
                raise RuntimeError(f"{path} is not a loadable extension")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _module = module
        return _module


def available() -> bool:
    """Whether the extension builds and loads here (the first call may compile it). A
    failure warns once and is kept: no later call tries again (a failing compile would
    otherwise cost every graph capture its time)."""
    global _failure
    if _failure is not None:
        return False
    try:
        load()
    except (RuntimeError, OSError, ImportError) as exc:
        _failure = str(exc)
        warnings.warn(f"the compiled staged launch is not available ({_failure}); calls on "
                      "device tensors take the Python path (a few µs more host time each)",
                      RuntimeWarning, stacklevel=3)
        return False
    return True


def make(**fields: Any) -> Any | None:
    """A ``StagedLaunch`` of the given fields (see ``staged_init`` in the source), or None
    (with :func:`available`'s warning, or one naming what the extension refused) where it
    cannot be had: the caller then takes the Python path."""
    if not available():
        return None
    try:
        return load().StagedLaunch(**fields)
    except (TypeError, ValueError, OverflowError) as exc:  # a graph it cannot describe
        warnings.warn(f"the compiled staged launch refused this graph ({exc}); its calls "
                      "take the Python path", RuntimeWarning, stacklevel=2)
        return None
