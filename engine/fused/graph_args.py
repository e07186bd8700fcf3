"""Kernel arguments inside an instantiated CUDA graph, set between its launches.

A captured graph replays the arguments its kernels were captured with. The driver lets the
host change one kernel node's arguments in the instantiated graph
(``cuGraphExecKernelNodeSetParams``), and the change applies to launches made after it, never
to one already queued or running. So a call can name its own tensors to a graph with no
handshake with the GPU: the engine's graphs read the caller's inputs in their first kernel
(``kernels.STAGE_ARGS``) and write the logits into the caller's tensor in their last, and a
call on device tensors is one launch with nothing staged or copied around it. torch has no
binding for this; ctypes reaches the driver, which also launches the graphs
(:class:`Launcher`) in their device's context (:class:`Context`) and says where kernels
reach pinned host memory (:func:`device_address`).

Nodes are found in the graph (captured with ``keep_graph=True``) by what their arguments
held at capture: :func:`leading_args`, the graph's first kernel, whose leading arguments
were given values; :func:`pointer_arg`, the arguments of its last kernel that held an
address. Kernels between them (library ones among them) are never queried.
Argument layouts (offset and size of each) come from the driver (``cuFuncGetParamInfo``,
CUDA 12.4 and later: :func:`supported`). An argument a call sets must not have been specialised by triton at
capture (``do_not_specialize``, on alignment too, for any value a call may set; a pointer
to a fresh torch allocation keeps any alignment triton assumed).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable

import torch

_NODE_KERNEL = 0  # CU_GRAPH_NODE_TYPE_KERNEL
_LOSSY_QUERY = 402  # CUDA_ERROR_LOSSY_QUERY: the node's edges carry data (e.g. PDL ones)
_MIN_DRIVER = 12040  # cuFuncGetParamInfo
_FORMATS = {"Q": 8, "q": 8, "i": 4, "I": 4}  # struct formats of the settable arguments


class _NodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p),
                ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem_bytes", ctypes.c_uint),
                ("kernel_params", ctypes.POINTER(ctypes.c_void_p)),
                ("extra", ctypes.POINTER(ctypes.c_void_p)),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


_driver: ctypes.CDLL | None = None


def _cuda() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuGraphLaunch.restype = ctypes.c_int
        lib.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuStreamSynchronize.restype = ctypes.c_int
        lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cuStreamQuery.restype = ctypes.c_int
        lib.cuStreamQuery.argtypes = [ctypes.c_void_p]
        lib.cuMemcpyHtoDAsync_v2.restype = ctypes.c_int
        lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_void_p]
        _driver = lib
    return _driver


def _set_params() -> Callable[..., int]:
    """``cuGraphExecKernelNodeSetParams_v2`` (CUDA 12.4 drivers and later: :func:`supported`)."""
    function = _cuda().cuGraphExecKernelNodeSetParams_v2
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_NodeParams)]
    return function


def driver_functions() -> dict[str, int]:
    """The addresses of the driver functions a staged call makes (for the compiled path,
    ``engine.fused.staged_launch``, which links no CUDA library), under the names its
    ``StagedLaunch`` takes them by."""
    cuda = _cuda()
    names = {"set_params": "cuGraphExecKernelNodeSetParams_v2", "graph_launch": "cuGraphLaunch",
             "ctx_get": "cuCtxGetCurrent", "ctx_set": "cuCtxSetCurrent"}
    return {key: ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value or 0
            for key, name in names.items()}


def supported() -> bool:
    """Whether this process's CUDA driver can do what this module asks of it (12.4 or
    later, with ``cuFuncGetParamInfo``); False where there is no driver at all."""
    try:
        lib = _cuda()
    except OSError:
        return False
    version = ctypes.c_int(0)
    return (hasattr(lib, "cuFuncGetParamInfo")
            and lib.cuDriverGetVersion(ctypes.byref(version)) == 0
            and version.value >= _MIN_DRIVER)


def check(result: int, what: str) -> None:
    """Raise on a driver error, named as the driver names it (e.g. CUDA_ERROR_ASSERT, a
    device-side assert that ended the context)."""
    if result != 0:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        cuda = _cuda()
        cuda.cuGetErrorName(result, ctypes.byref(name))
        cuda.cuGetErrorString(result, ctypes.byref(text))
        raise RuntimeError(f"CUDA error: {what} failed: {(name.value or b'?').decode()} "
                           f"({(text.value or b'?').decode()}; CUresult {result})")


_DEVICE_POINTER = 3  # CU_POINTER_ATTRIBUTE_DEVICE_POINTER (2 is the memory type)


def device_address(host_address: int) -> int | None:
    """Where kernels reach pinned host memory (unified addressing: usually the host address
    itself); None where the driver gives no such address (not pinned, or not mapped)."""
    value = ctypes.c_uint64(0)
    if _cuda().cuPointerGetAttribute(ctypes.byref(value), _DEVICE_POINTER,
                                     ctypes.c_uint64(host_address)) != 0:
        return None
    return value.value


class Context:
    """The primary CUDA context of one device (the one torch's runtime uses), retained
    here and never released (torch keeps it for the process's life as well). Driver calls
    (launches, argument sets) act in the calling thread's current context: a thread that
    has made no CUDA runtime call yet has none, and one that last worked on another
    device has that device's. :meth:`enter` makes this one current where it is not and
    :meth:`leave` restores what was. One thread at a time (the engine's lock)."""

    def __init__(self, device_index: int) -> None:
        cuda = _cuda()
        device, context = ctypes.c_int(), ctypes.c_void_p()
        check(cuda.cuDeviceGet(ctypes.byref(device), device_index), "cuDeviceGet")
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
              "cuDevicePrimaryCtxRetain")
        if not context.value:
            raise RuntimeError(f"device {device_index} has no primary context")
        self.handle: int = context.value  # the CUcontext (also for code making its own calls)
        self._get, self._set = cuda.cuCtxGetCurrent, cuda.cuCtxSetCurrent
        self._found = ctypes.c_void_p()  # scratch: one caller at a time

    def enter(self) -> int | None:
        """None if this context was current already, else the one to :meth:`leave` to
        (0: none)."""
        check(self._get(ctypes.byref(self._found)), "cuCtxGetCurrent")
        if self._found.value == self.handle:
            return None
        previous = self._found.value or 0
        check(self._set(self.handle), "cuCtxSetCurrent")
        return previous

    def leave(self, previous: int | None) -> None:
        if previous is not None:
            check(self._set(previous or None), "cuCtxSetCurrent")


class Launcher:
    """``cuGraphLaunch`` of one instantiated graph on a raw stream handle: what
    ``CUDAGraph.replay`` does without its bookkeeping of random-number generators (the
    engine's graphs draw none). Host time per launch, BERT-base 1x128 (``launch_cost.py``,
    H200): 2.9 against 3.6 µs (v24), 4.8 against 6.9 on a slower host (v25). Holds the
    graph: its executable graph lives as long as it does."""

    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self._graph = graph
        self._exec = graph.raw_cuda_graph_exec()
        self._launch = _cuda().cuGraphLaunch

    def __call__(self, stream: int) -> None:
        check(self._launch(self._exec, stream), "cuGraphLaunch")


def copy_to_device(device: int, host: int, nbytes: int, stream: int) -> None:
    """Queue a copy of ``nbytes`` from (pinned) host memory to device memory on a raw
    stream handle, in the current context (``cuMemcpyHtoDAsync``): one driver call, where
    torch's ``copy_`` adds its dispatch."""
    check(_cuda().cuMemcpyHtoDAsync_v2(device, host, nbytes, stream or None),
          "cuMemcpyHtoDAsync")


def synchronize(stream: int) -> None:
    """Wait for the work queued so far on a raw stream handle (in the current context:
    0 is its legacy default stream), as ``torch.cuda.Stream.synchronize`` does, without
    making torch's stream object (~5 µs of host time on the H200's host, v26)."""
    check(_cuda().cuStreamSynchronize(stream or None), "cuStreamSynchronize")


def argument_layout(function: int) -> list[tuple[int, int]]:
    """(offset, size) in bytes of each argument of a kernel (a ``CUfunction`` handle);
    empty where the driver cannot say."""
    cuda = _cuda()
    layout: list[tuple[int, int]] = []
    offset, size = ctypes.c_size_t(), ctypes.c_size_t()
    while cuda.cuFuncGetParamInfo(ctypes.c_void_p(function), ctypes.c_size_t(len(layout)),
                                  ctypes.byref(offset), ctypes.byref(size)) == 0:
        layout.append((offset.value, size.value))
    return layout  # empty: not a function handle the driver describes


def _kernel_nodes(raw_graph: int, end: str) -> list[tuple[int, _NodeParams]]:
    """The kernel nodes at one end of a (kept) CUDA graph, with their parameters: ``end``
    "first", the graph's roots, or "last", the nodes no node depends on (in a captured
    stream: the first and the last). No other node is looked at: library kernels (cuBLAS)
    in between are never queried."""
    cuda = _cuda()
    graph = ctypes.c_void_p(raw_graph)
    count = ctypes.c_size_t(0)
    listing = "cuGraphGetRootNodes" if end == "first" else "cuGraphGetNodes"
    check(getattr(cuda, listing)(graph, None, ctypes.byref(count)), listing)
    nodes = (ctypes.c_void_p * count.value)()
    check(getattr(cuda, listing)(graph, nodes, ctypes.byref(count)), listing)
    found = []
    for node in nodes:
        handle = ctypes.c_void_p(node)
        kind = ctypes.c_int()
        check(cuda.cuGraphNodeGetType(handle, ctypes.byref(kind)), "cuGraphNodeGetType")
        if kind.value != _NODE_KERNEL:
            continue
        if end == "last":
            dependents = ctypes.c_size_t(0)
            result = cuda.cuGraphNodeGetDependentNodes(handle, None, ctypes.byref(dependents))
            if result == _LOSSY_QUERY or (result == 0 and dependents.value):
                continue  # it has dependents (edges with data make the count query lossy)
            check(result, "cuGraphNodeGetDependentNodes")
        params = _NodeParams()
        check(cuda.cuGraphKernelNodeGetParams_v2(handle, ctypes.byref(params)),
              "cuGraphKernelNodeGetParams")
        if params.kernel_params:  # else launched with a packed buffer: not ours
            found.append((int(node or 0), params))
    return found


def _described(raw_graph: int, end: str,
               ) -> list[tuple[int, _NodeParams, list[tuple[int, int]]]]:
    """:func:`_kernel_nodes` with each one's argument layout, where the driver gives one."""
    layouts: dict[int, list[tuple[int, int]]] = {}
    found = []
    for node, params in _kernel_nodes(raw_graph, end):
        function = params.func or params.kern
        if function:
            if function not in layouts:
                layouts[function] = argument_layout(function)
            if layouts[function]:
                found.append((node, params, layouts[function]))
    if not found:
        raise RuntimeError(f"no {end} kernel of the graph has an argument layout the driver "
                           "describes")
    return found


def _values(params: _NodeParams, layout: list[tuple[int, int]]) -> list[int]:
    """Each argument's captured value as an unsigned integer (little-endian)."""
    return [int.from_bytes(ctypes.string_at(params.kernel_params[i], size), "little")
            for i, (_, size) in enumerate(layout)]


def leading_args(graph: torch.cuda.CUDAGraph, captured: tuple[int, ...],
                 formats: str) -> KernelArgs:
    """The leading arguments (struct ``formats``: ``Q`` an address, ``i`` an int32) of
    the one first kernel of ``graph`` captured with ``captured`` as them."""
    want = [v & ((1 << (8 * _FORMATS[f])) - 1) for v, f in zip(captured, formats, strict=True)]
    found = []
    for node, params, layout in _described(graph.raw_cuda_graph(), "first"):
        if (len(layout) >= len(formats)
                and [size for _, size in layout[:len(formats)]] == [_FORMATS[f] for f in formats]
                and _values(params, layout)[:len(formats)] == want):
            found.append((node, params, layout))
    if len(found) != 1:
        raise RuntimeError(f"expected one first kernel of the graph with those leading "
                           f"arguments, found {len(found)}")
    node, params, layout = found[0]
    return KernelArgs(graph, node, params, layout, list(range(len(formats))), formats)


def pointer_arg(graph: torch.cuda.CUDAGraph, address: int) -> PointerArg:
    """Every argument of the graph's last kernel that held ``address`` at capture (a kernel
    may be given one tensor for several arguments, e.g. for outputs it does not store)."""
    found = []
    for node, params, layout in _described(graph.raw_cuda_graph(), "last"):
        slots = [i for i, v in enumerate(_values(params, layout))
                 if layout[i][1] == 8 and v == address]
        if slots:
            found.append((node, params, layout, slots))
    if len(found) != 1:
        raise RuntimeError(f"expected one last kernel of the graph to hold the address, "
                           f"found {len(found)}")
    node, params, layout, slots = found[0]
    return PointerArg(graph, node, params, layout, slots, "Q" * len(slots))


class KernelArgs:
    """Some arguments (``slots``, increasing, struct ``formats``) of one kernel node of
    ``graph`` (captured with ``keep_graph=True`` and instantiated), the rest kept as
    captured: :meth:`set` changes them for the graph's later launches (only when they
    differ from the last values set)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, node: int, params: _NodeParams,
                 layout: list[tuple[int, int]], slots: list[int], formats: str) -> None:
        if (len(slots) != len(formats) or slots != sorted(set(slots))
                or any(_FORMATS.get(f) != layout[i][1] for i, f in zip(slots, formats,
                                                                        strict=True))):
            raise ValueError(f"argument formats {formats!r} do not match the kernel's "
                             f"argument sizes {[layout[i][1] for i in slots]}")
        total = max(offset + size for offset, size in layout)
        self._buffer = ctypes.create_string_buffer(total)
        base = ctypes.addressof(self._buffer)
        for i, (offset, size) in enumerate(layout):  # every argument as captured
            ctypes.memmove(base + offset, params.kernel_params[i], size)
        self._pointers = (ctypes.c_void_p * len(layout))(*(base + off for off, _ in layout))
        params.kernel_params = ctypes.cast(self._pointers, ctypes.POINTER(ctypes.c_void_p))
        params.extra = None
        self._params = params
        # The set arguments as runs of adjacent ones, a struct each (the bytes between runs
        # hold other arguments: never written).
        runs: list[tuple[int, str, int]] = []  # (offset, format, arguments)
        for i, f in zip(slots, formats, strict=True):
            offset, size = layout[i]
            if runs and runs[-1][0] + struct.calcsize("<" + runs[-1][1]) == offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + f, runs[-1][2] + 1)
            else:
                runs.append((offset, f, 1))
        self._runs = [(offset, struct.Struct("<" + fmt), n) for offset, fmt, n in runs]
        self._count = len(slots)
        # Where each set argument lives in the buffer, and its size (``native_view``).
        self._slots_at = [(base + layout[i][0], layout[i][1]) for i in slots]
        self.node = node  # two KernelArgs on one node would undo each other's values
        self._call = (ctypes.c_void_p(graph.raw_cuda_graph_exec()), ctypes.c_void_p(node),
                      ctypes.byref(self._params))
        self._set = _set_params()
        self._last: tuple[int, ...] | None = None

    def native_view(self) -> tuple[int, int, list[tuple[int, int]]]:
        """(node, address of its kernel node parameters, [(address, size)] of each set
        argument in the buffer those parameters point into), for code that sets them
        itself (``staged_launch``); the buffer lives as long as this object."""
        return self.node, ctypes.addressof(self._params), list(self._slots_at)

    def set(self, *values: int) -> None:
        """The arguments of the graph's later launches."""
        if values == self._last:
            return
        if len(values) != self._count:
            raise ValueError(f"{self._count} argument values expected, got {len(values)}")
        at = 0
        for offset, run, n in self._runs:
            run.pack_into(self._buffer, offset, *values[at:at + n])
            at += n
        self._last = None  # unknown until the driver has taken them
        check(self._set(*self._call), "cuGraphExecKernelNodeSetParams")
        self._last = values


class PointerArg(KernelArgs):
    """One address for every argument it covers (:func:`pointer_arg`)."""

    def set(self, *values: int) -> None:
        """The address (one value) of the graph's later launches."""
        (address,) = values
        super().set(*(address,) * self._count)
