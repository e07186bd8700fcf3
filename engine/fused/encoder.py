"""The BERT-QA forward pass over packed tokens, written once against an op set.

Per layer, 4 GEMMs (cuBLAS, or FP8 ``_scaled_mm``) and 3 fused kernels::

    qkv  = x @ Wqkv^T                          GEMM (bias added inside attention)
    ctx  = attention(qkv + bqkv)               attention_varlen
    a    = ctx @ Wo^T                          GEMM
    x    = LN(a + bo + x)                      bias_residual_layernorm (+ e4m3 copy of x)
    h    = x @ W1^T                            GEMM
    h    = gelu(h + b1)                        bias_gelu (or its e4m3 copy only)
    a    = h @ W2^T                            GEMM
    x    = LN(a + b2 + x)                      bias_residual_layernorm (last layer: + QA head)

plus one embedding+LayerNorm kernel in front. No GEMM carries a bias: each bias rides in
the kernel that reads the GEMM's output anyway.
"""

from __future__ import annotations

from types import ModuleType

import torch

from engine.fused.fp8 import Quantized, scaled_linear
from engine.fused.weights import BertQAWeights, Linear


def _linear(x: torch.Tensor | None, xq: Quantized | None, lin: Linear,
            fp8_out: torch.dtype) -> torch.Tensor:
    """``x @ W^T`` without bias; FP8 when both the weight and the activation have e4m3 copies."""
    if xq is not None and lin.w8 is not None and lin.w8_scale is not None:
        return scaled_linear(xq, lin.w8, lin.w8_scale, fp8_out)
    assert x is not None, "activation only exists as FP8 but the weight has no FP8 copy"
    return torch.mm(x, lin.weight.t())


def encode_packed(
    w: BertQAWeights,
    ops: ModuleType,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    n_seqs: int,
    max_seqlen: int,
    fp8_out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """QA logits float32 [2, T] (start row, end row) of packed int32 token tensors.

    ``ops`` is ``engine.fused.kernels`` (Triton) or ``engine.fused.torch_ops`` (PyTorch):
    the same functions with the same contracts.

    ``n_seqs``/``max_seqlen`` may over-state the batch (see ``attention_varlen``); tokens
    outside every sequence get logits too, which callers ignore.
    """
    cfg = w.config
    eps = cfg.layer_norm_eps
    tanh = cfg.gelu == "tanh"
    out8 = fp8_out_dtype or w.dtype
    layers = w.layers
    x, xq = ops.embed_layernorm(
        input_ids, token_type_ids, position_ids, w.word_embeddings, w.position_embeddings,
        w.token_type_embeddings, w.emb_ln_weight, w.emb_ln_bias, eps,
        fp8=layers[0].qkv.w8 is not None,
    )
    for i, layer in enumerate(layers):
        qkv = _linear(x, xq, layer.qkv, out8)
        ctx = ops.attention_varlen(qkv, layer.qkv.bias, cu_seqlens, max_seqlen, n_seqs,
                                   cfg.num_heads)
        a = _linear(ctx, None, layer.attn_out, out8)
        x, xq = ops.bias_residual_layernorm(
            a, layer.attn_out.bias, x, layer.ln1_weight, layer.ln1_bias, eps,
            fp8=layer.ffn_in.w8 is not None,
        )
        h = _linear(x, xq, layer.ffn_in, out8)
        h, hq = ops.bias_gelu(h, layer.ffn_in.bias, fp8=layer.ffn_out.w8 is not None, tanh=tanh)
        a = _linear(h, hq, layer.ffn_out, out8)
        if i == len(layers) - 1:
            return ops.bias_residual_layernorm_qa(  # type: ignore[no-any-return]
                a, layer.ffn_out.bias, x, layer.ln2_weight, layer.ln2_bias, eps,
                w.qa_weight, w.qa_bias,
            )
        x, xq = ops.bias_residual_layernorm(
            a, layer.ffn_out.bias, x, layer.ln2_weight, layer.ln2_bias, eps,
            fp8=layers[i + 1].qkv.w8 is not None,
        )
    raise ValueError("a BERT encoder needs at least one layer")
