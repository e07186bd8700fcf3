"""Where each program of one CUDA-graph forward pass ran, and when (``kernels.timeline``).

    python3 benchmarks/program_timeline.py --out DIR [--shapes bert-base:1x128,bert-base:2x48]
        [--dtype fp8 [--calibrate]] [--option KEY=VALUE ...] [--set module.ATTR=VALUE ...]
        [--passes 20] [--idle] [--plot-layer 5] [--by-slice FFN2=4]

A kernel trace (``trace_pass.py``) sees one start and one end per kernel; with
programmatic dependent launch that hides what moves a pass: when each kernel's programs
became resident, how long after its predecessor's last program their wait returned, on
which multiprocessors they ran and beside what. Here every program of the small-batch
path's kernels (embeddings, the deferred layer's GEMMs, attention, the QA head) records
its start, the return of its PDL wait and its end on the GPU's global timer, and its SM.

Each shape's engine captures its graph while a timeline records, then replays it
``--passes`` times back to back (``--idle``: the last pass alone, the GPU idle before it);
the rows are those of the last pass. Per launch, in µs from the pass's first program
start: ``step`` (the last program's end minus the previous launch's), ``handoff`` (the
first wait's return minus the previous launch's last end: what the dependency costs
once its data is there), ``waits`` (last minus first wait return: how unevenly the
programs were released), ``after`` (the last end minus the last wait return: the work
that follows the dependency), and ``early`` (programs resident before the previous
launch's last end). After the wait, between the marks the deferred GEMMs write
(``timeline.FIELDS``): ``loop``, ``epi``, ``count``, ``finish`` (:func:`program_parts`;
the median program and the last to end). Placement: ``sms`` (distinct
multiprocessors), ``stack`` (most programs on one SM), ``doubled`` and ``reused``
(:func:`placement`), ``host`` (:func:`hosting`), and the mean work of each kind of
program. Means per
position in a layer, as ``trace_pass.py`` gives them. Writes
``DIR/timeline_<shape>.json`` (every program's row, per launch), ``DIR/timeline.md`` and,
with matplotlib, ``DIR/timeline_<shape>.png``: layer ``--plot-layer``'s programs by SM.
``--from FILE`` reports a saved ``timeline_<shape>.json[.gz]`` again, without a GPU.
``--by-slice FFN2=4`` also lists a split-K launch's programs by K slice and by whether
each was its tile's last (:func:`slice_parts`).
The timer reads cost a few instructions a program: times run a little over untraced
ones; compare shapes and variants traced alike.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# Row fields (``kernels.timeline.FIELDS``, checked by a test), by index.
_START, _WAITED, _END, _START_CLK, _END_CLK, _SM = 0, 1, 2, 3, 5, 6
_PRODUCT, _EPILOGUE, _COUNTED = 8, 9, 10
# The parts of a program after its wait, between its marks (kernels.timeline.FIELDS).
_PARTS = ("loop", "epi", "count", "finish")
_FIRST, _LAST = "embeddings", "LN + QA head"  # the deferred path's first and last launch
Launches = list[tuple[str, "np.ndarray[Any, np.dtype[np.int64]]"]]


def launch_stats(launches: Launches) -> list[dict[str, Any]]:
    """Per launch (name, int64 rows [programs, fields] in launch order): the figures of
    the module docstring, µs from the first program start of all of them."""
    t0 = min(int(rows[:, _START].min()) for _, rows in launches)
    out = []
    prev_end: float | None = None
    prev_sms: set[int] = set()
    for i, (name, rows) in enumerate(launches):
        start = (rows[:, _START] - t0) / 1e3
        waited = (rows[:, _WAITED] - t0) / 1e3
        end = (rows[:, _END] - t0) / 1e3
        last_end = float(end.max())
        base = float(start.min()) if prev_end is None else prev_end
        _, per_sm = np.unique(rows[:, _SM], return_counts=True)
        out.append({
            "name": name, "programs": int(rows.shape[0]),
            "first_start": float(start.min()), "first_waited": float(waited.min()),
            "last_waited": float(waited.max()), "last_end": last_end,
            "step": last_end - base,
            "handoff": float(waited.min()) - base,
            "waits": float(waited.max() - waited.min()),
            "after": last_end - float(waited.max()),
            "early": int((start < base).sum()),  # 0 for the first: base is its start
            "sms": int(per_sm.size), "stack": int(per_sm.max()),
            **program_parts(rows), **placement(rows, prev_sms),
            **hosting(rows, launches[i + 1][1] if i + 1 < len(launches) else rows[:0]),
        })
        prev_end = last_end
        prev_sms = {int(sm) for sm in rows[:, _SM]}
    return out


def hosting(rows: np.ndarray[Any, np.dtype[np.int64]],
            following: np.ndarray[Any, np.dtype[np.int64]]) -> dict[str, float]:
    """``host``: a launch's programs on whose SM a program of the launch after it started
    before they ended (resident early under PDL, loading what it may before its wait),
    and the mean µs from wait to end of those and of the rest (NaN where none)."""
    work = (rows[:, _END] - rows[:, _WAITED]) / 1e3
    first_start: dict[int, int] = {}
    for sm, start in zip(following[:, _SM].tolist(), following[:, _START].tolist(),
                         strict=True):
        first_start[sm] = min(start, first_start.get(sm, start))
    host = np.array([first_start.get(int(sm), end) < end
                     for sm, end in zip(rows[:, _SM], rows[:, _END], strict=True)], dtype=bool)
    return {"host": int(host.sum()),
            "work_host": float(work[host].mean()) if host.any() else math.nan,
            "work_alone": float(work[~host].mean()) if (~host).any() else math.nan}


def placement(rows: np.ndarray[Any, np.dtype[np.int64]],
              prev_sms: set[int]) -> dict[str, float]:
    """Where a launch's programs ran: ``doubled`` (programs on an SM that ran another
    program of the launch), ``reused`` (its SMs that the launch before it also used:
    programs placed beside that launch's, which were resident when these arrived), and
    the mean µs from wait to end of single and of doubled programs (NaN where none)."""
    sms, inverse, counts = np.unique(rows[:, _SM], return_inverse=True, return_counts=True)
    doubled = counts[inverse] > 1
    work = (rows[:, _END] - rows[:, _WAITED]) / 1e3
    return {"doubled": int(doubled.sum()),
            "reused": len({int(sm) for sm in sms} & prev_sms),
            "work_single": float(work[~doubled].mean()) if (~doubled).any() else math.nan,
            "work_doubled": float(work[doubled].mean()) if doubled.any() else math.nan}


def program_parts(rows: np.ndarray[Any, np.dtype[np.int64]]) -> dict[str, float]:
    """µs between a launch's marks after the wait (``loop``: to the product's end,
    ``epi``: to the output computed, ``count``: to the tile counter's return, ``finish``:
    to the end; 0 where a kernel has no such mark): the median over its programs, and as
    ``last_<part>`` those of the program that ended last (the one the next launch waits
    for)."""
    parts = _parts(rows)
    last = parts[int(np.argmax(rows[:, _END]))]
    return {**{p: float(np.median(parts[:, i])) for i, p in enumerate(_PARTS)},
            **{f"last_{p}": float(last[i]) for i, p in enumerate(_PARTS)}}


def _parts(rows: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[Any]]:
    """µs of each program's parts after its wait, [programs, len(_PARTS)]."""
    return np.diff(rows[:, [_WAITED, _PRODUCT, _EPILOGUE, _COUNTED, _END]], axis=1) / 1e3


def slice_parts(launches: Launches, name: str, splits: int) -> list[dict[str, Any]]:
    """The parts after the wait of every launch ``name``, a grid of (tiles, ``splits``)
    (a row's flat index is ``tile + split * tiles``), by K slice and by whether the
    program was its tile's last to end (the one that fixes the tile up): medians over the
    programs of each kind, with their count."""
    groups: dict[tuple[int, bool], list[np.ndarray[Any, np.dtype[Any]]]] = {}
    for n, rows in launches:
        if n != name:
            continue
        if len(rows) % splits:
            raise ValueError(f"{name}: {len(rows)} programs are not {splits} K slices")
        ends = rows[:, _END].reshape(splits, -1)
        last = (ends == ends.max(axis=0)).ravel()
        for i, part in enumerate(_parts(rows)):
            groups.setdefault((i // ends.shape[1], bool(last[i])), []).append(part)
    return [{"split": split, "last": last_, "programs": len(v),
             **dict(zip(_PARTS, np.median(np.array(v), axis=0).tolist(), strict=True))}
            for (split, last_), v in sorted(groups.items())]


def slice_markdown(name: str, groups: list[dict[str, Any]]) -> str:
    """:func:`slice_parts` as a table."""
    lines = [f"{name} by K slice (median µs after the wait; last: the tile's last program):",
             "", "| slice | last | programs | " + " | ".join(_PARTS) + " |",
             "|---" * (3 + len(_PARTS)) + "|"]
    for g in groups:
        lines.append(f"| {g['split']} | {'yes' if g['last'] else 'no'} | {g['programs']} | "
                     + " | ".join(f"{g[p]:.2f}" for p in _PARTS) + " |")
    return "\n".join([*lines, ""])


_MEANS = ("step", "handoff", "waits", "after", "early", "sms", "stack", "programs",
          *_PARTS, *(f"last_{p}" for p in _PARTS), "doubled", "reused", "work_single",
          "work_doubled", "host", "work_host", "work_alone")


def layer_means(stats: list[dict[str, Any]], layers: int) -> list[dict[str, Any]]:
    """Mean figures of each position within a layer: the launches between the embeddings
    and the QA head cut into ``layers`` equal runs; empty unless the launches begin and
    end with those and divide evenly (on other paths some kernels are not traced, and a
    step would span them)."""
    body = stats[1:-1]
    if (not body or len(body) % layers or stats[0]["name"] != _FIRST
            or stats[-1]["name"] != _LAST):
        return []
    per = len(body) // layers
    return [{"position": f"{i + 1} {body[i]['name']}",
             **{k: _mean([s[k] for s in body[i::per]]) for k in _MEANS}}
            for i in range(per)]


def _mean(values: list[float]) -> float:
    """The mean of the values that are not NaN (NaN if none is)."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.fmean(kept) if kept else math.nan


def timer_step_ns(launches: Launches) -> int:
    """The smallest non-zero gap between any two recorded global-timer stamps, ns: the
    timer's resolution at best (0 if every stamp is equal)."""
    stamps = np.unique(np.concatenate([rows[:, [_START, _WAITED, _END]].ravel()
                                       for _, rows in launches]))
    gaps = np.diff(stamps)
    return int(gaps.min()) if gaps.size else 0


def clock_ghz(launches: Launches) -> float:
    """The SMs' clock, GHz: cycles over global-timer ns from each program's start to its
    end (median over programs that took at least a microsecond)."""
    rows = np.concatenate([r for _, r in launches])
    ns = rows[:, _END] - rows[:, _START]
    keep = ns >= 1000
    if not keep.any():
        return 0.0
    return float(np.median((rows[keep, _END_CLK] - rows[keep, _START_CLK]) / ns[keep]))


def markdown(title: str, stats: list[dict[str, Any]], means: list[dict[str, Any]],
             note: str = "") -> str:
    """One shape's table: every launch, or the first, the per-position means and the
    last where ``means`` holds them."""
    span = stats[-1]["last_end"] if stats else 0.0
    lines = [f"## {title}: {len(stats)} launches, span {span:.1f} us", ""]
    if note:
        lines += [note, ""]
    lines += ["| launch | programs | step | handoff | waits | after | early |",
              "|---|---|---|---|---|---|---|"]
    rows = stats[:1] + means + stats[-1:] if means else stats
    labels = [s["position"] if "position" in s else s["name"] for s in rows]
    for label, s in zip(labels, rows, strict=True):
        lines.append(f"| {label} | {s['programs']:.0f} "
                     f"| {s['step']:.2f} | {s['handoff']:.2f} | {s['waits']:.2f} "
                     f"| {s['after']:.2f} | {s['early']:.1f} |")
    lines += ["", "Placement (work: µs from wait to end, the mean of the programs named):", "",
              "| launch | sms | stack | doubled | reused | work single | work doubled "
              "| host | work host | work alone |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in zip(labels, rows, strict=True):
        work = ["-" if math.isnan(s[k]) else f"{s[k]:.2f}"
                for k in ("work_single", "work_doubled", "work_host", "work_alone")]
        lines.append(f"| {label} | {s['sms']:.1f} | {s['stack']:.2f} | {s['doubled']:.1f} "
                     f"| {s['reused']:.1f} | {work[0]} | {work[1]} | {s['host']:.1f} "
                     f"| {work[2]} | {work[3]} |")
    if not any(s[k] for s in rows for k in (*_PARTS[:-1], *(f"last_{p}" for p in _PARTS[:-1]))):
        return "\n".join([*lines, "", "(No marks after the wait: recorded before them.)", ""])
    lines += ["", "After the wait (median program; the last to end):", "",
              "| launch | loop | epi | count | finish | last: loop | epi | count | finish |",
              "|---|---|---|---|---|---|---|---|---|"]
    for label, s in zip(labels, rows, strict=True):
        cells = [s[p] for p in _PARTS] + [s[f"last_{p}"] for p in _PARTS]
        lines.append(f"| {label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join([*lines, ""])


def plot_layer(path: Path, launches: Launches, first: int, count: int,
               title: str) -> None:
    """Launches ``first : first + count`` by SM: a thin bar from each program's start to
    its wait's return, a thick one from there to its end (matplotlib, if installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    chosen = launches[first : first + count]
    t0 = min(int(rows[:, _START].min()) for _, rows in chosen)
    fig, ax = plt.subplots(figsize=(12, 7))
    colors = plt.get_cmap("tab10")
    for i, (name, rows) in enumerate(chosen):
        c = colors(i % 10)
        for r in rows:
            s, w, e = ((r[_START] - t0) / 1e3, (r[_WAITED] - t0) / 1e3, (r[_END] - t0) / 1e3)
            ax.plot([s, w], [r[_SM], r[_SM]], color=c, linewidth=0.8, alpha=0.5)
            ax.plot([w, e], [r[_SM], r[_SM]], color=c, linewidth=3.0)
        ax.plot([], [], color=c, linewidth=3, label=f"{first + i}: {name}")
    ax.set_xlabel("µs from the first program's start")
    ax.set_ylabel("multiprocessor")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record_shape(name: str, batch: int, seq: int, options: dict[str, Any], dtype: str,
                 calibrate: bool, passes: int, idle: bool) -> tuple[Launches, int]:
    """The last pass's (launch name, rows) in launch order, and the model's layers."""
    import torch

    from benchmarks.bench_gpu import device_packed, mix_windows, random_padded
    from benchmarks.rounds import tool_engine
    from engine.fused.kernels import timeline

    rng = np.random.default_rng(4)
    eng, cfg = tool_engine(name, dtype, options, mix_windows(rng, 256) if calibrate else None)
    x = device_packed(*random_padded(rng, batch, seq, None))
    recorder = timeline.Timeline(torch.device("cuda"))
    with torch.inference_mode():
        with timeline.recording(recorder):  # the graph's capture (and its warm-up pass)
            eng._run_device(*x)
        for _ in range(passes):
            eng._run_device(*x)
        torch.cuda.synchronize()
        recorder.rows.zero_()  # what the last pass writes is the graph's slots only
        for _ in range(1 if idle else passes):
            eng._run_device(*x)
        torch.cuda.synchronize()
    written = [(launch.name, rows.numpy()) for launch, rows in recorder.launch_rows()
               if (rows[:, _END] > 0).all()]
    if not written:
        raise SystemExit(f"{name} {batch}x{seq}: no launch recorded a row (no graph?)")
    return written, cfg.num_hidden_layers


def _finite(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The figures with None for NaN (none of the programs named), as strict JSON has it."""
    return [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in rows]


def load_recorded(path: Path) -> tuple[str, Launches, int]:
    """A saved ``timeline_<shape>.json`` (or ``.json.gz``): its title (with the module
    constants it was recorded with), launches and layers.
    Rows saved before the marks existed (8 fields) get them at their wait, as a kernel
    without marks writes them."""
    import gzip

    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
        saved = json.load(f)
    launches: Launches = []
    for launch in saved["launches"]:
        rows = np.asarray(launch["rows"], dtype=np.int64)
        if rows.shape[1] < _COUNTED + 1:
            marks = np.repeat(rows[:, [_WAITED]], _COUNTED + 1 - rows.shape[1], axis=1)
            rows = np.concatenate([rows, marks], axis=1)
        launches.append((launch["name"], rows))
    per = len(saved.get("per_layer", []))  # absent where the report failed after the save
    layers = saved.get("layers") or ((len(launches) - 2) // per if per else 1)
    constants = saved.get("set") or []
    return saved["shape"] + (f" ({', '.join(constants)})" if constants else ""), launches, layers


def analyse(title: str, launches: Launches, layers: int, out: Path, tag: str,
            plot_at: int, by_slice: tuple[tuple[str, int], ...] = ()
            ) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """One pass's report (markdown), its launches' figures and the per-position means;
    plots layer ``plot_at`` (or the last) into ``out/timeline_<tag>.png``. ``by_slice``:
    (launch name, K slices) whose programs the report also lists by slice."""
    stats = launch_stats(launches)
    means = layer_means(stats, layers)
    note = (f"Global timer: smallest step between stamps {timer_step_ns(launches)} ns; "
            f"SM clock {clock_ghz(launches):.2f} GHz (cycles over ns). "
            + ("" if means else "Launches not in whole layers: every launch listed."))
    per = len(means) or len(launches)
    layer = min(plot_at, layers - 1) if means else 0
    plot_layer(out / f"timeline_{tag}.png", launches, 1 + per * layer if means else 0,
               per, f"{title}, layer {layer}" if means else title)
    slices = [slice_markdown(name, slice_parts(launches, name, splits))
              for name, splits in by_slice]
    return "\n".join([markdown(title, stats, means, note), *slices]), stats, means


def _by_slice(text: str) -> tuple[str, int]:
    """``NAME=SPLITS`` -> (NAME, SPLITS)."""
    name, _, splits = text.rpartition("=")
    if not name or not splits.isdigit() or int(splits) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=SPLITS, got {text!r}")
    return name, int(splits)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sys.path.insert(0, str(REPO))
    from benchmarks.trace_pass import add_engine_arguments, engine_options

    add_engine_arguments(p, REPO / "build" / "timeline", "bert-base:1x128")
    p.add_argument("--passes", type=int, default=20)
    p.add_argument("--idle", action="store_true", help="the recorded pass alone, GPU idle")
    p.add_argument("--plot-layer", type=int, default=5, help="the layer the plot shows")
    p.add_argument("--from", dest="saved", type=Path, action="append", default=[],
                   help="a saved timeline_<shape>.json[.gz] to report again (no GPU; "
                        "repeatable; --shapes is then ignored)")
    p.add_argument("--by-slice", type=_by_slice, action="append", default=[],
                   metavar="NAME=SPLITS", help="also list launch NAME's programs by K "
                   "slice, its grid having SPLITS of them (e.g. FFN2=4; repeatable)")
    args = p.parse_args()
    if args.plot_layer < 0 or args.passes < 1:
        p.error("--plot-layer must be >= 0 and --passes >= 1")
    options = engine_options(p, args)
    report = ["# Programs of one forward pass (µs; see benchmarks/program_timeline.py)", ""]
    for path in args.saved:
        title, launches, layers = load_recorded(path)
        tag = path.name.removesuffix(".gz").removesuffix(".json").removeprefix("timeline_")
        text, _, _ = analyse(title, launches, layers, args.out, tag, args.plot_layer,
                             tuple(args.by_slice))
        report.append(f"{text}\nFrom {path.name}.\n")
        print(report[-1], flush=True)
    from benchmarks.bench_gpu import parse_shapes

    for name, batch, seq in [] if args.saved or not args.shapes else parse_shapes(
            args.shapes):
        launches, layers = record_shape(name, batch, seq, options, args.dtype,
                                        args.calibrate, args.passes, args.idle)
        title = f"{name} {batch}x{seq} {args.dtype}" + (" calibrated" if args.calibrate
                                                        else "")
        tag = f"{name}_{batch}x{seq}_{args.dtype}"
        saved = {"shape": title, "options": options, "set": args.set, "idle": args.idle,
                 "layers": layers,
                 "launches": [{"name": n, "rows": r.tolist()} for n, r in launches]}
        path = args.out / f"timeline_{tag}.json"
        path.write_text(json.dumps(saved))  # the recording first: a report error keeps it
        text, stats, means = analyse(title, launches, layers, args.out, tag,
                                     args.plot_layer, tuple(args.by_slice))
        report.append(text)
        path.write_text(json.dumps(saved | {"stats": _finite(stats),
                                            "per_layer": _finite(means)}, allow_nan=False))
        print(report[-1], flush=True)
    if args.set:
        report.append("Module constants set: " + ", ".join(args.set))
    (args.out / "timeline.md").write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
