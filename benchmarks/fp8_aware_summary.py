"""Summarize ``training/fp8_aware_sweep.sh`` runs: F1 per checkpoint and scheme, and each
recipe's verdict by the rule declared before the runs (``engine/fused/NOTES.md`` v46).

    python3 benchmarks/fp8_aware_summary.py DIR [DIR ...] [--shipped-f1 77.68]

Each DIR holds one sweep's ``acc-NAME-COMMIT.json`` files (``NAME`` ``awareN`` or
``plainN``; ``-sum-residual`` for the out-projection adding the residual); DIRs with the
same name up to a ``-s...`` suffix (more seeds of one recipe) are pooled. The rule: over a
recipe's FP8-aware seeds, a scheme gains F1 room only if its mean F1 loss is <= 0.10 both
against the shipped checkpoint's fp32 F1 and against each checkpoint's own.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

SCHEMES = ("default", "all static", "sum residual")
BUDGET = 0.10


@dataclass(frozen=True)
class Row:
    recipe: str
    name: str
    fp32: float
    f1: dict[str, float]  # scheme -> F1
    logit_err: dict[str, float]  # scheme -> mean |d| against its own fp32 logits


def _scheme(path: Path, scheme: str) -> str:
    if "-sum-residual-" in path.name:
        return "sum residual"
    return "default" if scheme.startswith("static:") else "all static"


def load(dirs: list[Path]) -> list[Row]:
    """One row per checkpoint: its fp32 F1 and each scheme's F1 and logit error."""
    rows: dict[tuple[str, str], Row] = {}
    for d in dirs:
        recipe = re.sub(r"-s\d+$", "", d.name)
        for path in sorted(d.glob("acc-*.json")):
            name = path.name.split("-")[1]
            data = json.loads(path.read_text())
            label = name if d.name == recipe else f"{name} ({d.name})"  # a re-run's control
            row = rows.setdefault((d.name, name),
                                  Row(recipe, label, data["reference"]["f1"], {}, {}))
            for run in data["runs"]:
                scheme = _scheme(path, run["scheme"])
                row.f1[scheme], row.logit_err[scheme] = run["f1"], run["mean_abs"]
    return list(rows.values())


class Verdict(NamedTuple):
    vs_shipped: float  # mean F1 loss against the shipped checkpoint's fp32 F1
    vs_own: float  # mean F1 loss against each checkpoint's own fp32 F1
    room: bool  # both within the budget
    seeds: int  # FP8-aware checkpoints the means are over


def verdicts(rows: list[Row], shipped: float) -> dict[tuple[str, str], Verdict]:
    """(recipe, scheme) -> its :class:`Verdict` over the recipe's FP8-aware checkpoints."""
    out = {}
    for recipe in dict.fromkeys(r.recipe for r in rows):
        aware = [r for r in rows if r.recipe == recipe and r.name.startswith("aware")]
        for scheme in SCHEMES:
            have = [r for r in aware if scheme in r.f1]
            if not have:
                continue
            vs_shipped = statistics.mean(shipped - r.f1[scheme] for r in have)
            vs_own = statistics.mean(r.fp32 - r.f1[scheme] for r in have)
            out[recipe, scheme] = Verdict(vs_shipped, vs_own,
                                          max(vs_shipped, vs_own) <= BUDGET, len(have))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", type=Path, nargs="+")
    p.add_argument("--shipped-f1", type=float, default=77.68,
                   help="the shipped checkpoint's fp32 F1 (the sweeps' --baseline)")
    args = p.parse_args()
    rows = load(args.dirs)
    table = Table(title="FP8-aware fine-tunes: SQuAD v1.1 dev F1 (mean |logit - own fp32|)")
    for col in ("recipe", "checkpoint", "fp32", *SCHEMES):
        table.add_column(col)
    for r in rows:
        table.add_row(r.recipe, r.name, f"{r.fp32:.2f}", *(
            f"{r.f1[s]:.2f} ({r.logit_err[s]:.4f})" if s in r.f1 else "" for s in SCHEMES))
    console = Console()
    console.print(table)
    rule = Table(title=f"mean F1 loss over the FP8-aware seeds (budget {BUDGET}, both)")
    for col in ("recipe", "scheme", "seeds", "vs shipped", "vs own", "room"):
        rule.add_column(col)
    for (recipe, scheme), v in verdicts(rows, args.shipped_f1).items():
        rule.add_row(recipe, scheme, str(v.seeds), f"{v.vs_shipped:+.3f}", f"{v.vs_own:+.3f}",
                     "yes" if v.room else "no")
    console.print(rule)


if __name__ == "__main__":
    main()
