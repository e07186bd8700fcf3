"""``engine.fused.small_gemm`` and the engine option ``cutlass_small_gemms`` without a GPU:
where the library is looked for, what a missing one says, which calls are refused before
any kernel runs, and the option's checks (its kernels are checked on the GPU:
``tests/gpu/test_fused_gpu.py::test_small_batch_paths_agree[seven_kernels_cutlass]``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import REPO_ROOT

torch = pytest.importorskip("torch")


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    from engine.fused import small_gemm

    monkeypatch.setenv("QA_SMALL_GEMM_LIB", str(tmp_path / "missing.so"))
    small_gemm.LIBRARY.forget()
    yield small_gemm
    small_gemm.LIBRARY.forget()


def test_library_path_and_a_missing_library(no_library) -> None:  # type: ignore[no-untyped-def]
    small_gemm = no_library
    assert small_gemm.library_path().name == "missing.so"
    assert not small_gemm.available()
    with pytest.raises(RuntimeError, match=r"build\.sh small"):
        small_gemm.LIBRARY.load()


def test_default_library_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.fused import small_gemm

    monkeypatch.delenv("QA_SMALL_GEMM_LIB", raising=False)
    assert small_gemm.library_path() == REPO_ROOT / "build" / "cuda" / "libqa_small_gemm.so"


@pytest.mark.parametrize("case", ["fp32 x", "fp32 w", "bias without gelu", "gelu without bias",
                                  "fp16 bias", "K mismatch", "strided x"])
def test_linear_refuses_what_its_kernels_do_not_take(case: str) -> None:
    """Each of these is a ValueError before the library is touched (none exists here)."""
    from engine.fused import small_gemm

    x = torch.zeros(8, 64, dtype=torch.float16)
    w = torch.zeros(32, 64, dtype=torch.float16)
    b = torch.zeros(32)
    kwargs: dict[str, object] = {
        "fp32 x": {"x": x.float(), "w": w},
        "fp32 w": {"x": x, "w": w.float()},
        "bias without gelu": {"x": x, "w": w, "bias": b},
        "gelu without bias": {"x": x, "w": w, "gelu": True},
        "fp16 bias": {"x": x, "w": w, "bias": b.half(), "gelu": True},
        "K mismatch": {"x": x, "w": torch.zeros(32, 32, dtype=torch.float16)},
        "strided x": {"x": torch.zeros(8, 128, dtype=torch.float16)[:, ::2], "w": w},
    }[case]
    with pytest.raises(ValueError, match="small GEMM"):
        small_gemm.linear(**kwargs)  # type: ignore[arg-type]


def test_engine_option_is_checked() -> None:
    """``cutlass_small_gemms`` takes names (a sequence or text; None, "" or () for none),
    refuses unknown ones, and refuses to run where its kernels cannot: without CUDA."""
    from engine.fused.engine import FusedEngine

    base = FusedEngine.from_pretrained(REPO_ROOT / "models" / "minilm-l6-squad", device="cpu",
                                       backend="torch")
    for empty in (None, "", ()):
        engine = FusedEngine(base.weights, "cpu", backend="torch", cutlass_small_gemms=empty)
        assert engine.options.cutlass_small_gemms == ()
    with pytest.raises(ValueError, match="unknown GEMMs"):
        FusedEngine(base.weights, "cpu", backend="torch", cutlass_small_gemms="qkv,ffn2")
    for names in ("ffn1, qkv", ("qkv",)):
        with pytest.raises(ValueError, match="runs on CUDA"):
            FusedEngine(base.weights, "cpu", backend="torch", cutlass_small_gemms=names)
