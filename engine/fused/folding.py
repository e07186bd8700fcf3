"""A LayerNorm folded into the linear layer that reads its output.

For a row ``x`` with mean ``mu`` and ``r = 1 / sqrt(var + eps)``::

    LN(x) @ W^T + c = r * (x @ (W diag(gamma))^T - mu * u) + (W beta + c)

where ``u`` holds the row sums of ``W diag(gamma)``. So the GEMM after a LayerNorm can
take the un-normalised rows, provided it knows each row's ``mu`` and ``r``: in the
small-batch path the GEMM that produced the rows adds up each row's sum and sum of
squares in its epilogue (``kernels.deferred``). ``u`` is summed
from the *rounded* folded weight, so that ``mu * u`` cancels exactly the part of the
product that the rounded weight gives the mean.

With calibrated FP8 (:class:`DeferredFP8Layer`) the un-normalised rows are multiplied
in e4m3: the producer of each row also stores it in e4m3 with one calibrated scale, the
folded weight has one scale, and ``u`` sums the *dequantized* e4m3 weight, for the same
reason.

Folded here: QKV (after the embedding LayerNorm in layer 0, after the previous layer's
second LayerNorm otherwise) and FFN1 (after the layer's first LayerNorm). The QKV bias
is the attention kernel's (it adds Q's and V's; K's cancels in the softmax, so ``W_k
beta`` does too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.fused.fp8 import quantize_tiles
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


@dataclass(frozen=True)
class FoldedFP8:
    w8: torch.Tensor  # [out, in] e4m3: the folded weight over its one scale
    scale: torch.Tensor  # [1] float32: the input's scale times the weight's
    colsum: torch.Tensor  # [out] float32: row sums of the dequantized w8

    @classmethod
    def of(cls, w8: torch.Tensor, w_scale: torch.Tensor, x_scale: torch.Tensor) -> FoldedFP8:
        """From an e4m3 folded weight and its scale ([1]), for inputs quantized with
        ``x_scale`` ([1]): the product's scale and the dequantized weight's row sums."""
        return cls(w8=w8, scale=(x_scale * w_scale).contiguous(),
                   colsum=(w8.float() * w_scale).sum(1).contiguous())


@dataclass(frozen=True)
class DeferredFP8Layer:
    """One layer of the deferred-LayerNorm path on e4m3 operands (calibrated scales):
    QKV and FFN1 folded, FFN2 plain; the out-projection stays 16-bit (its FP8 rounding
    costs F1: ``engine/fused/NOTES.md``, v12). ``*_inv`` are what each GEMM's input is
    multiplied by before its e4m3 rounding (1 / its scale), applied by whoever writes it."""

    qkv: FoldedFP8
    ffn_in: FoldedFP8
    ffn_out_w8: torch.Tensor  # [D, F] e4m3
    ffn_out_scale: torch.Tensor  # [1] float32
    qkv_inv: torch.Tensor  # [1] float32
    ffn_in_inv: torch.Tensor  # [1]
    ffn_out_inv: torch.Tensor  # [1]


def _e4m3_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 copy, float32 [1] scale): one scale for the tensor."""
    w8, scale = quantize_tiles(w, w.shape[0], w.shape[1])
    return w8.contiguous(), scale.reshape(1).contiguous()


def fold_fp8(folded: FoldedLinear, x_scale: torch.Tensor) -> FoldedFP8:
    """``folded``'s weight in e4m3, for inputs quantized with ``x_scale`` ([1])."""
    return FoldedFP8.of(*_e4m3_weight(folded.weight), x_scale)


def deferred_fp8_layers(w: BertQAWeights, x_scales: dict[str, list[torch.Tensor]]
                        ) -> tuple[DeferredFP8Layer, ...]:
    """Every layer of ``w`` (folded) on e4m3 operands, with per layer input scales
    ``x_scales["qkv"|"ffn_in"|"ffn_out"][i]`` ([1] float32): QKV's and FFN1's for their
    un-normalised inputs, FFN2's for the GELU's output."""
    if w.folded is None:
        raise ValueError("the FP8 deferred path needs the folded layers (with_folded)")
    out = []
    for i, (layer, fold) in enumerate(zip(w.layers, w.folded, strict=True)):
        sq, sf, sh = (x_scales[g][i] for g in ("qkv", "ffn_in", "ffn_out"))
        w2, w2_scale = _e4m3_weight(layer.ffn_out.weight)
        out.append(DeferredFP8Layer(
            qkv=fold_fp8(fold.qkv, sq), ffn_in=fold_fp8(fold.ffn_in, sf), ffn_out_w8=w2,
            ffn_out_scale=(sh * w2_scale).contiguous(), qkv_inv=(1.0 / sq).contiguous(),
            ffn_in_inv=(1.0 / sf).contiguous(), ffn_out_inv=(1.0 / sh).contiguous()))
    return tuple(out)


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
