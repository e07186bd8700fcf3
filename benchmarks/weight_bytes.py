# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""Does a batch-1 GEMM get faster with one-byte weights? Weight-only int8 / e4m3 against
fp16, in the small-batch path's own launch pattern.

At 128 tokens each BERT-base GEMM streams its weights from HBM (the model's 170 MB do not
fit in L2) while its math is a few hundred MFLOP. ``handoff.py`` measured a 768x768 GEMM
chain at ~3.1 µs per kernel with L2-resident weights; the engine's FFN1/FFN2 steps take
6.4-6.7 µs. If the weight stream is what is left, weights stored in one byte (per output
channel scale, converted to fp16 in registers after the load, activations untouched, so
the deferred LayerNorm's algebra still holds) would halve it.

Per shape of a BERT-base layer (QKV, attention output, FFN1, FFN2; the engine's tiles and
K splits, split GEMMs storing float32 partials), a chain of ``--steps`` kernels over as
many distinct weight copies (more bytes than the 50 MB L2 holds, except the attention
output's one-byte copies: 28 MB at 48 steps), each launched with
PDL and its L2 weight prefetch as the engine does, captured in one CUDA graph; µs per
kernel, median over interleaved rounds. Every dtype's first kernel is checked against a
float32 product of the dequantized weights.

    python -m benchmarks.weight_bytes --out benchmarks/gpu-weight-bytes.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from typing import Any

import triton
import triton.language as tl

from engine.fused.kernels.common import launch_options, pdl_enter
from engine.fused.kernels.matmul import check_k_split, grouped_tile, prefetch_slices

# weight dtypes; ``:indexed`` = the loop-index pointer form (:func:`_wq_gemm_kernel`);
# ``:wide`` = BLOCK_K doubled where the K slice holds it (the same bytes a stage at one
# byte an element); ``@BMxBNxBK/warps/stages`` = other tiles than the shape's (e.g.
# ``float16@64x64x64/4/8``). ``e4m3x`` is FP8 on both operands (activations too: one
# e4m3 tensor scale), multiplied as e4m3 by the tensor cores, not converted.
VARIANTS = ("float16", "float16:indexed", "int8", "e4m3", "e4m3:indexed")
# name: (K, N, splits, (BM, BN, BK, warps, stages)) -- the engine's small_batch_plan at 128
SHAPES: dict[str, tuple[int, int, int, tuple[int, ...]]] = {
    "qkv": (768, 2304, 1, (64, 64, 128, 4, 3)),
    "out": (768, 768, 4, (64, 64, 64, 4, 4)),
    "ffn1": (768, 3072, 1, (64, 64, 128, 4, 3)),
    "ffn2": (3072, 768, 4, (64, 64, 64, 4, 4)),
}


@triton.jit
def _wq_gemm_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, k_split,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    QUANT: tl.constexpr, PARTIAL: tl.constexpr, USE_PDL: tl.constexpr,
                    W_BYTES: tl.constexpr, INDEXED: tl.constexpr, CONVERT: tl.constexpr):
    """``x @ (w * s)^T`` for ``w`` [N, K] in fp16 or (QUANT) one byte with per-row scales
    ``s``: the engine's ``_gemm_kernel`` prologue (L2 weight prefetch, L1 scale prefetch,
    PDL wait) and K loop, the weight tile converted to fp16 after its load (``CONVERT``;
    without it both operands are e4m3 and ``s`` also holds the activation scale). ``INDEXED``
    takes each K step's pointers from the loop index instead of advancing carried pointer
    tensors (fewer 64-bit adds in the loop; v15 found the carried form costly in attention)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BM, BN, 8)
    k0 = split * k_split
    if USE_PDL:
        prefetch_slices(w_ptr, s_ptr, N, K, k0, k_split, pid_n, BN, QUANT, W_BYTES)
    pdl_enter(USE_PDL)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    rows = tl.minimum(offs_m, M - 1).to(tl.int64)
    cols = tl.minimum(offs_n, N - 1).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * K + k0 + offs_k[None, :]
    w_ptrs = w_ptr + cols[:, None] * K + k0 + offs_k[None, :]
    acc = tl.zeros((BM, BN), tl.float32)
    for kk in range(0, k_split, BK):
        if INDEXED:
            a = tl.load(x_ptrs + kk, cache_modifier=".cg")
            b = tl.load(w_ptrs + kk)
        else:
            a = tl.load(x_ptrs, cache_modifier=".cg")
            b = tl.load(w_ptrs)
            x_ptrs += BK
            w_ptrs += BK
        if CONVERT:
            b = b.to(tl.float16)
        acc = tl.dot(a, tl.trans(b), acc)
    nmask = offs_n < N
    if QUANT:
        acc *= tl.load(s_ptr + offs_n, mask=nmask, other=0.0)[None, :]
    omask = (offs_m < M)[:, None] & nmask[None, :]
    prow = offs_m.to(tl.int64)
    if PARTIAL:
        prow += split.to(tl.int64) * M
    o = out_ptr + prow[:, None] * N + offs_n[None, :]
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=omask)


def quantize(w: Any, dtype: str) -> tuple[Any, Any]:
    """(weight in ``dtype``, float32 per-row scale): symmetric per output channel."""
    import torch

    from engine.fused.fp8 import quantize_rows

    if dtype == "float16":
        return w.half().contiguous(), torch.ones(w.shape[0], device=w.device)
    if dtype == "e4m3":  # the engine's per-row e4m3 quantizer
        q = quantize_rows(w.float())
        return q.data.contiguous(), q.scale.reshape(-1).contiguous()
    scale = w.float().abs().amax(dim=1).clamp_min(1e-12) / 127.0
    return (w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


def gemm(x: Any, w: Any, s: Any, out: Any, splits: int, config: tuple[int, ...],
         pdl: bool = True, indexed: bool = False) -> None:
    """One launch of :func:`_wq_gemm_kernel` (``out`` [splits, M, N] float32 when split)."""
    m, k = x.shape
    n = w.shape[0]
    bm, bn, bk, warps, stages = config
    check_k_split(k, splits, bk)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), splits)
    _wq_gemm_kernel[grid](x, w, s, out, m, n, k, k // splits, BM=bm, BN=bn, BK=bk,
                          QUANT=w.element_size() == 1, PARTIAL=splits > 1, USE_PDL=pdl,
                          W_BYTES=w.element_size(), INDEXED=indexed,
                          CONVERT=w.dtype != x.dtype, num_warps=warps,
                          num_stages=stages, **launch_options(pdl))


def parse_config(text: str) -> tuple[int, ...]:
    """``"64x64x64/4/8"`` -> (64, 64, 64, 4, 8): tile, warps, stages."""
    tile, warps, stages = text.split("/")
    return (*(int(v) for v in tile.split("x")), int(warps), int(stages))


def chain(x: Any, ws: list[tuple[Any, Any]], dst: Any, splits: int,
          config: tuple[int, ...], indexed: bool) -> None:
    """One kernel per weight copy, each waiting for the one before (PDL)."""
    for w, s in ws:
        gemm(x, w, s, dst, splits, config, indexed=indexed)


def measure(tokens: int, steps: int, rounds: int, reps: int, shapes: list[str],
            variants: list[str]) -> dict[str, Any]:
    import torch

    from benchmarks.rounds import capture_graph, cuda_ms, interleaved

    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict[str, Any] = {}
    for name in shapes:
        k, n, splits, config = SHAPES[name]
        x = (torch.randn(tokens, k, device="cuda", generator=gen) * 0.5).half()
        dst = torch.empty((splits, tokens, n) if splits > 1 else (tokens, n), device="cuda",
                          dtype=torch.float32 if splits > 1 else torch.float16)
        runs, check = {}, {}
        for variant in variants:
            head, _, tiles = variant.partition("@")
            dtype, _, form = head.partition(":")
            indexed = form == "indexed"
            cfg = parse_config(tiles) if tiles else config
            if form == "wide" and (k // splits) % (2 * cfg[2]) == 0:
                cfg = (cfg[0], cfg[1], 2 * cfg[2], *cfg[3:])
            both = dtype == "e4m3x"
            xs = x.to(torch.float8_e4m3fn) if both else x
            ws = [quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.02,
                           "e4m3" if both else dtype) for _ in range(steps)]
            w0, s0 = ws[0]
            ref = xs.float() @ (w0.float() * s0[:, None]).t()
            gemm(xs, w0, s0, dst, splits, cfg, pdl=False, indexed=indexed)
            got = dst.float().sum(0) if splits > 1 else dst.float()
            check[variant] = float((got - ref).abs().max() / ref.abs().max())
            runs[variant] = capture_graph(
                functools.partial(chain, xs, ws, dst, splits, cfg, indexed), 1).replay
        times = interleaved(runs, rounds, reps, timer=cuda_ms)
        us = {d: statistics.median(t) * 1e3 / steps for d, t in times.items()}
        out[name] = {"k": k, "n": n, "splits": splits, "config": list(config),
                     "us_per_kernel": us, "rounds_ms": times, "max_rel_err": check}
        print(f"{name} K={k} N={n} /{splits}: " + " ".join(
            f"{d} {v:.2f} us" for d, v in us.items()) + f"  err={check}", flush=True)
        del runs
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=48, help="kernels (and weight copies) a chain")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--commit", default="")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    import torch

    res = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
           "commit": a.commit, "tokens": a.tokens, "steps": a.steps,
           "results": measure(a.tokens, a.steps, a.rounds, a.reps, a.shapes.split(","),
                              a.variants.split(","))}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
