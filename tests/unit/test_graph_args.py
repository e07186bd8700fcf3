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


class _ContextDriver:
    """The driver calls ``Context``, ``Launcher``, ``synchronize``, ``copy_to_device`` and
    ``device_address`` make: one thread's current context, primary contexts by device,
    launches, stream waits, copies and pointer queries recorded."""

    def __init__(self) -> None:
        self.current: int | None = None
        self.launches: list[tuple[int, int]] = []
        self.launch_result = 0
        self.syncs: list[int | None] = []
        self.copies: list[tuple[int, int, int, int | None]] = []
        self.sync_result = 0

    def cuDeviceGet(self, ref: Any, ordinal: int) -> int:
        ref._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ref: Any, device: Any) -> int:
        ref._obj.value = 0x1000 + device.value
        return 0

    def cuCtxGetCurrent(self, ref: Any) -> int:
        ref._obj.value = self.current
        return 0

    def cuCtxSetCurrent(self, context: int | None) -> int:
        self.current = context
        return 0

    def cuGraphLaunch(self, graph_exec: int, stream: int) -> int:
        self.launches.append((graph_exec, stream))
        return self.launch_result

    def cuMemcpyHtoDAsync_v2(self, device: int, host: int, nbytes: int,
                             stream: int | None) -> int:
        self.copies.append((device, host, nbytes, stream))
        return 0

    def cuStreamSynchronize(self, stream: int | None) -> int:
        self.syncs.append(stream)
        return self.sync_result

    def cuPointerGetAttribute(self, ref: Any, attribute: int, address: Any) -> int:
        if attribute != 3 or address.value % 2:  # the device pointer, of pinned memory only
            return 1
        ref._obj.value = address.value
        return 0

    def cuGetErrorName(self, result: int, ref: Any) -> int:
        ref._obj.value = {710: b"CUDA_ERROR_ASSERT"}.get(result)
        return 0

    def cuGetErrorString(self, result: int, ref: Any) -> int:
        ref._obj.value = {710: b"device-side assert triggered"}.get(result)
        return 0


def test_context_made_current_only_where_it_is_not_and_restored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A device's primary context, whatever is current where it is made: entered from a
    thread with none current, or with another device's, it is made current and the
    previous one comes back on leaving; already current, nothing is set."""
    from engine.fused import graph_args as ga

    driver = _ContextDriver()
    monkeypatch.setattr(ga, "_driver", driver)
    driver.current = 0x1000  # device 0's context current where device 1's is made
    ctx = ga.Context(1)
    assert driver.current == 0x1000
    for before in (None, 0x1000):  # no context (a fresh thread), then another device's
        driver.current = before
        previous = ctx.enter()
        assert driver.current == 0x1001 and previous == (before or 0)
        ctx.leave(previous)
        assert driver.current == before
    driver.current = 0x1001
    assert ctx.enter() is None
    ctx.leave(None)
    assert driver.current == 0x1001


def test_launcher_and_device_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch goes to the driver with the graph's executable graph and the stream; a
    failed one raises with the driver's name of the error. A pinned buffer's device
    address is the driver's answer; None where the driver has none."""
    from engine.fused import graph_args as ga

    driver = _ContextDriver()
    monkeypatch.setattr(ga, "_driver", driver)

    class Graph:
        def raw_cuda_graph_exec(self) -> int:
            return 77

    launch = ga.Launcher(Graph())  # type: ignore[arg-type]
    launch(5)
    assert driver.launches == [(77, 5)]
    driver.launch_result = 710
    with pytest.raises(RuntimeError, match=r"CUDA error: cuGraphLaunch failed: "
                                           r"CUDA_ERROR_ASSERT \(device-side assert"):
        launch(5)
    assert ga.device_address(4096) == 4096
    assert ga.device_address(4097) is None


def test_stream_synchronize_and_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A raw stream handle goes to the driver as it is (0, the default stream, as NULL);
    a failed wait (a fault found there) raises with the driver's name of the error. A
    copy to the device goes with its addresses, size and stream."""
    from engine.fused import graph_args as ga

    driver = _ContextDriver()
    monkeypatch.setattr(ga, "_driver", driver)
    ga.synchronize(0)
    ga.synchronize(5)
    assert driver.syncs == [None, 5]
    ga.copy_to_device(4096, 8192, 1548, 0)
    ga.copy_to_device(4096, 8192, 1548, 5)
    assert driver.copies == [(4096, 8192, 1548, None), (4096, 8192, 1548, 5)]
    driver.sync_result = 710
    with pytest.raises(RuntimeError, match=r"CUDA error: cuStreamSynchronize failed: "
                                           r"CUDA_ERROR_ASSERT"):
        ga.synchronize(5)
