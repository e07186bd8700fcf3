"""Launches the settled mix pass's four GEMM kinds once each, for Nsight Compute: where the
Gluon int8 GEMMs' time goes against cuBLASLt's e4m3 ones (``engine/fused/NOTES.md`` v53).

At the mix's token count (BERT-large, 47,391 tokens by default) and on random operands of
the engine's formats: FFN1 and the out-projection as the default runs them on large passes
(``kernels.gluon_gemm`` on int8 operands with per-channel weight scales, at
``int8.GEMM_CONFIGS``: FFN1 cooperative with bias + GELU + e4m3 out, the out-projection
ping-pong with a 16-bit out), QKV and FFN2 as cuBLASLt e4m3 GEMMs with fast accumulation and
16-bit outputs (``fp8.static_linear``'s call, with its tuned plans). Each is launched once to
compile and plan, then once more between ``cudaProfilerStart`` and ``Stop``:

    ncu --clock-control none --profile-from-start off --csv --page details \\
        --section SpeedOfLight --section WarpStateStats --metrics \\
        sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum \\
        python3 benchmarks/profile_int8_gemms.py > ncu_gemms.csv
    python3 benchmarks/profile_int8_gemms.py --summarize ncu_gemms.csv

(``ncu`` flushes the caches before each profiled launch: each kernel reads its weights from
HBM once, as the first tile wave of a pass does.) ``--summarize`` prints, per kernel, the
time, the clock, the achieved TOPS or TFLOP/s (the kernels taken in the order launched here), the
SM, tensor-pipe, L2 and DRAM throughputs as shares of their peaks, the L2's bytes a second,
and the cycles a warp waits between issued instructions.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
D, F = 1024, 4096  # BERT-large's hidden and FFN widths
# (label, N, K) in launch order: the FLOPs of each are 2 * tokens * N * K
GEMMS = [("ffn1 int8 gluon", F, D), ("out_proj int8 gluon", D, D),
         ("qkv e4m3 cublaslt", 3 * D, D), ("ffn2 e4m3 cublaslt", D, F)]
PERCENTS = {  # ncu's "Metric Name" -> the column printed (shares of peak, and one ratio)
    "Compute (SM) Throughput": "SM %",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": "tensor %",
    "L2 Cache Throughput": "L2 %", "DRAM Throughput": "DRAM %",
    "Warp Cycles Per Issued Instruction": "cycles / issue",
}


def launches(tokens: int) -> list[Callable[..., object]]:
    """One closure a GEMM (``GEMMS``' order), on operands made once; the two Gluon ones
    take ``config`` (``gluon_gemm.CONFIG``'s order; ``int8.GEMM_CONFIGS``' by default)."""
    import torch

    from engine.fused.cublaslt import fp8_linear
    from engine.fused.int8 import GEMM_CONFIGS, column_scales, quantize_channels
    from engine.fused.kernels import gluon_gemm

    g = torch.Generator(device="cuda").manual_seed(0)
    dev = "cuda"

    def int8_operands(n: int, k: int) -> tuple[torch.Tensor, ...]:
        x8 = torch.randint(-90, 91, (tokens, k), generator=g, device=dev, dtype=torch.int8)
        w8, sw = quantize_channels(torch.randn((n, k), generator=g, device=dev) * 0.03)
        top, col = column_scales(sw)
        return x8, torch.full((1,), 0.02, device=dev), w8, top, col

    def e4m3_operands(n: int, k: int) -> tuple[torch.Tensor, ...]:
        x = torch.randn((tokens, k), generator=g, device=dev).to(torch.float8_e4m3fn)
        w = (torch.randn((n, k), generator=g, device=dev) * 8).to(torch.float8_e4m3fn)
        one = torch.ones((1,), device=dev)
        return x, one * 0.05, w, one * 0.004

    x8, xs, w8, top, col = int8_operands(F, D)
    b1 = (torch.randn(F, generator=g, device=dev) * 0.1).to(torch.bfloat16)
    h_out = torch.empty((tokens, F), device=dev, dtype=torch.float8_e4m3fn)
    h_inv = torch.full((1,), 40.0, device=dev)
    o8, os_, wo8, otop, ocol = int8_operands(D, D)
    o_out = torch.empty((tokens, D), device=dev, dtype=torch.float16)
    q_ops = e4m3_operands(3 * D, D)
    f2_ops = e4m3_operands(D, F)

    def ffn1(config: tuple[int, int, int, int] = GEMM_CONFIGS["ffn_in"]) -> object:
        return gluon_gemm.gemm(x8, xs, w8, top, h_out, bias=b1, col_scale=col,
                               out_scale=h_inv, gelu=1, config=config)

    def out_proj(config: tuple[int, int, int, int] = GEMM_CONFIGS["attn_out"]) -> object:
        return gluon_gemm.gemm(o8, os_, wo8, otop, o_out, col_scale=ocol, config=config)

    def qkv() -> object:
        return fp8_linear(*q_ops, torch.float16, fast_accum=True)

    def ffn2() -> object:
        return fp8_linear(*f2_ops, torch.float16, fast_accum=True)

    return [ffn1, out_proj, qkv, ffn2]


UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "hz": 1e-6, "khz": 1e-3, "mhz": 1.0, "ghz": 1e3,
         "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}  # -> µs, MHz, bytes


def _value(rec: dict[str, str], name: str) -> float:
    """A metric in µs, MHz or bytes (ncu's own unit converted), NaN where absent; a unit
    this table does not know raises rather than be read as another."""
    if name not in rec:
        return float("nan")
    unit = rec.get(name + " unit", "").lower()
    if unit not in UNITS:
        raise ValueError(f"{name}: unit {unit!r} is not one of {sorted(UNITS)}")
    return float(rec[name]) * UNITS[unit]


def summarize(path: Path, tokens: int) -> None:
    """The table of ``--summarize``: one row a profiled kernel, in launch order."""
    rows: dict[str, dict[str, str]] = {}
    with path.open(newline="") as fh:
        lines = [line for line in fh if line.startswith('"')]  # ncu's own lines first
    for rec in csv.DictReader(lines):
        key = f'{rec["ID"]}:{rec["Kernel Name"][:40]}'
        name, value = rec["Metric Name"], rec["Metric Value"].replace(",", "")
        rows.setdefault(key, {})[name] = value
        rows[key][name + " unit"] = rec.get("Metric Unit", "")
    if len(rows) != len(GEMMS):  # rows are named by launch order: one kernel a GEMM
        raise ValueError(f"{path}: {len(rows)} kernels profiled, {len(GEMMS)} launched")
    print("| kernel | GEMM | µs | MHz | " + " | ".join(PERCENTS.values())
          + " | T(FL)OP/s | L2 TB/s |")
    print("|" + "---|" * (len(PERCENTS) + 6))
    for (key, rec), (label, n, k) in zip(rows.items(), GEMMS, strict=True):
        us = _value(rec, "Duration")
        cells = " | ".join(rec.get(m, "?") for m in PERCENTS)
        print(f"| {key} | {label} | {us:.1f} | {_value(rec, 'SM Frequency'):.0f} | {cells} | "
              f"{2 * tokens * n * k / us / 1e6:,.0f} | "
              f"{_value(rec, 'lts__t_bytes.sum') / us / 1e6:.2f} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=47391)
    p.add_argument("--summarize", type=Path, default=None,
                   help="print the table of an ncu CSV written by this script's launches")
    args = p.parse_args(argv)
    if args.summarize is not None:
        summarize(args.summarize, args.tokens)
        return
    sys.path.insert(0, str(REPO))
    import torch

    calls = launches(args.tokens)
    for call in calls:  # compile, plan, warm
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("launched: " + ", ".join(label for label, _, _ in GEMMS), file=sys.stderr)


if __name__ == "__main__":
    main()
