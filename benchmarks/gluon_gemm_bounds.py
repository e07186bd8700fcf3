"""How far the Gluon int8 GEMMs run from their main loop's bound, alone at the mix's
token count (``engine/fused/NOTES.md`` v53).

    python3 benchmarks/gluon_gemm_bounds.py --out bounds.json [--tokens 47391]
        [--rounds 5] [--calls 24] [--configs "ffn1=3:128:32:256,4:64:32:256;..."]

In the settled mix pass the default's two Gluon int8 GEMMs (FFN1 and the out-projection,
``int8.GEMM_CONFIGS``) are ~31% of the kernels' time at ~60% of the int8 tensor cores'
peak, where cuBLASLt's e4m3 FFN2 runs at ~84% of it. Each GEMM
(``profile_int8_gemms.launches``' operands) is timed in these forms, through
``gluon_gemm.DIAGNOSTIC``: ``gemm`` (as the engine runs it), ``handoff`` (the epilogue
frees each tile's buffer without reading it: the main loop and the accumulators' handoff
through shared memory) and ``loop`` (no handoff: the main loop alone, its loads and
wgmmas); ``no-store`` (the whole epilogue, its stores predicated off: what the stores cost)
and ``no-read`` (the epilogue's math and stores on stand-in values, without the handoff
buffer's reads; not a bound, since the stand-ins cost integer work: v54 ran it slower than
``gemm``), all at the module's ``SPLIT_HANDOFF``; ``gemm`` and
``handoff`` with a cooperative kernel's accumulators handed over in column halves and
``gemm`` whole (``gluon_gemm.SPLIT_HANDOFF`` on and off; the ping-pong kernel has no split
form, so there they time the same kernel again), ``gemm`` with the handoff buffers in v41's
generic swizzle (``gluon_gemm.NVMMA_HANDOFF`` off). ``gemm`` over ``loop`` is what the
epilogue side costs;
``loop`` against the clock's peak what the main loop leaves. Then each of ``--configs`` in
the ``gemm`` form.
Each form is a CUDA graph of ``--calls`` calls; the forms take turns for ``--rounds`` rounds
(``rounds.interleaved``, burst clocks: the SM clock and power over the run are printed).
Prints µs a call (median of the rounds), int8 TOPS and the share of ``gemm``'s time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# form -> (gluon_gemm.DIAGNOSTIC, gluon_gemm.NVMMA_HANDOFF, gluon_gemm.SPLIT_HANDOFF or
# None for the module's own)
FORMS: dict[str, tuple[int, bool, bool | None]] = {
    "gemm": (0, True, None), "handoff": (1, True, None), "loop": (2, True, None),
    "no-store": (3, True, None), "no-read": (4, True, None),
    "gemm split-handoff": (0, True, True), "handoff split-handoff": (1, True, True),
    "gemm whole-handoff": (0, True, False), "gemm generic-handoff": (0, False, None)}
DEFAULT_CONFIGS = "ffn1=4:64:32:256,4:128:32:128;out_proj=3:128:16:256"


def parse_configs(text: str) -> dict[str, list[tuple[int, int, int, int]]]:
    """``"ffn1=3:128:32:256,...;out_proj=..."`` -> configs a GEMM."""
    out: dict[str, list[tuple[int, int, int, int]]] = {}
    for part in filter(None, text.split(";")):
        name, _, values = part.partition("=")
        if name not in ("ffn1", "out_proj"):
            raise ValueError(f"bad GEMM {name!r}: ffn1 or out_proj")
        configs = [tuple(int(v) for v in c.split(":")) for c in filter(None, values.split(","))]
        if any(len(c) != 4 for c in configs):
            raise ValueError(f"bad config in {part!r}: STAGES:BLOCK_K:SUB_M:BLOCK_N")
        out[name] = configs  # type: ignore[assignment]
    return out


def graphs(tokens: int, calls: int,
           configs: dict[str, list[tuple[int, int, int, int]]]) -> dict[str, Any]:
    """name -> a captured graph of ``calls`` calls, each form's under its diagnostic."""
    from benchmarks.profile_int8_gemms import launches
    from benchmarks.rounds import capture_graph
    from engine.fused.kernels import gluon_gemm

    ffn1, out_proj = launches(tokens)[:2]
    fns: dict[str, Callable[..., object]] = {"ffn1": ffn1, "out_proj": out_proj}
    captured: dict[str, Any] = {}
    defaults = gluon_gemm.DIAGNOSTIC, gluon_gemm.NVMMA_HANDOFF, gluon_gemm.SPLIT_HANDOFF
    try:
        for gemm, fn in fns.items():
            for form, (diag, nvmma, split) in FORMS.items():
                gluon_gemm.DIAGNOSTIC, gluon_gemm.NVMMA_HANDOFF = diag, nvmma
                gluon_gemm.SPLIT_HANDOFF = defaults[2] if split is None else split
                captured[f"{gemm} {form}"] = capture_graph(fn, calls)
            gluon_gemm.DIAGNOSTIC, gluon_gemm.NVMMA_HANDOFF, gluon_gemm.SPLIT_HANDOFF = defaults
            for config in configs.get(gemm, []):
                tag = ":".join(map(str, config))
                captured[f"{gemm} gemm {tag}"] = capture_graph(
                    lambda fn=fn, config=config: fn(config=config), calls)
    finally:
        gluon_gemm.DIAGNOSTIC, gluon_gemm.NVMMA_HANDOFF, gluon_gemm.SPLIT_HANDOFF = defaults
    return captured


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=47391)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=24)
    p.add_argument("--configs", default=DEFAULT_CONFIGS)
    p.add_argument("--commit", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    from benchmarks.gpu_clocks import ClockSampler, clock_fields, torch_gpu_id
    from benchmarks.profile_int8_gemms import GEMMS
    from benchmarks.rounds import interleaved

    captured = graphs(args.tokens, args.calls, parse_configs(args.configs))
    with ClockSampler(gpu=torch_gpu_id()) as clocks:
        start = clocks.now()
        times = interleaved({name: g.replay for name, g in captured.items()}, args.rounds,
                            reps=1)
        end = clocks.now()
    clock = clock_fields(clocks.between(start, end))
    flops = {"ffn1": 2 * args.tokens * GEMMS[0][1] * GEMMS[0][2],
             "out_proj": 2 * args.tokens * GEMMS[1][1] * GEMMS[1][2]}
    rows = []
    print(f"Gluon int8 GEMMs alone, {args.tokens} tokens, {torch.cuda.get_device_name()}, "
          f"SM {clock.get('sm_mhz', 0):.0f} MHz, {clock.get('power_w', 0):.0f} W (medians)")
    print("| GEMM | form | µs a call | TOPS | of gemm's time |")
    print("|---|---|---|---|---|")
    for name, ms in times.items():
        gemm, form = name.split(" ", 1)
        us = statistics.median(ms) * 1e3 / args.calls
        base = statistics.median(times[f"{gemm} gemm"]) * 1e3 / args.calls
        rows.append({"gemm": gemm, "form": form, "us": us, "rounds_ms": ms,
                     "tops": flops[gemm] / us / 1e6})
        print(f"| {gemm} | {form} | {us:.1f} | {flops[gemm] / us / 1e6:,.0f} | "
              f"{100 * us / base:.0f}% |")
    args.out.write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(), "commit": args.commit, "tokens": args.tokens,
        "calls": args.calls, "clocks": clock, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
