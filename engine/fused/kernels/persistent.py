# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""The whole encoder of a small batch in one persistent kernel.

At a few hundred tokens a BERT layer is ~7 dependent steps of a few microseconds each,
and a kernel boundary costs about as much as the step (PDL hides the launch, not the
drain and refill). Here one program per multiprocessor runs every step of every layer,
separated by grid-wide barriers. Phases (``p``): 0 embeddings + LayerNorm, then per layer ``7 l + 1 ..
7 l + 7``: QKV GEMM, attention, attention-output GEMM (split-K partials), bias + residual
+ LayerNorm, FFN1 GEMM + bias + GELU, FFN2 GEMM (split-K partials), bias + residual +
LayerNorm (last layer: + the QA head). Each phase is a grid-stride loop over its tasks,
and the tasks are the same ``@jit`` functions the separate kernels run
(``gemm_tile``, ``attention_tile``, ``embed_ln_rows``, ``residual_ln_rows``).

**Barrier.** A monotonic counter (zeroed before each launch): after phase ``p`` each
program adds one (release, GPU scope) and spins until it reads ``(p + 1) * programs``,
then fences (acquire). The programs must all be resident at once: the grid is one program
per multiprocessor, each fits on one, and the launch is cooperative where triton offers
it. Activations are read past L1 (``.cg``) because other programs rewrite them every
layer.

**CPU interpreter.** The interpreter runs programs one after another, so a barrier would
wait forever: there the launcher runs one launch per phase with the barrier compiled out
(``USE_BARRIER=False``). The phase code is identical, which is what CI tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.fused.dispatch import multiprocessors
from engine.fused.kernels.attention import ATTN_SMALL, attention_tile, head_block, softmax_scale
from engine.fused.kernels.matmul import EPI_GELU, EPI_PARTIAL, EPI_STORE, gemm_tile, small_batch_plan
from engine.fused.kernels.rows import embed_ln_rows, residual_ln_rows
from engine.fused.weights import BertQAWeights, flat_strides

PHASES_PER_LAYER = 7
_PPL = tl.constexpr(PHASES_PER_LAYER)  # globals a @triton.jit function reads: constexpr


@triton.jit
def _fence_acq_rel_gpu():
    tl.inline_asm_elementwise("fence.acq_rel.gpu; // dummy $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _grid_barrier(bar_ptr, target):
    """Wait until every program has arrived here (the counter reaches ``target``)."""
    tl.debug_barrier()  # this program's writes happen before its arrival
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.load(bar_ptr, volatile=True)
    while seen < target:
        seen = tl.load(bar_ptr, volatile=True)
    _fence_acq_rel_gpu()
    tl.debug_barrier()


@triton.jit
def _gemm_phase(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, pid, nprog,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLITS: tl.constexpr,
                EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, TANH: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    tiles = num_m * tl.cdiv(N, BN)
    k_len = K // SPLITS
    for t in range(pid, tiles * SPLITS, nprog):
        split = t // tiles
        tile = t - split * tiles
        gemm_tile(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, split * k_len, k_len,
                  tile % num_m, tile // num_m, split, BM, BN, BK, EPILOGUE, HAS_BIAS, TANH)


@triton.jit
def _encoder_kernel(
    ids_ptr, tt_ptr, pos_ptr, cu_ptr,
    word_ptr, posemb_ptr, type_ptr, emb_g_ptr, emb_b_ptr,
    mats_ptr, vecs_ptr, qa_w_ptr, qa_b_ptr,
    x_ptr, qkv_ptr, ctx_ptr, part_ptr, h_ptr, logits_ptr, bar_ptr,
    T, n_seqs, max_seqlen, n_layers, phase_lo, phase_hi, D, F, mat_stride, vec_stride, eps,
    qk_scale,
    H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr, ATT_BM: tl.constexpr, ATT_BN: tl.constexpr,
    QKV_BM: tl.constexpr, QKV_BN: tl.constexpr, QKV_BK: tl.constexpr,
    OUT_BM: tl.constexpr, OUT_BN: tl.constexpr, OUT_BK: tl.constexpr, OUT_S: tl.constexpr,
    FF1_BM: tl.constexpr, FF1_BN: tl.constexpr, FF1_BK: tl.constexpr,
    FF2_BM: tl.constexpr, FF2_BN: tl.constexpr, FF2_BK: tl.constexpr, FF2_S: tl.constexpr,
    TANH: tl.constexpr, USE_BARRIER: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    split_stride = T * D
    for p in range(phase_lo, phase_hi):
        if p == 0:
            for r0 in range(pid * ROWS, T, nprog * ROWS):
                embed_ln_rows(r0 + tl.arange(0, ROWS), ids_ptr, tt_ptr, pos_ptr, T, word_ptr,
                              posemb_ptr, type_ptr, emb_g_ptr, emb_b_ptr, x_ptr, x_ptr, x_ptr,
                              T, D, eps, BLOCK_D, False)
        else:
            layer = (p - 1) // _PPL
            j = (p - 1) - layer * _PPL
            mw = mats_ptr + layer * mat_stride  # < 2**31 elements for BERT-large
            vw = vecs_ptr + layer * vec_stride
            if j == 0:  # QKV = x Wqkv^T (biases are added inside attention)
                _gemm_phase(x_ptr, mw, vw, qkv_ptr, T, 3 * D, D, pid, nprog,
                            QKV_BM, QKV_BN, QKV_BK, 1, EPI_STORE, False, TANH)
            elif j == 1:  # attention, one task per (query block, sequence, head)
                n_tasks = tl.cdiv(max_seqlen, ATT_BM) * n_seqs * H
                for t in range(pid, n_tasks, nprog):
                    head = t % H
                    rest = t // H
                    attention_tile(qkv_ptr, vw, ctx_ptr, cu_ptr, rest // n_seqs, rest % n_seqs,
                                   head, qk_scale, 3 * D, D, D, HEAD_DIM, BLOCK_DH, ATT_BM, ATT_BN)
            elif j == 2:  # attention output projection: split-K partials
                _gemm_phase(ctx_ptr, mw + 3 * D * D, vw, part_ptr, T, D, D, pid, nprog,
                            OUT_BM, OUT_BN, OUT_BK, OUT_S, EPI_PARTIAL, False, TANH)
            elif j == 3:  # x = LN(sum of partials + bo + x), in place
                for r0 in range(pid * ROWS, T, nprog * ROWS):
                    residual_ln_rows(r0 + tl.arange(0, ROWS), part_ptr, vw + 3 * D, x_ptr,
                                     vw + 4 * D, vw + 5 * D, x_ptr, x_ptr, x_ptr, qa_w_ptr,
                                     qa_b_ptr, logits_ptr, T, T, split_stride, D, eps,
                                     BLOCK_D, OUT_S, False, False, False)
            elif j == 4:  # h = GELU(x W1^T + b1)
                _gemm_phase(x_ptr, mw + 4 * D * D, vw + 6 * D, h_ptr, T, F, D, pid, nprog,
                            FF1_BM, FF1_BN, FF1_BK, 1, EPI_GELU, True, TANH)
            elif j == 5:  # FFN2: split-K partials
                _gemm_phase(h_ptr, mw + 4 * D * D + D * F, vw, part_ptr, T, D, F, pid, nprog,
                            FF2_BM, FF2_BN, FF2_BK, FF2_S, EPI_PARTIAL, False, TANH)
            else:  # x = LN(sum of partials + b2 + x); the last layer gives the QA logits
                last = layer == n_layers - 1
                for r0 in range(pid * ROWS, T, nprog * ROWS):
                    rows = r0 + tl.arange(0, ROWS)
                    if last:
                        residual_ln_rows(rows, part_ptr, vw + 6 * D + F, x_ptr, vw + 7 * D + F,
                                         vw + 8 * D + F, x_ptr, x_ptr, x_ptr, qa_w_ptr, qa_b_ptr,
                                         logits_ptr, T, T, split_stride, D, eps,
                                         BLOCK_D, FF2_S, False, True, False)
                    else:
                        residual_ln_rows(rows, part_ptr, vw + 6 * D + F, x_ptr, vw + 7 * D + F,
                                         vw + 8 * D + F, x_ptr, x_ptr, x_ptr, qa_w_ptr, qa_b_ptr,
                                         logits_ptr, T, T, split_stride, D, eps,
                                         BLOCK_D, FF2_S, False, False, False)
        if USE_BARRIER:  # noqa: SIM102 (constexpr test, then a run-time one)
            if p + 1 < phase_hi:
                _grid_barrier(bar_ptr, (p + 1 - phase_lo) * nprog)


def persistent_supported(w: BertQAWeights) -> bool:
    """Whether :func:`encode_persistent` can run these weights (flat fp16/bf16 layers,
    dimensions in whole 128-element tiles, a power-of-two head size up to 128)."""
    cfg = w.config
    strides = flat_strides(cfg.hidden_size, cfg.intermediate_size)
    return (w.flat is not None and tuple(w.flat.mats.shape[1:] + w.flat.vecs.shape[1:]) == strides
            and w.dtype in (torch.float16, torch.bfloat16)
            and cfg.hidden_size % 128 == 0 and cfg.intermediate_size % 128 == 0
            and cfg.head_dim in (16, 32, 64, 128))


def encode_persistent(
    w: BertQAWeights,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    n_seqs: int,
    max_seqlen: int,
    programs: int | None = None,
    barrier: bool | None = None,
) -> torch.Tensor:
    """QA logits float32 [2, T] of a packed batch, the whole encoder in one launch.

    ``programs`` defaults to the multiprocessor count (CUDA) or 4 (CPU interpreter);
    ``barrier`` (default: on CUDA) runs all phases in one launch; off, each phase is its
    own launch (the interpreter's mode, also usable on a GPU to rule the barrier out).
    """
    cfg = w.config
    assert w.flat is not None
    t, d, f = input_ids.shape[0], cfg.hidden_size, cfg.intermediate_size
    strides = (w.flat.mats.stride(0), w.flat.vecs.stride(0))  # elements per layer
    dev = input_ids.device
    on_gpu = dev.type == "cuda"
    programs = programs or (multiprocessors(dev) if on_gpu else 4)
    barrier = on_gpu if barrier is None else barrier
    # The separate kernels' tiles and splits (warps and stages are the kernel's own).
    qkv_t, _ = small_batch_plan(t, 3 * d, d, False, programs)
    out_t, out_s = small_batch_plan(t, d, d, True, programs)
    ff1_t, _ = small_batch_plan(t, f, d, False, programs)
    ff2_t, ff2_s = small_batch_plan(t, d, f, True, programs)
    x = torch.empty((t, d), device=dev, dtype=w.dtype)
    qkv = torch.empty((t, 3 * d), device=dev, dtype=w.dtype)
    ctx = torch.empty((t, d), device=dev, dtype=w.dtype)
    part = torch.empty((max(out_s, ff2_s), t, d), device=dev, dtype=torch.float32)
    h = torch.empty((t, f), device=dev, dtype=w.dtype)
    logits = torch.empty((2, t), device=dev, dtype=torch.float32)
    bar = torch.zeros(1, device=dev, dtype=torch.int32)
    if t == 0:
        return logits
    n_phases = 1 + PHASES_PER_LAYER * cfg.num_layers
    spans = [(0, n_phases)] if barrier else [(p, p + 1) for p in range(n_phases)]
    for lo, hi in spans:
        _encoder_kernel[(programs,)](
            input_ids, token_type_ids, position_ids, cu_seqlens,
            w.word_embeddings, w.position_embeddings, w.token_type_embeddings,
            w.emb_ln_weight, w.emb_ln_bias, w.flat.mats, w.flat.vecs, w.qa_weight, w.qa_bias,
            x, qkv, ctx, part, h, logits, bar,
            t, n_seqs, max_seqlen, cfg.num_layers, lo, hi, d, f, *strides, cfg.layer_norm_eps,
            softmax_scale(cfg.head_dim),
            H=cfg.num_heads, HEAD_DIM=cfg.head_dim, BLOCK_DH=head_block(cfg.head_dim),
            BLOCK_D=triton.next_power_of_2(d), ROWS=2, ATT_BM=ATTN_SMALL[0], ATT_BN=ATTN_SMALL[1],
            QKV_BM=qkv_t[0], QKV_BN=qkv_t[1], QKV_BK=qkv_t[2],
            OUT_BM=out_t[0], OUT_BN=out_t[1], OUT_BK=out_t[2], OUT_S=out_s,
            FF1_BM=ff1_t[0], FF1_BN=ff1_t[1], FF1_BK=ff1_t[2],
            FF2_BM=ff2_t[0], FF2_BN=ff2_t[1], FF2_BK=ff2_t[2], FF2_S=ff2_s,
            TANH=cfg.gelu == "tanh", USE_BARRIER=barrier, num_warps=4, num_stages=3,
        )
    return logits
