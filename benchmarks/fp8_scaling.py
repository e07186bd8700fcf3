"""Row-wise against block-wise FP8 scaling for ``torch._scaled_mm``: speed and error of the
BERT-large GEMMs at SQuAD-mix size, in one run.

    python3 benchmarks/fp8_scaling.py --out fp8.json [--tokens 47391]

Schemes, each ``x @ w.T`` from e4m3 with float32 scales, fp16 output:

* ``rowwise``: one scale per token (row of ``x``) and per output channel (row of ``w``),
  the engine's FP8 path;
* ``block_1x128_128x128``: one scale per token per 128 input channels, one per 128x128
  block of ``w`` (DeepSeek-V3's recipe);
* ``block_1x128_1x128``: per token and per output channel, each per 128 input channels;
* ``cutlass_1x128_128x128``: the first block scheme through the engine's CUTLASS kernel
  (``engine.fused.cutlass_fp8``), when its library is built.

The block-wise ``_scaled_mm`` calls need the token count to be a multiple of 4 (their
M-major scales are read in 16-byte rows): pass ``--tokens 47392``.

Each is timed by replaying a CUDA graph of 24 calls. Its error is the max and mean
absolute difference from the fp16 GEMM of the unquantized operands (float32
accumulation), relative to that GEMM's mean absolute value. Inputs: random activations
with a few outlier channels (as after a LayerNorm) and random weights. Block-wise scales
may need a particular memory layout; each layout tried, and the error of each failure, is
recorded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def measure(name: str, n: int, k: int, t: int, g: Any, replays: int) -> dict[str, Any]:
    """One GEMM shape [t, k] x [n, k]^T: every scheme's time and error."""
    import torch

    from benchmarks.attn_backends import _time_graph
    from engine.fused.fp8 import quantize_tiles

    x = torch.randn((t, k), generator=g, device="cuda")
    x[:, torch.randint(0, k, (8,), generator=g, device="cuda")] *= 12  # outlier channels
    x = x.half()
    w = (torch.randn((n, k), generator=g, device="cuda") * 0.03).half()
    ref = torch.mm(x, w.t()).float()
    ref_mean = float(ref.abs().mean())
    xr, sxr = quantize_tiles(x, 1, k)
    wr, swr = quantize_tiles(w, 1, k)
    xb, sxb = quantize_tiles(x, 1, 128)
    wb, swb = quantize_tiles(w, 128, 128)
    wc, swc = quantize_tiles(w, 1, 128)
    schemes: dict[str, list[tuple[str, Any]]] = {
        "rowwise": [("rows", lambda: torch._scaled_mm(
            xr, wr.t(), scale_a=sxr.contiguous(), scale_b=swr.t().contiguous(),
            out_dtype=torch.float16))],
        "block_1x128_128x128": [
            (f"a {la}, b {lb}", lambda sa=sa, sb=sb: torch._scaled_mm(
                xb, wb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16))
            for la, sa in (("M-major", sxb.t().contiguous().t()), ("K-major", sxb.contiguous()))
            for lb, sb in (("N-major", swb.t().contiguous()), ("K-major", swb.contiguous().t()))],
        "block_1x128_1x128": [
            (f"a {la}, b {lb}", lambda sa=sa, sb=sb: torch._scaled_mm(
                xb, wc.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16))
            for la, sa in (("M-major", sxb.t().contiguous().t()), ("K-major", sxb.contiguous()))
            for lb, sb in (("N-major", swc.t().contiguous()), ("K-major", swc.contiguous().t()))],
    }
    from engine.fused import cutlass_fp8
    from engine.fused.fp8 import quantize_blocks as quantize_act_blocks
    from engine.fused.fp8 import quantize_weight_blocks

    if cutlass_fp8.LIBRARY.available():  # the engine's block-wise path, on the same operands
        xq = quantize_act_blocks(x)
        w8, ws = quantize_weight_blocks(w)
        schemes["cutlass_1x128_128x128"] = [("engine layouts", lambda: cutlass_fp8.blockwise_gemm(
            xq, w8, ws, torch.float16))]
    fp16_us, _ = _time_graph(lambda: torch.mm(x, w.t()), 24, replays)
    row: dict[str, Any] = {"gemm": name, "n": n, "k": k, "fp16_mm_us": fp16_us}
    for scheme, layouts in schemes.items():
        tries = []
        for layout, fn in layouts:
            try:
                out = fn().float()
                diff = (out - ref).abs()
                us, _ = _time_graph(fn, 24, replays)
                tries.append({"layout": layout, "us": us,
                              "max_rel": float(diff.max()) / ref_mean,
                              "mean_rel": float(diff.mean()) / ref_mean})
            except Exception as exc:
                tries.append({"layout": layout, "error": repr(exc)[:240]})
            print(f"{name} {scheme} {tries[-1]}", flush=True)
        row[scheme] = tries
    return row


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks import gemm_cli

    args = gemm_cli.parse_args(__doc__, 47391)
    import torch

    t = args.tokens
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = {g: gemm_cli.BERT_LARGE_GEMMS[g] for g in ("qkv", "ffn1", "ffn2")}
    result: dict[str, Any] = {**gemm_cli.header(t), "gemms": []}
    for name, (n, k) in shapes.items():
        result["gemms"].append(measure(name, n, k, t, g, args.replays))
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        torch.cuda.empty_cache()

if __name__ == "__main__":
    main()
