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
