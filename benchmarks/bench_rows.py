"""The large path's row kernels at SQuAD-mix size: time per call, bandwidth, and a sweep
of their tiles.

    python3 benchmarks/bench_rows.py --out rows.json [--tokens 47391] [--model bert-large]

Kernels (BERT-large widths by default): bias + GELU on the FFN1 output ([T, 4096] fp16 in;
fp16 out, or the per-row e4m3 copy and scales), and bias + residual + LayerNorm ([T, 1024]
fp16 in; fp16 out, plus the e4m3 copy with ``fp8``). Each configuration (rows per program,
warps) runs as a CUDA graph of ``--layers`` calls; its output is compared with the
launcher's default configuration's. Bytes are what the kernel must move (inputs read once,
outputs written once). For scale, the run also times ``torch`` copying 512 MiB in a CUDA graph
(read + write bytes per second; on the H200, 2026-11-30, 2.7 TB/s, well under the 4.1-4.2
TB/s ``bench_gpu.py`` measures for its device copy: a reference, not a ceiling). Random inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# (rows per program, warps) tried per kernel; the launcher's default is timed first.
GELU_TILES = [(1, 4), (1, 8), (2, 8), (2, 16), (4, 16)]
GELU16_TILES = [(1024, 4, 4), (1024, 8, 8), (2048, 2, 8), (4096, 1, 8), (4096, 2, 16)]
LN_TILES = [(1, 4), (2, 4), (4, 8), (8, 16)]


def copy_rate_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate (read + write bytes per second), GB/s."""
    import torch

    from benchmarks.attn_backends import _time_graph

    a = torch.empty(nbytes // 4, device="cuda", dtype=torch.float16)
    b = torch.empty_like(a)
    us, _ = _time_graph(lambda: b.copy_(a), 4, 10)
    return nbytes / us * 1e-3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=47391, help="rows (the mix256 batch: 47,391)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import torch
    import triton

    from benchmarks.attn_backends import _time_graph
    from engine.fused.kernels import rows as r

    t, d, f = args.tokens, args.hidden, args.ffn
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, device="cuda", dtype=torch.float16)

    h, b1 = randn(t, f) * 2, randn(f)
    a, res, b2, gamma, beta = randn(t, d), randn(t, d), randn(d), randn(d), randn(d)
    out16 = torch.empty((t, f), device="cuda", dtype=torch.float16)
    q8 = torch.empty((t, f), device="cuda", dtype=torch.float8_e4m3fn)
    qs = torch.empty((t, 1), device="cuda", dtype=torch.float32)
    ln_out = torch.empty((t, d), device="cuda", dtype=torch.float16)
    ln_q = torch.empty((t, d), device="cuda", dtype=torch.float8_e4m3fn)
    ln_qs = torch.empty((t, 1), device="cuda", dtype=torch.float32)
    rate = copy_rate_gbs()
    print(f"device copy: {rate:.0f} GB/s (read + write)", flush=True)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "tokens": t,
                              "copy_gbs": rate, "kernels": []}

    def gelu(block: int, rows: int, warps: int, fp8: bool) -> Any:
        grid = (triton.cdiv(t, rows), triton.cdiv(f, block))
        return lambda: r._bias_gelu_kernel[grid](
            h, b1, out16, q8, qs, t, f, 0, BLOCK_F=block, ROWS=rows, SPLITS=1, FP8_OUT=fp8,
            TANH=False, USE_PDL=False, num_warps=warps)

    def ln(rows: int, warps: int, fp8: bool) -> Any:
        return lambda: r._residual_ln_kernel[(triton.cdiv(t, rows),)](
            a, b2, res, gamma, beta, ln_out, ln_q, ln_qs, gamma, gamma, ln_out, t, 0, 0, d,
            1e-5, BLOCK_D=triton.next_power_of_2(d), ROWS=rows, SPLITS=1, FP8_OUT=fp8,
            QA_HEAD=False, USE_PDL=False, num_warps=warps)

    def result_of(fp8: bool, ln_kernel: bool) -> torch.Tensor:
        if ln_kernel:
            return (ln_q.float() * ln_qs) if fp8 else ln_out.float()
        return (q8.float() * qs) if fp8 else out16.float()

    fb, fr, fw = r._row_tile(t, f)
    gelu16_default = r._gelu_tile(f)
    _, lr, lw = r._row_tile(t, d)
    cases: list[tuple[str, int, list[tuple[tuple[int, ...], Any]], bool, bool]] = [
        ("bias_gelu fp8", t * f * 3 + t * 4,
         [((fr, fw), gelu(fb, fr, fw, True))]
         + [((rows, w), gelu(fb, rows, w, True)) for rows, w in GELU_TILES], True, False),
        ("bias_gelu fp16", t * f * 4,
         [(gelu16_default, gelu(*gelu16_default, False))]
         + [(c, gelu(c[0], c[1], c[2], False)) for c in GELU16_TILES], False, False),
        ("residual_ln fp8", t * d * 7 + t * 4,
         [((lr, lw), ln(lr, lw, True))] + [((rows, w), ln(rows, w, True))
                                           for rows, w in LN_TILES], True, True),
        ("residual_ln fp16", t * d * 6,
         [((lr, lw), ln(lr, lw, False))] + [((rows, w), ln(rows, w, False))
                                            for rows, w in LN_TILES], False, True),
    ]
    for name, nbytes, configs, fp8, is_ln in cases:
        ref = None
        for i, (cfg, fn) in enumerate(configs):
            fn()
            torch.cuda.synchronize()
            out = result_of(fp8, is_ln).clone()
            ref = out if ref is None else ref
            err = float((out - ref).abs().max())
            us, _ = _time_graph(fn, args.layers, args.replays)
            row = {"kernel": name, "config": list(cfg), "default": i == 0, "us": us,
                   "gbs": nbytes / us * 1e-3, "max_abs_vs_default": err}
            result["kernels"].append(row)
            print(f"{name} {cfg}{' (default)' if i == 0 else ''}: {us:.1f} us, "
                  f"{row['gbs']:.0f} GB/s, diff {err:.2e}", flush=True)
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
