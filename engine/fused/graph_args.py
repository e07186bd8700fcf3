"""A kernel's arguments inside an instantiated CUDA graph, set between its launches.

A captured graph replays the arguments its kernels were captured with. The driver lets the
host change one kernel node's arguments in the instantiated graph
(``cuGraphExecKernelNodeSetParams``), and the change applies to launches made after it, never
to one already queued or running. So a call can name its own tensors to a graph with no
handshake with the GPU: the engine's graphs take the caller's input and output tensors as
the arguments of their first and last kernels (``kernels.stage_call``,
``kernels.logits_call``), and a call on device tensors is one launch whose kernels read
nothing from host memory. torch has no binding for this; ctypes reaches the driver.

The node is found in the graph (captured with ``keep_graph=True``) by its kernel's
function handle; the argument layout (offset and size of each) comes from the driver
(``cuFuncGetParamInfo``, CUDA 12.4 and later), and every argument keeps its captured value
except the leading ones a call sets. Those must not have been specialised by triton at
capture (``do_not_specialize``, also on alignment): the compiled kernel holds for any value.
"""

from __future__ import annotations

import ctypes
import struct

import torch

_NODE_KERNEL = 0  # CU_GRAPH_NODE_TYPE_KERNEL
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
        for name in ("cuGraphKernelNodeGetParams_v2", "cuGraphExecKernelNodeSetParams_v2"):
            getattr(lib, name).restype = ctypes.c_int
        lib.cuGraphExecKernelNodeSetParams_v2.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_NodeParams)]
        _driver = lib
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed (CUresult {result})")


def argument_layout(function: int) -> list[tuple[int, int]]:
    """(offset, size) in bytes of each argument of a kernel (a ``CUfunction`` handle)."""
    cuda = _cuda()
    layout: list[tuple[int, int]] = []
    offset, size = ctypes.c_size_t(), ctypes.c_size_t()
    while cuda.cuFuncGetParamInfo(ctypes.c_void_p(function), ctypes.c_size_t(len(layout)),
                                  ctypes.byref(offset), ctypes.byref(size)) == 0:
        layout.append((offset.value, size.value))
    if not layout:
        raise RuntimeError("cuFuncGetParamInfo gave no argument layout for the kernel "
                           "(it needs a CUDA 12.4 driver or later)")
    return layout


def _kernel_nodes(raw_graph: int) -> list[tuple[int, _NodeParams]]:
    """Every kernel node of a (kept) CUDA graph with its parameters."""
    cuda = _cuda()
    graph = ctypes.c_void_p(raw_graph)
    count = ctypes.c_size_t(0)
    _check(cuda.cuGraphGetNodes(graph, None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    _check(cuda.cuGraphGetNodes(graph, nodes, ctypes.byref(count)), "cuGraphGetNodes")
    found = []
    for node in nodes:
        kind = ctypes.c_int()
        _check(cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)),
               "cuGraphNodeGetType")
        if kind.value == _NODE_KERNEL:
            params = _NodeParams()
            _check(cuda.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(params)),
                   "cuGraphKernelNodeGetParams")
            found.append((int(node or 0), params))
    return found


class KernelArgs:
    """The leading arguments of the one node of ``graph`` that runs ``function``.

    ``graph`` was captured with ``keep_graph=True`` and instantiated; ``formats`` gives the
    struct format of each argument a call sets (``Q`` for an address, ``i`` for an int32),
    which must match the kernel's argument sizes. :meth:`set` changes them for the graph's
    later launches (only when they differ from the last values set)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, function: int, formats: str) -> None:
        matches = [(node, params) for node, params in _kernel_nodes(graph.raw_cuda_graph())
                   if function in (params.func, params.kern)]
        if len(matches) != 1:
            raise RuntimeError(f"expected one graph node running the kernel, found "
                               f"{len(matches)}")
        node, params = matches[0]
        if not params.kernel_params:
            raise RuntimeError("the graph node's kernel arguments are not readable")
        layout = argument_layout(function)
        if len(formats) > len(layout) or any(
                _FORMATS.get(f) != size for f, (_, size) in zip(formats, layout, strict=False)):
            raise ValueError(f"argument formats {formats!r} do not match the kernel's "
                             f"argument sizes {[size for _, size in layout]}")
        total = max(offset + size for offset, size in layout)
        self._buffer = ctypes.create_string_buffer(total)
        base = ctypes.addressof(self._buffer)
        for i, (offset, size) in enumerate(layout):  # every argument as captured
            ctypes.memmove(base + offset, params.kernel_params[i], size)
        self._pointers = (ctypes.c_void_p * len(layout))(*(base + off for off, _ in layout))
        params.kernel_params = ctypes.cast(self._pointers, ctypes.POINTER(ctypes.c_void_p))
        params.extra = None
        self._params = params
        # The settable arguments as one struct at the first one's offset (with padding).
        first = layout[0][0]
        fmt, at = "<", first
        for f, (offset, size) in zip(formats, layout, strict=False):
            fmt += "x" * (offset - at) + f
            at = offset + size
        self._struct, self._first = struct.Struct(fmt), first
        self._call = (ctypes.c_void_p(graph.raw_cuda_graph_exec()), ctypes.c_void_p(node),
                      ctypes.byref(self._params))
        self._set = _cuda().cuGraphExecKernelNodeSetParams_v2
        self._last: tuple[int, ...] | None = None

    def set(self, *values: int) -> None:
        """The leading arguments of the graph's later launches."""
        if values == self._last:
            return
        self._struct.pack_into(self._buffer, self._first, *values)
        self._last = None  # unknown until the driver has taken them
        _check(self._set(*self._call), "cuGraphExecKernelNodeSetParams")
        self._last = values
