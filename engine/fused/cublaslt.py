"""cuBLASLt FP8 GEMMs with fused epilogues, called through ctypes (no build step).

``torch._scaled_mm`` runs cuBLASLt's FP8 GEMM but exposes neither its epilogues (bias,
bias + GELU) nor an e4m3 output with its own scale. This module calls the same library
directly::

    y = out_scale * act(x_scale * w_scale * (xq @ w8^T) + bias)

with ``xq`` [M, K] and ``w8`` [N, K] e4m3 (row-major, so cuBLASLt's column-major "TN"
layout with no copy), ``x_scale`` one float32 per row of ``xq`` or one for the tensor,
``w_scale`` one per row of ``w8`` or one for the tensor, ``act`` nothing or cuBLASLt's
GELU (its tanh form), and ``y`` fp16/bf16, or e4m3 with ``out_scale`` a float32 scalar.
With an e4m3 ``y`` a GEMM writes the next GEMM's input directly: FFN1 + bias + GELU +
quantization in one kernel.

16-bit GEMMs (``y = x @ w^T``, fp16 or bf16, float32 accumulation; :func:`half_linear`)
run through the same plans, so the tuned table can choose their configuration too: the
engine's 16-bit large-batch GEMMs (the out-projection of the calibrated mix pass) run
:func:`tuned_half_linear`, which takes a tuned configuration where the table has one for
the shape and leaves the GEMM to ``torch.mm`` otherwise.

The library is the one torch already loaded (``libcublasLt.so.13``/``.12``), or
``$QA_CUBLASLT_LIB``. Plans (descriptors and the heuristic's algorithms) are cached
per shape and configuration, the :data:`MAX_PLANS` most recently used (eager passes run
their exact token count, so every batch size is a shape); pointers are set per call, so
calls can be captured in CUDA graphs. GEMMs in flight at once must not share a workspace
(with one for the device, BERT-large passes in flight on two streams gave logits off by up
to 3.2 in 9 of 24 passes; ``benchmarks/streams_mix.py --shared-workspace``): a call uses
the :class:`Workspace` of the owner it runs under (:func:`using`: a graph cache, whose
graphs keep the pointer and replay on their callers' streams), else its CUDA stream's.
Either is allocated at its first call, which must not be inside a capture.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import astuple, dataclass, field, fields
from functools import cache
from typing import Any

import torch

from engine.fused import cublaslt_algos, cublaslt_table
from engine.fused.cublaslt_algos import AlgoConfig, HeuristicResult

# cudaDataType_t / cublasComputeType_t / cublasLt enums (cublasLt.h, library_types.h).
_R_32F, _R_16F, _R_16BF, _R_8F_E4M3 = 0, 2, 14, 28
_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_DESC_A_SCALE, _DESC_B_SCALE, _DESC_D_SCALE = 17, 18, 20
_DESC_FAST_ACCUM, _DESC_BIAS_TYPE = 25, 26
_DESC_A_SCALE_MODE, _DESC_B_SCALE_MODE = 31, 32
_SCALE_SCALAR, _SCALE_OUTER_VEC = 0, 3
_EPI_DEFAULT, _EPI_BIAS, _EPI_GELU, _EPI_GELU_BIAS = 1, 4, 32, 36
_PREF_MAX_WORKSPACE = 1
_WORKSPACE_BYTES = 32 << 20  # cuBLAS's recommendation for Hopper
HEURISTIC_ALGOS = 16  # algorithms asked of the heuristic per plan (``fp8_linear``'s ``algo``)
# Whether plans run a measured configuration from ``cublaslt_table.TABLE_PATH`` where it has
# one for the shape (else the heuristic's first choice). Read per call, and part of a plan's
# key, so a pass can be A/B'd with it off (``ab_replay.py --set``).
TUNED = True
# Plans kept; the least recently used beyond this are destroyed. A plan is a few KB of host
# memory, and making one (the heuristic's query) takes ~0.1 ms.
MAX_PLANS = 1024

_TYPES = {torch.float16: _R_16F, torch.bfloat16: _R_16BF, torch.float8_e4m3fn: _R_8F_E4M3}


class CublasLtError(RuntimeError):
    """cuBLASLt is missing, refused a configuration, or failed a call."""


# A plan's descriptor holds the scale and bias pointers of the call being enqueued: calls
# from several threads (engines on several GPUs) must not interleave setting and enqueuing.
_CALL_LOCK = threading.Lock()


def _candidates() -> list[str]:
    env = os.environ.get("QA_CUBLASLT_LIB")
    if env:
        return [env]
    names = ["libcublasLt.so.13", "libcublasLt.so.12"]
    for base in sys.path:  # the nvidia-cublas wheels torch depends on
        names += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libcublasLt.so.*")))
    found = ctypes.util.find_library("cublasLt")
    return names + ([found] if found else [])


@cache
def _lib() -> ctypes.CDLL:
    errors = []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
            continue
        for fn in ("cublasLtCreate", "cublasLtMatmulDescCreate", "cublasLtMatrixLayoutCreate",
                   "cublasLtMatmulPreferenceCreate", "cublasLtMatmulDescSetAttribute",
                   "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic",
                   "cublasLtMatmul", "cublasLtMatmulPreferenceDestroy",
                   "cublasLtMatmulDescDestroy", "cublasLtMatrixLayoutDestroy"):
            getattr(lib, fn).restype = ctypes.c_int
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        lib.cublasLtMatrixLayoutCreate.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
        lib.cublasLtMatmul.argtypes = [ctypes.c_void_p] * 14 + [ctypes.c_size_t, ctypes.c_void_p]
        lib.cublasLtMatmulDescDestroy.argtypes = [ctypes.c_void_p]
        lib.cublasLtMatrixLayoutDestroy.argtypes = [ctypes.c_void_p]
        return lib
    raise CublasLtError("cuBLASLt not found (set QA_CUBLASLT_LIB): " + "; ".join(errors))


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed with cublasStatus_t {status}")


@cache
def _handle() -> ctypes.c_void_p:
    h = ctypes.c_void_p()
    _check(_lib().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
    return h


class Workspace:
    """A workspace for the calls made under :func:`using` it, whatever their stream: its
    owner keeps it as long as graphs captured with it live. One tensor per device, made
    at the first call that needs it."""

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}

    def tensor(self, device: int) -> torch.Tensor:
        t = self._tensors.get(device)
        if t is None:
            t = self._tensors[device] = _allocate(device)
        return t


_OWNER: ContextVar[Workspace | None] = ContextVar("cublaslt_workspace", default=None)
# Per (device, stream handle) for calls under no owner, kept as torch keeps cuBLAS's:
# torch hands out its streams from fixed pools (32 per priority and device), so a process
# has few unless it brings its own (torch.cuda.ExternalStream). Guarded by _CALL_LOCK.
_WORKSPACES: dict[tuple[int, int], torch.Tensor] = {}


@contextmanager
def using(workspace: Workspace) -> Iterator[None]:
    """Calls in this block (this thread, this context) use ``workspace``."""
    token = _OWNER.set(workspace)
    try:
        yield
    finally:
        _OWNER.reset(token)


def _allocate(device: int) -> torch.Tensor:
    if torch.cuda.is_current_stream_capturing():
        raise CublasLtError("a first cuBLASLt call inside a capture: its workspace does not "
                            "exist yet; run one call on that stream (or under the same "
                            "Workspace) before capturing")
    return torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=f"cuda:{device}")


def _workspace(device: int, stream: int) -> torch.Tensor:
    """The workspace of a call on ``stream`` (its handle) of ``device``: its owner's
    (:func:`using`), else the stream's."""
    owner = _OWNER.get()
    if owner is not None:
        return owner.tensor(device)
    ws = _WORKSPACES.get((device, stream))
    if ws is None:
        ws = _WORKSPACES[(device, stream)] = _allocate(device)
    return ws


def available() -> bool:
    """Whether a CUDA device with FP8 tensor cores (sm_89+) and cuBLASLt are here."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        return False
    try:
        _lib()
    except CublasLtError:
        return False
    return True


@dataclass(frozen=True)
class _Key:
    m: int
    n: int
    k: int
    out: torch.dtype
    bias: torch.dtype | None
    gelu: bool
    x_rows: bool
    w_rows: bool
    out_scaled: bool
    fast_accum: bool
    tuned: bool  # run the tuned table's configuration, where it has one
    # The operands' type: e4m3 (``fp8_linear``) or 16-bit (``half_linear``: no scales).
    operands: torch.dtype = torch.float8_e4m3fn

    def name(self) -> str:
        """The GEMM's fields as a string, the tuned table's key: all but ``tuned``, and
        ``operands`` only when 16-bit (so e4m3 keys read as they did before it existed)."""
        return ",".join(f"{f.name}={str(v).replace('torch.', '')}"
                        for f, v in zip(fields(self), astuple(self), strict=True)
                        if f.name != "tuned"
                        and not (f.name == "operands" and v == torch.float8_e4m3fn))

    @property
    def fp8(self) -> bool:
        return self.operands == torch.float8_e4m3fn


@dataclass
class _Plan:
    desc: ctypes.c_void_p
    a: ctypes.c_void_p  # the weight [N, K]: column-major K x N, transposed
    b: ctypes.c_void_p  # the activation [M, K]: column-major K x M
    c: ctypes.c_void_p
    d: ctypes.c_void_p
    types: cublaslt_algos.Types
    algos: list[ctypes.Array[ctypes.c_uint64]]  # the heuristic's usable ones, first choice first
    # The tuned table's configuration, when the key asks for it and the table has one that
    # cuBLASLt accepts: the plan's first choice, ahead of the heuristic's.
    tuned: AlgoConfig | None = None
    # Configurations built and checked once: the tuned one and those run on request
    # (``fp8_linear(config=)``).
    configured: dict[AlgoConfig, cublaslt_algos.Algo] = field(default_factory=dict)

    def layouts(self) -> tuple[ctypes.c_void_p, ...]:
        return (self.a, self.b, self.c, self.d)


def _set(desc: ctypes.c_void_p, attr: int,
         value: ctypes.c_int32 | ctypes.c_int8 | ctypes.c_void_p) -> None:
    _check(_lib().cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value),
                                                 ctypes.sizeof(value)), f"attribute {attr}")


def _layout(dtype: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
    lay = ctypes.c_void_p()
    _check(_lib().cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld),
           "cublasLtMatrixLayoutCreate")
    return lay


_PLANS: OrderedDict[_Key, _Plan] = OrderedDict()  # guarded by _CALL_LOCK


def _plan(key: _Key) -> _Plan:
    """The key's plan, made on first use; the caller holds :data:`_CALL_LOCK`."""
    plan = _PLANS.get(key)
    if plan is not None:
        _PLANS.move_to_end(key)
        return plan
    plan = _PLANS[key] = _new_plan(key)
    while len(_PLANS) > max(1, MAX_PLANS):  # never the plan just made
        _destroy(_PLANS.popitem(last=False)[1])
    return plan


def clear_plans() -> None:
    """Destroy every cached plan: the next call of each shape makes its plan afresh,
    looking the tuned table up again (after ``cublaslt_table.TABLE_PATH`` changed: tables
    are read once per path)."""
    with _CALL_LOCK:
        _HALF_TUNED.clear()
        while _PLANS:
            _destroy(_PLANS.popitem()[1])


def _destroy(plan: _Plan) -> None:
    """Free a plan's descriptors (host memory: work already enqueued does not read them)."""
    lib = _lib()
    for lay in plan.layouts():
        lib.cublasLtMatrixLayoutDestroy(lay)
    lib.cublasLtMatmulDescDestroy(plan.desc)


def _new_plan(key: _Key) -> _Plan:
    lib = _lib()
    desc = ctypes.c_void_p()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _R_32F),
           "cublasLtMatmulDescCreate")
    _set(desc, _DESC_TRANSA, ctypes.c_int32(_OP_T))
    _set(desc, _DESC_TRANSB, ctypes.c_int32(_OP_N))
    # Pointers the heuristic looks at for alignment; the real ones are set per call.
    dummy = ctypes.c_void_p(256)
    if key.fp8:
        # cuBLAS's A is our weight (scales per its rows = our output channels), B our
        # activation.
        _set(desc, _DESC_A_SCALE_MODE,
             ctypes.c_int32(_SCALE_OUTER_VEC if key.w_rows else _SCALE_SCALAR))
        _set(desc, _DESC_B_SCALE_MODE,
             ctypes.c_int32(_SCALE_OUTER_VEC if key.x_rows else _SCALE_SCALAR))
        _set(desc, _DESC_FAST_ACCUM, ctypes.c_int8(key.fast_accum))
        for attr in (_DESC_A_SCALE, _DESC_B_SCALE):
            _set(desc, attr, dummy)
    epi = ((_EPI_GELU_BIAS if key.gelu else _EPI_BIAS) if key.bias is not None
           else (_EPI_GELU if key.gelu else _EPI_DEFAULT))
    _set(desc, _DESC_EPILOGUE, ctypes.c_int32(epi))
    if key.bias is not None:
        _set(desc, _DESC_BIAS_TYPE, ctypes.c_int32(_TYPES[key.bias]))
    if key.out_scaled:
        _set(desc, _DESC_D_SCALE, dummy)
    if key.bias is not None:
        _set(desc, _DESC_BIAS_POINTER, dummy)
    out, ab = _TYPES[key.out], _TYPES[key.operands]
    c_type = _R_16BF if key.out == torch.float8_e4m3fn else out  # C of an e4m3 D: 16-bit
    plan = _Plan(desc, _layout(ab, key.k, key.n, key.k),
                 _layout(ab, key.k, key.m, key.k), _layout(c_type, key.n, key.m, key.n),
                 _layout(out, key.n, key.m, key.n),
                 cublaslt_algos.Types(_COMPUTE_32F, _R_32F, ab, ab, c_type, out),
                 [])
    try:
        _fill(plan, key)
    except BaseException:
        _destroy(plan)
        raise
    return plan


# (configuration, plan without its row count) pairs cuBLASLt refused, warned about once:
# a row-range entry would otherwise warn for every batch size.
_REFUSED: set[tuple[AlgoConfig, str]] = set()


def _fill(plan: _Plan, key: _Key) -> None:
    """The heuristic's algorithms and the tuned table's choice, into a new plan."""
    lib, desc = _lib(), plan.desc
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
    ws = ctypes.c_uint64(_WORKSPACE_BYTES)
    _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE, ctypes.byref(ws),
                                                    ctypes.sizeof(ws)), "preference workspace")
    found = ctypes.c_int(0)
    results = (HeuristicResult * HEURISTIC_ALGOS)()
    try:
        _check(lib.cublasLtMatmulAlgoGetHeuristic(
            _handle(), desc, plan.a, plan.b, plan.c, plan.d, pref, HEURISTIC_ALGOS, results,
            ctypes.byref(found)), f"heuristic for {key}")
    finally:
        lib.cublasLtMatmulPreferenceDestroy(pref)
    plan.algos = [r.algo for r in results[:found.value] if r.state == 0]
    if not plan.algos:
        raise CublasLtError(f"cuBLASLt has no algorithm for {key}")
    config = _tuned_config(key) if key.tuned else None
    if config is not None:
        algo = _checked(plan, config)
        refused = (config, cublaslt_table.gemm(key.name()))
        if algo is not None:
            plan.tuned, plan.configured[config] = config, algo
        elif refused not in _REFUSED:
            _REFUSED.add(refused)
            warnings.warn(f"cuBLASLt refuses the tuned table's {config} for {key.name()}: "
                          "running the heuristic's choice", RuntimeWarning, stacklevel=5)


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else ""


def _tuned_config(key: _Key) -> AlgoConfig | None:
    """The tuned table's configuration for this GEMM on this GPU and cuBLASLt, if any."""
    return cublaslt_table.find(cublaslt_table.load_table(),
                               cublaslt_table.TableKey(_device_name(), version(), key.name()))


def _checked(plan: _Plan, config: AlgoConfig) -> cublaslt_algos.Algo | None:
    """``config`` built for the plan if cuBLASLt accepts it within the workspace, else None."""
    algo = cublaslt_algos.build(_lib(), _handle(), plan.types, config)
    if algo is None or not cublaslt_algos.check(_lib(), _handle(), plan.desc, plan.layouts(),
                                                algo, _WORKSPACE_BYTES):
        return None
    return algo


def version() -> int:
    """cuBLASLt's version number (``cublasLtGetVersion``): tuned choices are valid for one."""
    return int(_lib().cublasLtGetVersion())


def _choose(plan: _Plan, key: _Key, algo: int | None,
            config: AlgoConfig | None) -> ctypes.Array[ctypes.c_uint64]:
    """The algorithm structure ``fp8_linear`` runs (see its docstring)."""
    if config is not None:
        if config not in plan.configured:
            built = _checked(plan, config)
            if built is None:
                raise CublasLtError(f"cuBLASLt refuses {config} for {key}")
            plan.configured[config] = built
        return plan.configured[config].data
    if algo is None:
        return plan.algos[0] if plan.tuned is None else plan.configured[plan.tuned].data
    if algo >= len(plan.algos):
        raise CublasLtError(f"the heuristic offers {len(plan.algos)} algorithms for {key}, "
                            f"not {algo + 1}")
    return plan.algos[algo]


def _scale_rows(scale: torch.Tensor, rows: int, what: str) -> bool:
    """True for one scale per row, False for one per tensor; checks dtype and size."""
    if scale.dtype != torch.float32 or not scale.is_contiguous():
        raise ValueError(f"{what} must be contiguous float32")
    if scale.numel() not in (1, rows):
        raise ValueError(f"{what} must hold 1 or {rows} values, got {scale.numel()}")
    return scale.numel() == rows and rows != 1


def _shape(x: torch.Tensor, w: torch.Tensor, what: str) -> tuple[int, int, int]:
    """(m, n, k) of ``x @ w^T``, after checking the operands are 2-D, row-major and
    multiply."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"shapes {tuple(x.shape)} and {tuple(w.shape)} do not multiply")
    if not (x.is_contiguous() and w.is_contiguous()):
        raise ValueError(f"{what} takes row-major (contiguous) operands")
    return x.shape[0], w.shape[0], x.shape[1]


def _key(xq: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
         out_dtype: torch.dtype, bias: torch.Tensor | None, gelu: bool,
         out_scale: torch.Tensor | None, fast_accum: bool) -> _Key:
    """The plan key of an ``fp8_linear`` call, after checking its arguments."""
    if xq.dtype != torch.float8_e4m3fn or w8.dtype != torch.float8_e4m3fn:
        raise ValueError("fp8_linear takes e4m3 operands")
    m, n, k = _shape(xq, w8, "fp8_linear")
    if out_dtype not in _TYPES:
        raise ValueError(f"unsupported output dtype {out_dtype}")
    if (out_dtype == torch.float8_e4m3fn) != (out_scale is not None):
        raise ValueError("an e4m3 output needs out_scale, and only it takes one")
    if bias is not None and (bias.shape != (n,) or bias.dtype not in (torch.float16, torch.bfloat16)):
        raise ValueError(f"bias must be fp16/bf16 of shape ({n},)")
    return _Key(m, n, k, out_dtype, None if bias is None else bias.dtype, gelu,
                _scale_rows(x_scale, m, "x_scale"), _scale_rows(w_scale, n, "w_scale"),
                out_scale is not None, fast_accum, TUNED)


_HALF = (torch.float16, torch.bfloat16)


def _half_key(x: torch.Tensor, w: torch.Tensor) -> _Key:
    """The plan key of a ``half_linear`` call, after checking its arguments."""
    if x.dtype not in _HALF or w.dtype != x.dtype:
        raise ValueError(f"half_linear takes two fp16 or two bf16 operands, not {x.dtype} "
                         f"and {w.dtype}")
    m, n, k = _shape(x, w, "half_linear")
    return _Key(m, n, k, x.dtype, None, False, False, False, False, False, TUNED,
                operands=x.dtype)


@dataclass(frozen=True)
class SearchSpace:
    """What ``benchmarks/cublaslt_search.py`` needs of one GEMM (:func:`search_space`)."""

    gpu: str
    version: int
    plan: str  # the tuned table's key for this GEMM (``_Key.name``)
    heuristic: list[AlgoConfig]  # the heuristic's usable configurations, first choice first
    candidates: list[AlgoConfig]  # the grid's configurations cuBLASLt accepts
    tuned: AlgoConfig | None  # the table's current choice, if any
    algos: list[dict[str, Any]]  # per algorithm: capabilities, configurations checked/accepted

    def entry(self, config: AlgoConfig, **measured: object) -> dict[str, object]:
        """A tuned-table entry choosing ``config`` for this GEMM."""
        return {"gpu": self.gpu, "cublaslt_version": self.version, "plan": self.plan,
                "config": config.to_json(), **measured}


def search_space(xq: torch.Tensor, x_scale: torch.Tensor | None, w8: torch.Tensor,
                 w_scale: torch.Tensor | None, out_dtype: torch.dtype,
                 bias: torch.Tensor | None = None, gelu: bool = False,
                 out_scale: torch.Tensor | None = None, fast_accum: bool = False,
                 swizzle: bool = False, max_checks: int = 1_000_000) -> SearchSpace:
    """The configurations an ``fp8_linear`` call with these arguments could run (over
    ``cublaslt_algos.candidates``' grid); with 16-bit operands and no scales (the other
    arguments at their defaults, ``out_dtype`` the operands'), a ``half_linear`` call's."""
    if x_scale is None and w_scale is None:
        key = _half_key(xq, w8)
        if (out_dtype != xq.dtype or bias is not None or gelu or out_scale is not None
                or fast_accum):
            raise ValueError("a 16-bit GEMM's search space has no epilogue, scales or "
                             "fast accumulation, and its output is its operands' type")
    elif x_scale is None or w_scale is None:
        raise ValueError("give both scales (e4m3 operands) or neither (16-bit)")
    else:
        key = _key(xq, x_scale, w8, w_scale, out_dtype, bias, gelu, out_scale, fast_accum)
    lib, handle = _lib(), _handle()
    report: list[dict[str, Any]] = []
    # The plan stays cached (not destroyed) while its grid is checked; inference on other
    # threads waits meanwhile (seconds: a benchmark's tool, not a serving path).
    with _CALL_LOCK:
        plan = _plan(key)
        found = cublaslt_algos.candidates(lib, handle, plan.types, plan.desc, plan.layouts(),
                                          _WORKSPACE_BYTES, swizzle, max_checks, report)
        heuristic = [cublaslt_algos.read(lib, a) for a in plan.algos]
    return SearchSpace(_device_name(), version(), key.name(), heuristic, found, plan.tuned,
                       report)


def fp8_linear(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    out_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    fast_accum: bool = False,
    algo: int | None = None,
    config: AlgoConfig | None = None,
    addend: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out_scale * act(x_scale * w_scale * (xq @ w8^T) + bias)`` in ``out_dtype`` (see the
    module docstring). ``out_scale`` is required for, and only for, an e4m3 output.

    ``addend`` (a contiguous [M, N] tensor of a 16-bit ``out_dtype``, not aliasing ``out``)
    is added to the result in the epilogue, cuBLASLt's C with beta = 1: a residual read by
    the GEMM rather than by the kernel after it.

    ``fast_accum`` accumulates in the tensor cores' own precision throughout (no periodic
    promotion to float32). The algorithm: ``config`` (raises :class:`CublasLtError` if
    cuBLASLt refuses it), or the heuristic's ``algo``-th (an index past the ones it offers
    raises), or, given neither, the plan's first choice: the tuned table's configuration
    for this shape where :data:`TUNED` and the table has one, the heuristic's first
    otherwise."""
    key = _key(xq, x_scale, w8, w_scale, out_dtype, bias, gelu, out_scale, fast_accum)
    m, n = key.m, key.n
    out = _out(key, xq, out)
    if addend is not None and (out_dtype == torch.float8_e4m3fn or addend.shape != (m, n)
                               or addend.dtype != out_dtype or not addend.is_contiguous()):
        raise ValueError(f"addend must be a contiguous {out_dtype} tensor of shape ({m}, {n}) "
                         "and the output 16-bit")
    pointers = {_DESC_A_SCALE: w_scale, _DESC_B_SCALE: x_scale, _DESC_D_SCALE: out_scale,
                _DESC_BIAS_POINTER: bias}
    return _matmul(key, xq, w8, out, addend, algo, config, pointers)


def _out(key: _Key, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``out``, checked, or a new [M, N] output of the key's type."""
    if out is None:
        return torch.empty((key.m, key.n), device=x.device, dtype=key.out)
    if out.shape != (key.m, key.n) or out.dtype != key.out or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {key.out} tensor of shape "
                         f"({key.m}, {key.n})")
    return out


def _matmul(key: _Key, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
            addend: torch.Tensor | None, algo: int | None, config: AlgoConfig | None,
            pointers: dict[int, torch.Tensor | None]) -> torch.Tensor:
    """Enqueue ``out = x @ w^T (+ addend)`` on the current stream with the key's plan and
    the chosen algorithm (:func:`_choose`), the descriptor's ``pointers`` (attribute ->
    tensor; None: not set) set for this call."""
    if algo is not None and algo < 0:
        raise ValueError(f"algo must be >= 0, got {algo}")
    if algo is not None and config is not None:
        raise ValueError("give algo or config, not both")
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0 if addend is None else 1.0)
    # beta = 0: C is not read. An e4m3 D has a 16-bit C type, so C cannot alias D.
    c_ptr = (addend.data_ptr() if addend is not None
             else None if key.out == torch.float8_e4m3fn else out.data_ptr())
    stream = torch.cuda.current_stream(x.device).cuda_stream
    with _CALL_LOCK:
        ws = _workspace(x.device.index or 0, stream)
        plan = _plan(key)
        chosen = _choose(plan, key, algo, config)
        for attr, tensor in pointers.items():
            if tensor is not None:
                _set(plan.desc, attr, ctypes.c_void_p(tensor.data_ptr()))
        _check(_lib().cublasLtMatmul(
            _handle(), plan.desc, ctypes.byref(alpha), ctypes.c_void_p(w.data_ptr()), plan.a,
            ctypes.c_void_p(x.data_ptr()), plan.b, ctypes.byref(beta),
            ctypes.c_void_p(c_ptr), plan.c, ctypes.c_void_p(out.data_ptr()), plan.d,
            ctypes.byref(chosen), ctypes.c_void_p(ws.data_ptr()),
            ctypes.c_size_t(ws.numel()),
            ctypes.c_void_p(stream)), "cublasLtMatmul")
    return out


def half_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
                algo: int | None = None, config: AlgoConfig | None = None) -> torch.Tensor:
    """``x @ w^T`` for 16-bit ``x`` [M, K] and ``w`` [N, K] of one type (fp16 or bf16), in
    that type, with float32 accumulation: ``torch.mm(x, w.t())`` through a plan of this
    module, so a measured configuration can run it. The algorithm is chosen as in
    :func:`fp8_linear`."""
    key = _half_key(x, w)
    return _matmul(key, x, w, _out(key, x, out), None, algo, config, {})


@cache
def _loads() -> bool:
    """Whether cuBLASLt loads (the 16-bit path has no compute-capability floor)."""
    try:
        _lib()
    except CublasLtError:
        return False
    return True


# Whether the tuned table has a configuration for a 16-bit GEMM's key on this process's
# GPU (:func:`tuned_half_linear`), so shapes without one make no plan; cleared with the
# plans. Guarded by _CALL_LOCK.
_HALF_TUNED: dict[_Key, bool] = {}


def tuned_half_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """``half_linear(x, w)`` with the tuned table's configuration where :data:`TUNED`, the
    operands are CUDA tensors ``half_linear`` takes and the table has a configuration for
    the GEMM on this GPU that cuBLASLt accepts; None otherwise (the caller runs its own
    GEMM, e.g. ``torch.mm``). A shape's first call looks the table up (and, with an entry,
    makes its plan: the heuristic's query, ~0.1 ms); later calls cost a dict lookup."""
    if not (TUNED and x.is_cuda and w.device == x.device and _loads()):
        return None
    try:
        key = _half_key(x, w)
    except ValueError:  # operands half_linear does not take: the caller's GEMM runs them
        return None
    with _CALL_LOCK:
        tuned = _HALF_TUNED.get(key)
        if tuned is None:
            if len(_HALF_TUNED) >= MAX_PLANS:
                _HALF_TUNED.clear()
            tuned = _HALF_TUNED[key] = (_tuned_config(key) is not None
                                        and _plan(key).tuned is not None)
    return _matmul(key, x, w, _out(key, x, None), None, None, None, {}) if tuned else None
