"""The Triton server shipped in the ``nvidia-pytriton`` wheel: where it is, how it starts.

The wheel carries ``tritonserver``, the python backend and one backend stub per Python
version. The stub must sit in the backend directory, the wheel's bundled libraries must
be on LD_LIBRARY_PATH, and the stub runs model.py with the ``python3`` first on PATH,
so our venv's bin goes first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

STUB_SHM_PREFIX = "triton_python_backend_shm_region_"


@dataclass(frozen=True)
class TritonInstall:
    server_dir: Path  # .../pytriton/tritonserver
    libs_dir: Path  # .../nvidia_pytriton.libs

    @classmethod
    def find(cls) -> TritonInstall:
        import pytriton

        site = Path(pytriton.__file__).resolve().parent.parent
        install = cls(site / "pytriton" / "tritonserver", site / "nvidia_pytriton.libs")
        if not (install.server_dir / "bin" / "tritonserver").exists():
            raise FileNotFoundError(f"no tritonserver binary under {install.server_dir}")
        return install

    @property
    def binary(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"

    def backend_dir(self, build_dir: Path) -> Path:
        """A backends/ folder with the python backend and this Python's stub (made once)."""
        python_dir = build_dir / "backends" / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        source = self.server_dir / "backends" / "python"
        for item in source.iterdir():
            if item.is_file():
                _copy_if_changed(item, python_dir / item.name)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = self.server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.exists():
            raise FileNotFoundError(f"the wheel has no python backend stub for Python {version}")
        _copy_if_changed(stub, python_dir / stub.name)
        return python_dir.parent

    def environment(
        self, extra_pythonpath: Path, base: dict[str, str] | None = None
    ) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(self.libs_dir), libdir, env.get("LD_LIBRARY_PATH", "")) if p
        )
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(extra_pythonpath), env.get("PYTHONPATH", "")) if p
        )
        return env

    def command(
        self, repository: Path, backend_dir: Path, http: int, grpc: int, metrics: int
    ) -> list[str]:
        return [
            str(self.binary),
            f"--model-repository={repository}",
            f"--backend-directory={backend_dir}",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--allow-metrics=true",
            "--strict-readiness=true",
            "--exit-on-error=true",
            "--log-verbose=0",
        ]


def remove_stub_shared_memory(stub_argv: list[str]) -> None:
    """Remove the shared memory region a killed python backend stub leaves in /dev/shm.

    The stub names it on its command line. It is removed on a clean stop, and by a stub that
    ends on its own after Triton died; a stub killed with SIGKILL leaves it.
    """
    for arg in stub_argv:
        if arg.startswith(STUB_SHM_PREFIX) and "/" not in arg:
            with contextlib.suppress(OSError):
                (Path("/dev/shm") / arg).unlink()


def _copy_if_changed(src: Path, dst: Path) -> None:
    if not dst.exists() or dst.stat().st_size != src.stat().st_size:
        shutil.copy2(src, dst)
