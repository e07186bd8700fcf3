"""cuBLASLt algorithm configurations beyond the heuristic's: the configurations cuBLASLt
accepts for a GEMM over a grid (every algorithm ID; its tile and stage IDs; custom options
0-15; the cluster shapes of :data:`CLUSTERS`; split-K by :data:`SPLITS` with each reduction
scheme; swizzling where asked; inner shapes left to the algorithm), built from their
fields and checked by ``cublasLtMatmulAlgoCheck``.

This is FasterTransformer's ``gemm_test`` approach: the heuristic ranks configurations by
a model, which at small M (a batch of one, 384 tokens) may pick a tile that fits the
shape worse than another it does not list. ``benchmarks/cublaslt_search.py`` times the
candidates and writes the winners to the tuned table (``cublaslt_table``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from itertools import chain
from typing import Any

# cublasLtMatmulAlgoCapAttributes_t / cublasLtMatmulAlgoConfigAttributes_t (cublasLt.h).
_CAP_SPLITK, _CAP_REDUCTION_MASK, _CAP_SWIZZLE, _CAP_TILE_IDS = 0, 1, 2, 6
_CAP_CUSTOM_MAX, _CAP_STAGES_IDS = 7, 13
_CFG_TILE, _CFG_SPLITK, _CFG_REDUCTION, _CFG_SWIZZLE, _CFG_CUSTOM, _CFG_STAGES = 1, 2, 3, 4, 5, 6
_CFG_INNER, _CFG_CLUSTER = 7, 8
SPLITS = (1, 2, 3, 4, 6, 8)  # K splits tried where an algorithm supports splitting
# An algorithm none of whose first this-many configurations cuBLASLt accepts is skipped
# (on the H200 one has 722,304 configurations and accepts none of them).
MAX_MISSES = 20_000
# CUBLASLT_CLUSTER_SHAPE_AUTO, 1x1x1, 2x1x1, 4x1x1, 1x2x1, 2x2x1, 4x2x1, 1x4x1, 2x4x1.
CLUSTERS = (0, 2, 3, 4, 5, 6, 7, 8, 9)


class Algo(ctypes.Structure):
    """cublasLtMatmulAlgo_t."""

    data: ctypes.Array[ctypes.c_uint64]
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t (a check writes all but its ``algo``)."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


@dataclass(frozen=True)
class AlgoConfig:
    """One cuBLASLt configuration: the fields ``cublasLtMatmulAlgoConfigSetAttribute`` takes."""

    algo_id: int
    tile: int = 0
    stages: int = 0
    splitk: int = 1
    reduction: int = 0
    swizzle: int = 0
    custom: int = 0
    inner: int = 0
    cluster: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AlgoConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown AlgoConfig fields {sorted(unknown)}")
        return cls(**{k: int(v) for k, v in data.items()})

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Types:
    """The (compute, scale, A, B, C, D) type enums of a plan, as cublasLtMatmulAlgoInit takes."""

    compute: int
    scale: int
    a: int
    b: int
    c: int
    d: int

    def args(self) -> tuple[int, ...]:
        return (self.compute, self.scale, self.a, self.b, self.c, self.d)


@cache
def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """``lib`` with the result and argument types of the functions used here (size_t
    arguments must not go through as C ints)."""
    ptr, size, i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    signatures: dict[str, list[Any]] = {
        "cublasLtMatmulAlgoGetIds": [ptr, i32, i32, i32, i32, i32, i32, i32, ptr, ptr],
        "cublasLtMatmulAlgoInit": [ptr, i32, i32, i32, i32, i32, i32, i32, ptr],
        "cublasLtMatmulAlgoCheck": [ptr] * 8,
        "cublasLtMatmulAlgoCapGetAttribute": [ptr, i32, ptr, size, ptr],
        "cublasLtMatmulAlgoConfigSetAttribute": [ptr, i32, ptr, size],
        "cublasLtMatmulAlgoConfigGetAttribute": [ptr, i32, ptr, size, ptr],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, args
    return lib


def _cap(lib: ctypes.CDLL, algo: Algo, attr: int, ctype: type[ctypes._SimpleCData[int]]) -> int:
    value = ctype(0)
    written = ctypes.c_size_t(0)
    if lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, ctypes.byref(value),
                                             ctypes.sizeof(value), ctypes.byref(written)):
        return 0
    return int(value.value)


def _cap_list(lib: ctypes.CDLL, algo: Algo, attr: int) -> list[int]:
    """An array capability (tile or stages IDs); [0] (undefined: the algorithm's own) if none."""
    size = ctypes.c_size_t(0)
    if lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, None, 0,
                                             ctypes.byref(size)) or size.value == 0:
        return [0]
    buf = (ctypes.c_uint32 * (size.value // 4))()
    written = ctypes.c_size_t(0)
    if lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, buf, size.value,
                                             ctypes.byref(written)):
        return [0]
    return list(buf) or [0]


_SETTERS: tuple[tuple[str, int, type[ctypes._SimpleCData[int]]], ...] = (
    ("tile", _CFG_TILE, ctypes.c_uint32), ("stages", _CFG_STAGES, ctypes.c_uint32),
    ("splitk", _CFG_SPLITK, ctypes.c_int32), ("reduction", _CFG_REDUCTION, ctypes.c_uint32),
    ("swizzle", _CFG_SWIZZLE, ctypes.c_uint32), ("custom", _CFG_CUSTOM, ctypes.c_uint32),
    ("inner", _CFG_INNER, ctypes.c_uint16), ("cluster", _CFG_CLUSTER, ctypes.c_uint16),
)


def _configure(lib: ctypes.CDLL, base: Algo, config: AlgoConfig) -> Algo | None:
    """A copy of the initialised ``base`` with ``config``'s fields set, or None if refused."""
    algo = Algo.from_buffer_copy(base)
    for name, attr, ctype in _SETTERS:
        value = ctype(getattr(config, name))
        if lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), attr, ctypes.byref(value),
                                                    ctypes.sizeof(value)):
            return None
    return algo


def build(lib: ctypes.CDLL, handle: ctypes.c_void_p, types: Types, config: AlgoConfig) -> Algo | None:
    """The algorithm structure for ``config``, or None if cuBLASLt refuses a field."""
    lib = _declare(lib)
    base = Algo()
    if lib.cublasLtMatmulAlgoInit(handle, *types.args(), config.algo_id, ctypes.byref(base)):
        return None
    return _configure(lib, base, config)


def read(lib: ctypes.CDLL, algo: Any) -> AlgoConfig:
    """The configuration of an algorithm structure (e.g. one the heuristic returned)."""
    lib = _declare(lib)
    ptr = ctypes.cast(ctypes.byref(algo), ctypes.POINTER(Algo))
    values: dict[str, int] = {}
    written = ctypes.c_size_t(0)
    getters: tuple[tuple[str, int, type[ctypes._SimpleCData[int]]], ...] = (
        ("algo_id", 0, ctypes.c_int32), *_SETTERS)
    for name, attr, ctype in getters:
        value = ctype(0)
        lib.cublasLtMatmulAlgoConfigGetAttribute(ptr, attr, ctypes.byref(value),
                                                 ctypes.sizeof(value), ctypes.byref(written))
        values[name] = int(value.value)
    return AlgoConfig(**values)


def check(lib: ctypes.CDLL, handle: ctypes.c_void_p, desc: ctypes.c_void_p,
          layouts: tuple[ctypes.c_void_p, ...], algo: Algo, max_workspace: int) -> bool:
    """Whether cuBLASLt accepts ``algo`` for this GEMM within ``max_workspace`` bytes."""
    res = HeuristicResult()
    status = _declare(lib).cublasLtMatmulAlgoCheck(handle, desc, *layouts, ctypes.byref(algo),
                                                   ctypes.byref(res))
    return bool(status == 0 and int(res.workspaceSize) <= max_workspace)


def _caps(lib: ctypes.CDLL, algo: Algo) -> dict[str, Any]:
    """What one algorithm can be configured with (its capabilities)."""
    return {"splitk": _cap(lib, algo, _CAP_SPLITK, ctypes.c_int32),
            "reduction_mask": _cap(lib, algo, _CAP_REDUCTION_MASK, ctypes.c_uint32),
            "swizzle": _cap(lib, algo, _CAP_SWIZZLE, ctypes.c_uint32),
            "custom_max": _cap(lib, algo, _CAP_CUSTOM_MAX, ctypes.c_int32),
            "tiles": _cap_list(lib, algo, _CAP_TILE_IDS),
            "stages": _cap_list(lib, algo, _CAP_STAGES_IDS)}


def _unsplit(caps: dict[str, Any], algo_id: int, swizzle: bool) -> Iterator[AlgoConfig]:
    """One algorithm's configurations without split-K: tiles x stages x custom options x
    swizzles x :data:`CLUSTERS`, as far as its capabilities allow."""
    swizzles = (0, 1) if swizzle and caps["swizzle"] else (0,)
    for tile in caps["tiles"]:
        for stages in caps["stages"]:
            for custom in range(min(caps["custom_max"], 15) + 1):
                for sw in swizzles:
                    for cluster in CLUSTERS:
                        yield AlgoConfig(algo_id, tile, stages, 1, 0, sw, custom, cluster=cluster)


def _splits(caps: dict[str, Any], accepted: list[AlgoConfig]) -> Iterator[AlgoConfig]:
    """Split-K variants (:data:`SPLITS` x reduction schemes) of accepted unsplit ones."""
    if not caps["splitk"]:
        return
    schemes = [s for s in (1, 2, 4) if caps["reduction_mask"] & s] or [0]
    for config in accepted:
        for k in SPLITS[1:]:
            for red in schemes:
                yield replace(config, splitk=k, reduction=red)


def candidates(lib: ctypes.CDLL, handle: ctypes.c_void_p, types: Types, desc: ctypes.c_void_p,
               layouts: tuple[ctypes.c_void_p, ...], max_workspace: int,
               swizzle: bool = False, max_checks: int = 1_000_000,
               report: list[dict[str, Any]] | None = None) -> list[AlgoConfig]:
    """Every configuration cuBLASLt accepts for this GEMM (``cublasLtMatmulAlgoCheck``), in
    algorithm-ID order: first without split-K, then the split-K variants of those accepted.
    Stops after ``max_checks`` checks, and skips the rest of an algorithm after
    :data:`MAX_MISSES` refusals in a row from its start. ``report`` receives, per
    algorithm, its capabilities and how many of its configurations were checked and
    accepted."""
    lib = _declare(lib)
    ids = (ctypes.c_int * 256)()
    count = ctypes.c_int(0)
    if lib.cublasLtMatmulAlgoGetIds(handle, *types.args(), 256, ids, ctypes.byref(count)):
        return []
    found: list[AlgoConfig] = []
    checks = 0
    for algo_id in ids[: count.value]:
        base = Algo()
        if lib.cublasLtMatmulAlgoInit(handle, *types.args(), algo_id, ctypes.byref(base)):
            continue
        caps = _caps(lib, base)
        row = {"algo_id": algo_id, **caps, "checked": 0, "accepted": 0}
        if report is not None:
            report.append(row)
        unsplit: list[AlgoConfig] = []  # read by _splits once the unsplit grid is done
        for config in chain(_unsplit(caps, algo_id, swizzle), _splits(caps, unsplit)):
            checks += 1
            if checks > max_checks:
                return found
            if row["accepted"] == 0 and row["checked"] >= MAX_MISSES:
                break
            row["checked"] += 1
            algo = _configure(lib, base, config)
            if algo is not None and check(lib, handle, desc, layouts, algo, max_workspace):
                row["accepted"] += 1
                found.append(config)
                if config.splitk == 1:
                    unsplit.append(config)
    return found
