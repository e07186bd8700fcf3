# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""One launch that writes a packed batch into a CUDA graph's static input buffer.

A graph replays on its bucket's int32 buffer (``packing.bucket_layout``: token ids, token
types and positions, each ``bucket.tokens`` long, then ``bucket.seqs + 1`` cu_seqlens).
Filling it with torch ops takes five launches (four copies and the fill of the unused
cu_seqlens entries); at batch 1 their host-side launch cost is a tenth of the whole call.
Graphs that stage their own inputs do it in their first kernel instead (``rows.STAGE_ARGS``);
this launch serves the engine's other graphs (above ``graphs.STAGE_MAX_TOKENS`` tokens, or
with ``graph_staging=False``) and tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.fused.kernels.rows import copy_cu

_BLOCK = 1024


@triton.jit
def _stage_kernel(ids_ptr, tt_ptr, pos_ptr, cu_ptr, buf_ptr, t, n, b, seqs,
                  BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tok = i < t
    tl.store(buf_ptr + i, tl.load(ids_ptr + i, mask=tok), mask=tok)
    tl.store(buf_ptr + n + i, tl.load(tt_ptr + i, mask=tok), mask=tok)
    tl.store(buf_ptr + 2 * n + i, tl.load(pos_ptr + i, mask=tok), mask=tok)
    copy_cu(i, cu_ptr, buf_ptr + 3 * n, b, seqs + 1)


def stage_inputs(buf: torch.Tensor, tokens: int, ids: torch.Tensor, tt: torch.Tensor,
                 pos: torch.Tensor, cu: torch.Tensor) -> None:
    """Write int32 ``ids``/``tt``/``pos`` [T] and ``cu`` [B + 1] into ``buf``, a bucket
    buffer whose token sections are ``tokens`` long (rows past T keep what they held)."""
    t, b = ids.shape[0], cu.shape[0] - 1
    seqs = buf.shape[0] - 3 * tokens - 1
    if t > tokens or b > seqs:
        raise ValueError(f"batch ({t} tokens, {b} sequences) does not fit the buffer")
    grid = (triton.cdiv(max(t, seqs + 1), _BLOCK),)
    _stage_kernel[grid](ids, tt, pos, cu, buf, t, tokens, b, seqs, BLOCK=_BLOCK)


@triton.jit
def _positions_kernel(cu_ptr, pos_ptr, t, b, steps, longest, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # Token i's sequence: the last s in [0, b) with cu[s] <= i, by binary search (``steps``
    # halvings of [0, b - 1]); every token gets a position in [0, longest), even where
    # ``cu`` does not cover it.
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.zeros([BLOCK], tl.int32) + (b - 1)
    for _ in range(steps):
        mid = (lo + hi + 1) // 2
        below = tl.load(cu_ptr + mid) <= i
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid - 1)
    pos = tl.minimum(tl.maximum(i - tl.load(cu_ptr + lo), 0), longest - 1)
    tl.store(pos_ptr + i, pos, mask=i < t)


def packed_positions(cu: torch.Tensor, tokens: int, longest: int) -> torch.Tensor:
    """Position ids int32 [``tokens``] of packed sequences: each restarts at 0 at its
    offset in int32 ``cu`` [B + 1], in one launch (computed by torch ops it took nine).
    Whatever ``cu`` says, every position lies in [0, ``longest``) (the position table's
    rows): tokens past ``cu[B]`` continue the last sequence's count, and with no sequence
    at all every position is 0."""
    b = cu.shape[0] - 1
    if b <= 0:
        return torch.zeros(tokens, dtype=torch.int32, device=cu.device)
    pos = torch.empty(tokens, dtype=torch.int32, device=cu.device)
    if tokens:
        grid = (triton.cdiv(tokens, _BLOCK),)
        _positions_kernel[grid](cu, pos, tokens, b, (b - 1).bit_length(), longest,
                                BLOCK=_BLOCK)
    return pos
