"""Weights kept in L2 between calls: an access-policy window on a graph's kernels.

A batch-1 pass streams every layer's weights from HBM (BERT-base, calibrated FP8: ~78 MB of
e4m3 weights against an L2 of 50-60 MB), so consecutive calls find none of them in L2. With
part of L2 set aside for *persisting* lines (``cuCtxSetLimit``,
``CU_LIMIT_PERSISTING_L2_CACHE_SIZE``, a limit of this process's context, not a device
setting) and an access-policy window over the weights on each kernel node of a graph,
the lines the window marks persisting stay in L2 from one call to the next; the rest
streams as before. TensorRT exposes the same thing (``setPersistentCacheLimit``).

``hit_ratio`` is the share of the window's lines that persist (CUDA picks them by
address), so a window over the whole arena at ``set-aside / arena`` spreads the kept lines
over every layer. The driver API is reached through ctypes (torch has no binding for it).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

_ATTR_MAX_PERSISTING_L2 = 108  # CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE
_ATTR_MAX_WINDOW = 109  # CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE
_LIMIT_PERSISTING_L2 = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
_NODE_KERNEL = 0  # CU_GRAPH_NODE_TYPE_KERNEL
_ATTR_ACCESS_POLICY_WINDOW = 1  # CU_KERNEL_NODE_ATTRIBUTE_ACCESS_POLICY_WINDOW
_PERSISTING, _STREAMING = 2, 1  # CUaccessProperty
_HIT_PROP = _PERSISTING  # DEBUG (temporary): A/B of the property
_APPLY = True  # DEBUG (temporary): keep_graph without the window


class _Window(ctypes.Structure):  # CUaccessPolicyWindow
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t),
                ("hit_ratio", ctypes.c_float), ("hit_prop", ctypes.c_int),
                ("miss_prop", ctypes.c_int)]


class _AttrValue(ctypes.Union):  # CUlaunchAttributeValue (64 bytes)
    _fields_ = [("window", _Window), ("pad", ctypes.c_char * 64)]


_driver: ctypes.CDLL | None = None


def _cuda() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed (CUresult {result})")


@dataclass(frozen=True)
class Limits:
    l2_bytes: int
    max_persisting_bytes: int  # the largest set-aside this GPU allows
    max_window_bytes: int


def limits(device: torch.device) -> Limits:
    """This GPU's L2, its largest persisting set-aside and largest window."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    values = []
    for attr in (_ATTR_MAX_PERSISTING_L2, _ATTR_MAX_WINDOW):
        v = ctypes.c_int()
        _check(_cuda().cuDeviceGetAttribute(ctypes.byref(v), attr, index),
               "cuDeviceGetAttribute")
        values.append(v.value)
    return Limits(torch.cuda.get_device_properties(index).L2_cache_size, *values)


def set_aside(nbytes: int) -> int:
    """Set the context's persisting L2 limit to ``nbytes`` (at most the GPU's); returns the
    limit in force. The caller's device must be current (torch makes it so)."""
    torch.cuda.init()  # type: ignore[no-untyped-call]
    _check(_cuda().cuCtxSetLimit(_LIMIT_PERSISTING_L2, ctypes.c_size_t(nbytes)),
           "cuCtxSetLimit(persisting L2)")
    got = ctypes.c_size_t()
    _check(_cuda().cuCtxGetLimit(ctypes.byref(got), _LIMIT_PERSISTING_L2), "cuCtxGetLimit")
    return got.value


def reset() -> None:
    """Turn every persisting line in L2 back into a normal one."""
    _check(_cuda().cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")


@dataclass(frozen=True)
class Window:
    base: int  # device address
    nbytes: int
    hit_ratio: float  # share of the window's lines that persist, (0, 1]

    def __post_init__(self) -> None:
        if self.nbytes <= 0 or not 0.0 < self.hit_ratio <= 1.0:
            raise ValueError(f"an L2 window needs bytes > 0 and a hit ratio in (0, 1]: {self}")


def apply(raw_graph: int, window: Window) -> int:
    """Give every kernel node of the (not yet instantiated) CUDA graph ``raw_graph`` the
    access-policy window; returns how many kernel nodes got it."""
    cuda = _cuda()
    graph = ctypes.c_void_p(raw_graph)
    count = ctypes.c_size_t(0)
    _check(cuda.cuGraphGetNodes(graph, None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    _check(cuda.cuGraphGetNodes(graph, nodes, ctypes.byref(count)), "cuGraphGetNodes")
    value = _AttrValue()
    if not _APPLY:
        return 0
    value.window = _Window(window.base, window.nbytes, window.hit_ratio, _HIT_PROP,
                           _STREAMING)
    kernels = 0
    for node in nodes:
        kind = ctypes.c_int()
        _check(cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)),
               "cuGraphNodeGetType")
        if kind.value != _NODE_KERNEL:
            continue
        _check(cuda.cuGraphKernelNodeSetAttribute(
            ctypes.c_void_p(node), _ATTR_ACCESS_POLICY_WINDOW, ctypes.byref(value)),
            "cuGraphKernelNodeSetAttribute(access policy window)")
        kernels += 1
    return kernels
