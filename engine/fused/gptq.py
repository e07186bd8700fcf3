"""Error-compensated e4m3 rounding of a GEMM weight (GPTQ, Frantar et al., 2022).

Rounding each weight to its nearest e4m3 value (what :func:`engine.fused.fp8.quantize_tiles`
does) treats every input channel alike. GPTQ rounds a weight ``W`` [N, K] one input
column at a time and spreads each column's rounding error over the columns not yet
rounded, weighted by how the GEMM's inputs correlate (their Gram matrix ``H = X^T X``
over calibration tokens), so that ``X @ Wq^T`` rather than ``Wq`` itself stays close:
the layer's output error, not the weight's, is what is minimised. The scale (one for the
tensor, as the calibrated engine runs it) and the format are unchanged; only which way
each weight rounds differs, so the GEMMs cost exactly what they cost with nearest
rounding.

The algorithm is the paper's (its reference implementation's blocked form): a damped
``H``, the upper Cholesky factor of its inverse, columns in blocks of ``block`` with the
block's error carried to the remaining columns in one product, and optionally the
columns taken in order of decreasing ``diag(H)`` ("act order").
"""

from __future__ import annotations

import torch

from engine.fused.fp8 import FP8_DTYPE, FP8_MAX


def _e4m3(w: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """``w * inv`` rounded to e4m3 (saturating), as float32 (in units of the scale)."""
    return (w * inv).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float()


def gptq_e4m3(w: torch.Tensor, gram: torch.Tensor, scale: torch.Tensor | float,
              block: int = 128, damp: float = 0.01, act_order: bool = True) -> torch.Tensor:
    """e4m3 ``Wq`` [N, K] with ``Wq * scale ~= w`` and ``X @ (Wq * scale)^T`` close to
    ``X @ w^T`` for inputs ``X`` whose Gram matrix (``X^T X``, any positive multiple) is
    ``gram`` [K, K]. ``damp`` is the share of ``diag(gram)``'s mean added to its diagonal
    (the paper's 1%); input channels that never fired (zero diagonal) round to nearest.
    Runs in float32 on ``gram``'s device."""
    k = w.shape[1]
    if gram.shape != (k, k):
        raise ValueError(f"a Gram matrix for a weight of {k} input channels is {k}x{k}, "
                         f"got {tuple(gram.shape)}")
    dev = gram.device
    s = torch.as_tensor(scale, dtype=torch.float32, device=dev).reshape(())
    if not bool(torch.isfinite(s)) or float(s) <= 0:
        raise ValueError(f"the scale must be finite and positive, got {float(s)}")
    inv = 1.0 / s
    weight = w.to(device=dev, dtype=torch.float32).clone()
    h = gram.to(torch.float32).clone()
    if not bool(torch.isfinite(h).all()):
        raise ValueError("the Gram matrix has non-finite entries")
    dead = torch.diagonal(h) <= 0
    h[dead, dead] = 1.0
    perm = torch.argsort(torch.diagonal(h), descending=True) if act_order else None
    if perm is not None:
        weight, h = weight[:, perm], h[perm][:, perm]
    torch.diagonal(h).add_(damp * float(torch.diagonal(h).mean()))
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    out = torch.zeros_like(weight)  # e4m3 values, in units of the scale
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1 = weight[:, i1:i2].clone()
        err = torch.zeros_like(w1)
        h1 = hinv[i1:i2, i1:i2]
        for j in range(i2 - i1):
            col = w1[:, j]
            units = _e4m3(col, inv)
            out[:, i1 + j] = units
            e = (col - units * s) / h1[j, j]
            w1[:, j:] -= e.unsqueeze(1) * h1[j, j:].unsqueeze(0)
            err[:, j] = e
        weight[:, i2:] -= err @ hinv[i1:i2, i2:]
    if perm is not None:
        out = out[:, torch.argsort(perm)]
    return out.to(FP8_DTYPE).to(w.device)  # exact: every value is already e4m3


def output_error(w: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor | float,
                 gram: torch.Tensor) -> float:
    """``||X (w - w8 * scale)^T||_F^2`` from the Gram matrix alone (``trace(D H D^T)``)."""
    d = w.float().to(gram.device) - w8.float().to(gram.device) * float(scale)
    return float(((d @ gram.float()) * d).sum())
