# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""The fused encoder's OpenAI-Triton kernels, and launchers over torch tensors.

Every kernel computes in float32 and reads/writes whatever float dtype its tensors have
(fp16, bf16, fp32; e4m3 for the optional FP8 copies). Most GEMMs are not here: cuBLAS
(``torch.mm`` / ``torch._scaled_mm``) wins on them, so each kernel below is the epilogue or
prologue that cuBLAS cannot fuse, merged with its neighbours. The exception is FFN1, whose
exact-erf GELU epilogue cuBLAS lacks (cuBLASLt's is the tanh form):

==========================  ==================================================================
``embed_layernorm``          word + position + token-type gather, sum, LayerNorm (+ FP8 copy)
``attention_varlen``         QKV bias, scaled QK^T, online softmax, PV over packed sequences
``bias_gelu``                FFN bias + exact (erf) GELU (+ FP8 copy instead of the fp16 one)
``bias_residual_layernorm``  projection bias + residual add + LayerNorm (+ FP8 copy)
``..._qa``                   the same for the last layer, dotted with the 2-row QA head
``linear_bias_gelu``         FFN1 GEMM with bias + GELU in its epilogue (replaces cuBLAS +
                             ``bias_gelu`` for few tokens, where it measured faster; fp16/bf16)
``splitk_linear``            optional split-K GEMM leaving float32 partials that the two
                             kernels above sum while reading (see ``gemm``)
==========================  ==================================================================

Launchers never synchronise with the device and take every size from the host, so a
whole forward pass can be captured in a CUDA graph. With ``TRITON_INTERPRET=1`` set
before this module is imported, the same kernels run on CPU tensors (for CI).
``torch_ops`` holds the plain-PyTorch spec of each launcher, with the same signature.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.fused.fp8 import FP8_DTYPE, FP8_MAX, SCALE_MIN, Quantized

# Attention tiles (BLOCK_M queries x BLOCK_N keys, warps, pipeline stages). Few programs
# (batch 1): 64-query tiles, so short sequences still spread over more multiprocessors.
# Many programs: 128-query tiles with 8 warps, half the K/V re-reads per query.
ATTN_SMALL = (64, 64, 4, 3)
ATTN_LARGE = (128, 64, 8, 3)
_ATTN_SMALL_PROGRAMS = 4 * 132  # below ~4 waves of an H100/H200, prefer the small tile
# Fused FFN1 GEMM + bias + GELU tiles (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages).
GEMM_GELU_LARGE = (128, 256, 64, 8, 3)
GEMM_GELU_SMALL = (64, 64, 64, 4, 4)  # below ~4 waves of an H100/H200, prefer the small tile
_LOG2E = 1.4426950408889634
# Globals a @triton.jit function reads must be constexpr.
_FP8_MAX = tl.constexpr(FP8_MAX)
_SCALE_MIN = tl.constexpr(SCALE_MIN)


# ----------------------------------------------------------------------------- helpers


@triton.jit
def _round_to_e4m3_grid(x):
    """Round float32 to 3 mantissa bits (nearest even) so the e4m3 cast after it is exact.

    On the GPU the cast alone would round the same way; this makes the result independent
    of the cast's rounding (triton 3.9's interpreter mis-rounds when the mantissa carries
    into the exponent), at a few integer ops per element in a memory-bound kernel.
    """
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # -1048576 == ~0xFFFFF
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _store_rows_fp8(y, mask, rmask, q_ptrs, scale_ptrs):
    """Per-row e4m3 quantization of a [ROWS, COLS] float32 tile (masked lanes hold 0)."""
    amax = tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1)
    scale = tl.maximum(amax / _FP8_MAX, _SCALE_MIN)
    q = tl.minimum(tl.maximum(y / scale[:, None], -_FP8_MAX), _FP8_MAX)
    tl.store(q_ptrs, _round_to_e4m3_grid(q).to(tl.float8e4nv), mask=mask)
    tl.store(scale_ptrs, scale, mask=rmask)


@triton.jit
def _layernorm_rows(x, mask, cols, cmask, g_ptr, b_ptr, D, eps):
    """LayerNorm of each row of a float32 tile whose masked lanes hold 0."""
    mean = tl.sum(x, axis=1) / D
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / D
    rstd = 1.0 / tl.sqrt(var + eps)
    g = tl.load(g_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    return xc * rstd[:, None] * g[None, :] + b[None, :]


# ----------------------------------------------------------------------------- kernels


@triton.jit
def _embed_ln_kernel(
    ids_ptr, tt_ptr, pos_ptr, word_ptr, posemb_ptr, type_ptr, g_ptr, b_ptr,
    out_ptr, q_ptr, qs_ptr,
    n_rows, D, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, FP8_OUT: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    mask = rmask[:, None] & cmask[None, :]
    tok = tl.load(ids_ptr + rows, mask=rmask, other=0).to(tl.int64)
    typ = tl.load(tt_ptr + rows, mask=rmask, other=0).to(tl.int64)
    pos = tl.load(pos_ptr + rows, mask=rmask, other=0).to(tl.int64)
    x = tl.load(word_ptr + tok[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x += tl.load(posemb_ptr + pos[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x += tl.load(type_ptr + typ[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = _layernorm_rows(x, mask, cols, cmask, g_ptr, b_ptr, D, eps)
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    if FP8_OUT:
        _store_rows_fp8(y, mask, rmask, q_ptr + offs, qs_ptr + rows)


@triton.jit
def _residual_ln_kernel(
    a_ptr, bias_ptr, res_ptr, g_ptr, b_ptr,
    out_ptr, q_ptr, qs_ptr,
    qa_w_ptr, qa_b_ptr, logits_ptr,
    n_rows, logits_stride, split_stride, D, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr,
    FP8_OUT: tl.constexpr, QA_HEAD: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    mask = rmask[:, None] & cmask[None, :]
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(1, SPLITS):  # split-K partial sums of the GEMM, if any
        x += tl.load(a_ptr + s * split_stride + offs, mask=mask, other=0.0)
    x += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    x += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = _layernorm_rows(x, mask, cols, cmask, g_ptr, b_ptr, D, eps)
    if QA_HEAD:
        # The last layer's hidden states are only ever read by the 2-logit head: dot them
        # here (in float32, from the unrounded LayerNorm output) and never store them.
        w0 = tl.load(qa_w_ptr + cols, mask=cmask, other=0.0)
        w1 = tl.load(qa_w_ptr + D + cols, mask=cmask, other=0.0)
        start = tl.sum(y * w0[None, :], axis=1) + tl.load(qa_b_ptr)
        end = tl.sum(y * w1[None, :], axis=1) + tl.load(qa_b_ptr + 1)
        tl.store(logits_ptr + rows, start, mask=rmask)
        tl.store(logits_ptr + logits_stride + rows, end, mask=rmask)
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        if FP8_OUT:
            _store_rows_fp8(y, mask, rmask, q_ptr + offs, qs_ptr + rows)


@triton.jit
def _bias_gelu_kernel(
    h_ptr, bias_ptr, out_ptr, q_ptr, qs_ptr,
    n_rows, F, split_stride,
    BLOCK_F: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr,
    FP8_OUT: tl.constexpr, TANH: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    rmask = rows < n_rows
    cmask = cols < F
    mask = rmask[:, None] & cmask[None, :]
    offs = rows.to(tl.int64)[:, None] * F + cols[None, :]
    x = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(1, SPLITS):  # split-K partial sums of the GEMM, if any
        x += tl.load(h_ptr + s * split_stride + offs, mask=mask, other=0.0)
    x += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if TANH:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        e = tl.exp(-2.0 * tl.abs(u))  # in (0, 1]: no overflow
        t = (1.0 - e) / (1.0 + e)
        y = 0.5 * x * (1.0 + tl.where(u >= 0, t, -t))
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    if FP8_OUT:
        # Only the next GEMM reads this activation: store its e4m3 copy alone
        # (BLOCK_F covers the whole row, so the row's scale is known here).
        _store_rows_fp8(y, mask, rmask, q_ptr + offs, qs_ptr + rows)
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attn_varlen_kernel(
    qkv_ptr, bias_ptr, out_ptr, cu_ptr,
    qk_scale, stride_qkv, stride_out, D,
    HEAD_DIM: tl.constexpr, BLOCK_DH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One (query block, sequence, head): softmax(Q K^T * scale) V with an online softmax.

    Q, K, V are column slices of the packed QKV GEMM output (no bias yet). A sequence's
    tokens are rows ``cu[seq]:cu[seq+1]``; programs past a sequence's end write nothing,
    so the grid may be sized for bucketed (padded) sequence counts and lengths.

    Biases cost nothing inside the loop: the K bias adds ``q . bk`` to every score of a
    query row, which softmax cancels, so it is dropped; rows of P sum to one, so
    ``P (V + bv) = P V + bv`` and the V bias is added once at the end. K and V tiles thus
    go from memory straight into ``tl.dot``, which lets the compiler pipeline the loads.
    """
    m_block = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(cu_ptr + seq)
    length = tl.load(cu_ptr + seq + 1) - start
    m0 = m_block * BLOCK_M

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_DH)
    dmask = offs_d < HEAD_DIM
    col = head * HEAD_DIM + offs_d
    mmask = offs_m < length
    q_rows = (start + offs_m).to(tl.int64)
    io_mask = mmask[:, None] & dmask[None, :]
    dtype = qkv_ptr.dtype.element_ty

    q = tl.load(qkv_ptr + q_rows[:, None] * stride_qkv + col[None, :], mask=io_mask, other=0.0)
    bq = tl.load(bias_ptr + col, mask=dmask, other=0.0)
    # Softmax scale and log2(e) folded into Q once, so the loop uses exp2 directly.
    q = ((q.to(tl.float32) + bq[None, :]) * qk_scale).to(dtype)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DH], tl.float32)
    n_end = tl.where(m0 < length, length, 0)  # empty programs skip the loop
    k_ptrs = qkv_ptr + (start + offs_n).to(tl.int64)[:, None] * stride_qkv + D + col[None, :]
    for n0 in range(0, n_end, BLOCK_N):
        nmask = (n0 + offs_n) < length
        kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(k_ptrs + D, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k))
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(dtype), v)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_qkv
    bv = tl.load(bias_ptr + 2 * D + col, mask=dmask, other=0.0)
    # l_i >= 1 on every row that saw a key (its max contributes exp2(0)); the floor only
    # keeps rows of empty programs finite (they are not stored).
    out = acc / tl.maximum(l_i, 1.0)[:, None] + bv[None, :]
    o_ptrs = out_ptr + q_rows[:, None] * stride_out + col[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _gemm_bias_gelu_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, TANH: tl.constexpr,
):
    """``out = GELU(x @ w^T + bias)``: the FFN1 GEMM with bias and GELU in its epilogue.

    ``x`` [M, K], ``w`` [N, K] row-major, K a multiple of BLOCK_K. Rows/columns past the
    edge are clamped on load (no masks in the K loop) and masked on store. Programs are
    ordered in groups of GROUP_M row-tiles so that neighbours share weight tiles in L2.
    The GELU is computed from the float32 accumulator: one rounding, to the output dtype.
    """
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.minimum(offs_m, M - 1).to(tl.int64)
    cols = tl.minimum(offs_n, N - 1).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + cols[:, None] * K + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(x_ptrs)
        b = tl.load(w_ptrs)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    nmask = offs_n < N
    x = acc + tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    if TANH:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        e = tl.exp(-2.0 * tl.abs(u))
        t = (1.0 - e) / (1.0 + e)
        y = 0.5 * x * (1.0 + tl.where(u >= 0, t, -t))
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    o_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & nmask[None, :])


@triton.jit
def _splitk_gemm_kernel(
    x_ptr, w_ptr, out_ptr,
    M, N, K, k_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``out[s] = x[:, Ks] @ w[:, Ks]^T`` in float32, ``Ks`` the s-th of the K splits.

    ``x`` [M, K] and ``w`` [N, K] are row-major; program (n, m, s) owns one output tile of
    split s. The consumer kernel adds the splits up while it reads the tile anyway.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = split * k_split + tl.arange(0, BLOCK_K)
    mmask = offs_m < M
    nmask = offs_n < N
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(0, k_split, BLOCK_K):
        a = tl.load(x_ptrs, mask=mmask[:, None], other=0.0)
        b = tl.load(w_ptrs, mask=nmask[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    rows = split.to(tl.int64) * M + offs_m
    tl.store(out_ptr + rows[:, None] * N + offs_n[None, :], acc,
             mask=mmask[:, None] & nmask[None, :])


# ----------------------------------------------------------------------------- launchers


def _row_tile(n_rows: int, width: int) -> tuple[int, int, int]:
    """(BLOCK, ROWS, num_warps) for a row-wise kernel over ``width`` columns.

    Small batches get 2 rows per program (more programs for few tokens); large ones
    about 4096 elements per program (fewer, fuller programs).
    """
    block = triton.next_power_of_2(width)
    rows = 2 if n_rows < 8192 else max(2, 4096 // block)
    warps = 4 if block * rows <= 2048 else 8
    return block, rows, warps


def _fp8_buffers(x: torch.Tensor, on: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not on:
        return x, x  # never touched: the FP8 branch is compiled out
    q = torch.empty(x.shape, device=x.device, dtype=FP8_DTYPE)
    return q, torch.empty((x.shape[0], 1), device=x.device, dtype=torch.float32)


def embed_layernorm(
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor,
    word: torch.Tensor,
    position: torch.Tensor,
    token_type: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    fp8: bool = False,
) -> tuple[torch.Tensor, Quantized | None]:
    """LayerNorm(word[ids] + position[pos] + token_type[tt]) for packed int32 [T] inputs."""
    n, d = input_ids.shape[0], word.shape[1]
    out = torch.empty((n, d), device=word.device, dtype=word.dtype)
    q, qs = _fp8_buffers(out, fp8)
    block, rows, warps = _row_tile(n, d)
    _embed_ln_kernel[(triton.cdiv(n, rows),)](
        input_ids, token_type_ids, position_ids, word, position, token_type, gamma, beta,
        out, q, qs, n, d, eps,
        BLOCK_D=block, ROWS=rows, FP8_OUT=fp8, num_warps=warps,
    )
    return out, (Quantized(q, qs) if fp8 else None)


def _splits(a: torch.Tensor) -> tuple[int, int]:
    """(number of split-K partials, elements between them) of a GEMM output."""
    if a.dim() == 3:
        return a.shape[0], a.shape[1] * a.shape[2]
    return 1, 0


def bias_residual_layernorm(
    a: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    fp8: bool = False,
) -> tuple[torch.Tensor, Quantized | None]:
    """LayerNorm(a + bias + residual), in ``residual``'s dtype (+ per-row e4m3 copy).

    ``a`` is a GEMM output [T, D], or [S, T, D] float32 split-K partials to be summed.
    """
    n, d = a.shape[-2:]
    splits, split_stride = _splits(a)
    out = torch.empty((n, d), device=a.device, dtype=residual.dtype)
    q, qs = _fp8_buffers(out, fp8)
    block, rows, warps = _row_tile(n, d)
    _residual_ln_kernel[(triton.cdiv(n, rows),)](
        a, bias, residual, gamma, beta, out, q, qs, gamma, gamma, out,
        n, 0, split_stride, d, eps,
        BLOCK_D=block, ROWS=rows, SPLITS=splits, FP8_OUT=fp8, QA_HEAD=False, num_warps=warps,
    )
    return out, (Quantized(q, qs) if fp8 else None)


def bias_residual_layernorm_qa(
    a: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    qa_weight: torch.Tensor,
    qa_bias: torch.Tensor,
) -> torch.Tensor:
    """QA logits float32 [2, T] (row 0 start, row 1 end) of LayerNorm(a + bias + residual)."""
    n, d = a.shape[-2:]
    splits, split_stride = _splits(a)
    logits = torch.empty((2, n), device=a.device, dtype=torch.float32)
    block, rows, warps = _row_tile(n, d)
    _residual_ln_kernel[(triton.cdiv(n, rows),)](
        a, bias, residual, gamma, beta, a, a, a, qa_weight, qa_bias, logits,
        n, logits.stride(0), split_stride, d, eps,
        BLOCK_D=block, ROWS=rows, SPLITS=splits, FP8_OUT=False, QA_HEAD=True, num_warps=warps,
    )
    return logits


def bias_gelu(
    h: torch.Tensor,
    bias: torch.Tensor,
    fp8: bool = False,
    tanh: bool = False,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor | None, Quantized | None]:
    """GELU(h + bias): ``(out, None)``, or ``(None, e4m3 copy)`` when ``fp8``.

    ``h`` is a GEMM output [T, F], or [S, T, F] float32 split-K partials to be summed.
    A 2-D ``h`` is overwritten in place (elementwise, so safe; it saves an allocation of the
    largest activation); otherwise ``out`` is new, in ``out_dtype``.
    """
    n, f = h.shape[-2:]
    splits, split_stride = _splits(h)
    if fp8:
        q, qs = _fp8_buffers(h[-1] if splits > 1 else h, True)
        block, rows, warps = _row_tile(n, f)  # whole rows: the scale needs them
        grid = (triton.cdiv(n, rows), 1)
        out = h
    else:
        q = qs = h
        block, rows, warps = min(1024, triton.next_power_of_2(f)), 4, 4
        grid = (triton.cdiv(n, rows), triton.cdiv(f, block))
        out = h if splits == 1 and out_dtype in (None, h.dtype) else torch.empty(
            (n, f), device=h.device, dtype=out_dtype or h.dtype)
    _bias_gelu_kernel[grid](
        h, bias, out, q, qs, n, f, split_stride,
        BLOCK_F=block, ROWS=rows, SPLITS=splits, FP8_OUT=fp8, TANH=tanh, num_warps=warps,
    )
    if fp8:
        return None, Quantized(q, qs)
    return out, None


def splitk_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    splits: int,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 4,
) -> torch.Tensor:
    """``x @ w.T`` as float32 split-K partials [splits, M, N] (their sum is the product).

    ``x`` [M, K], ``w`` [N, K], both contiguous; ``K`` must split into ``splits`` equal
    multiples of ``block_k``.
    """
    m, k = x.shape
    n = w.shape[0]
    if k % (splits * block_k):
        raise ValueError(f"K={k} does not split into {splits} multiples of {block_k}")
    out = torch.empty((splits, m, n), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), splits)
    _splitk_gemm_kernel[grid](
        x, w, out, m, n, k, k // splits,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def gemm_gelu_config(m: int, n: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the fused FFN1 GEMM.

    Few tokens: 64x64 tiles, so the weight stream spreads over more multiprocessors (best
    of 7 tiles at 128 and 384 tokens, H200 2026-11-29). Many tokens: 128x256 tiles, 8 warps
    (best Triton tile at 42,891 tokens, though still 17% slower than cuBLAS + bias_gelu,
    which is why the engine only fuses FFN1 for few tokens).
    """
    if m >= 2048:
        return GEMM_GELU_LARGE
    return GEMM_GELU_SMALL


def linear_bias_gelu(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor,
    tanh: bool = False,
    config: tuple[int, int, int, int, int] | None = None,
) -> torch.Tensor:
    """GELU(x @ w.T + bias) in ``x``'s dtype: the FFN1 GEMM with its epilogue fused.

    ``x`` [M, K] and ``w`` [N, K] contiguous, K a multiple of the tile's BLOCK_K (callers
    check :func:`gemm_gelu_supported`).
    """
    m, k = x.shape
    n = w.shape[0]
    bm, bn, bk, warps, stages = config or gemm_gelu_config(m, n)
    if k % bk:
        raise ValueError(f"K={k} is not a multiple of {bk}")
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0:
        return out
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _gemm_bias_gelu_kernel[grid](
        x, w, bias, out, m, n, k,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, TANH=tanh,
        num_warps=warps, num_stages=stages,
    )
    return out


def gemm_gelu_supported(k: int) -> bool:
    """Whether :func:`linear_bias_gelu` takes this inner dimension (every tile's BLOCK_K)."""
    return k % 64 == 0


def attention_config(max_seqlen: int, n_seqs: int, num_heads: int,
                     head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a batch of this size."""
    programs = triton.cdiv(max_seqlen, ATTN_SMALL[0]) * n_seqs * num_heads
    return ATTN_SMALL if programs < _ATTN_SMALL_PROGRAMS or head_dim > 64 else ATTN_LARGE


def attention_varlen(
    qkv: torch.Tensor,
    qkv_bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    n_seqs: int,
    num_heads: int,
    config: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """Bidirectional multi-head attention over packed sequences; returns [T, hidden].

    ``qkv`` [T, 3*hidden] is the bias-free QKV GEMM output; ``cu_seqlens`` int32
    [n_seqs + 1]. ``max_seqlen`` and ``n_seqs`` only size the grid: they may exceed the
    real values (extra sequences have zero length), which is what CUDA graphs rely on.
    Rows of the output outside every sequence are left unwritten.
    """
    n, three_d = qkv.shape
    d = three_d // 3
    head_dim = d // num_heads
    out = torch.empty((n, d), device=qkv.device, dtype=qkv.dtype)
    if n_seqs == 0 or max_seqlen == 0:
        return out
    scale = _LOG2E / float(head_dim) ** 0.5
    bm, bn, warps, stages = config or attention_config(max_seqlen, n_seqs, num_heads, head_dim)
    grid = (triton.cdiv(max_seqlen, bm), n_seqs, num_heads)
    _attn_varlen_kernel[grid](
        qkv, qkv_bias, out, cu_seqlens,
        scale, qkv.stride(0), out.stride(0), d,
        HEAD_DIM=head_dim, BLOCK_DH=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages,
    )
    return out
