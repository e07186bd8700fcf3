"""The FP8 GEMMs of a BERT-large SQuAD-mix pass: accumulation mode and algorithm choice.

    python3 benchmarks/fp8_gemm_tuning.py --out tuning.json [--tokens 47392]

For each GEMM of a BERT-large layer at ``--tokens`` rows (QKV, out-projection, FFN1,
FFN2), on the same e4m3 operands (per-row activation scales, per-channel weight scales):

* ``scaled_mm``: row-wise ``torch._scaled_mm`` (the engine's call), with and without
  ``use_fast_accum``;
* ``lt_rows_aI``: ``cublaslt.fp8_linear`` with the same scales, the heuristic's I-th
  algorithm (0: its own choice), fast accumulation off and on;
* ``lt_tensor_aI``: the same with one scale per operand (the operands re-quantized);
* ``fp16_mm``: the fp16 GEMM (the engine's out-projection; the others for scale).

Times: a CUDA graph of 24 calls, median of ``--replays`` (``attn_backends._time_graph``).
Errors: relative to the output's mean absolute value, against float32 math on the same
e4m3 values (so they show the accumulation, not the quantization). Ends with a table per
GEMM: each family's first-choice and best time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _row(name: str, fast: bool | None, fn: Any, ref: Any, replays: int) -> dict[str, Any] | None:
    """``cublaslt_fp8._variant`` (time, error, or the refusal) tagged with the accumulation
    mode; ``None`` where cuBLASLt offers no algorithm of that index."""
    from benchmarks.cublaslt_fp8 import _variant

    row = _variant(f"{name}{'_fast' if fast else ''}", fn, lambda y: y, ref, replays)
    if "offers" in row.get("error", ""):
        return None
    return {**row, "variant": name, "fast_accum": fast}


def _gemm(x: Any, w: Any, replays: int) -> list[dict[str, Any]]:
    """Every variant of ``x @ w^T`` (fp16 [T, K] and [N, K]) on the same e4m3 operands."""
    import torch

    from engine.fused import cublaslt
    from engine.fused.fp8 import quantize_rows, quantize_tiles

    (t, k), n = x.shape, w.shape[0]
    xq = quantize_rows(x)
    w8, ws = quantize_tiles(w, 1, k)  # ws [N, 1]
    ref = (xq.data.float() * xq.scale) @ (w8.float() * ws).t()
    xs, wsv, ws_row = xq.scale.reshape(-1), ws.reshape(-1).contiguous(), ws.t().contiguous()
    x8t, xt = quantize_tiles(x, t, k)  # one scale for the whole tensor
    w8t, wt = quantize_tiles(w, n, k)
    xt, wt = xt.reshape(1).contiguous(), wt.reshape(1).contiguous()
    ref_t = (x8t.float() * xt) @ (w8t.float() * wt).t()
    rows: list[dict[str, Any]] = []

    def add(row: dict[str, Any] | None) -> bool:
        if row is not None:
            rows.append(row)
        return row is not None and "error" not in row

    for fast in (False, True):
        add(_row("scaled_mm", fast, lambda f=fast: torch._scaled_mm(
            xq.data, w8.t(), scale_a=xq.scale, scale_b=ws_row, out_dtype=torch.float16,
            use_fast_accum=f), ref, replays))
        for family, (a, sa, b, sb), r in (("lt_rows", (xq.data, xs, w8, wsv), ref),
                                          ("lt_tensor", (x8t, xt, w8t, wt), ref_t)):
            for i in range(cublaslt.HEURISTIC_ALGOS):
                def call(a: Any = a, sa: Any = sa, b: Any = b, sb: Any = sb, f: bool = fast,
                         i: int = i) -> Any:
                    return cublaslt.fp8_linear(a, sa, b, sb, torch.float16, fast_accum=f, algo=i)
                if not add(_row(f"{family}_a{i}", fast, call, r, replays)):
                    break
    add(_row("fp16_mm", None, lambda: x @ w.t(), x.float() @ w.float().t(), replays))
    return rows


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks import gemm_cli

    args = gemm_cli.parse_args(__doc__, 47392)
    import torch

    t = args.tokens
    g = torch.Generator(device="cuda").manual_seed(0)
    result: dict[str, Any] = {**gemm_cli.header(t), "gemms": {}}
    for gemm, (n, k) in gemm_cli.BERT_LARGE_GEMMS.items():
        x = torch.randn((t, k), generator=g, device="cuda").half()
        w = (torch.randn((n, k), generator=g, device="cuda") * 0.03).half()
        print(f"{gemm}:", flush=True)
        result["gemms"][gemm] = _gemm(x, w, args.replays)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
    print(f"\nBERT-large GEMMs at {t} tokens, µs (first choice / best [algo]), slow | fast accum:")
    for gemm, rows in result["gemms"].items():
        cells = []
        for family in ("scaled_mm", "lt_rows", "lt_tensor"):
            for fast in (False, True):
                timed = [r for r in rows if r.get("fast_accum") is fast and "us" in r
                         and r["variant"].startswith(family)]
                if timed:
                    best = min(timed, key=lambda r: r["us"])
                    cells.append(f"{family}{'+fast' if fast else ''} {timed[0]['us']:.0f}/"
                                 f"{best['us']:.0f}[{best['variant'].rpartition('_')[2]}]")
        fp16 = [r for r in rows if r["variant"] == "fp16_mm" and "us" in r]
        print(f"  {gemm:5s} " + "  ".join(cells) + (f"  fp16 {fp16[0]['us']:.0f}" if fp16 else ""))


if __name__ == "__main__":
    main()
