"""The BERT-QA forward pass over packed tokens, written once against an op set.

Per layer, 4 GEMMs and 3 fused kernels::

    qkv  = x @ Wqkv^T                          GEMM (bias added inside attention)
    ctx  = attention(qkv + bqkv)               attention_varlen
    a    = ctx @ Wo^T                          GEMM
    x    = LN(a + bo + x)                      bias_residual_layernorm (+ e4m3 copy of x)
    h    = gelu(x @ W1^T + b1)                 GEMM + bias_gelu, or one GEMM with both
    a    = h @ W2^T                            GEMM
    x    = LN(a + b2 + x)                      bias_residual_layernorm (last layer: + QA head)

plus one embedding+LayerNorm kernel in front. No cuBLAS GEMM carries a bias: each bias
rides in the kernel that reads the GEMM's output anyway. Two paths:

* **Small batches** (up to ``small_batch_max_tokens`` tokens, fp16/bf16): every GEMM is the
  Triton ``linear``: QKV plain, FFN1 with bias + GELU in its epilogue, the attention-output
  and FFN2 GEMMs split over K into float32 partials that the residual-LayerNorm kernels
  sum. All 7 kernels of a layer launch with programmatic dependent launch (PDL) where the
  GPU has it, each GEMM prefetching its weights into L2 (and the GEMMs and attention their
  bias slices into L1) while the kernel before it runs.
  At around a hundred tokens the pass is bound by kernel boundaries and by weight streaming
  through few multiprocessors, which this path attacks; cuBLAS cannot take part (it does
  not wait on ``griddepcontrol``). With ``cutlass_small_gemms`` (the engine's default on
  models of hidden size ``AUTO_SMALL_GEMMS_MIN_HIDDEN`` and up where the library is built),
  QKV and/or FFN1 are CUTLASS kernels instead (``small_gemm``; they do wait on it).
* **Small batches without LayerNorm kernels** (models up to ``deferred_ln_max_hidden``
  wide, with ``w.folded``): the same path with five kernels a layer instead of seven. The
  GEMM before each residual LayerNorm leaves the un-normalised sum (and its row sums) and
  the GEMMs after it apply the LayerNorm algebraically (``kernels.deferred``,
  ``folding``).
* **Persistent (opt-in, ``persistent``):** the small-batch path's kernels as phases of one
  kernel with grid-wide barriers between them (``kernels.persistent``).
* **Large batches:** cuBLAS GEMMs (FP8 ``_scaled_mm`` from ``fp8_min_tokens`` tokens when
  the weights have e4m3 copies), Triton kernels around them, launched without PDL. With
  calibrated scales (``w.calibrated``, from ``fp8_calibrated_min_tokens`` tokens) every
  GEMM is a cuBLASLt FP8 GEMM with per-tensor scales (``fp8.static_linear``), the
  LayerNorm and attention kernels write e4m3 with the calibrated scales, and FFN1 + bias +
  GELU + e4m3 is one cuBLASLt GEMM (``fp8.calibrated_ffn1``): the bias_gelu kernel drops
  out. With ``int8_gemms`` (the engine's default ``"auto"`` on BERT-large / BERT-base
  widths from ``int8_min_tokens`` tokens) the out-projection and FFN1 are int8 Gluon GEMMs
  with SmoothQuant smoothing instead (``engine.fused.int8``), attention and the LayerNorm
  writing their int8 inputs. With :data:`OUT_PROJ_ADDS_RESIDUAL` (opt-in), the 16-bit
  out-projection adds the residual (cuBLAS, in place) and the residual stays that sum
  (``residual.SumResidual``): the LayerNorm after it writes only FFN1's e4m3 input and the
  rows' moments (``layernorm_quant``), and the one after FFN2 normalizes the sum as it
  reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from engine.fused import cublaslt, dispatch, small_gemm
from engine.fused.folding import FoldedFP8, FoldedLinear
from engine.fused.fp8 import (
    FP8_DTYPE,
    Quantized,
    calibrated_ffn1,
    scaled_linear,
    static_linear,
)
from engine.fused.int8 import GEMM_CONFIGS, int8_linear
from engine.fused.residual import SumResidual
from engine.fused.weights import BertQAWeights, Linear

# On the large path's calibrated layers (the 16-bit out-projection, FFN1 reading only the
# e4m3 copy of the LayerNorm before it), the out-projection adds the residual and the
# residual is kept as that sum: 2 bytes an element fewer per layer. H100, BERT-large mix,
# settled: +1.6% (6,968-6,982 windows/s against 6,854-6,866). Off: its F1 loss on the
# shipped MiniLM was +0.115 over the 4 weight roundings (+0.107 over 8; the two-LayerNorm
# form +0.093 over the same 8), with the same logit error (mean |d| 0.0613 vs 0.0612): a
# chance-sized difference (per rounding -0.08 to +0.14) that lands over the 0.1 budget
# (engine/fused/NOTES.md v42). Read at each call, so an A/B can set it.
OUT_PROJ_ADDS_RESIDUAL = False

# Below ~4k tokens the row-scaled e4m3 GEMMs measured no faster than fp16 ones (H200,
# 2026-11-29: BERT-base 32x128 1.87 vs 1.81 ms; BERT-large 32x128 4.63 vs 5.44 ms).
FP8_MIN_TOKENS = 4096
# With calibrated (per-tensor) scales FP8 pays wherever the large path runs: cuBLASLt's
# per-tensor FP8 GEMMs beat fp16 ones from a few hundred tokens up (H200, 2026-11-30,
# BERT-large at 384 tokens, µs: QKV 5.1 vs 7.0, FFN1 5.5 vs 7.1, FFN2 6.2 vs 9.8), while
# the small-batch path (fp16 only) wins below: BERT-base 1x128 0.293 ms vs 0.501 for FP8.
FP8_CALIBRATED_MIN_TOKENS = 129
# The GEMMs whose input a calibrated pass quantizes with its static scale. The attention
# output keeps the model dtype (and its GEMM fp16): static e4m3 there cost the most
# accuracy. Shipped MiniLM, SQuAD v1.1 dev, 4 weight roundings each (H200, 2026-11-30,
# fp8_accuracy.py): mean |logit error| 0.0653 with all four static, 0.0611 with these
# three (F1 loss +0.07, as row scales' +0.07), 0.0656 / 0.0648 / 0.0644 with QKV's / FFN1's
# / FFN2's input per token instead; speed, graph replay, BERT-large SQuAD mix: 35.35 ms all
# four, 36.98 these three (one run); row scales 41.88 (the next run).
FP8_STATIC_INPUTS = ("qkv", "ffn_in", "ffn_out")
# Large path: up to this many tokens, FFN1 is one Triton GEMM with bias + GELU in its
# epilogue instead of cuBLAS + ``bias_gelu`` (H200, 2026-11-29, per layer: 5.9 vs 7.1 us at
# 128 tokens, 12.3 vs 12.8 at 384; loses from 4096 up). None turns it off.
FFN1_FUSED_MAX_TOKENS: int | None = 512
# Calibrated engines run the deferred (small-batch, LayerNorm-free) layer's QKV, FFN1 and
# FFN2 on e4m3 operands (``folding.DeferredFP8Layer``). H200, 2026-12-01: BERT-base 1x128
# and 4x32 -15% (graph replay); shipped MiniLM, 128-token windows one per call, F1 loss
# +0.094 on average over 4 weight roundings (-0.07 to +0.33), the calibrated large
# path's +0.095 (engine/fused/NOTES.md, v20).
FP8_DEFERRED = True
# Up to this many tokens the small-batch path runs (None: never). H200, 2026-11-30, whole
# passes against the large path: it wins at 128 tokens (BERT-base 0.383 vs 0.488 ms,
# BERT-large 0.912 vs 1.011) and ties or loses above: 192 (0.501 vs 0.498 with its current
# tiles; BERT-large 1.420 vs 1.180), 256 (0.560 vs 0.524, 1.204 vs 1.156), 384 (0.624 vs
# 0.565, 1.462 vs 1.232). Triton's GEMMs trail cuBLAS as M grows.
SMALL_BATCH_MAX_TOKENS: int | None = 128
# The small-batch path runs without LayerNorm kernels (``kernels.deferred``) for models of
# at most this hidden size (None: never). H200, 2026-11-30, CUDA-graph replay at 1x128:
# BERT-base 0.305-0.312 ms vs 0.321 with the seven-kernel layer; BERT-large 0.835 vs 0.813
# (its whole-row out-projection and FFN2's tile fix-up cost more than the two LayerNorm
# steps they replace).
DEFERRED_LN_MAX_HIDDEN: int | None = 768
# ``cutlass_small_gemms="auto"`` (the engine's default) runs QKV and FFN1 of the seven-kernel
# layer as CUTLASS kernels on models of at least this hidden size, where the library is
# built. H200, 2026-11-30, graph replay, BERT-large (1024): 2.8-17% faster at each of 1x16,
# 1x32, 1x64, 1x96, 1x128, 2x64, 4x32, 8x16 (v17); BERT-base (768) forced onto that layer:
# no gain (v16).
AUTO_SMALL_GEMMS_MIN_HIDDEN = 1024
# In batches of at least this many sequences (None: never) the seven-kernel layer's Triton
# QKV GEMM lets attention launch (PDL) only after its K loop, as CUTLASS's kernels do:
# launched at once, attention's programs (sequences x heads x query blocks, many of them
# empty) crowd the few multiprocessors the GEMM leaves free. H200, 2026-11-30, graph
# replay, BERT-large: 2x64 -3.2%, 4x32 -10.7%, 8x16 -10.6%; 1x128 +0.6% (within the
# rounds' spread); the deferred layer (BERT-base) gained nothing at any of them (v17).
QKV_LATE_RELEASE_MIN_SEQS: int | None = 2
# The small-batch layers' kernels by the names ``EncodeOptions.late_release`` takes: the
# deferred layer runs qkv, attention, out, ffn1, ffn2; the seven-kernel layer adds the
# LayerNorms ln1 (after the out-projection) and ln2 (after FFN2; the last layer's, which
# feeds the QA head, has no successor to release).
LATE_RELEASE_KERNELS = ("qkv", "attention", "out", "ln1", "ffn1", "ffn2", "ln2")
# The deferred layer's GEMMs that can load their weight slice whole before their PDL wait
# (``EncodeOptions.early_weights``), and those that do by default (``kernels.deferred``;
# where the slice does not fit, a GEMM keeps its K loop). H200, 2026-12-01, BERT-base
# 1x128 calibrated FP8, graph replay, two engines each: QKV + FFN1 0.2493 ms against
# 0.2505 (idle GPU 0.2538 against 0.2556); FFN2 too 0.2511-0.2526 (another machine: -4.6
# us over all three). 16-bit launches take it where their slices fit too: the shipped
# MiniLM's shape in fp16 (QKV and FFN1 slices of 48 KB), graph replay, ms K loop -> early:
# 1x128 0.1057 -> 0.1037 (idle GPU 0.1088 -> 0.1070), 1x64 0.0978 -> 0.0969, 1x32 0.0978
# -> 0.0969, 2x64 0.1027 -> 0.1007, 4x32 0.1078 -> 0.1046, 1x16 0.0973 -> 0.0964 (NOTES
# v28); BERT-base's 96 KB 16-bit slices were 12% slower, and the fit rule
# (``early_weights_fit``) refuses them. The out-projection's 32-row plan never fits (its
# ``mma.sync`` tiles spilled this way, v27); "out" is for plans on 64-row tiles
# (``gemm_plans``), and on BERT-base's 16-bit out-projection even 64x16 (120 KB) needs
# ``kernels.deferred._EARLY_BYTES`` raised, as ``benchmarks/out_proj_sweep.sh`` does for
# its early variants; otherwise the K loop runs. Every 64-row plan lost at 1x128 FP8, with
# or without early weights (+1.4 to +12.7%, v32): the 32x32 plan stays.
EARLY_WEIGHT_GEMMS = ("qkv", "out", "ffn1", "ffn2")
EARLY_WEIGHTS: tuple[str, ...] = ("qkv", "ffn1")
# The deferred layer's residual GEMMs that build their addend (bias + LN(residual)) before
# their PDL wait (``kernels.deferred.residual_linear``'s ``settled``): the out-projection's
# residual comes from the previous layer's FFN2 (QKV and attention between), FFN2's from
# the out-projection (FFN1 between). v32's timeline (H200, 2026-12-01, BERT-base 1x128
# calibrated FP8): each FFN2 program spent 1.84 us of its ~4.7 after the wait building it
# (528 instructions with 5 barriers between the product and the atomic adds; 43 without).
# Graph replay, ms, after-product -> FFN2 settled (``benchmarks/settled_sweep.sh``): FP8
# 1x128 0.2494 -> 0.2448, 2x64 0.2493 -> 0.2450, 4x32 0.2504 -> 0.2458, 8x16 0.2625 ->
# 0.2573; the shipped MiniLM's shape in fp16 0.1040 -> 0.1008. The out-projection settled
# lost (1x128 0.3033, 2x64 0.2876, 4x32 0.2885; 8x16 0.2605): its 32x32 mma.sync tiles
# held the addend through the K loop (72 -> 94 registers) and FFN1's programs, launched
# during it, ran two to an SM. ("out" stays an option, tested.)
SETTLED_RESIDUAL_GEMMS: tuple[str, ...] = ("ffn2",)

# Tiles and K splits of one GEMM: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages[, loads]),
# splits (``kernels.matmul.GemmConfig``; the optional ``loads`` only for ``linear``).
GemmPlan = tuple[tuple[int, ...], int]


@dataclass(frozen=True)
class EncodeOptions:
    """How :func:`encode_packed` runs; the defaults are the engine's.

    ``gemm_plans`` overrides the small-batch plan of GEMMs by name (``qkv``, ``out``,
    ``ffn1``, ``ffn2``); ``attn_config`` imposes attention tiles; ``attn_tile_list`` lets
    the large path launch attention over a tile list (``kernels.attention_tiles``, built
    once per pass) where that saves programs. ``deferred_ln_max_hidden``
    runs the small-batch path without LayerNorm kernels for models up to that hidden size
    (where the weights have folded copies). ``persistent`` runs the batches the small-batch
    path takes, if at most ``persistent_max_tokens`` tokens, as one persistent kernel
    (``kernels.persistent``) where the op set and the weights support it (measured slower
    than the separate kernels; see ``NOTES.md``, v4b). ``fp8_static_inputs`` names the
    GEMMs (of ``calibration.GEMMS``) whose input a calibrated pass quantizes with its
    calibrated per-tensor scale; the others keep a scale per token, as uncalibrated FP8
    has them (QKV and FFN row-scaled, the attention output in the model dtype). The
    default leaves out the attention output (``FP8_STATIC_INPUTS``).
    ``cutlass_small_gemms`` (of ``small_gemm.GEMMS``) runs those GEMMs of the seven-kernel
    small-batch layer as CUTLASS kernels (``engine.fused.small_gemm``; the engine checks
    that they can run). The seven-kernel layer's Triton QKV GEMM lets attention launch
    (PDL) only after its K loop, not before it, in batches of at least
    ``qkv_late_release_min_seqs`` sequences (None: never). ``late_release`` names kernels
    of either small-batch layer (of ``LATE_RELEASE_KERNELS``) that do so in every batch:
    their Triton kernels let the next kernel launch after their main loop (the K loop;
    attention and the LayerNorms after their stores), not right after their wait. The
    CUTLASS kernels keep their own placement. ``fp8_deferred`` runs the deferred layer's
    QKV, FFN1 and FFN2 on e4m3 operands where the weights have them (``folded8``, from a
    calibration that recorded the un-normalised inputs). ``early_weights`` names the
    deferred layer's GEMMs (of ``EARLY_WEIGHT_GEMMS``) whose programs load their whole
    weight slice before their PDL wait, where it fits
    (``kernels.deferred.early_weights_fit``), on e4m3 or 16-bit operands.
    ``attn_grid`` sizes the deferred layer's attention grid: ``"table"`` gives each
    sequence the query blocks ``dispatch.QUERY_BLOCKS`` has for the layer and the bucket's
    sequence count (more than its longest sequence needs: their programs do nothing),
    ``"fewest"`` never more, and a number at least that many blocks (an A/B and sweep
    knob). ``int8_gemms`` (of ``calibration.INT8_GEMMS``) run in int8 on calibrated
    large-path passes of at least ``int8_min_tokens`` tokens (those the pass runs: under a
    CUDA graph its bucket's, padding included, as for ``fp8_calibrated_min_tokens``);
    shorter passes keep their e4m3 (or 16-bit) forms.
    """

    fp8_out_dtype: torch.dtype | None = None
    fp8_min_tokens: int = FP8_MIN_TOKENS
    fp8_calibrated_min_tokens: int = FP8_CALIBRATED_MIN_TOKENS
    fp8_fast_accum: bool = True
    fp8_static_inputs: tuple[str, ...] = FP8_STATIC_INPUTS
    ffn1_fused_max_tokens: int | None = FFN1_FUSED_MAX_TOKENS
    small_batch_max_tokens: int | None = SMALL_BATCH_MAX_TOKENS
    pdl: bool = True
    prefetch: bool = True
    persistent: bool = False
    persistent_max_tokens: int = 256
    deferred_ln_max_hidden: int | None = DEFERRED_LN_MAX_HIDDEN
    attn_config: tuple[int, int, int, int] | None = None
    attn_tile_list: bool = True
    gemm_plans: tuple[tuple[str, GemmPlan], ...] = ()
    cutlass_small_gemms: tuple[str, ...] = ()
    qkv_late_release_min_seqs: int | None = QKV_LATE_RELEASE_MIN_SEQS
    late_release: tuple[str, ...] = ()
    fp8_deferred: bool = FP8_DEFERRED
    early_weights: tuple[str, ...] = EARLY_WEIGHTS
    attn_grid: int | str = "table"
    int8_gemms: tuple[str, ...] = ()
    int8_min_tokens: int = 0


def _linear(x: torch.Tensor | None, xq: Quantized | None, lin: Linear,
            fp8_out: torch.dtype, fast_accum: bool) -> torch.Tensor:
    """``x @ W^T`` without bias: FP8 when the activation comes with an e4m3 copy (and the
    weight has one), else 16-bit: the tuned table's cuBLASLt configuration where it has one
    for the shape on this GPU (``cublaslt.tuned_half_linear``), else ``torch.mm``."""
    if xq is not None and lin.w8 is not None and lin.w8_scale is not None:
        return scaled_linear(xq, lin.w8, lin.w8_scale, fp8_out, fast_accum)
    assert x is not None, "activation only exists as FP8 but the weight has no FP8 copy"
    tuned = cublaslt.tuned_half_linear(x, lin.weight)
    return torch.mm(x, lin.weight.t()) if tuned is None else tuned


def _add_linear(acc: torch.Tensor, x: torch.Tensor, lin: Linear) -> torch.Tensor:
    """``acc += x @ W^T`` in place, without bias: cuBLAS reads ``acc`` as its C (beta = 1),
    a GEMM that adds the residual."""
    return acc.addmm_(x, lin.weight.t())


def _small_batch(w: BertQAWeights, ops: ModuleType, tokens: int, use8: bool,
                 opts: EncodeOptions) -> bool:
    cfg = w.config
    return (opts.small_batch_max_tokens is not None
            and tokens <= opts.small_batch_max_tokens
            and not use8
            and w.dtype in (torch.float16, torch.bfloat16)
            and ops.gemm_supported(cfg.hidden_size)
            and ops.gemm_supported(cfg.intermediate_size))


def encode_packed(
    w: BertQAWeights,
    ops: ModuleType,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    n_seqs: int,
    max_seqlen: int,
    opts: EncodeOptions = EncodeOptions(),
    stage: bool = False,
) -> torch.Tensor:
    """QA logits float32 [2, T] (start row, end row) of packed int32 token tensors.

    ``ops`` is ``engine.fused.kernels`` (Triton) or ``engine.fused.torch_ops`` (PyTorch):
    the same functions with the same contracts.

    ``n_seqs``/``max_seqlen`` may over-state the batch (see ``attention_varlen``); tokens
    outside every sequence get logits too, which callers ignore. ``stage``: the pass is
    a graph capture whose first kernel, the embeddings', stages each call's inputs
    (``kernels.STAGE_ARGS``; not with the persistent kernel).
    """
    cfg = w.config
    eps = cfg.layer_norm_eps
    act = "gelu_tanh" if cfg.gelu == "tanh" else "gelu"
    tokens = input_ids.shape[0]
    layers = w.layers
    cal = w.calibrated if tokens >= opts.fp8_calibrated_min_tokens else None
    use8 = w.fp8 and (cal is not None or tokens >= opts.fp8_min_tokens)
    fast = opts.fp8_fast_accum
    small = _small_batch(w, ops, tokens, use8, opts)
    # PDL on the small-batch path only: on the large path a Triton kernel that may start
    # early sits on multiprocessors the cuBLAS GEMM before it still needs (H200,
    # 2026-11-30: BERT-large 1x384 1.479 ms with it, 1.218 without; mix -1 to -2%).
    pdl = small and opts.pdl and ops.pdl_available(input_ids)
    pf = pdl and opts.prefetch
    late = opts.late_release
    d, f = cfg.hidden_size, cfg.intermediate_size
    plans = dict(opts.gemm_plans)

    def plan(name: str, n: int, k: int, partial: bool) -> GemmPlan:
        return plans.get(name) or ops.small_batch_plan(tokens, n, k, partial)

    if (small and opts.persistent and tokens <= opts.persistent_max_tokens
            and ops.persistent_supported(w)):
        if stage:
            raise ValueError("the persistent kernel does not stage a graph's inputs")
        return ops.encode_persistent(  # type: ignore[no-any-return]
            w, input_ids, token_type_ids, position_ids, cu_seqlens, n_seqs, max_seqlen)
    if (small and w.folded is not None and opts.deferred_ln_max_hidden is not None
            and d <= opts.deferred_ln_max_hidden):
        return _encode_deferred(w, ops, input_ids, token_type_ids, position_ids, cu_seqlens,
                                n_seqs, max_seqlen, opts, pdl, stage)
    if small:
        (c_qkv, _), (c_out, s_out) = plan("qkv", 3 * d, d, False), plan("out", d, d, True)
        late_qkv = "qkv" in late or (opts.qkv_late_release_min_seqs is not None
                                     and n_seqs >= opts.qkv_late_release_min_seqs)
        (c_ff1, _), (c_ff2, s_ff2) = plan("ffn1", f, d, False), plan("ffn2", d, f, True)
    fuse_ffn1 = small or (opts.ffn1_fused_max_tokens is not None
                          and tokens <= opts.ffn1_fused_max_tokens
                          and w.dtype in (torch.float16, torch.bfloat16)
                          and ops.gemm_supported(d))
    out8 = opts.fp8_out_dtype or w.dtype

    static = frozenset(opts.fp8_static_inputs) if cal is not None else frozenset()
    # int8 GEMMs (engine.fused.int8) on calibrated large passes: the out-projection, and
    # FFN1 where it is the one calibrated GEMM (its input and FFN2's static)
    i8 = w.int8 if cal is not None and not small and opts.int8_gemms else None
    if cal is not None and not small and opts.int8_gemms and i8 is None:
        raise ValueError("int8_gemms needs a calibration with per-channel input magnitudes, "
                         "loaded by the engine that asks for them")
    if tokens < opts.int8_min_tokens:
        i8 = None
    int8_out = i8 is not None and "attn_out" in opts.int8_gemms
    int8_ffn1 = (i8 is not None and "ffn_in" in opts.int8_gemms
                 and {"ffn_in", "ffn_out"} <= static)
    # the sum residual: with 16-bit (or int8) out-projections and FFN1 both e4m3 or both
    # int8 (its int8 copy comes from layernorm_quant then)
    sum_residual = (OUT_PROJ_ADDS_RESIDUAL and not small and cal is not None
                    and "attn_out" not in static and {"ffn_in", "ffn_out"} <= static
                    and int8_out == int8_ffn1)

    def wants8(lin: Linear) -> bool:  # does this GEMM take an e4m3 activation?
        return cal is not None or (use8 and lin.w8 is not None)

    def x_scale(i: int, gemm: str) -> torch.Tensor | None:  # a static input's scale
        return getattr(cal[i], gemm).x_scale if gemm in static and cal is not None else None

    def large(i: int, gemm: str, x: torch.Tensor | None, xq: Quantized | None,
              lin: Linear) -> torch.Tensor:  # a large-path GEMM, static or per token
        if gemm in static and cal is not None:
            assert xq is not None
            return static_linear(xq, getattr(cal[i], gemm), out8, fast)
        return _linear(x, xq, lin, out8, fast)

    x, xq = ops.embed_layernorm(
        input_ids, token_type_ids, position_ids, w.word_embeddings, w.position_embeddings,
        w.token_type_embeddings, w.emb_ln_weight, w.emb_ln_bias, eps,
        fp8=wants8(layers[0].qkv), pdl=pdl, fp8_blocks=w.fp8_blocks,
        fp8_scale=x_scale(0, "qkv"), stage=cu_seqlens if stage else None,
    )
    tiles = (ops.attention_tiles(cu_seqlens, tokens, n_seqs, max_seqlen, cfg.num_heads,
                                 d // cfg.num_heads, config=opts.attn_config)
             if opts.attn_tile_list and not small else None)
    for i, layer in enumerate(layers):
        if small and "qkv" in opts.cutlass_small_gemms:
            qkv = small_gemm.linear(x, layer.qkv.weight, pdl=pdl)
        elif small:
            qkv = ops.linear(x, layer.qkv.weight, config=c_qkv, pdl=pdl, prefetch=pf,
                             late_release=late_qkv)
        else:
            qkv = large(i, "qkv", x, xq, layer.qkv)
        ctx_scale = None if int8_out else x_scale(i, "attn_out")
        ctx8 = {"int8_mult": i8[i].attn_out.mult} if int8_out and i8 is not None else {}
        ctx = ops.attention_varlen(qkv, layer.qkv.bias, cu_seqlens, max_seqlen, n_seqs,
                                   cfg.num_heads, config=opts.attn_config, pdl=pdl,
                                   prefetch=pf, fp8_scale=ctx_scale, tiles=tiles,
                                   late_release="attention" in late, **ctx8)
        res: torch.Tensor | SumResidual
        if sum_residual:  # x is read by nothing after this: the sum overwrites it
            copy: dict[str, Any]  # FFN1's input copy: int8 or e4m3
            if int8_out and i8 is not None:
                s = int8_linear(ctx, i8[i].attn_out, w.dtype, addend=x,
                                config=GEMM_CONFIGS["attn_out"])
                copy = {"int8_mult": i8[i].ffn_in.mult}
            else:
                s = _add_linear(x, ctx, layer.attn_out)
                copy = {"fp8_blocks": w.fp8_blocks, "fp8_scale": x_scale(i, "ffn_in")}
            xq, moments = ops.layernorm_quant(s, layer.attn_out.bias, layer.ln1_weight,
                                              layer.ln1_bias, eps, **copy)
            res = SumResidual(s, moments, layer.attn_out.bias, layer.ln1_weight,
                              layer.ln1_bias)
        else:
            if small:
                a = ops.linear(ctx, layer.attn_out.weight, splits=s_out, config=c_out,
                               pdl=pdl, prefetch=pf, late_release="out" in late)
            elif int8_out and i8 is not None:
                a = int8_linear(ctx, i8[i].attn_out, w.dtype,
                                config=GEMM_CONFIGS["attn_out"])
            else:
                a = large(i, "attn_out", ctx, None if ctx_scale is None
                          else Quantized(ctx, ctx_scale), layer.attn_out)
            x8 = {"int8_mult": i8[i].ffn_in.mult} if int8_ffn1 and i8 is not None else {}
            x, xq = ops.bias_residual_layernorm(
                a, layer.attn_out.bias, x, layer.ln1_weight, layer.ln1_bias, eps,
                fp8=wants8(layer.ffn_in), pdl=pdl, fp8_blocks=w.fp8_blocks,
                fp8_scale=None if x8 else x_scale(i, "ffn_in"), late_release="ln1" in late,
                **x8,
            )
            res = x
        if int8_ffn1 and i8 is not None and cal is not None:
            # One int8 GEMM: FFN1 + bias + GELU + e4m3 (FFN2's calibrated input).
            assert xq is not None
            h, hq = None, Quantized(int8_linear(
                xq.data, i8[i].ffn_in, FP8_DTYPE, bias=cal[i].b1, gelu=True,
                out_scale=cal[i].h_inv, config=GEMM_CONFIGS["ffn_in"]), cal[i].ffn_out.x_scale)
        elif cal is not None and {"ffn_in", "ffn_out"} <= static:
            # One GEMM: FFN1 + bias + GELU + e4m3, calibrated scales.
            assert xq is not None
            h, hq = None, calibrated_ffn1(xq, cal[i], fast)
        elif small and "ffn1" in opts.cutlass_small_gemms:
            h, hq = small_gemm.linear(x, layer.ffn_in.weight, layer.ffn_in.bias, gelu=True,
                                      pdl=pdl), None
        elif fuse_ffn1 and not wants8(layer.ffn_in) and not wants8(layer.ffn_out):
            h, hq = ops.linear(x, layer.ffn_in.weight, layer.ffn_in.bias, act=act,
                               config=c_ff1 if small else None, pdl=pdl, prefetch=pf,
                               late_release="ffn1" in late), None
        else:
            h = large(i, "ffn_in", x, xq, layer.ffn_in)
            h, hq = ops.bias_gelu(h, layer.ffn_in.bias, fp8=wants8(layer.ffn_out),
                                  tanh=act == "gelu_tanh", out_dtype=w.dtype,
                                  fp8_blocks=w.fp8_blocks, fp8_scale=x_scale(i, "ffn_out"))
        if small:
            a = ops.linear(h, layer.ffn_out.weight, splits=s_ff2, config=c_ff2, pdl=pdl,
                           prefetch=pf, late_release="ffn2" in late)
        else:
            a = large(i, "ffn_out", h, hq, layer.ffn_out)
        if i == len(layers) - 1:
            return ops.bias_residual_layernorm_qa(  # type: ignore[no-any-return]
                a, layer.ffn_out.bias, res, layer.ln2_weight, layer.ln2_bias, eps,
                w.qa_weight, w.qa_bias, pdl=pdl,
            )
        x, xq = ops.bias_residual_layernorm(
            a, layer.ffn_out.bias, res, layer.ln2_weight, layer.ln2_bias, eps,
            fp8=wants8(layers[i + 1].qkv), pdl=pdl,
            fp8_blocks=w.fp8_blocks, fp8_scale=x_scale(i + 1, "qkv"),
            late_release="ln2" in late,
        )
    raise ValueError("a BERT encoder needs at least one layer")


def _attention_seqlen(ops: ModuleType, w: BertQAWeights, opts: EncodeOptions, tokens: int,
                     n_seqs: int, max_seqlen: int, e4m3: bool, device: torch.device) -> int:
    """The ``max_seqlen`` the deferred layer's attention grid is sized for: the batch's,
    or whole query blocks past it per ``attn_grid``: a number of blocks, or the count
    ``dispatch.QUERY_BLOCKS`` has for the layer and this pass's token and sequence counts
    (under CUDA graphs the bucket's; an eager pass of other counts finds no entry). The
    torch spec sizes no grid."""
    config_of = getattr(ops, "attention_config", None)
    if opts.attn_grid == "fewest" or config_of is None or n_seqs == 0 or max_seqlen == 0:
        return max_seqlen
    cfg = w.config
    if isinstance(opts.attn_grid, int):
        wanted = opts.attn_grid
    else:  # the table's count, 0 where it has none
        key = (dispatch.multiprocessors(device), cfg.hidden_size, cfg.num_heads,
               cfg.intermediate_size, tokens, e4m3)
        wanted = dispatch.query_blocks(n_seqs, key)
        if wanted == 0:
            return max_seqlen
    bm = (opts.attn_config or config_of(max_seqlen, n_seqs, cfg.num_heads,
                                        cfg.hidden_size // cfg.num_heads, tokens))[0]
    return wanted * bm if wanted > -(-max_seqlen // bm) else max_seqlen


def _encode_deferred(
    w: BertQAWeights,
    ops: ModuleType,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    n_seqs: int,
    max_seqlen: int,
    opts: EncodeOptions,
    pdl: bool,
    stage: bool = False,
) -> torch.Tensor:
    """The small-batch pass with every LayerNorm deferred to the GEMMs around it: per layer

        qkv = LN_prev(z_prev) @ Wqkv^T                  folded
        ctx = attention(qkv + bqkv')
        y   = ctx @ Wo^T + bo + LN_prev(z_prev)         un-normalised, model dtype; + sums
        h   = gelu(LN1(y) @ W1^T + b1)                  folded
        z  += h @ W2^T + b2 + LN1(y)                    split-K atomics, float32; + sums

    and LN2(z) of the last layer goes to the QA head. With ``opts.fp8_deferred`` and
    e4m3 layers (``w.folded8``) QKV, FFN1 and FFN2 multiply e4m3 operands: ``z`` and ``y``
    also get e4m3 copies from whoever writes them, and FFN1 writes ``h`` in e4m3 only.
    LayerNorm moments come from each
    row's (sum, sum of squares), added up by the GEMM that produced the row. Per layer
    parity ``p`` a scratch row holds ``z``, its sums, ``y``'s sums and FFN2's tile
    counters; layer ``i``'s QKV zeroes scratch ``i % 2``, which layer ``i - 2`` filled and
    nothing reads after layer ``i - 1``'s out-projection. (Zeroing it all once before the
    pass measured slower: by the time FFN2 adds into it, the weight streams have evicted
    it from L2.) The embeddings' sum is "layer -1" (scratch 1).
    """
    assert w.folded is not None
    cfg = w.config
    eps = cfg.layer_norm_eps
    act = "gelu_tanh" if cfg.gelu == "tanh" else "gelu"
    t = input_ids.shape[0]
    d, f = cfg.hidden_size, cfg.intermediate_size
    pf = pdl and opts.prefetch
    late = opts.late_release
    plans = dict(opts.gemm_plans)
    f8s = w.folded8 if opts.fp8_deferred else None
    early = opts.early_weights
    attn_seqlen = _attention_seqlen(ops, w, opts, t, n_seqs, max_seqlen, f8s is not None,
                                    input_ids.device)
    early_tail = dispatch.early_tail(n_seqs, f8s is not None)

    def plan(name: str, n: int, k: int, kind: str) -> GemmPlan:
        return plans.get(name) or ops.deferred_plan(t, n, k, kind, f8s is not None
                                                    and name != "out")

    (c_qkv, _), (c_out, _) = plan("qkv", 3 * d, d, "folded"), plan("out", d, d, "residual")
    (c_ff1, _), (c_ff2, s_ff2) = plan("ffn1", f, d, "folded"), plan("ffn2", d, f, "accumulate")
    tiles = -(-t // 32) * -(-d // 32)  # FFN2's output tiles, at most (32x32 the smallest)
    scratch = torch.empty((2, t * d + 4 * t + tiles), device=input_ids.device,
                          dtype=torch.float32)
    z32 = [scratch[p, : t * d].view(t, d) for p in (0, 1)]
    z_sums = [scratch[p, t * d: t * d + 2 * t].view(t, 2) for p in (0, 1)]
    y_sums = [scratch[p, t * d + 2 * t: t * d + 4 * t].view(t, 2) for p in (0, 1)]
    counters = [scratch[p, t * d + 4 * t:].view(torch.int32) for p in (0, 1)]
    z16 = torch.empty((t, d), device=input_ids.device, dtype=w.dtype)
    z8 = y8 = None
    if f8s is not None:
        z8, y8 = (torch.empty((t, d), device=input_ids.device, dtype=torch.float8_e4m3fn)
                  for _ in range(2))
    ops.embed_sum(input_ids, token_type_ids, position_ids, w.word_embeddings,
                  w.position_embeddings, w.token_type_embeddings, z32[1], z16, z_sums[1],
                  pdl=pdl, z8=z8, inv8=f8s[0].qkv_inv if f8s is not None else None,
                  stage=cu_seqlens if stage else None)
    ln_g, ln_b = w.emb_ln_weight, w.emb_ln_bias

    def folded(x: torch.Tensor, x8: torch.Tensor | None, lin: FoldedLinear,
               lin8: FoldedFP8 | None, *args: Any, **kw: Any) -> torch.Tensor:
        """QKV or FFN1: on 16-bit operands, or (``lin8``) on e4m3 ones (input ``x8``)."""
        if lin8 is None:
            return ops.folded_linear(x, lin.weight, lin.colsum, *args, **kw)  # type: ignore[no-any-return]
        return ops.folded_linear(x8, lin8.w8, lin8.colsum, *args, scale=lin8.scale, **kw)  # type: ignore[no-any-return]

    for i, (layer, fold) in enumerate(zip(w.layers, w.folded, strict=True)):
        p, q = i % 2, (i + 1) % 2  # this layer's scratch, the previous one's
        f8 = f8s[i] if f8s is not None else None
        nxt = f8s[i + 1] if f8s is not None and i + 1 < len(f8s) else None
        qkv = folded(z16, z8, fold.qkv, f8.qkv if f8 else None, None, z_sums[q], eps,
                     zero=scratch[p], config=c_qkv, pdl=pdl, prefetch=pf,
                     late_release="qkv" in late, out_dtype=w.dtype, early="qkv" in early)
        ctx = ops.attention_varlen(qkv, fold.qkv.bias, cu_seqlens, attn_seqlen, n_seqs,
                                   cfg.num_heads, config=opts.attn_config, pdl=pdl,
                                   prefetch=pf, late_release="attention" in late,
                                   early_tail=early_tail)
        y = ops.residual_linear(ctx, layer.attn_out.weight, layer.attn_out.bias, z32[q],
                                z_sums[q], ln_g, ln_b, eps, y_sums[p], config=c_out, pdl=pdl,
                                prefetch=pf, late_release="out" in late, out8=y8,
                                inv8=f8.ffn_in_inv if f8 else None, early="out" in early,
                                settled="out" in SETTLED_RESIDUAL_GEMMS)
        h = folded(y, y8, fold.ffn_in, f8.ffn_in if f8 else None, fold.ffn_in.bias, y_sums[p],
                   eps, act=act, config=c_ff1, pdl=pdl, prefetch=pf,
                   late_release="ffn1" in late, out_inv=f8.ffn_out_inv if f8 else None,
                   early="ffn1" in early)
        ops.residual_linear(h, f8.ffn_out_w8 if f8 else layer.ffn_out.weight,
                            layer.ffn_out.bias, y, y_sums[p], layer.ln1_weight,
                            layer.ln1_bias, eps, z_sums[p], out=z32[p], out16=z16,
                            counters=counters[p], splits=s_ff2, config=c_ff2, pdl=pdl,
                            prefetch=pf, late_release="ffn2" in late,
                            scale=f8.ffn_out_scale if f8 else None,
                            out8=z8 if nxt else None, inv8=nxt.qkv_inv if nxt else None,
                            early="ffn2" in early, settled="ffn2" in SETTLED_RESIDUAL_GEMMS)
        ln_g, ln_b = layer.ln2_weight, layer.ln2_bias
    return ops.layernorm_qa(z32[(len(w.layers) - 1) % 2], ln_g, ln_b, eps,  # type: ignore[no-any-return]
                            w.qa_weight, w.qa_bias, pdl=pdl)
