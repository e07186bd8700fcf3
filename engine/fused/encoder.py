"""The BERT-QA forward pass over packed tokens, written once against an op set.

Per layer, 4 GEMMs (cuBLAS, Triton split-K, or FP8 ``_scaled_mm``) and 3 fused kernels::

    qkv  = x @ Wqkv^T                          GEMM (bias added inside attention)
    ctx  = attention(qkv + bqkv)               attention_varlen
    a    = ctx @ Wo^T                          GEMM
    x    = LN(a + bo + x)                      bias_residual_layernorm (+ e4m3 copy of x)
    h    = x @ W1^T                            GEMM        } or, for few tokens, one Triton GEMM
    h    = gelu(h + b1)                        bias_gelu   } with both in its epilogue
    a    = h @ W2^T                            GEMM
    x    = LN(a + b2 + x)                      bias_residual_layernorm (last layer: + QA head)

plus one embedding+LayerNorm kernel in front. No GEMM carries a bias: each bias rides in
the kernel that reads the GEMM's output anyway.
"""

from __future__ import annotations

from types import ModuleType

import torch

from engine.fused.fp8 import Quantized, scaled_linear
from engine.fused.gemm import GemmPlanner
from engine.fused.weights import BertQAWeights, Linear

# Below ~4k tokens the row-scaled e4m3 GEMMs measured no faster than fp16 ones (H200,
# 2026-11-29: BERT-base 32x128 1.87 vs 1.81 ms; BERT-large 32x128 4.63 vs 5.44 ms).
FP8_MIN_TOKENS = 4096
# Up to this many tokens, FFN1 runs as one Triton GEMM with bias + GELU in its epilogue
# (``linear_bias_gelu``) instead of cuBLAS + ``bias_gelu``; None turns it off. H200,
# 2026-11-29, per layer: the fused GEMM wins at 128 tokens (5.9 vs 7.1 us, and one launch
# fewer) and 384 (12.3 vs 12.8), and loses from 4096 up (56 vs 52 us; 844 vs 739 at 42,891).
FFN1_FUSED_MAX_TOKENS: int | None = 512


def _linear(x: torch.Tensor | None, xq: Quantized | None, lin: Linear,
            fp8_out: torch.dtype, planner: GemmPlanner | None) -> torch.Tensor:
    """``x @ W^T`` without bias: FP8 when the activation comes with an e4m3 copy (and the
    weight has one), else cuBLAS or split-K as ``planner`` picks (split-K partials are
    [S, T, N] float32, which only the residual-LayerNorm and GELU kernels accept)."""
    if xq is not None and lin.w8 is not None and lin.w8_scale is not None:
        return scaled_linear(xq, lin.w8, lin.w8_scale, fp8_out)
    assert x is not None, "activation only exists as FP8 but the weight has no FP8 copy"
    if planner is not None:
        return planner.linear(x, lin.weight)
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
    planner: GemmPlanner | None = None,
    fp8_min_tokens: int = FP8_MIN_TOKENS,
    ffn1_fused_max_tokens: int | None = FFN1_FUSED_MAX_TOKENS,
    attn_config: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """QA logits float32 [2, T] (start row, end row) of packed int32 token tensors.

    ``ops`` is ``engine.fused.kernels`` (Triton) or ``engine.fused.torch_ops`` (PyTorch):
    the same functions with the same contracts.

    ``n_seqs``/``max_seqlen`` may over-state the batch (see ``attention_varlen``); tokens
    outside every sequence get logits too, which callers ignore. FP8 weights are used only
    from ``fp8_min_tokens`` tokens up; ``planner`` (None: cuBLAS) picks the attention-output
    and FFN GEMMs' implementation. Up to ``ffn1_fused_max_tokens`` tokens (None: never),
    an fp16/bf16 FFN1 is one GEMM with bias and GELU in its epilogue. ``attn_config``
    imposes attention tiles (None: ``kernels.attention_config``).
    """
    cfg = w.config
    eps = cfg.layer_norm_eps
    tanh = cfg.gelu == "tanh"
    out8 = fp8_out_dtype or w.dtype
    layers = w.layers
    use8 = w.fp8 and input_ids.shape[0] >= fp8_min_tokens

    fuse_ffn1 = (ffn1_fused_max_tokens is not None
                 and input_ids.shape[0] <= ffn1_fused_max_tokens
                 and w.dtype in (torch.float16, torch.bfloat16)
                 and ops.gemm_gelu_supported(cfg.hidden_size)
                 and (planner is None or not planner.forcing_splitk))

    def wants8(lin: Linear) -> bool:  # does this GEMM take an e4m3 activation?
        return use8 and lin.w8 is not None

    x, xq = ops.embed_layernorm(
        input_ids, token_type_ids, position_ids, w.word_embeddings, w.position_embeddings,
        w.token_type_embeddings, w.emb_ln_weight, w.emb_ln_bias, eps,
        fp8=wants8(layers[0].qkv),
    )
    for i, layer in enumerate(layers):
        qkv = _linear(x, xq, layer.qkv, out8, None)  # attention reads it: no split-K
        ctx = ops.attention_varlen(qkv, layer.qkv.bias, cu_seqlens, max_seqlen, n_seqs,
                                   cfg.num_heads, config=attn_config)
        a = _linear(ctx, None, layer.attn_out, out8, planner)
        x, xq = ops.bias_residual_layernorm(
            a, layer.attn_out.bias, x, layer.ln1_weight, layer.ln1_bias, eps,
            fp8=wants8(layer.ffn_in),
        )
        if fuse_ffn1 and not wants8(layer.ffn_in) and not wants8(layer.ffn_out):
            h, hq = ops.linear_bias_gelu(x, layer.ffn_in.weight, layer.ffn_in.bias, tanh), None
        else:
            h = _linear(x, xq, layer.ffn_in, out8, planner)
            h, hq = ops.bias_gelu(h, layer.ffn_in.bias, fp8=wants8(layer.ffn_out), tanh=tanh,
                                  out_dtype=w.dtype)
        a = _linear(h, hq, layer.ffn_out, out8, planner)
        if i == len(layers) - 1:
            return ops.bias_residual_layernorm_qa(  # type: ignore[no-any-return]
                a, layer.ffn_out.bias, x, layer.ln2_weight, layer.ln2_bias, eps,
                w.qa_weight, w.qa_bias,
            )
        x, xq = ops.bias_residual_layernorm(
            a, layer.ffn_out.bias, x, layer.ln2_weight, layer.ln2_bias, eps,
            fp8=wants8(layers[i + 1].qkv),
        )
    raise ValueError("a BERT encoder needs at least one layer")
