"""INT8 against FP8 GEMMs at the SQuAD mix's size: can int8 run the engine's GEMMs as fast?

    python3 benchmarks/int8_gemm_speed.py --out speed.json [--tokens 47392]

The question behind ``int8_accuracy.py`` (NOTES v49): int8 operands may leave F1 room
that e4m3 does not. That is only a lever if int8 GEMMs with the engine's epilogues run as
fast as its FP8 ones. Hopper's tensor cores peak at the same rate for both; whether the
libraries reach it is what this measures, per BERT-large GEMM ([tokens, K] x [N, K]^T),
each timed by replaying a CUDA graph of 24 calls (idle GPU, burst clocks: a ratio between
forms, not a settled pass):

* ``fp16_mm``: ``torch.mm`` (cuBLAS), fp16 output;
* ``fp8_scaled_mm``: ``torch._scaled_mm`` with per-tensor scales, fp16 output (cuBLASLt);
* ``int8_int_mm``: ``torch._int_mm``, int32 output (cuBLASLt), and ``int8_int_mm_dequant``
  with the torch ops that turn it into the fp16 ``acc * s_row * s_col + bias`` the engine
  would need (what a library int8 GEMM costs when its epilogue runs as separate ops);
* ``triton_fp8`` / ``triton_int8``: one Triton kernel for both operand types, with that
  dequantizing epilogue fused (row scale, column scale, bias, fp16 store), each at its best
  of a few tile configurations: the like-for-like answer (same code, only the MMA type).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[1]
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
CONFIGS = ((128, 256, 128, 8, 8, 3), (128, 128, 128, 8, 8, 4), (128, 256, 64, 8, 8, 4),
           (256, 128, 128, 8, 8, 3), (128, 128, 128, 8, 4, 4))


@triton.jit
def scaled_gemm(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, INT8: tl.constexpr):
    """``c = (a @ b^T) * sa[:, None] * sb[None, :] + bias`` in fp16; ``a`` [M, K] and ``b``
    [N, K] row-major int8 (int32 accumulation) or e4m3 (float32); K a multiple of
    BLOCK_K, N of BLOCK_N."""
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = N // BLOCK_N
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_p = a_ptr + rm[:, None] * K + rk[None, :]
    b_p = b_ptr + rn[None, :] * K + rk[:, None]
    if INT8:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    m_ok = rm[:, None] < M
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_p, mask=m_ok)  # rows past M are never stored
        b = tl.load(b_p)
        if INT8:  # noqa: SIM108 (a Triton kernel: one dot per branch)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        else:
            acc = tl.dot(a, b, acc)
        a_p += BLOCK_K
        b_p += BLOCK_K
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    sb = tl.load(sb_ptr + rn)
    bias = tl.load(bias_ptr + rn).to(tl.float32)
    out = acc.to(tl.float32) * sa[:, None] * sb[None, :] + bias[None, :]
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], out.to(tl.float16), mask=m_ok)


def triton_gemm(a: Any, b: Any, sa: Any, sb: Any, bias: Any, cfg: tuple[int, ...],
                out: Any = None) -> Any:
    """:func:`scaled_gemm` with one of :data:`CONFIGS`."""
    import torch

    m, k = a.shape
    n = b.shape[0]
    bm, bn, bk, gm, warps, stages = cfg
    if k % bk or n % bn:
        raise ValueError(f"K {k} and N {n} must be multiples of {bk} and {bn}")
    c = out if out is not None else torch.empty((m, n), device=a.device, dtype=torch.float16)
    grid = (triton.cdiv(m, bm) * (n // bn),)
    scaled_gemm[grid](a, b, c, sa, sb, bias, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                      GROUP_M=gm, INT8=a.dtype == torch.int8, num_warps=warps,
                      num_stages=stages)
    return c


def operands(t: int, n: int, k: int, g: Any) -> dict[str, Any]:
    """Random activations and weights, and their int8 and e4m3 copies with their scales."""
    import torch

    x = torch.randn((t, k), generator=g, device="cuda").half()
    w = (torch.randn((n, k), generator=g, device="cuda") * 0.03).half()
    sx = x.float().abs().amax(1) / 127
    sw = w.float().abs().amax(1) / 127
    return {
        "x": x, "w": w, "bias": torch.randn(n, generator=g, device="cuda").half(),
        "x8": (x.float() / sx[:, None]).round().clamp(-127, 127).to(torch.int8),
        "w8": (w.float() / sw[:, None]).round().clamp(-127, 127).to(torch.int8),
        "sx": sx, "sw": sw,
        "xf8": (x.float() / (x.float().abs().amax() / 448)).to(torch.float8_e4m3fn),
        "wf8": (w.float() / (w.float().abs().amax() / 448)).to(torch.float8_e4m3fn),
        "one": torch.ones((), device="cuda"),
    }


def measure(name: str, n: int, k: int, t: int, g: Any, replays: int) -> dict[str, Any]:
    """Every form's µs for one GEMM shape, and the Triton forms' error against fp16."""
    import torch

    from benchmarks.attn_backends import _time_graph

    o = operands(t, n, k, g)
    ones_t, ones_n = torch.ones(t, device="cuda"), torch.ones(n, device="cuda")
    forms: dict[str, Any] = {
        "fp16_mm": lambda: torch.mm(o["x"], o["w"].t()),
        "fp8_scaled_mm": lambda: torch._scaled_mm(o["xf8"], o["wf8"].t(), scale_a=o["one"],
                                                  scale_b=o["one"], out_dtype=torch.float16),
        "int8_int_mm": lambda: torch._int_mm(o["x8"], o["w8"].t()),
        "int8_int_mm_dequant": lambda: torch.addcmul(
            o["bias"].float(), torch._int_mm(o["x8"], o["w8"].t()).float(),
            o["sx"][:, None] * o["sw"][None, :]).half(),
    }
    row: dict[str, Any] = {"gemm": name, "n": n, "k": k, "tokens": t}
    for form, fn in forms.items():
        try:
            row[f"{form}_us"] = _time_graph(fn, 24, replays)[0]
        except Exception as exc:  # a form this library lacks is recorded, not fatal
            row[f"{form}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    ref = torch.addmm(o["bias"].float(), o["x"].float(), o["w"].float().t())
    for kind, a, b, sa, sb in (("int8", o["x8"], o["w8"], o["sx"], o["sw"]),
                               ("fp8", o["xf8"], o["wf8"],
                                ones_t * (o["x"].float().abs().amax() / 448),
                                ones_n * (o["w"].float().abs().amax() / 448))):
        best = None
        for cfg in CONFIGS:
            try:
                out = torch.empty((t, n), device="cuda", dtype=torch.float16)
                us = _time_graph(lambda cfg=cfg, a=a, b=b, sa=sa, sb=sb, out=out: triton_gemm(
                    a, b, sa, sb, o["bias"], cfg, out), 24, replays)[0]
            except Exception as exc:
                row.setdefault(f"triton_{kind}_failed", []).append(
                    [list(cfg), f"{type(exc).__name__}: {exc}"[:200]])
                continue
            if best is None or us < best[0]:
                best = (us, cfg)
        if best is not None:
            got = triton_gemm(a, b, sa, sb, o["bias"], best[1]).float()
            row[f"triton_{kind}_us"], row[f"triton_{kind}_config"] = best[0], list(best[1])
            row[f"triton_{kind}_rel_err"] = float((got - ref).norm() / ref.norm())
    flops = 2.0 * t * n * k
    for key in [k_ for k_ in row if k_.endswith("_us")]:
        row[key.replace("_us", "_tflops")] = flops / row[key] / 1e6
    return row


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(REPO))
    import torch

    from benchmarks.gemm_cli import BERT_LARGE_GEMMS, header, parse_args

    args = parse_args(__doc__, 47392, argv)
    g = torch.Generator(device="cuda").manual_seed(0)
    result = {**header(args.tokens), "rows": []}
    for name, (n, k) in BERT_LARGE_GEMMS.items():
        row = measure(name, n, k, args.tokens, g, args.replays)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{'GEMM':6s}" + "".join(f"{f:>22s}" for f in (
        "fp16_mm", "fp8_scaled_mm", "int8_int_mm", "int8_int_mm_dequant", "triton_fp8",
        "triton_int8")) + "   (TFLOP/s)")
    for row in result["rows"]:
        print(f"{row['gemm']:6s}" + "".join(
            f"{row.get(f + '_tflops', float('nan')):22.0f}" for f in (
                "fp16_mm", "fp8_scaled_mm", "int8_int_mm", "int8_int_mm_dequant",
                "triton_fp8", "triton_int8")))


if __name__ == "__main__":
    main()
