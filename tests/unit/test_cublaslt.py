"""``engine.fused.cublaslt``: argument checks that need no GPU (the GEMMs themselves are
checked against float32 math in tests/gpu)."""

from __future__ import annotations

import pytest
import torch

from engine.fused import cublaslt
from engine.fused.cublaslt_algos import AlgoConfig

E4M3 = torch.float8_e4m3fn


def _operands(m: int = 8, n: int = 16, k: int = 32) -> tuple[torch.Tensor, ...]:
    x = torch.zeros((m, k)).to(E4M3)
    w = torch.zeros((n, k)).to(E4M3)
    return x, torch.ones(m), w, torch.ones(n)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "xq": a["xq"].float()}, "e4m3 operands"),
        (lambda a: {**a, "w8": torch.zeros((16, 24)).to(E4M3)}, "do not multiply"),
        (lambda a: {**a, "xq": torch.zeros((32, 8)).to(E4M3).t()}, "row-major"),
        (lambda a: {**a, "x_scale": torch.ones(3)}, "x_scale must hold 1 or 8"),
        (lambda a: {**a, "w_scale": torch.ones(16, dtype=torch.float64)}, "float32"),
        (lambda a: {**a, "out_dtype": torch.float32}, "unsupported output dtype"),
        (lambda a: {**a, "out_dtype": E4M3}, "needs out_scale"),
        (lambda a: {**a, "out_scale": torch.ones(1)}, "needs out_scale"),
        (lambda a: {**a, "bias": torch.ones(15).half()}, "bias must be"),
        (lambda a: {**a, "bias": torch.ones(16)}, "bias must be"),
        (lambda a: {**a, "out": torch.empty((8, 16))}, "out must be"),
        (lambda a: {**a, "addend": torch.empty((8, 15)).half()}, "addend must be"),
        (lambda a: {**a, "addend": torch.empty((8, 16))}, "addend must be"),
        (lambda a: {**a, "addend": torch.empty((16, 8)).half().t()}, "addend must be"),
        (lambda a: {**a, "out_dtype": E4M3, "out_scale": torch.ones(1),
                    "addend": torch.empty((8, 16)).half()}, "addend must be"),
        (lambda a: {**a, "algo": -1}, "algo must be"),
        (lambda a: {**a, "algo": 0, "config": AlgoConfig(66)}, "not both"),
    ],
)
def test_bad_arguments_are_refused_before_any_library_call(change, message) -> None:  # type: ignore[no-untyped-def]
    x, xs, w, ws = _operands()
    args = {"xq": x, "x_scale": xs, "w8": w, "w_scale": ws, "out_dtype": torch.float16}
    with pytest.raises(ValueError, match=message):
        cublaslt.fp8_linear(**change(args))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "x": a["x"].float()}, "two fp16 or two bf16"),
        (lambda a: {**a, "w": a["w"].bfloat16()}, "two fp16 or two bf16"),
        (lambda a: {**a, "w": torch.zeros((16, 24)).half()}, "do not multiply"),
        (lambda a: {**a, "x": torch.zeros((32, 8)).half().t()}, "row-major"),
        (lambda a: {**a, "out": torch.empty((8, 16))}, "out must be"),
        (lambda a: {**a, "out": torch.empty((16, 8)).half()}, "out must be"),
        (lambda a: {**a, "algo": -1}, "algo must be"),
        (lambda a: {**a, "algo": 0, "config": AlgoConfig(66)}, "not both"),
    ],
)
def test_half_linear_bad_arguments_are_refused_before_any_library_call(change, message) -> None:  # type: ignore[no-untyped-def]
    args = {"x": torch.zeros((8, 32)).half(), "w": torch.zeros((16, 32)).half()}
    with pytest.raises(ValueError, match=message):
        cublaslt.half_linear(**change(args))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"x_scale": None}, "both scales"),
        ({"w_scale": None}, "both scales"),
        ({"x_scale": None, "w_scale": None}, "two fp16 or two bf16"),  # e4m3 operands
        ({"x_scale": None, "w_scale": None, "xq": torch.zeros((8, 32)).half(),
          "w8": torch.zeros((16, 32)).half(), "gelu": True}, "no epilogue"),
        ({"x_scale": None, "w_scale": None, "xq": torch.zeros((8, 32)).half(),
          "w8": torch.zeros((16, 32)).half(), "out_dtype": torch.bfloat16}, "operands' type"),
    ],
)
def test_search_space_takes_both_scales_or_a_plain_16_bit_gemm(kw, message) -> None:  # type: ignore[no-untyped-def]
    x, xs, w, ws = _operands()
    args = {"xq": x, "x_scale": xs, "w8": w, "w_scale": ws, "out_dtype": torch.float16}
    with pytest.raises(ValueError, match=message):
        cublaslt.search_space(**{**args, **kw})


def test_tuned_half_linear_leaves_cpu_and_untuned_gemms_to_the_caller(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """None (the caller's ``torch.mm`` runs) for CPU tensors, with ``TUNED`` off, for
    operands ``half_linear`` does not take, and for shapes the table has no entry for; a
    shape's table lookup is made once (until ``clear_plans``), and a plan only for a
    shape with an entry. CPU stand-ins for the device, the plan and the library call."""
    x, w = torch.zeros((8, 32)).half(), torch.zeros((16, 32)).half()
    assert cublaslt.tuned_half_linear(x, w) is None  # CPU tensors: before any lookup
    looked: list[int] = []
    planned: list[int] = []
    ran: list[int] = []
    entries = {8: AlgoConfig(66)}

    class Cuda:  # what tuned_half_linear reads of a CUDA tensor, over a CPU one
        def __init__(self, t: torch.Tensor) -> None:
            self.t, self.is_cuda, self.device = t, True, "cuda:0"

        def __getattr__(self, name: str) -> object:
            return getattr(self.t, name)

    def plan(key: cublaslt._Key) -> object:
        planned.append(key.m)
        return type("P", (), {"tuned": entries.get(key.m)})()

    monkeypatch.setattr(cublaslt, "_loads", lambda: True)
    monkeypatch.setattr(cublaslt, "_HALF_TUNED", {})
    monkeypatch.setattr(cublaslt, "_PLANS", type(cublaslt._PLANS)())
    monkeypatch.setattr(cublaslt, "_tuned_config",
                        lambda key: looked.append(key.m) or entries.get(key.m))
    monkeypatch.setattr(cublaslt, "_plan", plan)
    monkeypatch.setattr(cublaslt, "_matmul", lambda key, *a: ran.append(key.m) or "product")
    monkeypatch.setattr(cublaslt, "_out", lambda key, x, out: None)
    for m in (8, 4, 8, 4):
        got = cublaslt.tuned_half_linear(Cuda(torch.zeros((m, 32)).half()), Cuda(w))  # type: ignore[arg-type]
        assert got == ("product" if m == 8 else None)
    assert looked == [8, 4] and planned == [8] and ran == [8, 8]
    assert cublaslt.tuned_half_linear(Cuda(x.float()), Cuda(w)) is None  # type: ignore[arg-type]
    monkeypatch.setattr(cublaslt, "TUNED", False)
    assert cublaslt.tuned_half_linear(Cuda(x), Cuda(w)) is None  # type: ignore[arg-type]
    monkeypatch.setattr(cublaslt, "TUNED", True)
    cublaslt.clear_plans()  # looks the table up again
    assert cublaslt.tuned_half_linear(Cuda(x), Cuda(w)) == "product"  # type: ignore[arg-type]
    assert looked == [8, 4, 8] and ran == [8, 8, 8]


def test_missing_library_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QA_CUBLASLT_LIB", "/nonexistent/libcublasLt.so")
    cublaslt._lib.cache_clear()
    try:
        with pytest.raises(cublaslt.CublasLtError, match="QA_CUBLASLT_LIB"):
            cublaslt._lib()
    finally:
        cublaslt._lib.cache_clear()


def test_scale_kind() -> None:
    assert cublaslt._scale_rows(torch.ones(8), 8, "s") is True
    assert cublaslt._scale_rows(torch.ones(1), 8, "s") is False
    assert cublaslt._scale_rows(torch.ones(1), 1, "s") is False  # one row: a scalar


def test_workspaces_per_stream_and_per_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call's workspace is its owner's under ``using`` (any stream, one per device),
    else its stream's; none is made inside a capture (a graph would keep a pointer to
    memory allocated in its own pool). CPU stand-ins for the allocation and the capture."""
    made: list[str] = []

    def fake_empty(n: int, dtype: torch.dtype, device: str) -> torch.Tensor:
        made.append(device)
        return torch.zeros(1, dtype=dtype)

    capturing = [False]
    monkeypatch.setattr(cublaslt.torch, "empty", fake_empty)
    monkeypatch.setattr(cublaslt.torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(cublaslt, "_WORKSPACES", {})
    a, b = cublaslt._workspace(0, 11), cublaslt._workspace(0, 22)
    assert a is not b and cublaslt._workspace(0, 11) is a
    owner = cublaslt.Workspace()
    with cublaslt.using(owner):
        mine = cublaslt._workspace(0, 11)
        assert mine is not a and cublaslt._workspace(0, 22) is mine
        assert cublaslt._workspace(1, 22) is not mine
    assert cublaslt._workspace(0, 11) is a
    assert made == ["cuda:0", "cuda:0", "cuda:0", "cuda:1"]
    capturing[0] = True
    assert cublaslt._workspace(0, 22) is b  # made before the capture
    with pytest.raises(cublaslt.CublasLtError, match="inside a capture"):
        cublaslt._workspace(0, 33)
    with cublaslt.using(cublaslt.Workspace()), pytest.raises(cublaslt.CublasLtError):
        cublaslt._workspace(0, 11)
    with cublaslt.using(owner):
        assert cublaslt._workspace(0, 33) is mine
    assert len(made) == 4
