"""A LayerNorm folded into the linear layer that reads its output.

For a row ``x`` with mean ``mu`` and ``r = 1 / sqrt(var + eps)``::

    LN(x) @ W^T + c = r * (x @ (W diag(gamma))^T - mu * u) + (W beta + c)

where ``u`` holds the row sums of ``W diag(gamma)``. So the GEMM after a LayerNorm can
take the un-normalised rows, provided it knows each row's ``mu`` and ``r``: in the
small-batch path the GEMM that produced the rows adds up each row's sum and sum of
squares in its epilogue (``kernels.deferred``). ``u`` is summed
from the *rounded* folded weight, so that ``mu * u`` cancels exactly the part of the
product that the rounded weight gives the mean.

Folded here: QKV (after the embedding LayerNorm in layer 0, after the previous layer's
second LayerNorm otherwise) and FFN1 (after the layer's first LayerNorm). The QKV bias
is the attention kernel's (it adds Q's and V's; K's cancels in the softmax, so ``W_k
beta`` does too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.fused.weights import BertQAWeights, Linear


@dataclass(frozen=True)
class FoldedLinear:
    weight: torch.Tensor  # [out, in], model dtype: W diag(gamma)
    colsum: torch.Tensor  # [out] float32: row sums of `weight` as stored
    bias: torch.Tensor  # [out] float32: W beta + b


@dataclass(frozen=True)
class FoldedLayer:
    qkv: FoldedLinear  # folds the LayerNorm before the layer
    ffn_in: FoldedLinear  # folds the layer's first LayerNorm


def fold_linear(lin: Linear, gamma: torch.Tensor, beta: torch.Tensor) -> FoldedLinear:
    """``lin`` applied after a LayerNorm with ``gamma``/``beta``, folded (see module doc)."""
    w = lin.weight.float()
    folded = (w * gamma.float()[None, :]).to(lin.weight.dtype).contiguous()
    return FoldedLinear(
        weight=folded,
        colsum=folded.float().sum(1).contiguous(),
        bias=(w @ beta.float() + lin.bias.float()).contiguous(),
    )


def fold_layernorms(w: BertQAWeights) -> tuple[FoldedLayer, ...]:
    """Every layer's QKV and FFN1 with the LayerNorm before them folded in."""
    out = []
    g, b = w.emb_ln_weight, w.emb_ln_bias
    for layer in w.layers:
        out.append(FoldedLayer(qkv=fold_linear(layer.qkv, g, b),
                               ffn_in=fold_linear(layer.ffn_in, layer.ln1_weight,
                                                  layer.ln1_bias)))
        g, b = layer.ln2_weight, layer.ln2_bias
    return tuple(out)


def with_folded(w: BertQAWeights, max_hidden: int | None) -> BertQAWeights:
    """``w`` with folded layers added if the deferred-LayerNorm path will run it: fp16/bf16
    weights of at most ``max_hidden`` hidden size (None: never). Unchanged otherwise, or
    if they are already there."""
    if (w.folded is not None or max_hidden is None or w.config.hidden_size > max_hidden
            or w.dtype not in (torch.float16, torch.bfloat16)):
        return w
    return dataclasses.replace(w, folded=fold_layernorms(w))
