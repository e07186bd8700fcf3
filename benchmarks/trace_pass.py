"""Where one batch-1 forward pass spends its time: a CUPTI kernel trace of real passes.

    python benchmarks/trace_pass.py --out DIR [--shapes bert-base:1x128,bert-large:1x384]
        [--dtype fp8 [--calibrate]] [--option KEY=VALUE ...] [--set module.ATTR=VALUE ...]
        [--repeat-layers N]

Each shape runs ``FusedEngine._run_device`` (what a call on device tensors pays per batch:
one CUDA-graph launch whose first kernel reads the caller's inputs and whose last writes
the caller's output, their arguments set per call) on a random-weight model, under
``torch.profiler``, several times with a synchronize between passes. From the last pass's
kernels (graph kernels are traced one by one) it reports:

* the span, from the first kernel's (or copy's) start to the last kernel's end, and the
  graph's span (its first to its last kernel, copies outside it excluded);
* per kernel kind, its count and its *step* time: with programmatic dependent launch a
  kernel starts early and waits, so its own duration overstates it; a kernel's step is
  the time from the previous kernel's end to its own end, and the steps add up to the
  span (gaps before a kernel are charged to it);
* the copies before the graph and the logits clone after it ("copy/fill") where a graph
  does not stage its own inputs, whose steps include the host's launch gaps between them;
* where the trace holds the CUDA runtime's graph-launch call: its host time and how long
  after its start the first kernel started (``launch_gap``). Under the profiler that
  call takes ~60 us (H200, 2026-12-01, against ~3 untraced): CUPTI's own cost, so this
  shows only the order of events; ``launch_cost.py`` times launches untraced.

``--set module.ATTR=VALUE`` sets a module constant before any engine is built (a launch
choice fixed into the graph at capture, as ``ab_replay.py --set`` does per variant).
``--repeat-layers N`` traces the model with its first N layers repeated to its depth
(``ab_replay.repeated_layers``: with N = 1 its weights stay in L2, which shows what each
kernel pays for its weight stream). ``--calibrate`` gives the engine static FP8 scales
first (``FusedEngine.calibrate`` on 256 windows of SQuAD dev lengths, not the traced
ones). Writes
``DIR/trace_<model>_<shape>.json`` (the raw kernel list of the last pass) and
``DIR/trace.md`` (one table per shape). Random weights; timings of a traced pass run a
little slower than untraced ones.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

_KINDS = [  # (substring of the kernel name, label), first match wins
    ("_deferred_gemm", "deferred-LN GEMM"), ("_layernorm_qa", "LN + QA head"),
    ("_gemm_kernel", "Triton GEMM"), ("_gemm_tma_kernel", "Triton GEMM"),
    ("_attn", "attention"), ("_residual_ln", "residual LN"),
    ("_embed_ln", "embed LN"), ("_bias_gelu", "bias GELU"), ("_encoder_kernel", "persistent"),
    ("_stage_kernel", "copy/fill"), ("gemm", "cuBLAS GEMM"), ("sm90", "cuBLAS GEMM"),
    ("cutlass", "cuBLAS GEMM"),
    ("elementwise", "copy/fill"), ("Memcpy", "copy/fill"), ("Memset", "copy/fill"),
    ("copy", "copy/fill"), ("fill", "copy/fill"),
]


def kind(name: str) -> str:
    return next((label for key, label in _KINDS if key in name), name[:40])


def kernel_steps(kernels: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(kind, step, own time) of each kernel in end order, us: a kernel's step runs from
    the previous kernel's end (the first one's start, for the first) to its own end."""
    ks = sorted(kernels, key=lambda e: e["ts"] + e["dur"])
    prev_end = min((e["ts"] for e in ks), default=0.0)
    out = []
    for e in ks:
        end = e["ts"] + e["dur"]
        out.append((kind(e["name"]), end - prev_end, e["dur"]))
        prev_end = end
    return out


def steps(kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """Span and per-kind step times (us) of one pass's kernels (``ts``/``dur`` in us)."""
    per: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "step_us": 0.0,
                                                            "own_us": 0.0})
    each = kernel_steps(kernels)
    for name, step, own in each:
        p = per[name]
        p["count"] += 1
        p["step_us"] += step
        p["own_us"] += own
    return {"span_us": sum(step for _, step, _ in each), "kernels": len(each),
            "by_kind": dict(sorted(per.items(), key=lambda kv: -kv[1]["step_us"]))}


# Kernel kinds that make up the encoder layers (everything between the embeddings and the
# last LayerNorm + QA head).
_LAYER_KINDS = ("deferred-LN GEMM", "attention", "Triton GEMM", "cuBLAS GEMM", "residual LN",
                "bias GELU")


def launch_gap(events: list[dict[str, Any]], first_kernel_ts: float) -> dict[str, float] | None:
    """The last graph launch (a CUDA runtime call whose name holds "GraphLaunch") that
    starts before ``first_kernel_ts``: how long the call took on the host and how long
    after its start the pass's first kernel started (us, CUPTI's common clock); None
    without such a call (the trace holds no runtime calls, or the pass was not a graph)."""
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e
                and "GraphLaunch" in e.get("name", "") and e["ts"] <= first_kernel_ts]
    if not launches:
        return None
    launch = max(launches, key=lambda e: e["ts"])
    return {"launch_api_us": launch["dur"], "launch_to_first_kernel_us":
            first_kernel_ts - launch["ts"]}


def layer_positions(kernels: list[dict[str, Any]], layers: int) -> list[dict[str, Any]]:
    """Mean step and own time (us) of each kernel position within a layer: the layer
    kernels (``_LAYER_KINDS``, in end order) cut into ``layers`` equal runs, position ``i``
    named by its kind in the first layer (e.g. the deferred layer: QKV, attention,
    out-projection, FFN1, FFN2 as "1 deferred-LN GEMM", "2 attention", ...). Empty if the
    kernels do not divide evenly into ``layers``."""
    ours = [t for t in kernel_steps(kernels) if t[0] in _LAYER_KINDS]
    if not ours or len(ours) % layers:
        return []
    per = len(ours) // layers
    return [{"position": f"{i + 1} {ours[i][0]}",
             "step_us": sum(t[1] for t in ours[i::per]) / layers,
             "own_us": sum(t[2] for t in ours[i::per]) / layers} for i in range(per)]


def trace_shape(name: str, batch: int, seq: int, options: dict[str, Any],
                out: Path, mix: bool = False, dtype: str = "float16",
                calibrate: bool = False, repeat_layers: int | None = None) -> dict[str, Any]:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.bench_gpu import device_packed, mix_windows, random_padded, squad_lengths
    from benchmarks.rounds import tool_engine

    rng = np.random.default_rng(4)
    eng, cfg = tool_engine(name, dtype, options, mix_windows(rng, 256) if calibrate else None,
                           repeat_layers)
    lengths = rng.choice(squad_lengths(), batch) if mix else None
    x = device_packed(*random_padded(rng, batch, seq, lengths))
    shape = (f"{batch}x{'mix' if mix else seq}" + ("" if dtype == "float16" else f"_{dtype}")
             + ("_calibrated" if calibrate else "")
             + (f"_repeat{repeat_layers}" if repeat_layers is not None else ""))
    with torch.inference_mode():
        for _ in range(5):
            eng._run_device(*x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(4):  # passes separated by a marker kernel ("spin_kernel")
                torch.cuda._sleep(1000)
                torch.cuda.synchronize()
                eng._run_device(*x)
                torch.cuda.synchronize()
    path = out / f"trace_{name}_{shape}.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    events = [e for e in trace
              if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    events.sort(key=lambda e: e["ts"])
    marks = [i for i, e in enumerate(events) if "spin_kernel" in e["name"]]
    last = events[marks[-1] + 1:]
    path.write_text(json.dumps([{k: e[k] for k in ("name", "ts", "dur")} for e in last]))
    graph = [e for e in last if kind(e["name"]) != "copy/fill"]
    res = {"model": name, "shape": shape, "options": options, **steps(last),
           "graph_span_us": steps(graph)["span_us"],
           "launch": launch_gap(trace, last[0]["ts"]) if last else None,
           "per_layer": layer_positions(last, cfg.num_hidden_layers)}
    print(f"trace {name} {shape}: span {res['span_us']:.1f} us (graph "
          f"{res['graph_span_us']:.1f}), {res['kernels']} "
          "kernels; " + ", ".join(f"{k} {v['count']}x {v['step_us']:.1f}"
                                  for k, v in res["by_kind"].items()), flush=True)
    return res


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["# Kernel trace of one forward pass (step = previous kernel's end to this "
             "kernel's end)", ""]
    for r in results:
        lines += [f"## {r['model']} {r['shape']} {r['options'] or ''}: span "
                  f"{r['span_us']:.1f} us (graph {r['graph_span_us']:.1f}), {r['kernels']} "
                  "kernels", ""]
        if r.get("launch"):
            lines += [f"Graph launch (traced, CUPTI's overhead included): "
                      f"{r['launch']['launch_api_us']:.1f} us on the host; the first kernel "
                      f"starts {r['launch']['launch_to_first_kernel_us']:.1f} us after the "
                      "launch call does.", ""]
        lines += ["| kernel | count | step us | step us each | own us |", "|---|---|---|---|---|"]
        for k, v in r["by_kind"].items():
            lines.append(f"| {k} | {v['count']} | {v['step_us']:.1f} | "
                         f"{v['step_us'] / v['count']:.2f} | {v['own_us']:.1f} |")
        lines.append("")
        if r.get("per_layer"):
            lines += ["| position in a layer | step us (mean over layers) | own us |",
                      "|---|---|---|"]
            lines += [f"| {q['position']} | {q['step_us']:.2f} | {q['own_us']:.2f} |"
                      for q in r["per_layer"]]
            lines.append("")
    return "\n".join(lines)


def apply_settings(items: list[str]) -> None:
    """Set each ``module.ATTR=VALUE`` (a Python literal) of ``--set``; a module without
    that attribute is an AttributeError (a typo must not pass as a measured variant)."""
    from benchmarks.ab_replay import parse_setting

    for item in items:
        _, module, attr, value = parse_setting("trace:" + item)
        mod = importlib.import_module(module)
        if not hasattr(mod, attr):
            raise AttributeError(f"{module} has no attribute {attr!r}")
        setattr(mod, attr, value)


def add_engine_arguments(p: argparse.ArgumentParser, out: Path, shapes: str) -> None:
    """The engine tools' shared options: --out, --shapes, --dtype, --calibrate, --option,
    --set (see :func:`engine_options`)."""
    p.add_argument("--out", type=Path, default=out)
    p.add_argument("--shapes", default=shapes,
                   help="MODEL:BxS list of full-length windows ('' for none)")
    p.add_argument("--dtype", default="float16", help="of --shapes: float16 or fp8")
    p.add_argument("--calibrate", action="store_true",
                   help="static FP8 scales first (fp8 engines; see the docstring)")
    p.add_argument("--option", action="append", default=[],
                   help="FusedEngine keyword for every shape, KEY=VALUE (repeatable)")
    p.add_argument("--set", action="append", default=[],
                   help="module.ATTR=VALUE: a module constant (a Python literal) set before "
                        "any engine is built, e.g. a launch choice fixed at capture")


def engine_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``--option`` as engine keywords, once ``--set``'s constants are set (a bad one is
    the parser's error), with ``--out`` made."""
    sys.path.insert(0, str(REPO))
    from engine.registry import _option_value

    options = {k: _option_value(v) for k, v in (o.split("=", 1) for o in args.option)}
    try:
        apply_settings(args.set)
    except (argparse.ArgumentTypeError, AttributeError) as exc:
        p.error(f"--set: {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    return options


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    add_engine_arguments(p, REPO / "build" / "trace",
                         "bert-base:1x128,bert-large:1x128,bert-large:1x384")
    p.add_argument("--mix", action="append", default=[],
                   help="MODEL:WINDOWS[:DTYPE], a batch of SQuAD-dev-length windows "
                        "(DTYPE float16 or fp8; repeatable)")
    p.add_argument("--repeat-layers", type=int, default=None,
                   help="the first N layers repeated to the model's depth (see above)")
    args = p.parse_args()
    options = engine_options(p, args)
    from benchmarks.bench_gpu import parse_shapes

    results = [trace_shape(name, b, s, options, args.out, dtype=args.dtype,
                           calibrate=args.calibrate, repeat_layers=args.repeat_layers)
               for name, b, s in (parse_shapes(args.shapes) if args.shapes else [])]
    for item in args.mix:
        name, windows, *dtype = item.split(":")
        results.append(trace_shape(name, int(windows), 384, options, args.out, mix=True,
                                   dtype=dtype[0] if dtype else "float16",
                                   calibrate=args.calibrate,
                                   repeat_layers=args.repeat_layers))
    report = markdown(results)
    if args.set:
        report += "\nModule constants set: " + ", ".join(args.set) + "\n"
    (args.out / "trace.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
