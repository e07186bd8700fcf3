"""The tuned table: cuBLASLt configurations measured faster than the heuristic's choice
(``benchmarks/cublaslt_search.py`` writes it), keyed by GPU name, cuBLASLt version and
GEMM plan. ``cublaslt.fp8_linear`` runs an entry that matches all three; a table written
for another GPU or library version changes nothing. An unreadable table or entry is
reported and ignored (the heuristic runs), never an error at inference time.

A plan names its row count exactly (``m=384,n=4096,...``), or as an inclusive range
(``m=20480-65536,n=3072,...``) for many-token batches, which eager passes run at their
exact token count: every batch size is a plan there. :func:`find` prefers an exact entry;
the ranges of one GEMM must not overlap.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from engine.fused.cublaslt_algos import AlgoConfig

TABLE_PATH = Path(__file__).with_name("cublaslt_tuned.json")


@dataclass(frozen=True)
class TableKey:
    """What a measured choice is valid for: the GPU, the library and the GEMM's plan key
    (``cublaslt._Key`` as a string of its fields)."""

    gpu: str
    version: int
    plan: str


def entry_key(entry: dict[str, Any]) -> TableKey:
    return TableKey(str(entry["gpu"]), int(entry["cublaslt_version"]), str(entry["plan"]))


_ROWS = re.compile(r"m=([1-9][0-9]*)(?:-([1-9][0-9]*))?")


def rows(plan: str) -> tuple[int, int]:
    """The inclusive row range of a plan string (``m=384,...`` or ``m=LO-HI,...``, positive
    decimal integers, LO <= HI)."""
    head = plan.partition(",")[0]
    match = _ROWS.fullmatch(head)
    if match is None:
        raise ValueError(f"plan {plan!r} does not start with m=ROWS or m=LO-HI")
    first = int(match[1])
    last = int(match[2]) if match[2] else first
    if first > last:
        raise ValueError(f"plan {plan!r}: empty row range")
    return first, last


def gemm(plan: str) -> str:
    """A plan string less its rows (``n=4096,k=1024,...``): the GEMM a row-range entry
    answers for, operand types included."""
    return plan.partition(",")[2]


def _same_gemm(a: TableKey, b: TableKey) -> bool:
    """Same GPU, library and every plan field but the rows."""
    return (a.gpu, a.version, gemm(a.plan)) == (b.gpu, b.version, gemm(b.plan))


def overlaps(a: TableKey, b: TableKey) -> bool:
    """Whether two row-range entries could both answer one plan (:func:`find` would pick
    whichever comes first)."""
    (lo_a, hi_a), (lo_b, hi_b) = rows(a.plan), rows(b.plan)
    return (a != b and _same_gemm(a, b) and lo_a != hi_a and lo_b != hi_b
            and lo_a <= hi_b and lo_b <= hi_a)


def parse(entries: Any, where: str) -> dict[TableKey, AlgoConfig]:
    """A table's entries by key; raises ValueError naming ``where`` and the entry (also for
    row ranges of one GEMM that overlap)."""
    if not isinstance(entries, list):
        raise ValueError(f"{where}: expected a JSON list of entries")
    table: dict[TableKey, AlgoConfig] = {}
    for i, e in enumerate(entries):
        try:
            key, config = entry_key(e), AlgoConfig.from_json(e["config"])
            rows(key.plan)
            if clash := next((k for k in table if overlaps(k, key)), None):
                raise ValueError(f"its rows overlap those of {clash.plan!r}")
            table[key] = config
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: entry {i}: {exc!r}") from exc
    return table


def find(table: dict[TableKey, AlgoConfig], key: TableKey) -> AlgoConfig | None:
    """The configuration for ``key`` (an exact plan string): its own entry, else one for the
    same GPU, version and other fields whose row range holds the plan's rows."""
    exact = table.get(key)
    if exact is not None:
        return exact
    m = rows(key.plan)[0]
    for k, config in table.items():
        if _same_gemm(k, key):
            lo, hi = rows(k.plan)
            if lo <= m <= hi:
                return config
    return None


def load_table(path: Path | None = None) -> dict[TableKey, AlgoConfig]:
    """The measured choices in ``path`` (default :data:`TABLE_PATH`; a JSON list of entries
    with ``gpu``, ``cublaslt_version``, ``plan`` and ``config``), read once per path;
    empty, with a warning, if the file is unreadable, and empty if it is absent."""
    return _load(path or TABLE_PATH)


@cache
def _load(path: Path) -> dict[TableKey, AlgoConfig]:
    if not path.exists():
        return {}
    try:
        return parse(json.loads(path.read_text()), str(path))
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        warnings.warn(f"ignoring the cuBLASLt tuned table: {exc}", RuntimeWarning, stacklevel=2)
        return {}
