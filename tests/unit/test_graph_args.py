"""``engine.fused.graph_args.KernelArgs``: how a call's values land in a kernel node's
argument buffer, checked without a GPU (the driver's set call is a stand-in that records
the buffer it is handed; finding nodes and the launches themselves are GPU tests)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

# A kernel's arguments as the driver lays them out: (offset, size), with an alignment gap.
LAYOUT = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 4), (36, 4), (40, 8), (48, 8), (56, 4), (64, 8)]


class _Graph:
    def raw_cuda_graph_exec(self) -> int:
        return 0


def _args(monkeypatch: pytest.MonkeyPatch, cls: Any, slots: list[int], formats: str,
          sent: list[list[bytes]], results: list[int] | None = None) -> Any:
    """KernelArgs over ``LAYOUT`` whose driver records each buffer it is handed in ``sent``
    and answers with ``results`` in turn (then 0)."""
    from engine.fused import graph_args as ga

    captured = [bytes([i + 1]) * size for i, (_, size) in enumerate(LAYOUT)]
    keep = [ctypes.create_string_buffer(v, len(v)) for v in captured]
    pointers = (ctypes.c_void_p * len(LAYOUT))(*(ctypes.addressof(b) for b in keep))
    params = ga._NodeParams()
    params.kernel_params = ctypes.cast(pointers, ctypes.POINTER(ctypes.c_void_p))

    def driver_set(_exec: object, _node: object, ref: Any) -> int:
        p = ref._obj  # the node parameters handed to the driver: read every argument
        sent.append([ctypes.string_at(p.kernel_params[i], size)
                     for i, (_, size) in enumerate(LAYOUT)])
        return results.pop(0) if results else 0

    def error_name(result: int, ref: Any) -> int:  # the driver's name of an error code
        ref._obj.value = {700: b"CUDA_ERROR_ILLEGAL_ADDRESS"}.get(result)
        return 0

    driver = type("Driver", (), {"cuGraphExecKernelNodeSetParams_v2": staticmethod(driver_set),
                                 "cuGetErrorName": staticmethod(error_name),
                                 "cuGetErrorString": staticmethod(lambda _r, _ref: 1)})
    monkeypatch.setattr(ga, "_driver", driver())
    args = cls(_Graph(), 1, params, LAYOUT, slots, formats)
    del keep  # the arguments were copied at construction
    return args


def test_leading_arguments_set_and_the_rest_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.fused.graph_args import KernelArgs

    sent: list[list[bytes]] = []
    args = _args(monkeypatch, KernelArgs, [0, 1, 2, 3, 4, 5], "QQQQii", sent)
    args.set(0x1122334455, 2, 3, 4, 5, 6)
    args.set(0x1122334455, 2, 3, 4, 5, 6)  # unchanged: no driver call
    args.set(7, 2, 3, 4, 5, 6)
    assert len(sent) == 2
    first = sent[0]
    assert first[:4] == [v.to_bytes(8, "little") for v in (0x1122334455, 2, 3, 4)]
    assert first[4] == (5).to_bytes(4, "little") and first[5] == (6).to_bytes(4, "little")
    assert first[6:] == [bytes([i + 1]) * size for i, (_, size) in enumerate(LAYOUT)][6:]
    assert sent[1][0] == (7).to_bytes(8, "little")
    with pytest.raises(ValueError, match="6 argument values expected"):
        args.set(1, 2, 3)


def test_one_pointer_for_scattered_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arguments 1, 7 and 9 take the address; those between them keep their bytes."""
    from engine.fused.graph_args import PointerArg

    sent: list[list[bytes]] = []
    arg = _args(monkeypatch, PointerArg, [1, 7, 9], "QQQ", sent)
    arg.set(0xABCDEF)
    want = [bytes([i + 1]) * size for i, (_, size) in enumerate(LAYOUT)]
    for i in (1, 7, 9):
        want[i] = (0xABCDEF).to_bytes(8, "little")
    assert sent == [want]


def test_formats_must_match_the_argument_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.fused.graph_args import KernelArgs

    with pytest.raises(ValueError, match="do not match"):
        _args(monkeypatch, KernelArgs, [0, 4], "QQ", [])  # argument 4 is 4 bytes
    with pytest.raises(ValueError, match="do not match"):
        _args(monkeypatch, KernelArgs, [1, 0], "QQ", [])  # not increasing


def test_values_the_driver_refused_are_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed set leaves no cached values: the same values go to the driver next time."""
    from engine.fused.graph_args import KernelArgs

    sent: list[list[bytes]] = []
    args = _args(monkeypatch, KernelArgs, [0], "Q", sent, results=[700])
    with pytest.raises(RuntimeError, match=r"CUDA error: .* CUDA_ERROR_ILLEGAL_ADDRESS \(\?; "
                                           r"CUresult 700\)"):
        args.set(42)
    args.set(42)
    args.set(42)  # now cached
    assert len(sent) == 2 and sent[1][0] == (42).to_bytes(8, "little")


def test_adjacent_arguments_across_an_alignment_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """An int32 at 56 and an address at 64 are not adjacent (4 bytes of padding between):
    each is written at its own offset and the padding is left alone."""
    from engine.fused.graph_args import KernelArgs

    sent: list[list[bytes]] = []
    args = _args(monkeypatch, KernelArgs, [8, 9], "iQ", sent)
    args.set(-3, 0xFEED)
    assert sent[0][8] == (-3).to_bytes(4, "little", signed=True)
    assert sent[0][9] == (0xFEED).to_bytes(8, "little")
    assert sent[0][:8] == [bytes([i + 1]) * size for i, (_, size) in enumerate(LAYOUT)][:8]
    assert len(args._runs) == 2
