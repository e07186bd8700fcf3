"""cuBLASLt FP8 epilogues against the engine's FFN1 at SQuAD-mix size, in one run.

    python3 benchmarks/cublaslt_fp8.py --out lt.json [--tokens 47392]

FFN1 of BERT-large (``[T, 1024] x [4096, 1024]^T``, then bias + GELU, then e4m3 for
FFN2), each variant on the same operands:

* ``engine``: row-wise ``torch._scaled_mm`` (fp16 out) + the ``bias_gelu`` kernel writing
  e4m3 with one scale per row (the engine's FP8 path);
* ``lt_rows_fp16``: ``engine.fused.cublaslt.fp8_linear``, row-wise scales, fp16 out, no
  epilogue (should match ``_scaled_mm``);
* ``lt_gelu_fp16``: the same with cuBLASLt's bias + GELU epilogue;
* ``lt_gelu_e4m3_<bias>``: bias + GELU + e4m3 output with one static scale for the tensor
  (here the exact amax of this output, i.e. a perfectly calibrated scale), bias fp16/bf16;
* ``lt_tensor_gelu_e4m3``: per-tensor input scales too.

Then FFN2 (``[T, 4096] x [1024, 4096]^T``) from an e4m3 input with one static scale:
``lt_ffn2_tensor_x`` (scalar activation scale, per-channel weight scales) against
``scaled_mm_rows`` (the engine's row-wise call).

Times: a CUDA graph of 24 calls, median of ``--replays``. Errors: against float32 math
on the same e4m3 operands with exact GELU, relative to the output's mean absolute
value (max and mean); an e4m3 output is dequantized first. A variant cuBLASLt refuses is
recorded with its error.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _errors(y: Any, ref: Any) -> dict[str, float]:
    d = (y.float() - ref).abs()
    mean = float(ref.abs().mean())
    return {"max_rel": float(d.max()) / mean, "mean_rel": float(d.mean()) / mean}


def _variant(name: str, fn: Callable[[], Any], deq: Callable[[Any], Any], ref: Any,
             replays: int) -> dict[str, Any]:
    from benchmarks.attn_backends import _time_graph

    row: dict[str, Any] = {"variant": name}
    try:
        y = fn()
        row.update(_errors(deq(y), ref))
        row["us"], row["graphed"] = _time_graph(fn, 24, replays)
    except Exception as exc:  # a refused variant is a result
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["trace"] = traceback.format_exc(limit=3)
    print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
    return row


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks import gemm_cli

    args = gemm_cli.parse_args(__doc__, 47392)
    import torch
    import torch.nn.functional as F

    from engine.fused import cublaslt, kernels
    from engine.fused.fp8 import FP8_MAX, dequantize, quantize_rows, quantize_tiles

    t, d, f = args.tokens, 1024, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((t, d), generator=g, device="cuda")
    x[:, torch.randint(0, d, (8,), generator=g, device="cuda")] *= 12  # outlier channels
    xq = quantize_rows(x.half())
    w1 = (torch.randn((f, d), generator=g, device="cuda") * 0.03).half()
    b1 = (torch.randn((f,), generator=g, device="cuda") * 0.1).half()
    w8, ws = quantize_tiles(w1, 1, d)  # ws [N, 1]
    ws_row = ws.t().contiguous()  # [1, N] for _scaled_mm
    ws_vec = ws.reshape(-1).contiguous()
    xs_vec = xq.scale.reshape(-1).contiguous()
    pre = (xq.data.float() * xq.scale) @ (w8.float() * ws).t() + b1.float()
    ref = F.gelu(pre)
    amax = float(ref.abs().max())
    out_scale = torch.tensor([FP8_MAX / amax], device="cuda")
    result: dict[str, Any] = {**gemm_cli.header(t), "ffn1": [], "ffn2": []}

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))

    def engine() -> Any:
        h = torch._scaled_mm(xq.data, w8.t(), scale_a=xq.scale, scale_b=ws_row,
                             out_dtype=torch.float16)
        return kernels.bias_gelu(h, b1, fp8=True)[1]

    plain = lambda y: y  # noqa: E731
    from_e4m3 = lambda y: y.float() / out_scale  # noqa: E731
    x_t = torch.tensor([float(xq.scale.max())], device="cuda")
    xq_t = (xq.data.float() * xq.scale / x_t).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    w_t = torch.tensor([float(ws.max())], device="cuda")
    w8_t = (w8.float() * ws / w_t).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    variants: list[tuple[str, Callable[[], Any], Callable[[Any], Any]]] = [
        ("engine", engine, dequantize),
        ("lt_rows_fp16", lambda: cublaslt.fp8_linear(
            xq.data, xs_vec, w8, ws_vec, torch.float16), lambda y: F.gelu(y.float() + b1.float())),
        ("lt_gelu_fp16", lambda: cublaslt.fp8_linear(
            xq.data, xs_vec, w8, ws_vec, torch.float16, bias=b1, gelu=True), plain),
        ("lt_gelu_e4m3_fp16bias", lambda: cublaslt.fp8_linear(
            xq.data, xs_vec, w8, ws_vec, torch.float8_e4m3fn, bias=b1, gelu=True,
            out_scale=out_scale), from_e4m3),
        ("lt_gelu_e4m3_bf16bias", lambda: cublaslt.fp8_linear(
            xq.data, xs_vec, w8, ws_vec, torch.float8_e4m3fn, bias=b1.bfloat16(), gelu=True,
            out_scale=out_scale), from_e4m3),
        ("lt_e4m3_noepi", lambda: cublaslt.fp8_linear(
            xq.data, xs_vec, w8, ws_vec, torch.float8_e4m3fn, out_scale=out_scale),
         lambda y: F.gelu(y.float() / out_scale + b1.float())),
        ("lt_gelu_bf16", lambda: cublaslt.fp8_linear(
            xq.data, xs_vec, w8, ws_vec, torch.bfloat16, bias=b1.bfloat16(), gelu=True), plain),
        ("lt_tensor_gelu_fp16", lambda: cublaslt.fp8_linear(
            xq_t, x_t, w8_t, w_t, torch.float16, bias=b1, gelu=True), plain),
        ("lt_tensor_gelu_e4m3", lambda: cublaslt.fp8_linear(
            xq_t, x_t, w8_t, w_t, torch.float8_e4m3fn, bias=b1.bfloat16(), gelu=True,
            out_scale=out_scale), from_e4m3),
    ]
    for name, fn, deq in variants:
        result["ffn1"].append(_variant(name, fn, deq, ref, args.replays))
        save()

    # FFN2 from an e4m3 input with one static scale (what the fused FFN1 writes).
    w2 = (torch.randn((d, f), generator=g, device="cuda") * 0.02).half()
    w28, w2s = quantize_tiles(w2, 1, f)
    hs = torch.tensor([amax / FP8_MAX], device="cuda")
    hq = (ref / hs).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    ref2 = (hq.float() * hs) @ (w28.float() * w2s).t()
    hs_rows = hs.expand(t, 1).contiguous()
    for name, fn in (
        ("scaled_mm_rows", lambda: torch._scaled_mm(
            hq, w28.t(), scale_a=hs_rows, scale_b=w2s.t().contiguous(), out_dtype=torch.float16)),
        ("lt_ffn2_tensor_x", lambda: cublaslt.fp8_linear(
            hq, hs, w28, w2s.reshape(-1).contiguous(), torch.float16)),
        ("lt_ffn2_rows_x", lambda: cublaslt.fp8_linear(
            hq, hs_rows.reshape(-1), w28, w2s.reshape(-1).contiguous(), torch.float16)),
    ):
        result["ffn2"].append(_variant(name, fn, plain, ref2, args.replays))
        save()


if __name__ == "__main__":
    main()
