"""A residual stream kept as the sum its LayerNorm normalizes.

Post-LN BERT's residual after a sub-layer is ``LayerNorm(s + bias)``, ``s`` the sum of the
sub-layer's GEMM and the previous residual. Written out, it costs a 16-bit tensor the
next residual LayerNorm reads back. Kept as ``s`` with its rows' moments instead (the GEMM
adding the previous residual as it writes ``s``), the LayerNorm step writes only its e4m3
copy (``kernels.layernorm_quant``), and the next residual LayerNorm normalizes ``s`` as it
reads it: 2 bytes an element fewer in all (``engine/fused/NOTES.md`` v42).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SumResidual:
    """The residual ``LayerNorm(s + bias)`` = ``(s + bias - mean) * rstd * gamma + beta``.

    ``s`` [T, D] 16-bit; ``moments`` [T, 2] float32, each row's mean and
    ``1 / sqrt(var + eps)`` of ``s + bias`` (what ``layernorm_quant`` returns); ``bias``,
    ``gamma``, ``beta`` [D], the LayerNorm's.
    """

    s: torch.Tensor
    moments: torch.Tensor
    bias: torch.Tensor
    gamma: torch.Tensor
    beta: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the residual stream (``s``'s)."""
        return self.s.dtype

    def value(self) -> torch.Tensor:
        """The residual in float32 (the spec; the kernels compute it as they read ``s``)."""
        x = self.s.float() + self.bias.float()
        mean, rstd = self.moments[:, :1], self.moments[:, 1:]
        return (x - mean) * rstd * self.gamma.float() + self.beta.float()
