"""``benchmarks/qkv_attention.py``'s swap into the engine (``install``), without a GPU: which
QKV GEMM + attention pairs go to the fused kernel, with which operands, and which stay on
the engine's kernels (the kernel itself is checked on the GPU by the tool's ``--check``)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


class FakeLibrary:
    """Records ``qa_qkv_attention`` calls (pointers and sizes) and returns ``rc``."""

    def __init__(self, rc: int = 0) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.rc = rc

    def qa_qkv_attention(self, *args: Any) -> int:
        self.calls.append(args)
        return self.rc


@pytest.fixture
def engine_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The engine's three kernels replaced by recorders (restored after the test, with
    whatever ``install`` put in their place); a call with ``late_release`` is recorded
    with a ``+late`` suffix."""
    from engine.fused import kernels

    calls: list[str] = []
    for name in ("folded_linear", "linear", "attention_varlen"):
        def record(*args: Any, _name: str = name, **kw: Any) -> Any:
            calls.append(_name + ("+late" if kw.get("late_release") else ""))
            return torch.zeros((args[0].shape[0], 3 * args[0].shape[1]))
        monkeypatch.setattr(kernels, name, record)
    return calls


def _operands(m: int = 16, d: int = 768) -> dict[str, Any]:
    return {"x": torch.zeros((m, d), dtype=torch.float16),
            "w": torch.zeros((3 * d, d), dtype=torch.float16),
            "u": torch.zeros(3 * d), "stats": torch.zeros((m, 2)),
            "bias": torch.zeros(3 * d), "cu": torch.tensor([0, m], dtype=torch.int32),
            "zero": torch.zeros(100)}


def test_folded_pairs_go_to_the_fused_kernel(engine_calls: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import qkv_attention as tool
    from engine.fused import kernels

    lib = FakeLibrary()
    monkeypatch.setattr(tool, "FUSE", ("folded",))
    tool.install(lib=lib)
    o = _operands()
    qkv = kernels.folded_linear(o["x"], o["w"], o["u"], None, o["stats"], 1e-5,
                                zero=o["zero"], pdl=True)
    assert qkv.shape == (16, 3 * 768) and not engine_calls  # a placeholder, nothing ran
    out = kernels.attention_varlen(qkv, o["bias"], o["cu"], 16, 1, 12)
    assert out.shape == (16, 768) and not engine_calls
    (args,) = lib.calls
    pointers = [o[k].data_ptr() for k in ("x", "w", "u", "stats", "bias", "cu")]
    assert args[:8] == (*pointers, out.data_ptr(), o["zero"].data_ptr())
    assert args[8] == 100 and args[10:14] == (16, 768, 12, 1)  # zero numel, m, d, heads, seqs
    assert args[16:18] == (1, 1)  # folded, PDL
    # Not the QKV (an activation), or wider than the kernel's 128 rows: the engine's kernels.
    kernels.folded_linear(o["x"], o["w"], o["u"], None, o["stats"], 1e-5, act="gelu",
                          late_release=True)
    big = _operands(m=200)
    qkv = kernels.folded_linear(big["x"], big["w"], big["u"], None, big["stats"], 1e-5)
    kernels.attention_varlen(qkv, big["bias"], big["cu"], 200, 1, 12, late_release=True)
    assert engine_calls == ["folded_linear+late", "folded_linear", "attention_varlen+late"]
    assert len(lib.calls) == 1


def test_plain_pairs_and_switching_off(engine_calls: list[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import qkv_attention as tool
    from engine.fused import kernels

    lib = FakeLibrary()
    monkeypatch.setattr(tool, "FUSE", ("plain",))
    tool.install(lib=lib)
    o = _operands(d=1024)
    qkv = kernels.linear(o["x"], o["w"], pdl=False)
    kernels.attention_varlen(qkv, o["bias"], o["cu"], 16, 1, 16)
    (args,) = lib.calls
    assert args[2] == 0 and args[3] == 0 and args[16:18] == (0, 0)  # no fold, no PDL
    kernels.folded_linear(o["x"], o["w"], o["u"], None, o["stats"], 1e-5)  # not "folded"
    monkeypatch.setattr(tool, "FUSE", ())
    qkv = kernels.linear(o["x"], o["w"], late_release=True)
    kernels.attention_varlen(qkv, o["bias"], o["cu"], 16, 1, 16)
    assert engine_calls == ["folded_linear", "linear+late", "attention_varlen"]
    lib.rc = 1
    monkeypatch.setattr(tool, "FUSE", ("plain",))
    qkv = kernels.linear(o["x"], o["w"])
    with pytest.raises(RuntimeError, match="returned 1"):
        kernels.attention_varlen(qkv, o["bias"], o["cu"], 16, 1, 16)
