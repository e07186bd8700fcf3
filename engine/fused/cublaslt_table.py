"""The tuned table: cuBLASLt configurations measured faster than the heuristic's choice
(``benchmarks/cublaslt_search.py`` writes it), keyed by GPU name, cuBLASLt version and
GEMM plan. ``cublaslt.fp8_linear`` runs an entry that matches all three; a table written
for another GPU or library version changes nothing. An unreadable table or entry is
reported and ignored (the heuristic runs), never an error at inference time.

A plan names its row count exactly (``m=384,n=4096,...``), or as an inclusive range
(``m=20480-65536,n=3072,...``) for many-token batches, which eager passes run at their
exact token count: every batch size is a plan there. :func:`find` prefers an exact entry.
"""

from __future__ import annotations

import json
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


def rows(plan: str) -> tuple[int, int]:
    """The inclusive row range of a plan string (``m=384,...`` or ``m=LO-HI,...``)."""
    head = plan.partition(",")[0]
    if not head.startswith("m="):
        raise ValueError(f"plan {plan!r} does not start with m=")
    lo, sep, hi = head[2:].partition("-")
    first, last = int(lo), int(hi) if sep else int(lo)
    if first > last:
        raise ValueError(f"plan {plan!r}: empty row range")
    return first, last


def parse(entries: Any, where: str) -> dict[TableKey, AlgoConfig]:
    """A table's entries by key; raises ValueError naming ``where`` and the entry."""
    if not isinstance(entries, list):
        raise ValueError(f"{where}: expected a JSON list of entries")
    table = {}
    for i, e in enumerate(entries):
        try:
            key, config = entry_key(e), AlgoConfig.from_json(e["config"])
            rows(key.plan)
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
    m, rest = rows(key.plan)[0], key.plan.partition(",")[2]
    for k, config in table.items():
        if (k.gpu, k.version) == (key.gpu, key.version) and k.plan.partition(",")[2] == rest:
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
