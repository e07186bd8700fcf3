"""Whole passes timed at a settled power limit, one variant after another: each runs
``settle_s`` at load first (at the H200's 700 W cap the clock a pass runs at depends on the
energy of the whole pass, and a GPU fresh from idle runs its first second or so at its top
clock; ``engine/fused/NOTES.md`` v36), then is timed for ``timed_s`` with its SM clock and
board power sampled (``gpu_clocks``). Used by ``mix_ablation`` and ``mix_settings`` (and
by v39's ``row_chunks.py``, removed with the option it measured; it is in commit
e5c508e)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# (variant name, a function of no arguments that readies the variant and returns the
# pass to time, a function of the pass's one argument)
Variant = tuple[str, Callable[[], Callable[[Any], Any]]]


def settled_rows(variants: Sequence[Variant], arg: Any, windows: int, settle_s: float,
                 timed_s: float, after_settle: Callable[[str], None] | None = None,
                 ) -> list[dict[str, Any]]:
    """One results row per variant, in order: median and p99 ms per pass, iterations,
    windows per second, the clock fields and ``saving_ms`` against the first variant.
    ``after_settle(name)`` runs between the settling and the timing (a check that the
    variant ran as meant). Prints each row as it is timed."""
    import json

    from benchmarks.bench_gpu import time_calls
    from benchmarks.gpu_clocks import ClockSampler, clock_fields, torch_gpu_id
    from benchmarks.rounds import run_for

    rows: list[dict[str, Any]] = []
    spans = []
    with ClockSampler(gpu=torch_gpu_id()) as sampler:
        for name, ready in variants:
            fn = ready()
            run_for(lambda _i: fn(arg), settle_s)  # noqa: B023
            if after_settle is not None:
                after_settle(name)
            start = sampler.now()
            t = time_calls(fn, [arg], target_s=timed_s, warmup=0, min_iters=8)
            spans.append((start, sampler.now()))
            row = {"variant": name, "ms": t.median_ms, "p99_ms": t.p99_ms, "iters": t.iters,
                   "windows_per_s": windows / t.median_ms * 1e3}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for row, span in zip(rows, spans, strict=True):
        row.update(clock_fields(sampler.between(*span)))
        row["saving_ms"] = rows[0]["ms"] - row["ms"]
    return rows


def ordered_variants(order: Sequence[str], use: Callable[[str], Callable[[Any], Any]],
                     ) -> list[Variant]:
    """:data:`Variant`s for the names in ``order`` (repeats allowed: the second ``x`` is
    labelled ``x_2``), each readied by ``use(name)``."""
    from collections import Counter

    plan: list[Variant] = []
    seen = Counter[str]()
    for name in order:
        seen[name] += 1
        label = name if seen[name] == 1 else f"{name}_{seen[name]}"
        plan.append((label, lambda name=name: use(name)))  # type: ignore[misc]
    return plan


def variant_checks(names: Sequence[str], use: Callable[[str], Callable[[Any], Any]],
                   arg: Any, reference: Any) -> dict[str, Any]:
    """Result fields from one unprofiled and one profiled pass of each variant in ``names``
    (once each, in order): its largest |logit - ``reference``|, its kernels a pass and
    their moves against the first variant's (``kernel_moves``), and its kernels' µs."""
    timed = list(dict.fromkeys(names))
    diff = {name: float((use(name)(arg) - reference).abs().max()) for name in timed}
    kernels = {name: kernel_table(use(name), arg, passes=1) for name in timed}
    return {"max_abs_logit_diff": diff,
            "kernels_per_pass": {n: sum(k["calls"] for k in t.values())
                                 for n, t in kernels.items()},
            "kernels_changed": kernel_moves(kernels, "calls"),
            "kernel_us": {n: {k: v["us"] for k, v in t.items()} for n, t in kernels.items()}}


def settled_variants(result: dict[str, Any], order: Sequence[str],
                     ready: Callable[[str], Callable[[], Callable[[Any], Any]]], arg: Any,
                     args: argparse.Namespace, profile: bool) -> None:
    """``result["rows"]``: :func:`settled_rows` of the variants named in ``order``
    (``ready(name)`` readies one, as a :data:`Variant`'s function); with ``profile`` also
    ``result["kernel_us"]``, each variant's :func:`kernel_table` µs by kernel name (after
    the settled rows, so at the clock the cap settled at), and their moves printed."""
    result["rows"] = settled_rows([(n, ready(n)) for n in order], arg, args.windows,
                                  args.settle_s, args.timed_s)
    if profile:
        tables = {n: kernel_table(ready(n)(), arg) for n in order}
        result["kernel_us"] = {n: {k: v["us"] for k, v in t.items()} for n, t in tables.items()}
        print_kernel_moves(tables, "us")


def kernel_table(fn: Callable[[Any], Any], arg: Any, passes: int = 3,
                 ) -> dict[str, dict[str, float]]:
    """Per CUDA kernel name (copies and memsets too), its calls and µs a pass of
    ``fn(arg)``: one pass unprofiled, then ``passes`` under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn(arg)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            fn(arg)
        torch.cuda.synchronize()
    table: dict[str, dict[str, float]] = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA":
            us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
            table[e.key] = {"calls": e.count / passes, "us": us / passes}
    return table


def kernel_moves(tables: dict[str, dict[str, dict[str, float]]], field: str,
                 ) -> dict[str, dict[str, float]]:
    """Per variant (``kernel_table``s by name), each kernel's ``field`` ("calls" or "us")
    less the first variant's, where it moved, largest move first."""
    first = next(iter(tables.values()))

    def value(table: dict[str, dict[str, float]], name: str) -> float:
        return table.get(name, {}).get(field, 0.0)

    moves = {}
    for variant, table in tables.items():
        moved = {n: value(table, n) - value(first, n) for n in set(table) | set(first)}
        moves[variant] = dict(sorted(((n, d) for n, d in moved.items() if d),
                                     key=lambda m: -abs(m[1])))
    return moves


def print_kernel_moves(tables: dict[str, dict[str, dict[str, float]]], field: str,
                       top: int = 8) -> None:
    """Each variant's kernel total of ``field`` and its ``top`` largest moves against the
    first variant's (``kernel_moves``)."""
    for variant, moved in kernel_moves(tables, field).items():
        total = sum(k.get(field, 0.0) for k in tables[variant].values())
        print(f"{variant}: {total:.0f} {field} of kernels; "
              + ", ".join(f"{n[:40]} {d:+.0f}" for n, d in list(moved.items())[:top]),
              flush=True)


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    """The rows as a table: ms, saving and its share of the first row's ms, windows/s,
    SM clock and power."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("variant", "ms", "saving ms", "share", "windows/s", "SM MHz", "W"):
        table.add_column(col)
    base = rows[0]["ms"]
    for row in rows:
        table.add_row(row["variant"], f"{row['ms']:.2f}", f"{row['saving_ms']:+.2f}",
                      f"{row['saving_ms'] / base:+.1%}", f"{row['windows_per_s']:.0f}",
                      f"{row.get('sm_mhz', float('nan')):.0f}",
                      f"{row.get('power_w', float('nan')):.0f}")
    Console().print(table)


def add_mix_args(p: argparse.ArgumentParser) -> None:
    """The options the settled mix tools share: windows per pass, the settling and timed
    seconds, the commit to record and the JSON output."""
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--settle-s", type=float, default=3.0)
    p.add_argument("--timed-s", type=float, default=1.0)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--out", type=Path, default=None)


def mix_result(args: argparse.Namespace, tokens: int, **fields: Any) -> dict[str, Any]:
    """A results record's head: date, GPU, commit, torch, the batch and the timing; then
    ``fields``; ``rows`` empty."""
    import time

    import torch

    return {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
            "commit": args.commit, "torch": torch.__version__, "windows": args.windows,
            "tokens": tokens, "settle_s": args.settle_s, "timed_s": args.timed_s,
            **fields, "rows": []}


def finish(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Write ``result`` to ``--out`` (if given) and print its rows as a table."""
    import json

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    print_table(f"BERT-large mix x{args.windows} ({result['tokens']} tokens), "
                f"{result['gpu']}, settled {args.settle_s:g} s, {args.commit}", result["rows"])
