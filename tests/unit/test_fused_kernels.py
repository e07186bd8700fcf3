"""The fused engine's Triton kernels, checked on the CPU through Triton's interpreter.

``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is *defined* (at import of
``engine.fused.kernels``), so the kernel checks run in child processes started with
``TRITON_INTERPRET=1``: nothing leaks into this pytest process or other tests. Each of N
children (one a core, at most two) runs every N-th check in :data:`CASES` and prints one JSON line
of results, each check's seconds on stderr; each check is reported as its own test here.
Run one child for them all with
``TRITON_INTERPRET=1 python tests/unit/test_fused_kernels.py --child`` (``--child I N``:
the I-th of N shards).

References are float64 torch computations on the same (already rounded) inputs, and
HF ``BertForQuestionAnswering`` in float32 for a whole tiny model. Known interpreter
limits (triton 3.9): ``tl.dot`` on bfloat16 returns garbage and float32->bfloat16 casts
truncate, so bfloat16 is checked on the row kernels only, within one bf16 ulp; the GPU
test suite checks bfloat16 end to end.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------ checks (child process)
# Each returns (error, tolerance); error is max |out - ref| / max(|ref|, 1) unless noted.
# Row kernels round once to the output dtype: half an ulp, plus bf16's truncating cast
# in the interpreter (a whole ulp).
_TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
# ``rows.LARGE_ROWS`` (8,192) as the row-kernel checks lower it: their large-batch tiles and
# the residual LayerNorm's loop on a few hundred rows, which the interpreter runs ~30x sooner
SMALL_LARGE_ROWS = 256


@contextlib.contextmanager
def _large_rows_lowered() -> Iterator[Any]:
    """``engine.fused.kernels.rows`` with ``LARGE_ROWS`` lowered to :data:`SMALL_LARGE_ROWS`;
    on exit its ``LARGE_ROWS``, ``ROW_LOOP`` and ``multiprocessors`` as they were (a check
    may set the other two inside)."""
    from engine.fused.kernels import rows

    saved = rows.LARGE_ROWS, rows.ROW_LOOP, rows.multiprocessors
    rows.LARGE_ROWS = SMALL_LARGE_ROWS
    try:
        yield rows
    finally:
        rows.LARGE_ROWS, rows.ROW_LOOP, rows.multiprocessors = saved


def _rel(out: object, ref: object) -> float:
    import torch

    assert isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor)
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.double() - ref.double()).abs().max() / max(float(ref.abs().max()), 1.0))


def _ln64(x: object, g: object, b: object, eps: float) -> object:
    import torch

    assert isinstance(x, torch.Tensor)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * g.double() + b.double()  # type: ignore[union-attr]


def _check_embed(dtype_name: str, fp8: bool) -> tuple[float, float]:
    import torch

    from engine.fused import kernels as k

    dt = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(1)
    t, d, vocab, npos = 45, 80, 50, 64  # d not a power of two: masked columns
    ids = torch.randint(0, vocab, (t,), generator=g, dtype=torch.int32)
    tt = torch.randint(0, 2, (t,), generator=g, dtype=torch.int32)
    pos = torch.randint(0, npos, (t,), generator=g, dtype=torch.int32)
    word, posemb, typ = (torch.randn(n, d, generator=g).to(dt) for n in (vocab, npos, 2))
    gamma, beta = torch.randn(d, generator=g), torch.randn(d, generator=g)
    out, q = k.embed_layernorm(ids, tt, pos, word, posemb, typ, gamma, beta, 1e-12, fp8=fp8)
    x = word.double()[ids.long()] + posemb.double()[pos.long()] + typ.double()[tt.long()]
    ref = _ln64(x, gamma, beta, 1e-12)
    tol = _TOL[dtype_name]
    if fp8:  # both outputs, each in units of its own tolerance
        return max(_rel(out, ref) / tol, _fp8_err(q, ref)), 1.0
    return _rel(out, ref), tol


def _fp8_err(q: object, ref: object) -> float:
    """Error of an e4m3 copy in units of its allowed error (pass: <= 1). Its scales are one
    per row, or with ``q.blocks`` one per row per 128 columns ([cols/128, rows rounded up
    to 4], M-major); each must be its tile's amax / 448.

    e4m3 keeps 3 mantissa bits: relative rounding error <= 2**-4, plus the subnormal step
    (2**-9 of the tile's scale) for tiny values.
    """
    import torch

    from engine.fused.fp8 import dequantize, padded_rows

    assert isinstance(ref, torch.Tensor)
    rows, cols = ref.shape
    if q.blocks:  # type: ignore[attr-defined]
        if q.scale.shape != (cols // 128, padded_rows(rows)):  # type: ignore[attr-defined]
            return math.inf
        scale = q.scale[:, :rows].t()  # type: ignore[attr-defined]
        expect = ref.view(rows, cols // 128, 128).abs().amax(2) / 448.0
        step = expect.repeat_interleave(128, dim=1) * 2.0**-9
    else:
        scale = q.scale  # type: ignore[attr-defined]
        expect = ref.abs().amax(1, keepdim=True) / 448.0
        step = expect * 2.0**-9
    if not torch.allclose(scale.double(), expect, rtol=1e-3, atol=1e-12):
        return math.inf
    allowed = ref.abs() * 2.0**-4 + step + 1e-9
    return float(((dequantize(q).double() - ref).abs() / allowed).max())  # type: ignore[arg-type]


def _check_fp8_blocks(kind: str) -> tuple[float, float]:
    """The row kernels' block-scaled e4m3 copies (``fp8_blocks``): rows not a multiple of
    4 (padded scale rows), width 384 in a 512-column tile (a masked block)."""
    import torch

    from engine.fused import kernels as k

    g = torch.Generator().manual_seed(11)
    t, d = 45, 384
    if kind == "embed":
        ids, pos = (torch.randint(0, 40, (t,), generator=g, dtype=torch.int32) for _ in "ip")
        tt = torch.randint(0, 2, (t,), generator=g, dtype=torch.int32)
        word, posemb, typ = (torch.randn(n, d, generator=g).half() for n in (40, 40, 2))
        gamma, beta = torch.randn(d, generator=g), torch.randn(d, generator=g)
        _, q = k.embed_layernorm(ids, tt, pos, word, posemb, typ, gamma, beta, 1e-12,
                                 fp8=True, fp8_blocks=True)
        x = word.double()[ids.long()] + posemb.double()[pos.long()] + typ.double()[tt.long()]
        ref = _ln64(x, gamma, beta, 1e-12)
    elif kind == "residual_ln":
        a, res = (torch.randn(t, d, generator=g).half() for _ in "ar")
        bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(3))
        gamma[:128] *= 20  # one block of each row much larger: the scales must differ
        _, q = k.bias_residual_layernorm(a, bias, res, gamma, beta, 1e-5, fp8=True,
                                         fp8_blocks=True)
        ref = _ln64(a.double() + bias.double() + res.double(), gamma, beta, 1e-5)
    else:
        h, bias = (torch.randn(t, d, generator=g) * 3).half(), torch.randn(d, generator=g)
        _, q = k.bias_gelu(h.clone(), bias, fp8=True, fp8_blocks=True)
        ref = _gelu64(h.double() + bias.double(), False)
    assert isinstance(ref, torch.Tensor)
    return _fp8_err(q, ref), 1.0


def _gelu64(x: object, tanh: bool) -> object:
    """Reference GELU in float64: exact erf form, or the tanh approximation."""
    import torch

    assert isinstance(x, torch.Tensor)
    if tanh:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _check_residual_ln(dtype_name: str, fp8: bool) -> tuple[float, float]:
    import torch

    from engine.fused import kernels as k

    dt = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(2)
    t, d = 33, 96
    a, res = torch.randn(t, d, generator=g).to(dt), torch.randn(t, d, generator=g).to(dt)
    bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(3))
    out, q = k.bias_residual_layernorm(a, bias, res, gamma, beta, 1e-5, fp8=fp8)
    ref = _ln64(a.double() + bias.double() + res.double(), gamma, beta, 1e-5)
    tol = _TOL[dtype_name]
    if fp8:
        return max(_rel(out, ref) / tol, _fp8_err(q, ref)), 1.0
    return _rel(out, ref), tol


def _check_splitk(dtype_name: str, loads: int = 0) -> tuple[float, float]:
    """Split-K partials sum to the product, and both consumers sum them. ``loads`` is the
    GEMM config's sixth entry (1: TMA boxes)."""
    import torch

    from engine.fused import kernels as k

    dt = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(6)
    m, n, kk = 70, 96, 256  # M and N not multiples of the 64 tile
    x, w = torch.randn(m, kk, generator=g).to(dt), torch.randn(n, kk, generator=g).to(dt)
    parts = k.linear(x, w, splits=4, config=(64, 64, 64, 4, 4, loads))
    ref = x.double() @ w.double().t()
    err = _rel(parts.sum(0), ref) / _TOL[dtype_name]
    bias, gamma, beta = (torch.randn(n, generator=g) for _ in range(3))
    res = torch.randn(m, n, generator=g).to(dt)
    y, _ = k.bias_residual_layernorm(parts, bias, res, gamma, beta, 1e-12)
    y_ref = _ln64(ref + bias.double() + res.double(), gamma, beta, 1e-12)
    err = max(err, _rel(y, y_ref) / _TOL[dtype_name])
    h, _ = k.bias_gelu(parts, bias, out_dtype=dt)
    xb = ref + bias.double()
    err = max(err, _rel(h, 0.5 * xb * (1 + torch.erf(xb / math.sqrt(2)))) / _TOL[dtype_name])
    return err, 1.0


def _sums64(v: object) -> object:
    import torch

    assert isinstance(v, torch.Tensor)
    v = v.double()
    return torch.stack([v.sum(1), (v * v).sum(1)], 1)


def _check_deferred(splits: int, early: bool = False, narrow: bool = False,
                    settled: bool = False) -> tuple[float, float]:
    """The deferred-LayerNorm kernels (``kernels.deferred``) against float64 LayerNorm-then-
    GEMM references, each error in units of its tolerance: the embeddings' sum with its
    row sums; the folded GEMM (GELU, and the buffer it zeroes); the residual GEMM stored
    whole and accumulated over ``splits`` K slices (atomics, tile counters, the copy and
    the row sums left by each tile's last program); the LayerNorm + QA head. ``early``:
    the GEMMs on 64-row tiles, their weight slices loaded whole (``early``), no K loop;
    ``narrow``: 64x16 tiles (an out-projection plan on ``wgmma`` tiles with as many
    programs as its 32x32 ones); ``settled``: the residual GEMMs build their addend before
    their wait (``residual_linear``'s ``settled``)."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.folding import fold_linear
    from engine.fused.kernels import deferred
    from engine.fused.weights import Linear
    from tests.launch_spy import launch_keywords

    g = torch.Generator().manual_seed(12)
    m, n, kk, eps = 45, 80, 192, 1e-5  # M, N not tile multiples; K = 3 x 64
    # early: 32-wide chunks, 6 of them in one K slice (2 in each of 3)
    tile = (64, 16, 32, 4, 2) if narrow else (64, 64, 32, 4, 2) if early else (32, 32, 64, 4, 2)
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    errs = []
    ids, tt, pos = (torch.randint(0, 20, (m,), generator=g, dtype=torch.int32) for _ in range(3))
    tables = [torch.randn(20, kk, generator=g).half() for _ in range(3)]
    z, z16, zs = torch.empty(m, kk), torch.empty(m, kk).half(), torch.empty(m, 2)
    k.embed_sum(ids, tt, pos, *tables, z, z16, zs)
    e = sum(t.double()[i.long()] for t, i in zip(tables, (ids, pos, tt), strict=True))
    errs += [_rel(z, e) / 1e-6, _rel(z16, e) / _TOL["float16"], _rel(zs, _sums64(e)) / 1e-6]
    with (launch_keywords(deferred, "_deferred_gemm_kernel", "EARLY") as launched,
          launch_keywords(deferred, "_deferred_gemm_kernel", "SETTLED") as built):
        x = (torch.randn(m, kk, generator=g) * 2 + 0.5).half()
        lin = Linear(torch.randn(n, kk, generator=g).half() * 0.1, torch.randn(n, generator=g))
        gamma, beta = torch.randn(kk, generator=g), torch.randn(kk, generator=g)
        f = fold_linear(lin, gamma, beta)
        zero = torch.full((3333,), math.nan)  # not a multiple of the zeroing block
        h = k.folded_linear(x, f.weight, f.colsum, f.bias, _sums64(x).float(), eps, act="gelu",
                            zero=zero, config=tile, early=early)
        ln = _ln64(x.double(), gamma, beta, eps)
        h_ref = _gelu64(ln @ lin.weight.double().t() + lin.bias.double(), False)
        errs += [_rel(h, h_ref) / _TOL["float16"], 0.0 if bool((zero == 0).all()) else math.inf]

        ctx = torch.randn(m, kk, generator=g).half()
        wo = torch.randn(n, kk, generator=g).half() * 0.1
        bo, g2, b2 = (torch.randn(n, generator=g) for _ in range(3))
        res = (torch.randn(m, n, generator=g) * 3 + 1).half()
        res_sums = _sums64(res).float()
        ref = ctx.double() @ wo.double().t() + bo.double() + _ln64(res.double(), g2, b2, eps)
        start = torch.randn(m, 2)
        acc = start.clone()
        y = k.residual_linear(ctx, wo, bo, res, res_sums, g2, b2, eps, acc, config=tile,
                              early=early, settled=settled)
        errs += [_rel(y, ref) / _TOL["float16"], _rel(acc, start.double() + _sums64(y)) / 1e-5]
        out, out16 = torch.zeros(m, n), torch.empty(m, n).half()
        counters = torch.zeros(tiles, dtype=torch.int32)  # e.g. 2 x 3 tiles of 32x32
        acc = start.clone()
        k.residual_linear(ctx, wo, bo, res, res_sums, g2, b2, eps, acc, out=out, out16=out16,
                          counters=counters, splits=splits, config=tile, early=early,
                          settled=settled)
        errs += [_rel(out, ref) / 1e-5, _rel(out16, ref) / _TOL["float16"],
                 _rel(acc, start.double() + _sums64(out)) / 1e-5,
                 0.0 if bool((counters == splits).all()) else math.inf]

        qa_w, qa_b = torch.randn(2, n, generator=g), torch.randn(2, generator=g)
        logits = k.layernorm_qa(out, g2, b2, eps, qa_w, qa_b)
        errs.append(_rel(logits, qa_w.double() @ _ln64(out.double(), g2, b2, eps).t()
                         + qa_b.double()[:, None]) / 1e-5)
    if launched != [early] * 3 or built != [False, settled, settled]:  # as asked for
        return math.inf, 1.0
    return max(errs), 1.0


def _with_tma(check: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """``check`` with early weight slices through TMA descriptors (``deferred.EARLY_TMA``);
    a failure unless every launch took that path."""
    from engine.fused.kernels import deferred
    from tests.launch_spy import launch_keywords

    with mock.patch.object(deferred, "EARLY_TMA", True), \
            launch_keywords(deferred, "_deferred_gemm_kernel", "W_TMA") as tma:
        result = check()
    return result if tma and all(tma) else (math.inf, 1.0)


_E4M3_STEP = 0.0625  # e4m3's relative rounding step (3 mantissa bits): at most half of it


def _check_deferred_fp8(splits: int, early: bool = False,
                        settled: bool = False) -> tuple[float, float]:
    """The deferred-LayerNorm kernels on e4m3 operands (``folding.DeferredFP8Layer``)
    against float64 math on the same e4m3 values, each error in units of its tolerance:
    the embeddings' e4m3 copy; the folded GEMM (FP8 product times its scale, LayerNorm
    algebra, GELU, e4m3 output); the out-projection's e4m3 copy of what it stores; FFN2's
    FP8 product accumulated over ``splits`` K slices with the last program's e4m3 copy.
    ``early`` and ``settled`` as for :func:`_check_deferred`."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.folding import fold_fp8, fold_linear
    from engine.fused.kernels import deferred
    from engine.fused.weights import Linear
    from tests.launch_spy import launch_keywords

    g = torch.Generator().manual_seed(21)
    m, n, kk, eps = 45, 80, 192, 1e-5
    # early: 32-wide chunks, 6 of them in one K slice (2 in each of 3)
    tile, tiles = ((64, 64, 32, 4, 2), 2) if early else ((32, 32, 64, 4, 2), 6)
    e8 = torch.float8_e4m3fn
    errs = []

    def deq(t: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
        return t.double() / inv.double()

    ids, tt, pos = (torch.randint(0, 20, (m,), generator=g, dtype=torch.int32) for _ in range(3))
    tables = [torch.randn(20, kk, generator=g).half() for _ in range(3)]
    z, z16, zs = torch.empty(m, kk), torch.empty(m, kk).half(), torch.empty(m, 2)
    z8, inv = torch.empty(m, kk, dtype=e8), torch.tensor([40.0])
    k.embed_sum(ids, tt, pos, *tables, z, z16, zs, z8=z8, inv8=inv)
    e = sum(t.double()[i.long()] for t, i in zip(tables, (ids, pos, tt), strict=True))
    errs.append(_rel(deq(z8, inv), e) / _E4M3_STEP)

    with (launch_keywords(deferred, "_deferred_gemm_kernel", "EARLY") as launched,
          launch_keywords(deferred, "_deferred_gemm_kernel", "SETTLED") as built):
        xs = torch.tensor([0.02])  # the input's scale: x = x8 * xs
        x8 = ((torch.randn(m, kk, generator=g) * 2 + 0.5) / xs).to(e8)
        xd = x8.double() * xs.double()
        lin = Linear(torch.randn(n, kk, generator=g).half() * 0.1, torch.randn(n, generator=g))
        gamma, beta = torch.randn(kk, generator=g), torch.randn(kk, generator=g)
        f16 = fold_linear(lin, gamma, beta)
        f8 = fold_fp8(f16, xs)
        w_scale = f8.scale.double() / xs.double()
        sums = _sums64(xd).float()
        mean, var = xd.mean(1, keepdim=True), xd.var(1, unbiased=False, keepdim=True)
        folded = ((xd - mean) / torch.sqrt(var + eps)) @ (f8.w8.double() * w_scale).t()
        h_ref = _gelu64(folded + f16.bias.double(), False)
        h_inv = torch.tensor([200.0 / float(h_ref.abs().max())])  # none saturates
        h8 = k.folded_linear(x8, f8.w8, f8.colsum, f16.bias, sums, eps,
                             act="gelu", config=tile, scale=f8.scale, out_inv=h_inv, early=early)
        q = k.folded_linear(x8, f8.w8, f8.colsum, None, sums, eps, config=tile, scale=f8.scale,
                            out_dtype=torch.float16, early=early)
        errs += [_rel(deq(h8, h_inv), h_ref) / _E4M3_STEP if h8.dtype == e8 else math.inf,
                 _rel(q, folded) / _TOL["float16"]]

        ctx = torch.randn(m, kk, generator=g).half()
        wo = torch.randn(n, kk, generator=g).half() * 0.1
        bo, g2, b2 = (torch.randn(n, generator=g) for _ in range(3))
        res = (torch.randn(m, n, generator=g) * 3 + 1).half()
        res_sums = _sums64(res).float()
        y8 = torch.empty(m, n, dtype=e8)
        y = k.residual_linear(ctx, wo, bo, res, res_sums, g2, b2, eps, torch.zeros(m, 2),
                              config=tile, out8=y8, inv8=inv, early=early, settled=settled)
        errs.append(_rel(deq(y8, inv), y.double()) / _E4M3_STEP)

        x2 = (torch.randn(m, kk, generator=g) * 30).to(e8)  # h in e4m3, scale 1 / 30
        w2 = (torch.randn(n, kk, generator=g) * 100).to(e8)
        s2 = torch.tensor([1e-3])
        ref = ((x2.double() @ w2.double().t()) * s2.double() + bo.double()
               + _ln64(res.double(), g2, b2, eps))
        out, out16 = torch.zeros(m, n), torch.empty(m, n).half()
        out8 = torch.empty(m, n, dtype=e8)
        counters = torch.zeros(tiles, dtype=torch.int32)
        z_inv = torch.tensor([200.0 / float(ref.abs().max())])
        k.residual_linear(x2, w2, bo, res, res_sums, g2, b2, eps, torch.zeros(m, 2), out=out,
                          out16=out16, counters=counters, splits=splits, config=tile, scale=s2,
                          out8=out8, inv8=z_inv, early=early, settled=settled)
        errs += [_rel(out, ref) / 1e-5, _rel(deq(out8, z_inv), ref) / _E4M3_STEP]
    if launched != [early] * 4 or built != [False, False, settled, settled]:  # as asked
        return math.inf, 1.0
    return max(errs), 1.0


def _check_residual_ln_qa() -> tuple[float, float]:
    import torch

    from engine.fused import kernels as k

    g = torch.Generator().manual_seed(3)
    t, d = 29, 64
    a, res = torch.randn(t, d, generator=g), torch.randn(t, d, generator=g)
    bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(3))
    qa_w, qa_b = torch.randn(2, d, generator=g), torch.randn(2, generator=g)
    logits = k.bias_residual_layernorm_qa(a, bias, res, gamma, beta, 1e-12, qa_w, qa_b)
    y = _ln64(a.double() + bias.double() + res.double(), gamma, beta, 1e-12)
    ref = qa_w.double() @ y.t() + qa_b.double()[:, None]  # type: ignore[union-attr]
    return _rel(logits, ref), 1e-5


def _check_gelu(dtype_name: str, tanh: bool, fp8: bool) -> tuple[float, float]:
    import torch

    from engine.fused import kernels as k

    dt = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(4)
    t, f = 21, 1500  # f spans two 1024-column blocks, the second partial
    h, bias = (torch.randn(t, f, generator=g) * 3).to(dt), torch.randn(f, generator=g)
    x = h.double() + bias.double()
    ref = _gelu64(x, tanh)
    out, q = k.bias_gelu(h.clone(), bias, fp8=fp8, tanh=tanh)
    if fp8:
        return _fp8_err(q, ref), 1.0
    return _rel(out, ref), _TOL[dtype_name]


def _check_gelu_range() -> tuple[float, float]:
    """The erf GELU's rational-exponential erfc over its whole range, in float32: near 0,
    through the tails where one side goes to x and the other to 0, out to +-inf (no
    NaN from 1/inf or exp2(-inf)). Error: max |out - ref| over max(|x| / 2, 1), against
    A&S 7.1.26's 1.5e-7 in erf plus float32 rounding."""
    import torch

    from engine.fused import kernels as k

    x = torch.cat([torch.linspace(-12, 12, 4001), torch.tensor([-1e30, 1e30, 1e-30, 0.0])])
    h = x.view(1, -1).float()
    out, _ = k.bias_gelu(h.clone(), torch.zeros(h.shape[1]))
    ref = _gelu64(x.double(), False)
    inf = torch.tensor([float("inf"), float("-inf")])
    out_inf, _ = k.bias_gelu(inf.view(1, 2).clone(), torch.zeros(2))
    if out_inf[0, 0] != float("inf") or not torch.isnan(out_inf[0, 1]):  # as erf's 0.5x(1-1)
        return math.inf, 1.0
    err = ((out[0].double() - ref).abs() / (x.double().abs() / 2).clamp(min=1)).max()
    return float(err), 4e-7


def _check_gemm_gelu(dtype_name: str, tanh: bool, loads: int = 0) -> tuple[float, float]:
    """FFN1 GEMM + bias + GELU in one kernel; M and N off the tile grid (clamped loads, or
    the zero fill of TMA boxes with ``loads=1``)."""
    import torch

    from engine.fused import kernels as k

    dt = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(9)
    m, n, kk = 70, 100, 128
    x, w = torch.randn(m, kk, generator=g).to(dt), (torch.randn(n, kk, generator=g) * 0.2).to(dt)
    bias = torch.randn(n, generator=g).to(dt)
    act = "gelu_tanh" if tanh else "gelu"
    out = k.linear(x, w, bias, act=act, config=(32, 64, 64, 4, 2, loads))
    xb = x.double() @ w.double().t() + bias.double()
    ref = _gelu64(xb, tanh)
    return _rel(out, ref), _TOL[dtype_name]


def _check_linear_plain(dtype_name: str, with_bias: bool, loads: int = 0) -> tuple[float, float]:
    """``linear`` with the plain epilogue (the small-batch QKV GEMM), one BLOCK_M=128 tile."""
    import torch

    from engine.fused import kernels as k

    dt = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(10)
    m, n, kk = 100, 72, 192
    x, w = torch.randn(m, kk, generator=g).to(dt), (torch.randn(n, kk, generator=g) * 0.2).to(dt)
    bias = torch.randn(n, generator=g).to(dt) if with_bias else None
    out = k.linear(x, w, bias, config=(128, 64, 64, 4, 3, loads))
    ref = x.double() @ w.double().t()
    if bias is not None:
        ref = ref + bias.double()
    return _rel(out, ref), _TOL[dtype_name]


def _attention64(qkv: Any, bias: Any, cu: Any, heads: int, head_dim: int) -> Any:
    """Packed attention in float64 (QKV plus its bias; each sequence of ``cu`` alone)."""
    import torch

    t, d = qkv.shape[0], heads * head_dim
    x = (qkv.double() + bias.double()).view(t, 3, heads, head_dim)
    ref = torch.empty(t, d, dtype=torch.float64)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        q, kk, v = (x[a:b, i].transpose(0, 1) for i in range(3))
        p = torch.softmax(q @ kk.transpose(1, 2) / math.sqrt(head_dim), -1)
        ref[a:b] = (p @ v).transpose(0, 1).reshape(b - a, d)
    return ref


def _check_attention(dtype_name: str, heads: int, head_dim: int,
                     large_tile: bool = False, fp8: bool = False,
                     tiled: bool = False, split: bool = False) -> tuple[float, float]:
    """Attention against float64 math. ``fp8``: the output in e4m3 with one given
    (calibrated) scale, chosen so that the largest values saturate: it must equal the
    clamped reference within e4m3 rounding (relative 2**-4, subnormal step 2**-9 of the
    scale) plus the fp16 inputs' error, as the torch spec's copy must. ``tiled``: over
    the batch's tile list (``attention_tiles``), which must also give the grid's output
    bit for bit. ``split``: the key loop split into unmasked full blocks and a masked
    tail (the default), with the tail's loads after the loop or before it
    (``early_tail``), which must give the masked loop's output bit for bit (grid or tile
    list, fp16 or e4m3); without it the engine's default loop is checked."""
    import torch

    from engine.fused import kernels as k
    from engine.fused import torch_ops
    from engine.fused.fp8 import FP8_DTYPE

    dt = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(5)
    lengths = [70, 1, 17, 64, 5]  # > one 64-key block, a single token, block-exact
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    t, d = int(cu[-1]), heads * head_dim
    qkv = (torch.randn(t, 3 * d, generator=g) * 0.5).to(dt)
    bias = torch.randn(3 * d, generator=g) * 0.5
    # Over-stated grid (more sequences, longer max) as CUDA graphs use: extra seqs are empty.
    cu_pad = torch.cat([cu, cu[-1:].repeat(3)])
    config = k.ATTN_LARGE if large_tile else k.ATTN_SMALL
    ref = _attention64(qkv, bias, cu, heads, head_dim)
    if fp8:
        scale = torch.tensor([float(ref.abs().max()) * 0.7 / 448.0])  # the top 30% saturate
        clamped = ref.clamp(-448.0 * float(scale), 448.0 * float(scale))
        allowed = clamped.abs() * 2.0**-4 + float(scale) * 2.0**-9 + 5e-3 * float(ref.abs().max())
        worst = 0.0
        for ops in (k, torch_ops):
            q8 = ops.attention_varlen(qkv, bias, cu_pad, 128, len(lengths) + 3, heads,
                                      config=config, fp8_scale=scale)
            if q8.dtype != FP8_DTYPE:
                return math.inf, 1.0
            worst = max(worst, float(((q8.double() * float(scale) - clamped).abs()
                                      / allowed).max()))
        if split:  # every loop form writes the same bytes (the early tail's too)
            forms = [k.attention_varlen(qkv, bias, cu_pad, 128, len(lengths) + 3, heads,
                                        config=config, fp8_scale=scale, split=f,
                                        early_tail=e).view(torch.uint8)
                     for f, e in ((False, False), (True, False), (True, True))]
            if not (torch.equal(forms[0], forms[1]) and torch.equal(forms[0], forms[2])):
                return math.inf, 1.0
        return worst, 1.0
    # The masked loop first (the split one is the default): the reference for ``split``.
    out = k.attention_varlen(qkv, bias, cu_pad, 128, len(lengths) + 3, heads, config=config,
                             split=False if split else None)
    if tiled:
        tiles = k.attention_tiles(cu_pad, t, len(lengths) + 3, 128, heads, head_dim,
                                  config=config, force=True)
        assert tiles is not None
        grid_out = out
        # Freed NaNs of the output's size: a fresh output (torch.empty) likely reuses them,
        # so rows the tile list misses show, not stale copies of the grid's results.
        del out
        for _ in range(4):
            torch.full_like(grid_out, float("nan"))
        out = k.attention_varlen(qkv, bias, cu_pad, 128, len(lengths) + 3, heads,
                                 config=config, tiles=tiles, split=False if split else None)
        if not torch.equal(out, grid_out):
            return math.inf, 1.0
    if split:  # the partial last key block loaded after the loop, then before it
        masked = out
        for early in (False, True):
            out = k.attention_varlen(qkv, bias, cu_pad, 128, len(lengths) + 3, heads,
                                     config=config, tiles=tiles if tiled else None, split=True,
                                     early_tail=early)
            if not torch.equal(out, masked):
                return math.inf, 1.0
    return _rel(out, ref), {"float32": 1e-5, "float16": 5e-3}[dtype_name]


def _check_attention_tiles() -> tuple[float, float]:
    """The tile list holds each sequence's query blocks in order, (start, length, first
    query), then empty slots (all zero) up to ceil(T / BLOCK_M) + sequences; it is
    built only where it saves a quarter of the grid's programs; a list built for other
    tiles is refused."""
    import torch

    from engine.fused import kernels as k

    lengths = [70, 1, 0, 128, 17, 64, 5, 0, 0]  # empty sequences inside and at the end
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    t, n = int(cu[-1]) + 7, len(lengths)  # rows past the last sequence, as buckets have
    tiles = k.attention_tiles(cu, t, n, 384, 2, 64, config=(64, 32, 4, 3))
    assert tiles is not None and tiles.block_m == 64
    want = [(int(cu[s]), ln, m) for s, ln in enumerate(lengths) for m in range(0, ln, 64)]
    got = tiles.slots.tolist()
    slots = -(-t // 64) + n
    bad = len(got) != slots or [tuple(r) for r in got[:len(want)]] != want
    bad |= any(r != [0, 0, 0] for r in got[len(want):])
    # A sequence longer than max_seqlen (against the contract) is cut as the grid cuts it,
    # and rows past the buffer are never listed: no slot is left unwritten.
    over = torch.tensor([0, 200, 210, 220], dtype=torch.int32)
    short = k.attention_tiles(over, 220, 3, 64, 2, 64, config=(64, 32, 4, 3), force=True)
    assert short is not None
    bad |= short.slots.tolist() != [[0, 200, 0], [200, 10, 0], [210, 10, 0],
                                     [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]
    beyond = k.attention_tiles(over, 64, 3, 256, 2, 64, config=(64, 32, 4, 3), force=True)
    assert beyond is not None  # 1 + 3 slots for 220 tokens in 64 rows: the first 4 blocks
    bad |= beyond.slots.tolist() != [[0, 200, 0], [0, 200, 64], [0, 200, 128], [0, 200, 192]]
    # Batch 1, or sequences as long as max_seqlen: no list.
    bad |= k.attention_tiles(cu[:2], 70, 1, 128, 2, 64) is not None
    full = torch.arange(0, 5 * 384, 384, dtype=torch.int32)
    bad |= k.attention_tiles(full, 4 * 384, 4, 384, 2, 64) is not None
    qkv = torch.zeros((t, 3 * 128), dtype=torch.float16)
    try:
        k.attention_varlen(qkv, torch.zeros(384), cu, 384, n, 2, config=(32, 32, 4, 3),
                           tiles=tiles)
        bad = True
    except ValueError:
        pass
    return float(bad), 0.5


def _check_attention_padded_grid() -> tuple[float, float]:
    """A grid sized for a longer ``max_seqlen`` than the batch's (more query blocks a
    sequence, as ``attention_grid`` asks for) launches the blocks and gives the fewest
    grid's output bit for bit, fp16 and e4m3, in every sequence's rows (rows past them
    belong to no sequence: neither grid writes them). Returns the number of failures."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.kernels import attention as attn
    from tests.launch_spy import launch_grids

    g = torch.Generator().manual_seed(6)
    heads, head_dim, lengths = 2, 64, [70, 1, 17]
    cu = torch.tensor([0, *np.cumsum(lengths).tolist(), sum(lengths)], dtype=torch.int32)
    t, d, n = sum(lengths) + 5, heads * head_dim, len(lengths) + 1  # an empty sequence too
    qkv = (torch.randn(t, 3 * d, generator=g) * 0.5).to(torch.float16)
    bias = torch.randn(3 * d, generator=g) * 0.5
    rows = slice(0, sum(lengths))
    bad = 0
    for scale in (None, torch.tensor([0.01])):
        base = k.attention_varlen(qkv, bias, cu, 70, n, heads, fp8_scale=scale,
                                  config=k.ATTN_SMALL)
        for max_seqlen, blocks in ((192, 3), (256, 4), (448, 7)):
            with launch_grids(attn, "_attn_varlen_kernel") as grids:
                out = k.attention_varlen(qkv, bias, cu, max_seqlen, n, heads, fp8_scale=scale,
                                         config=k.ATTN_SMALL)
            bad += grids != [(blocks, n, heads)] or not torch.equal(
                out[rows].view(torch.uint8), base[rows].view(torch.uint8))
    return float(bad), 0.5


def _check_attention_early_tail_choice() -> tuple[float, float]:
    """By default the split loop requests its partial last key block early
    (``EARLY_TAIL``) unless the launch caps registers; the masked loop never does, and an
    explicit choice wins on the split loop, capped or not. Each launch's choice is recorded; returns the
    number of wrong choices."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.kernels import attention as attn
    from tests.launch_spy import launch_keywords

    heads, lengths = 2, [70, 5]
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    qkv = torch.randn(sum(lengths), 3 * heads * 64).to(torch.float16)
    bias = torch.zeros(3 * heads * 64)
    original = attn.register_cap
    uncapped, capped = (lambda programs, warps: None), (lambda programs, warps: 128)
    cases = [  # (split, early_tail, register_cap, expected EARLY_TAIL)
        (None, None, uncapped, attn.ATTN_SPLIT_LOOP and attn.ATTN_EARLY_TAIL),
        (True, None, capped, False),
        (True, True, uncapped, True), (True, False, uncapped, False),
        (True, True, capped, True), (True, False, capped, False),
        (False, True, uncapped, False), (False, None, uncapped, False),
    ]
    bad = 0
    for split, early, cap, expected in cases:
        attn.register_cap = cap
        try:
            with launch_keywords(attn, "_attn_varlen_kernel", "EARLY_TAIL") as seen:
                k.attention_varlen(qkv, bias, cu, 70, 2, heads, config=k.ATTN_SMALL,
                                   split=split, early_tail=early)
        finally:
            attn.register_cap = original
        bad += seen != [expected]
    return float(bad), 0.5


def _check_stage_inputs() -> tuple[float, float]:
    """One launch fills a graph's input buffer as the torch spec's five ops do: the batch's
    tokens, its cu_seqlens, the unused entries set to the token count, the rest kept.
    Returns the number of differing or wrong entries (tolerance 0)."""
    import torch

    from engine.fused import kernels as k
    from engine.fused import torch_ops

    n, seqs, t = 40, 6, 29
    g = torch.Generator().manual_seed(11)
    before = torch.randint(0, 99, (3 * n + seqs + 1,), generator=g, dtype=torch.int32)
    ids, tt, pos = (torch.randint(0, 99, (t,), generator=g, dtype=torch.int32) for _ in range(3))
    cu = torch.tensor([0, 10, t], dtype=torch.int32)
    ours, spec = before.clone(), before.clone()
    k.stage_inputs(ours, n, ids, tt, pos, cu)
    torch_ops.stage_inputs(spec, n, ids, tt, pos, cu)
    want = before.clone()
    for i, src in enumerate((ids, tt, pos)):
        want[i * n: i * n + t] = src
    want[3 * n:] = torch.tensor([0, 10, t, t, t, t, t], dtype=torch.int32)
    return float((ours != want).sum() + (spec != want).sum()), 0.0


def _check_packed_positions() -> tuple[float, float]:
    """Positions from offsets, the kernel's binary search and the torch spec's
    ``searchsorted``, against a per-sequence ``arange``: one sequence, empty sequences
    (first, inside, last), several kernel blocks, over a thousand sequences (eleven search
    steps), tokens past the last offset (the last sequence's count goes on), positions
    past the table (kept at its last row) and no sequence at all (zeros, not whatever the
    memory held). Returns the number of wrong entries (tolerance 0)."""
    import torch

    from engine.fused import kernels as k
    from engine.fused import torch_ops

    rng = np.random.default_rng(5)
    cases = [[7], [0, 3, 0, 0, 5, 0], [1] * 9, [1500, 700], rng.integers(0, 9, 1100).tolist()]
    bad = 0
    for lengths in cases:
        cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
        for extra, longest in ((0, 4096), (3, 4096), (3, 512)):
            t = int(cu[-1]) + extra
            want = np.concatenate([np.arange(n) for n in lengths] + [np.arange(extra) + lengths[-1]])
            want = np.minimum(want, longest - 1)
            for ops in (k, torch_ops):
                got = ops.packed_positions(cu, t, longest)
                bad += got.dtype != torch.int32 or got.shape != (t,)
                bad += int((got.numpy() != want).sum())
    for ops in (k, torch_ops):
        got = ops.packed_positions(torch.zeros(1, dtype=torch.int32), 5, 512)
        bad += int((got.numpy() != 0).sum()) + (got.shape != (5,))
    return float(bad), 0.0


def _check_staging_embeddings(kind: str, cu_block: int) -> tuple[float, float]:
    """The embeddings kernels as a graph's first kernel, with the leading arguments a call
    sets (``STAGE_ARGS``): the caller's T < n tokens read where it holds them, rows from T
    on as token 0, and cu_seqlens copied into the graph's buffer (entries past the batch's
    B sequences repeat its end; ``cu_block`` 4: over several loop steps). The same kernel
    on the batch padded with token 0 must give the same rows bit for bit. Returns the
    number of wrong entries (tolerance 0)."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.kernels import deferred, rows

    n, d, seqs, t = 24, 32, 6, 19
    g = torch.Generator().manual_seed(12)
    word, position, types = (torch.randn((m, d), generator=g).half() for m in (50, 32, 2))
    gamma, beta = torch.rand(d, generator=g) + 0.5, torch.randn(d, generator=g)
    ids = torch.randint(1, 50, (t,), generator=g, dtype=torch.int32)
    tt = torch.randint(0, 2, (t,), generator=g, dtype=torch.int32)
    pos = torch.randint(0, 32, (t,), generator=g, dtype=torch.int32)
    cu = torch.tensor([0, 7, t], dtype=torch.int32)
    buf = torch.full((3 * n + seqs + 1,), 5, dtype=torch.int32)  # what a graph holds
    b_ids, b_tt, b_pos, b_cu = buf[:n], buf[n:2 * n], buf[2 * n:3 * n], buf[3 * n:]

    def call(*_: object) -> tuple[tuple[object, ...], tuple[torch.Tensor, int]]:
        return (ids, tt, pos, cu, t, 2), (b_cu, seqs + 1)  # as a call sets them

    def run(src: tuple[torch.Tensor, ...], staged: bool) -> list[torch.Tensor]:
        stage = b_cu if staged else None
        if kind == "sum":
            z, stats = torch.zeros((n, d)), torch.zeros((n, 2))
            z16 = torch.zeros((n, d), dtype=torch.float16)
            k.embed_sum(*src, word, position, types, z, z16, stats, stage=stage)
            return [z, z16, stats]
        return [k.embed_layernorm(*src, word, position, types, gamma, beta, 1e-12,
                                  stage=stage)[0]]

    saved = rows.staging_args, deferred.staging_args, rows._CU_BLOCK, deferred._CU_BLOCK
    rows.staging_args = deferred.staging_args = call  # type: ignore[assignment]
    rows._CU_BLOCK = deferred._CU_BLOCK = cu_block
    try:
        got = run((b_ids, b_tt, b_pos), True)
    finally:
        rows.staging_args, deferred.staging_args, rows._CU_BLOCK, deferred._CU_BLOCK = saved
    pad = torch.zeros(n - t, dtype=torch.int32)
    want = run(tuple(torch.cat([x, pad]) for x in (ids, tt, pos)), False)
    wrong = sum(int((a != b).sum()) for a, b in zip(got, want, strict=True))
    wrong += int((b_cu != torch.tensor([0, 7, t, t, t, t, t], dtype=torch.int32)).sum())
    wrong += int((buf[:3 * n] != 5).sum())  # the token sections are not written
    return float(wrong), 0.0


def _tiny_bert(seed: int = 0, hidden: int = 64) -> tuple[object, object]:
    """A random 2-layer, 4-head HF BERT-QA (LayerNorms and biases perturbed)."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    from engine.fused.config import BertQAConfig

    torch.manual_seed(seed)
    hf = BertConfig(vocab_size=120, hidden_size=hidden, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=2 * hidden,
                    max_position_embeddings=64)
    model = BertForQuestionAnswering(hf).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model, BertQAConfig.from_dict(hf.to_dict())


def _random_batch(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w, s = 5, 48
    lengths = np.array([48, 9, 30, 1, 20])
    ids = rng.integers(1, 120, (w, s)).astype(np.int32)
    mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
    mask[4] = mask[4][::-1]  # one left-padded row: positions must stay column indices
    tt = ((np.arange(s)[None, :] >= 6) & (mask == 1)).astype(np.int32)
    return ids, mask, tt


def _check_fp8_static() -> tuple[float, float]:
    """The residual LayerNorm's e4m3 copy with one given (calibrated) scale, chosen so
    that the largest values saturate: it must equal the clamped reference within e4m3
    rounding, and hand the given scale back."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.fp8 import dequantize

    g = torch.Generator().manual_seed(12)
    t, d = 45, 80
    a, res = (torch.randn(t, d, generator=g).half() for _ in "ar")
    bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(3))
    ref = _ln64(a.double() + bias.double() + res.double(), gamma, beta, 1e-5)
    assert isinstance(ref, torch.Tensor)
    scale = torch.tensor([float(ref.abs().max()) * 0.7 / 448.0])  # the top 30% saturate
    _, q = k.bias_residual_layernorm(a, bias, res, gamma, beta, 1e-5, fp8=True,
                                     fp8_scale=scale)
    if q is None or q.scale is not scale or q.blocks:
        return math.inf, 1.0
    clamped = ref.clamp(-448.0 * float(scale), 448.0 * float(scale))
    allowed = clamped.abs() * 2.0**-4 + float(scale) * 2.0**-9 + 1e-9
    return float(((dequantize(q).double() - clamped).abs() / allowed).max()), 1.0


def _check_layernorm_quant(mode: str) -> tuple[float, float]:
    """``layernorm_quant``: the e4m3 copy of LayerNorm(s + bias) in each scale mode (per
    row, 1x128 blocks, one calibrated scale that saturates the top 30%), and the rows'
    moments, whose normalization of ``s + bias`` must give the same LayerNorm (what the
    next residual LayerNorm computes as it reads ``s``). 45 rows of 384 (a masked 512
    tile)."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.fp8 import dequantize

    g = torch.Generator().manual_seed(13)
    t, d, eps = 45, 384, 1e-5
    s = (torch.randn(t, d, generator=g) * 4 + torch.randn(t, 1, generator=g) * 3).half()
    bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(3))
    gamma[:128] *= 20  # one block of each row much larger: block scales must differ
    x = s.double() + bias.double()
    ref = _ln64(x, gamma, beta, eps)
    assert isinstance(ref, torch.Tensor)
    mean = x.mean(1)
    rstd = 1 / torch.sqrt(((x - mean[:, None]) ** 2).mean(1) + eps)
    scale = torch.tensor([float(ref.abs().max()) * 0.7 / 448.0])
    q, moments = k.layernorm_quant(s, bias, gamma, beta, eps, fp8_blocks=mode == "blocks",
                                   fp8_scale=scale if mode == "static" else None)
    if moments.shape != (t, 2) or moments.dtype != torch.float32:
        return math.inf, 1.0
    err = max(_rel(moments[:, 0], mean), _rel(moments[:, 1], rstd)) / 1e-5
    again = (x - moments[:, :1].double()) * moments[:, 1:].double() * gamma.double() + beta
    err = max(err, _rel(again, ref) / 1e-5)
    if mode != "static":
        return max(err, _fp8_err(q, ref)), 1.0
    if q.scale is not scale or q.blocks:
        return math.inf, 1.0
    clamped = ref.clamp(-448.0 * float(scale), 448.0 * float(scale))
    allowed = clamped.abs() * 2.0**-4 + float(scale) * 2.0**-9 + 1e-9
    return max(err, float(((dequantize(q).double() - clamped).abs() / allowed).max())), 1.0


def _int8_err(q: object, ref: object, mult: object) -> float:
    """Error of an int8 copy of ``ref`` with column multipliers ``mult``, in units of half a
    step (pass: <= 1, plus a float32 rounding's slack): each element ``round(ref * mult)``
    saturating at +-127."""
    import torch

    assert isinstance(q, torch.Tensor) and isinstance(ref, torch.Tensor)
    if q.dtype != torch.int8:
        return math.inf
    want = (ref.double() * mult.double()).clamp(-127, 127)  # type: ignore[union-attr]
    return float((q.double() - want).abs().max()) / (0.5 + 1e-3)


def _check_int8_copy(kind: str) -> tuple[float, float]:
    """The int8 copies ahead of the int8 GEMMs (``engine.fused.int8``): ``round(y * mult)``
    with one multiplier a column, saturating at +-127, from the residual LayerNorm (one
    program a tile, and ``ROW_LOOP`` over stand-in multiprocessors: the same bytes) and
    from attention (each loop form the same bytes), the kernels and the torch spec within
    half a step of float64 math; the torch spec's attention copy is the kernel's
    reference."""
    import torch

    from engine.fused import kernels as k
    from engine.fused import torch_ops
    from engine.fused.kernels import rows
    from tests.launch_spy import launch_keywords

    g = torch.Generator().manual_seed(21)
    if kind == "layernorm":
        n, d = SMALL_LARGE_ROWS + 10, 96
        a = torch.randn(n, d, generator=g).half()
        res = torch.randn(n, d, generator=g).half()
        bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(3))
        ref = _ln64(a.double() + bias.double() + res.double(), gamma, beta, 1e-5)
        mult = torch.rand(d, generator=g) * 60 + 5  # the largest values saturate
        worst = 0.0
        copies = []
        for loop in (None, rows.ROW_LOOP):
            with _large_rows_lowered(), \
                    launch_keywords(rows, "_residual_ln_kernel", "LOOP") as looped:
                rows.ROW_LOOP = loop
                rows.multiprocessors = lambda device: 3  # type: ignore[assignment]
                _, q = k.bias_residual_layernorm(a, bias, res, gamma, beta, 1e-5,
                                                 int8_mult=mult)
            if looped != [loop is not None]:  # each form as it says (the default: the loop)
                return math.inf, 1.0
            assert q is not None and q.scale is mult
            copies.append(q.data)
            worst = max(worst, _int8_err(q.data, ref, mult))
        _, qt = torch_ops.bias_residual_layernorm(a, bias, res, gamma, beta, 1e-5,
                                                  int8_mult=mult)
        assert qt is not None
        worst = max(worst, _int8_err(qt.data, ref, mult))
        return (math.inf if not torch.equal(copies[0], copies[1]) else worst), 1.0
    heads, head_dim, lengths = 2, 64, [37, 1, 90]
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    t, d = int(cu[-1]), heads * head_dim
    qkv = (torch.randn(t, 3 * d, generator=g) * 0.5).half()
    bias = torch.randn(3 * d, generator=g) * 0.5
    ref = _attention64(qkv, bias, cu, heads, head_dim)
    mult = torch.rand(d, generator=g) * 150 / float(ref.abs().max()) + 20
    forms = [k.attention_varlen(qkv, bias, cu, 128, len(lengths), heads, int8_mult=mult,
                                split=f, early_tail=e)
             for f, e in ((False, False), (True, False), (True, True))]
    spec = torch_ops.attention_varlen(qkv, bias, cu, 128, len(lengths), heads, int8_mult=mult)
    # within half a step of float64 math, plus attention's float32 error (~1e-3 of a step
    # at these multipliers): a truncating copy would be up to a whole step off (2 here)
    worst = max(_int8_err(q, ref, mult) for q in (*forms, spec))
    same = all(torch.equal(forms[0], f) for f in forms[1:])
    return (worst if same else math.inf), 1.02


def _check_row_loop(loop: tuple[int, int, int]) -> tuple[float, float]:
    """``rows.ROW_LOOP`` (the default's form): the residual LayerNorm (and its QA form) as
    a few programs each looping over tiles gives the one-program-a-tile kernel's outputs
    exactly; 266 rows over the large-batch threshold lowered to :data:`SMALL_LARGE_ROWS`
    (the last tile partial where tiles have more than one row) over 3 stand-in
    multiprocessors, and off CUDA (no multiprocessors) a program a tile. The launches are
    checked to be the forms each run names."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.kernels import rows
    from tests.launch_spy import launch_keywords

    g = torch.Generator().manual_seed(16)
    n, d = SMALL_LARGE_ROWS + 10, 96
    a, res = (torch.randn(n, d, generator=g).half() for _ in "ar")
    bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(3))
    qa_w, qa_b = torch.randn(2, d, generator=g), torch.randn(2, generator=g)
    scale = torch.tensor([0.02])

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, q = k.bias_residual_layernorm(a, bias, res, gamma, beta, 1e-5, fp8=True,
                                           fp8_scale=scale)
        assert q is not None
        logits = k.bias_residual_layernorm_qa(a, bias, res, gamma, beta, 1e-5, qa_w, qa_b)
        return out, q.data.view(torch.uint8), logits

    with _large_rows_lowered(), launch_keywords(rows, "_residual_ln_kernel", "LOOP") as forms:
        rows.ROW_LOOP = None
        plain = run()
        rows.ROW_LOOP = loop
        off_cuda = run()  # no multiprocessors to count: a program a tile
        rows.multiprocessors = lambda device: 3  # type: ignore[assignment]
        looped = run()
    if forms != [False] * 4 + [True] * 2:  # two launches a run, only the last run looped
        return math.inf, 0.0
    return float(sum(not torch.equal(x, y) for x, y in zip(plain * 2, off_cuda + looped,
                                                              strict=True))), 0.0


def _check_sum_residual(qa: bool) -> tuple[float, float]:
    """The residual LayerNorm (and its QA-head form) with a ``SumResidual``: the residual
    is ``LayerNorm1(s + bias1)``, normalized with the moments as ``s`` is read; against
    the float64 spec on the same rounded inputs. 33 rows of 96 (a masked 128 tile)."""
    import torch

    from engine.fused import kernels as k
    from engine.fused.residual import SumResidual

    g = torch.Generator().manual_seed(14)
    t, d, eps = 33, 96, 1e-5
    a, s = (torch.randn(t, d, generator=g).half() for _ in "as")
    s = (s.float() * 5 + 2).half()
    b1, g1, be1, bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(6))
    _, moments = k.layernorm_quant(s, b1, g1, be1, eps)
    res = SumResidual(s, moments, b1, g1, be1)
    x1 = _ln64(s.double() + b1.double(), g1, be1, eps)
    assert isinstance(x1, torch.Tensor)
    ref = _ln64(a.double() + bias.double() + x1, gamma, beta, eps)
    assert isinstance(ref, torch.Tensor)
    if qa:
        qa_w, qa_b = torch.randn(2, d, generator=g), torch.randn(2, generator=g)
        logits = k.bias_residual_layernorm_qa(a, bias, res, gamma, beta, eps, qa_w, qa_b)
        return _rel(logits, qa_w.double() @ ref.t() + qa_b.double()[:, None]), 1e-5
    out, q = k.bias_residual_layernorm(a, bias, res, gamma, beta, eps, fp8=True)
    if out.dtype != torch.float16:
        return math.inf, 1.0
    return max(_rel(out, ref) / _TOL["float16"], _fp8_err(q, ref)), 1.0


def _check_tiny_bert(dtype: str, small_batch: bool = True, splits: int | None = None,
                     deferred_ln: bool = True, fp8_scaling: str = "rows",
                     calibrate: bool = False, static: tuple[str, ...] | None = None,
                     fp8_deferred: bool = False,
                     sum_residual: bool = False, int8: str | None = None,
                     ) -> tuple[float, float]:
    """The whole engine vs HF fp32. fp16 batches this small take the small-batch path
    (all-Triton GEMMs; ``splits`` imposes split-K on the attention-output and FFN2 GEMMs,
    FFN2 alone when ``deferred_ln``, which runs it without LayerNorm kernels) unless
    ``small_batch`` is off (cuBLAS-path code: torch.mm + epilogue kernels).
    ``fp8_scaling="blocks"`` needs widths in multiples of 128: hidden 128 then.
    ``calibrate``: calibrated per-tensor scales, from another batch, for the engine's
    default GEMMs or those named in ``static`` (all four: attention writing e4m3).
    ``fp8_deferred``: calibrated, the batch on the deferred small-batch layer with e4m3
    operands (and its logits must differ from the 16-bit deferred layer's: FP8 ran).
    ``sum_residual``: ``encoder.OUT_PROJ_ADDS_RESIDUAL`` on (off otherwise): calibrated,
    every layer's first LayerNorm must be ``layernorm_quant``. ``int8``: calibrated, those
    GEMMs (``int8_gemms``) in int8 with the kernels' int8 copies (their logits must differ
    from the e4m3 default's, and be the torch op set's within float rounding)."""
    import torch

    from engine.fused.engine import PAD_LOGIT, FusedEngine

    model, cfg = _tiny_bert(hidden=128 if fp8_scaling == "blocks" else 64)
    plans = None
    if splits is not None:
        tiles = (64, 32, 32, 4, 2)
        plans = {"out": (tiles, splits), "ffn2": (tiles, splits), "qkv": (tiles, 1),
                 "ffn1": (tiles, 1)}
    fp8_from = 1 << 30 if fp8_deferred else 0  # the deferred path takes every batch
    engine = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu",  # type: ignore[attr-defined]
                                         dtype=dtype, fp8_scaling=fp8_scaling,
                                         backend="triton", fp8_min_tokens=fp8_from,
                                         small_batch_max_tokens=512 if small_batch else None,
                                         gemm_plans=plans,
                                         deferred_ln_max_hidden=1024 if deferred_ln else None,
                                         fp8_calibrated_min_tokens=fp8_from,
                                         fp8_deferred=fp8_deferred, int8_gemms=int8,
                                         **({} if static is None
                                            else {"fp8_static_inputs": static}))
    assert engine.backend == "triton"
    if calibrate:
        engine.calibrate(*_random_batch(3))
        if engine.weights.calibrated is None:
            return math.inf, 0.0
    ids, mask, tt = _random_batch(7)
    from engine.fused import encoder
    from engine.fused.kernels import rows
    from tests.launch_spy import launch_grids

    adds, encoder.OUT_PROJ_ADDS_RESIDUAL = encoder.OUT_PROJ_ADDS_RESIDUAL, sum_residual
    try:
        with launch_grids(rows, "_layernorm_quant_kernel") as quant:
            start, end = engine.infer(ids, mask, tt)
        if int8:
            e4m3 = FusedEngine(engine.weights, "cpu", backend="triton",
                               fp8_min_tokens=fp8_from, fp8_calibrated_min_tokens=fp8_from,
                               small_batch_max_tokens=512)
            spec = FusedEngine(engine.weights, "cpu", backend="torch", fp8_min_tokens=fp8_from,
                               fp8_calibrated_min_tokens=fp8_from, small_batch_max_tokens=512,
                               int8_gemms=int8)
            spec.load_calibration(engine.calibration)  # type: ignore[arg-type]
            by_spec, by_e4m3 = spec.infer(ids, mask, tt)[0], e4m3.infer(ids, mask, tt)[0]
            if (engine.weights.int8 is None or np.array_equal(by_e4m3, start)
                    or np.abs(by_spec - start).max() > 1e-3 * max(np.abs(start).max(), 1.0)):
                return math.inf, 0.0
    finally:
        encoder.OUT_PROJ_ADDS_RESIDUAL = adds
    if len(quant) != (cfg.num_layers if sum_residual and calibrate else 0):
        return math.inf, 0.0
    if fp8_deferred:
        plain = FusedEngine(engine.weights, "cpu", backend="triton", fp8_min_tokens=fp8_from,
                            fp8_calibrated_min_tokens=fp8_from, small_batch_max_tokens=512,
                            fp8_deferred=False)
        if engine.weights.folded8 is None or np.array_equal(plain.infer(ids, mask, tt)[0],
                                                            start):
            return math.inf, 0.0
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids).long(),  # type: ignore[operator]
                    attention_mask=torch.from_numpy(mask).long(),
                    token_type_ids=torch.from_numpy(tt).long())
    keep = mask.astype(bool)
    if not ((start[~keep] == PAD_LOGIT).all() and (end[~keep] == PAD_LOGIT).all()):
        return math.inf, 0.0
    err = max(
        _rel(torch.from_numpy(start[keep]), ref.start_logits[torch.from_numpy(keep)]),
        _rel(torch.from_numpy(end[keep]), ref.end_logits[torch.from_numpy(keep)]),
    )
    return err, {"float32": 1e-4, "float16": 1e-2, "fp8": 6e-2}[dtype]


def _check_persistent(programs: int, through_engine: bool = False) -> tuple[float, float]:
    """The persistent kernel, one launch per phase (the interpreter runs programs one
    after another, so the grid barrier is compiled out), against HF fp32. ``programs``
    below the task counts exercises the grid-stride loops; 16 allows split-K."""
    import torch

    from engine.fused.engine import FusedEngine
    from engine.fused.kernels.persistent import encode_persistent
    from engine.fused.packing import pack_padded

    model, cfg = _tiny_bert(2, hidden=128)  # the kernel's GEMM tiles need 128-multiples
    engine = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu",  # type: ignore[attr-defined]
                                         dtype="float16", backend="triton", persistent=True)
    ids, mask, tt = _random_batch(11)
    keep = mask.astype(bool)
    if through_engine:
        start, end = (torch.from_numpy(a[keep]) for a in engine.infer(ids, mask, tt))
    else:
        p = pack_padded(ids, mask, tt)
        logits = encode_persistent(
            engine.weights, *(torch.from_numpy(a) for a in (p.input_ids, p.token_type_ids,
                                                              p.position_ids, p.cu_seqlens)),
            p.seqs, p.max_seqlen, programs=programs)
        # pack order is row-major over real tokens, as mask[keep] is
        start, end = logits[0], logits[1]
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids).long(),  # type: ignore[operator]
                    attention_mask=torch.from_numpy(mask).long(),
                    token_type_ids=torch.from_numpy(tt).long())
    k = torch.from_numpy(keep)
    return max(_rel(start, ref.start_logits[k]), _rel(end, ref.end_logits[k])), 1e-2


def _check_packed_entry_points() -> tuple[float, float]:
    """``infer_packed`` and ``infer_torch`` give what ``infer`` gives."""
    import torch

    from engine.fused.engine import FusedEngine

    model, cfg = _tiny_bert(1)
    engine = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu",  # type: ignore[attr-defined]
                                         dtype="float32", backend="triton")
    ids, mask, tt = _random_batch(8)
    mask[4] = mask[4][::-1]  # right padding again: infer_packed restarts positions at 0
    start, end = engine.infer(ids, mask, tt)
    keep = mask.astype(bool)
    lengths = keep.sum(1)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    ps, pe = engine.infer_packed(torch.from_numpy(ids[keep]), torch.from_numpy(tt[keep]), cu,
                                 int(lengths.max()))
    # Positions given (int64 here: converted), and given as int32 (used as they are).
    pos = torch.from_numpy(np.concatenate([np.arange(n) for n in lengths]))
    given = [engine.infer_packed(torch.from_numpy(ids[keep]).int(), torch.from_numpy(tt[keep]),
                                 cu, int(lengths.max()), position_ids=p)
             for p in (pos, pos.int())]
    try:
        engine.infer_packed(torch.from_numpy(ids[keep]), torch.from_numpy(tt[keep]), cu,
                            int(lengths.max()), position_ids=pos[:-1])
        raise AssertionError("position_ids of another length were accepted")
    except ValueError as exc:
        assert "position_ids has shape" in str(exc)
    ts, te = engine.infer_torch(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(tt))
    # One sequence: its positions are a view of the engine's kept arange (no kernel).
    row = keep[2]
    one_cu = torch.tensor([0, int(row.sum())], dtype=torch.int32)
    one = engine.infer_packed(torch.from_numpy(ids[2][row]), torch.from_numpy(tt[2][row]),
                              one_cu, int(row.sum()))
    kept = engine._positions(one_cu, int(row.sum()))
    assert engine._counting is not None and kept.data_ptr() == engine._counting.data_ptr()
    assert torch.equal(kept, torch.arange(int(row.sum()), dtype=torch.int32))
    errs = [
        _rel(one[0], torch.from_numpy(start[2][row])), _rel(one[1], torch.from_numpy(end[2][row])),
        _rel(ps, torch.from_numpy(start[keep])), _rel(pe, torch.from_numpy(end[keep])),
        _rel(ts, torch.from_numpy(start)), _rel(te, torch.from_numpy(end)),
        *(_rel(g, torch.from_numpy(w[keep])) for gs in given for g, w in zip(gs, (start, end),
                                                                              strict=True)),
    ]
    return max(errs), 1e-6


CASES: dict[str, Callable[[], tuple[float, float]]] = {
    "embed_ln_fp32": lambda: _check_embed("float32", False),
    "embed_ln_fp16": lambda: _check_embed("float16", False),
    "embed_ln_bf16": lambda: _check_embed("bfloat16", False),
    "embed_ln_fp16_fp8": lambda: _check_embed("float16", True),
    "residual_ln_fp32": lambda: _check_residual_ln("float32", False),
    "residual_ln_fp16_fp8": lambda: _check_residual_ln("float16", True),
    "residual_ln_bf16": lambda: _check_residual_ln("bfloat16", False),
    "residual_ln_qa_head": _check_residual_ln_qa,
    "gelu_erf_fp32": lambda: _check_gelu("float32", False, False),
    "gelu_erf_range": _check_gelu_range,
    "embed_ln_fp8_blocks": lambda: _check_fp8_blocks("embed"),
    "residual_ln_fp8_blocks": lambda: _check_fp8_blocks("residual_ln"),
    "gelu_erf_fp8_blocks": lambda: _check_fp8_blocks("gelu"),
    "residual_ln_fp8_static": _check_fp8_static,
    "residual_ln_int8_copy": lambda: _check_int8_copy("layernorm"),
    "attention_int8_copy": lambda: _check_int8_copy("attention"),
    "layernorm_quant_rows": lambda: _check_layernorm_quant("rows"),
    "layernorm_quant_blocks": lambda: _check_layernorm_quant("blocks"),
    "layernorm_quant_static": lambda: _check_layernorm_quant("static"),
    "gelu_erf_fp16": lambda: _check_gelu("float16", False, False),
    "gelu_tanh_fp32": lambda: _check_gelu("float32", True, False),
    "gelu_erf_fp8": lambda: _check_gelu("float16", False, True),
    "attention_fp32_hd16": lambda: _check_attention("float32", 4, 16),
    "attention_fp16_hd64": lambda: _check_attention("float16", 2, 64),
    "attention_fp16_hd24": lambda: _check_attention("float16", 3, 24),  # padded head dim
    "attention_fp16_large_tile": lambda: _check_attention("float16", 2, 64, large_tile=True),
    "attention_fp16_e4m3_static": lambda: _check_attention("float16", 2, 64, fp8=True),
    "attention_fp16_tile_list": lambda: _check_attention("float16", 2, 64, large_tile=True,
                                                         tiled=True),
    "attention_fp32_hd16_tile_list": lambda: _check_attention("float32", 4, 16, tiled=True),
    "attention_fp16_hd64_split_loop": lambda: _check_attention("float16", 2, 64, split=True),
    "attention_fp16_hd24_split_loop": lambda: _check_attention("float16", 3, 24, split=True),
    "attention_fp16_large_tile_split_loop": lambda: _check_attention(
        "float16", 2, 64, large_tile=True, split=True),
    "attention_fp16_tile_list_split_loop": lambda: _check_attention(
        "float16", 2, 64, tiled=True, split=True),
    "attention_fp16_e4m3_split_loop": lambda: _check_attention("float16", 2, 64, fp8=True,
                                                               split=True),
    "attention_tile_list_contents": _check_attention_tiles,
    "attention_padded_grid": _check_attention_padded_grid,
    "attention_early_tail_choice": _check_attention_early_tail_choice,
    "gemm_gelu_erf_fp16": lambda: _check_gemm_gelu("float16", False),
    "gemm_gelu_tanh_fp16": lambda: _check_gemm_gelu("float16", True),
    "gemm_gelu_erf_fp32": lambda: _check_gemm_gelu("float32", False),
    "linear_fp16_bias": lambda: _check_linear_plain("float16", True),
    "linear_fp32_no_bias": lambda: _check_linear_plain("float32", False),
    "splitk_gemm_fp32": lambda: _check_splitk("float32"),
    "splitk_gemm_fp16": lambda: _check_splitk("float16"),
    "gemm_gelu_erf_fp16_tma": lambda: _check_gemm_gelu("float16", False, loads=1),
    "linear_fp16_bias_tma": lambda: _check_linear_plain("float16", True, loads=1),
    "splitk_gemm_fp16_tma": lambda: _check_splitk("float16", loads=1),
    "deferred_ln_kernels": lambda: _check_deferred(1),
    "deferred_ln_kernels_3_splits": lambda: _check_deferred(3),
    "deferred_ln_kernels_fp8": lambda: _check_deferred_fp8(1),
    "deferred_ln_kernels_fp8_3_splits": lambda: _check_deferred_fp8(3),
    "deferred_ln_kernels_early_weights": lambda: _check_deferred(1, early=True),
    "deferred_ln_kernels_early_weights_3_splits": lambda: _check_deferred(3, early=True),
    "deferred_ln_kernels_early_weights_64x16": lambda: _check_deferred(1, early=True,
                                                                       narrow=True),
    "deferred_ln_kernels_early_weights_tma": lambda: _with_tma(
        lambda: _check_deferred(1, early=True)),
    "deferred_ln_kernels_early_weights_3_splits_tma": lambda: _with_tma(
        lambda: _check_deferred(3, early=True)),
    "deferred_ln_kernels_early_weights_64x16_tma": lambda: _with_tma(
        lambda: _check_deferred(1, early=True, narrow=True)),
    "deferred_ln_kernels_fp8_early_weights_tma": lambda: _with_tma(
        lambda: _check_deferred_fp8(1, early=True)),
    "deferred_ln_kernels_fp8_early_weights_3_splits_tma": lambda: _with_tma(
        lambda: _check_deferred_fp8(3, early=True)),
    "deferred_ln_kernels_fp8_early_weights": lambda: _check_deferred_fp8(1, early=True),
    "deferred_ln_kernels_fp8_early_weights_3_splits": lambda: _check_deferred_fp8(3, early=True),
    "deferred_ln_kernels_settled_3_splits": lambda: _check_deferred(3, settled=True),
    "deferred_ln_kernels_fp8_settled_3_splits": lambda: _check_deferred_fp8(3, settled=True),
    "deferred_ln_kernels_fp8_early_weights_settled_3_splits": lambda: _check_deferred_fp8(
        3, early=True, settled=True),
    "tiny_bert_fp32": lambda: _check_tiny_bert("float32"),
    "tiny_bert_fp16": lambda: _check_tiny_bert("float16"),
    "tiny_bert_fp16_splitk_2": lambda: _check_tiny_bert("float16", splits=2),
    "tiny_bert_fp16_seven_kernels": lambda: _check_tiny_bert("float16", deferred_ln=False),
    "tiny_bert_fp16_seven_kernels_splitk_2": lambda: _check_tiny_bert(
        "float16", splits=2, deferred_ln=False),
    "tiny_bert_fp16_large_path": lambda: _check_tiny_bert("float16", small_batch=False),
    "tiny_bert_fp8": lambda: _check_tiny_bert("fp8"),
    "tiny_bert_fp8_blocks": lambda: _check_tiny_bert("fp8", fp8_scaling="blocks"),
    "tiny_bert_fp8_calibrated": lambda: _check_tiny_bert("fp8", calibrate=True),  # default
    "tiny_bert_fp8_calibrated_sum_residual": lambda: _check_tiny_bert(
        "fp8", calibrate=True, sum_residual=True),
    "tiny_bert_int8_out_ffn1": lambda: _check_tiny_bert(
        "fp8", calibrate=True, int8="attn_out,ffn_in"),
    "tiny_bert_int8_sum_residual": lambda: _check_tiny_bert(
        "fp8", calibrate=True, int8="attn_out,ffn_in", sum_residual=True),
    "residual_ln_row_loop_4x8": lambda: _check_row_loop((4, 4, 8)),
    "residual_ln_row_loop_1x4": lambda: _check_row_loop((3, 1, 4)),
    "sum_residual_ln": lambda: _check_sum_residual(False),
    "sum_residual_ln_qa_head": lambda: _check_sum_residual(True),
    "tiny_bert_fp8_deferred": lambda: _check_tiny_bert("fp8", calibrate=True,
                                                       fp8_deferred=True),
    "tiny_bert_fp8_calibrated_all": lambda: _check_tiny_bert(
        "fp8", calibrate=True, static=("qkv", "attn_out", "ffn_in", "ffn_out")),
    # FFN1 static without its epilogue, then bias + GELU with per-row scales; and the
    # other way round: bias + GELU writing e4m3 with FFN2's calibrated scale.
    "tiny_bert_fp8_calibrated_ffn_in": lambda: _check_tiny_bert(
        "fp8", calibrate=True, static=("qkv", "attn_out", "ffn_in")),
    "tiny_bert_fp8_calibrated_ffn_out": lambda: _check_tiny_bert(
        "fp8", calibrate=True, static=("ffn_out",)),
    "packed_entry_points": _check_packed_entry_points,
    "stage_inputs": _check_stage_inputs,
    "packed_positions": _check_packed_positions,
    "staging_embed_sum": lambda: _check_staging_embeddings("sum", 1024),
    "staging_embed_layernorm": lambda: _check_staging_embeddings("layernorm", 4),
    "persistent_fp16_16_programs": lambda: _check_persistent(16),
    "persistent_fp16_3_programs": lambda: _check_persistent(3),
    "persistent_fp16_engine": lambda: _check_persistent(4, through_engine=True),
}


def _child_main(shard: int = 0, shards: int = 1) -> None:
    """Runs every ``shards``-th check of :data:`CASES` from the ``shard``-th, each one's
    seconds on stderr. Each starts from the same global torch seed, so its inputs do not
    depend on which checks ran before it in its shard."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    assert 0 <= shard < shards, f"--child I N: shard {shard} of {shards}"
    sys.path.insert(0, str(REPO))
    import torch

    results = {}
    for name, check in list(CASES.items())[shard::shards]:
        torch.manual_seed(0)
        start = time.perf_counter()
        try:
            err, tol = check()
            results[name] = {"ok": bool(err <= tol), "error": err, "tolerance": tol}
        except Exception as exc:  # report, keep checking the rest
            results[name] = {"ok": False, "error": None, "exception": repr(exc)}
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    print(json.dumps(results))


# ------------------------------------------------------------------ tests (pytest process)


@pytest.fixture(scope="module")
def interpreter_results() -> dict[str, dict[str, object]]:
    pytest.importorskip("triton")
    pytest.importorskip("transformers")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    # one child a core (at most 2: CI's machine), each every n-th check, side by side
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    shards = max(1, min(2, cores))
    deadline = time.monotonic() + 600
    results: dict[str, dict[str, object]] = {}
    counts = 0
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        children = []
        for i in range(shards):
            out, err = (stack.enter_context(Path(tmp, f"{i}.{kind}").open("w+"))
                        for kind in ("out", "err"))
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--child", str(i), str(shards)],
                env=env, cwd=REPO, stdout=out, stderr=err, text=True)
            stack.callback(proc.wait)  # none outlives the fixture, whatever it raises
            stack.callback(proc.kill)
            children.append((proc, out, err))
        for i, (proc, out, err) in enumerate(children):
            what = f"interpreter child --child {i} {shards}"
            try:
                code: int | str = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = "timed out after 600 s"
            out.seek(0)
            err.seek(0)
            lines = out.read().strip().splitlines()
            if code != 0 or not lines:
                pytest.fail(f"{what} failed ({code}); its stderr ends:\n{err.read()[-4000:]}")
            shard = json.loads(lines[-1])
            counts += len(shard)
            results.update(shard)
    assert set(results) == set(CASES) and counts == len(CASES), \
        "the shards lost or repeated checks"
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_under_triton_interpreter(
    case: str, interpreter_results: dict[str, dict[str, object]]
) -> None:
    result = interpreter_results[case]
    assert result["ok"], result


def test_deferred_gemms_refuse_tma_tiles() -> None:
    """The deferred-LayerNorm GEMMs have pointer loads only: a TMA config is an error, not
    a silently different kernel."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from engine.fused import kernels as k

    x, w = torch.zeros(8, 64, dtype=torch.float16), torch.zeros(64, 64, dtype=torch.float16)
    u, stats = torch.zeros(64), torch.zeros(8, 2)
    with pytest.raises(ValueError, match="pointer-load tiles only"):
        k.folded_linear(x, w, u, None, stats, 1e-12, config=(32, 32, 64, 4, 2, 1))


def test_gemm_config_sixth_entry_picks_the_loads() -> None:
    """A GEMM config is 5 entries (pointer loads) or 6 (the last one LOADS_*); others fail.
    K must cut into the splits' slices of whole K tiles (``check_k_split``)."""
    pytest.importorskip("triton")
    from engine.fused.kernels import matmul as mm

    assert mm.unpack_config((64, 64, 64, 4, 4))[5] == mm.LOADS_POINTER
    assert mm.unpack_config((64, 64, 64, 4, 4, 1))[5] == mm.LOADS_TMA
    for bad in [(64, 64, 64, 4), (64, 64, 64, 4, 4, 2), (64, 64, 64, 4, 4, 1, 0)]:
        with pytest.raises(ValueError, match="bad GEMM config"):
            mm.unpack_config(bad)
    mm.check_k_split(768, 4, 64)  # 4 slices of 3 tiles
    for k, splits, bk in [(768, 4, 128), (768, 5, 64), (700, 1, 64)]:
        with pytest.raises(ValueError, match=f"K={k} does not split into {splits}"):
            mm.check_k_split(k, splits, bk)


@pytest.mark.parametrize(("m", "n", "k", "partial"), [
    (128, 768, 768, True), (128, 768, 3072, True), (384, 1024, 4096, True),
    (384, 3072, 1024, False), (1, 768, 3072, True), (512, 1024, 1024, True), (100, 96, 192, True),
])
def test_small_batch_plan_splits_evenly_and_fills_the_gpu(m: int, n: int, k: int,
                                                          partial: bool) -> None:
    """Plans are pure Python (no kernel): K splits into whole tiles, splits only where the
    consumer sums partials, a GEMM of under half a wave of tiles is split, and splitting
    never makes more than two waves of programs."""
    pytest.importorskip("triton")
    from engine.fused.kernels.matmul import small_batch_plan

    (bm, bn, bk, _warps, _stages), splits = small_batch_plan(m, n, k, partial)
    assert k % (splits * bk) == 0
    assert partial or splits == 1
    tiles = -(-m // bm) * -(-n // bn)
    assert splits == 1 or tiles * splits <= 2 * 132
    if partial and tiles < 66 and k % (2 * bk) == 0:
        assert splits > 1


def test_packing_round_trip_and_positions() -> None:
    from engine.fused.packing import pack_padded

    ids = np.arange(12, dtype=np.int32).reshape(3, 4) + 1
    mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1]], dtype=np.int32)
    p = pack_padded(ids, mask, np.zeros_like(ids))
    assert p.input_ids.tolist() == [1, 2, 3, 10, 11, 12]
    assert p.cu_seqlens.tolist() == [0, 3, 3, 6]
    assert p.position_ids.tolist() == [0, 1, 2, 1, 2, 3]  # HF position = column index
    assert p.max_seqlen == 3 and p.seqs == 3 and p.tokens == 6


def test_packing_keeps_the_tokens_places_and_casts() -> None:
    """``keep`` marks where each packed token came from (row-major, what ``infer``
    unpacks into), any int dtype packs to int32, and an empty batch packs to nothing."""
    from engine.fused.packing import pack_padded

    ids = np.arange(12, dtype=np.int64).reshape(3, 4) + 1
    mask = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=np.int8)
    p = pack_padded(ids, mask, ids % 2)
    assert p.keep.tolist() == (mask != 0).tolist()
    assert p.input_ids.dtype == p.token_type_ids.dtype == p.position_ids.dtype == np.int32
    assert p.input_ids.tolist() == ids[mask != 0].tolist() == [1, 3, 9, 10, 11, 12]
    assert p.token_type_ids.tolist() == [1, 1, 1, 0, 1, 0]
    assert p.position_ids.tolist() == [0, 2, 0, 1, 2, 3] and p.cu_seqlens.tolist() == [0, 2, 2, 6]
    empty = pack_padded(ids[:0], mask[:0], ids[:0])
    assert empty.tokens == 0 and empty.cu_seqlens.tolist() == [0] and empty.max_seqlen == 0


def test_host_inputs_out_of_range_are_refused() -> None:
    """``infer`` refuses token ids and token types outside the model's tables (negative
    ones too) and positions past its position table, naming the bound; padding beyond
    the position table is fine while the mask keeps no token there."""
    pytest.importorskip("transformers")
    from engine.fused.engine import FusedEngine

    model, cfg = _tiny_bert(1)
    eng = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu",  # type: ignore[arg-type]
                                      backend="torch")
    ids = np.full((2, 8), 5, dtype=np.int32)
    mask, tt = np.ones_like(ids), np.zeros_like(ids)
    for bad_ids, bad_tt, match in ((-1, 0, "input_ids must lie in \\[0, 120\\)"),
                                   (120, 0, "input_ids"), (5, 2, "token_type_ids"),
                                   (5, -3, "token_type_ids")):
        i, t = ids.copy(), tt.copy()
        i[1, 3], t[1, 4] = bad_ids, bad_tt
        with pytest.raises(ValueError, match=match):
            eng.infer(i, mask, t)
    i[1, 3] = -1
    mask[1, 3] = 0  # not a token: not checked
    eng.infer(i, mask, tt)
    wide = np.full((1, 70), 5, dtype=np.int32)
    wide_mask = (np.arange(70) < 64)[None, :].astype(np.int32)
    start, _ = eng.infer(wide, wide_mask, np.zeros_like(wide))
    assert np.isfinite(start[0, :64]).all()
    wide_mask[0, 64] = 1
    with pytest.raises(ValueError, match="longer than 64 tokens"):
        eng.infer(wide, wide_mask, np.zeros_like(wide))


def test_buckets_bound_padding() -> None:
    from engine.fused.packing import bucket_for, bucket_layout, round_tokens

    for t in range(1, 70000, 97):
        r = round_tokens(t)
        assert r >= t and (r - t) <= max(64, t // 8)
    assert round_tokens(128) == 128 and round_tokens(384) == 384
    for per_octave in (1, 8, 32, 64):  # finer buckets pad less, never below 64 tokens
        for t in range(1, 70000, 89):
            r = round_tokens(t, per_octave)
            assert r >= t and (r - t) < max(64, t / per_octave) and r % 64 == 0
    assert [round_tokens(47392, k) for k in (8, 16, 32, 64)] == [49152, 49152, 48128, 47616]
    assert bucket_for(47392, 256, 384, 64).tokens == 47616
    for bad in (0, 3, 12):  # a power of two keeps every step a multiple of 64
        with pytest.raises(ValueError, match="per_octave"):
            round_tokens(100, bad)
    b = bucket_for(300, 3, 200)
    assert (b.tokens, b.seqs, b.max_seqlen) == (320, 4, 256)
    buf = bucket_layout(np.ones(300, np.int32), np.ones(300, np.int32), np.ones(300, np.int32),
                        np.array([0, 100, 200, 300], np.int32), b)
    assert buf.shape == (b.buffer_len,)
    assert buf[3 * 320 :].tolist() == [0, 100, 200, 300, 300]  # the extra sequence is empty
    assert buf[300:320].sum() == 0
    # Into a reused buffer (the host path's pinned one) that held a longer batch: the
    # same layout as a fresh one, padding rows cleared.
    used = np.full(b.buffer_len, 7, np.int32)
    small = (np.arange(5, 10, dtype=np.int32), np.ones(5, np.int32),
             np.arange(5, dtype=np.int32), np.array([0, 5], np.int32))
    assert bucket_layout(*small, b, out=used) is used
    assert used.tolist() == bucket_layout(*small, b).tolist()
    with pytest.raises(ValueError, match="out must be int32"):
        bucket_layout(*small, b, out=np.zeros(b.buffer_len, np.int64))  # type: ignore[arg-type]


def test_chunks_by_tokens() -> None:
    from engine.fused.packing import chunks_by_tokens

    chunks = chunks_by_tokens(np.array([5, 5, 5, 20, 1]), 10)
    assert [(c.start, c.stop) for c in chunks] == [(0, 2), (2, 3), (3, 4), (4, 5)]


def test_layers_are_views_into_flat_storage() -> None:
    """Every layer's tensors live in ``FlatLayers`` at the documented offsets (what the
    persistent kernel indexes), so editing the flat buffer edits the layer tensors."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from engine.fused.weights import flat_strides, pack_weights

    model, cfg = _tiny_bert(0, hidden=128)
    w = pack_weights(model.state_dict(), cfg, "cpu", torch.float16)  # type: ignore[attr-defined,arg-type]
    assert w.flat is not None
    d, f = 128, 256
    assert (w.flat.mats.shape[1], w.flat.vecs.shape[1]) == flat_strides(d, f)
    ly = w.layers[1]
    m, v = w.flat.mats[1], w.flat.vecs[1]
    assert ly.ffn_out.weight.data_ptr() == m[4 * d * d + f * d :].data_ptr()
    assert ly.ln2_bias.data_ptr() == v[8 * d + f :].data_ptr()
    ref = model.state_dict()["bert.encoder.layer.1.output.dense.weight"]  # type: ignore[attr-defined]
    assert torch.equal(ly.ffn_out.weight, ref.half())
    v[8 * d + f] = 42.0
    assert float(ly.ln2_bias[0]) == 42.0


def test_weight_keys_without_prefix_and_tf_names() -> None:
    torch = pytest.importorskip("torch")
    from engine.fused.weights import normalise_keys

    state = {"bert.embeddings.LayerNorm.gamma": torch.ones(2),
             "encoder.layer.0.output.LayerNorm.beta": torch.zeros(2),
             "qa_outputs.weight": torch.zeros(2, 2)}
    assert set(normalise_keys(state)) == {"embeddings.LayerNorm.weight",
                                          "encoder.layer.0.output.LayerNorm.bias",
                                          "qa_outputs.weight"}


def test_shipped_checkpoint_torch_path_matches_reference() -> None:
    """The CPU (plain-torch) path on the real checkpoint, a few windows, vs transformers."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model_dir = REPO / "models" / "minilm-l6-squad"
    from engine.fused.engine import FusedEngine
    from engine.reference import ReferenceEngine

    ours = FusedEngine.from_pretrained(model_dir, device="cpu", dtype="float32", backend="torch")
    ref = ReferenceEngine(model_dir)
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 20000, (3, 64)).astype(np.int32)
    mask = (np.arange(64)[None, :] < np.array([[64], [33], [8]])).astype(np.int32)
    tt = ((np.arange(64)[None, :] >= 5) & (mask == 1)).astype(np.int32)
    s, e = ours.infer(ids, mask, tt)
    rs, re_ = ref.infer(ids, mask, tt)
    keep = mask.astype(bool)
    assert np.abs(s[keep] - rs[keep]).max() < 1e-3
    assert np.abs(e[keep] - re_[keep]).max() < 1e-3


def test_attention_config_rule() -> None:
    """The default tile everywhere but many nearly full-length sequences of 64-wide heads
    with enough programs for ~4 waves, which take the 128-query tile."""
    from engine.fused import kernels as k

    big = k.ATTN_LARGE_MEAN
    assert k.attention_config(384, 1, 16, 64, 384) == k.ATTN_SMALL  # batch 1: few programs
    assert k.attention_config(384, 128, 16, 64, 128 * 384) == k.ATTN_LARGE
    assert k.attention_config(384, 128, 16, 64, 128 * big) == k.ATTN_LARGE
    assert k.attention_config(384, 128, 16, 64, 128 * big - 1) == k.ATTN_SMALL
    assert k.attention_config(384, 256, 16, 64, 45_000) == k.ATTN_SMALL  # the SQuAD mix
    assert k.attention_config(384, 128, 16, 128, 128 * 384) == k.ATTN_SMALL  # 128-wide heads
    assert k.attention_config(384, 128, 16, 64) == k.ATTN_SMALL  # token count unknown
    # ~4 waves of 132 multiprocessors: 3 blocks x 11 sequences x 16 heads = 528 programs.
    assert k.attention_config(384, 10, 16, 64, 10 * 384) == k.ATTN_SMALL
    assert k.attention_config(384, 11, 16, 64, 11 * 384) == k.ATTN_LARGE
    assert k.ATTN_LARGE[0] != k.ATTN_SMALL[0]


def test_split_loop_register_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split loop's registers are capped only where its programs outnumber what 132
    multiprocessors hold uncapped (3 of 4 warps each, 1 of 8), and not at all without a cap."""
    from engine.fused.kernels import attention as attn

    assert attn.register_cap(112, 4) is None  # BERT-large 1x384: one wave
    assert attn.register_cap(3 * 132, 4) is None
    assert attn.register_cap(3 * 132 + 1, 4) == attn.ATTN_MAXNREG == 128
    assert attn.register_cap(132, 8) is None
    assert attn.register_cap(133, 8) == 128
    assert attn.register_cap(50_000, 2) == 128  # other warp counts: one program an SM
    monkeypatch.setattr(attn, "ATTN_MAXNREG", None)
    assert attn.register_cap(50_000, 4) is None


if __name__ == "__main__" and "--child" in sys.argv:
    _child_main(*(int(a) for a in sys.argv[sys.argv.index("--child") + 1:][:2]))
