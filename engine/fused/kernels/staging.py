# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""One launch that writes a packed batch into a CUDA graph's static input buffer.

A graph replays on its bucket's int32 buffer (``packing.bucket_layout``: token ids, token
types and positions, each ``bucket.tokens`` long, then ``bucket.seqs + 1`` cu_seqlens).
Filling it with torch ops takes five launches (four copies and the fill of the unused
cu_seqlens entries); at batch 1 their host-side launch cost is a tenth of the whole call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.fused import call_table as ct
from engine.fused.kernels.common import launch_options, pdl_available, pdl_enter, pdl_release

_BLOCK = 1024


@triton.jit
def _stage_kernel(ids_ptr, tt_ptr, pos_ptr, cu_ptr, buf_ptr, t, n, b, seqs,
                  BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tok = i < t
    tl.store(buf_ptr + i, tl.load(ids_ptr + i, mask=tok), mask=tok)
    tl.store(buf_ptr + n + i, tl.load(tt_ptr + i, mask=tok), mask=tok)
    tl.store(buf_ptr + 2 * n + i, tl.load(pos_ptr + i, mask=tok), mask=tok)
    # Entries past the batch's last sequence repeat its end: those sequences are empty.
    seq = i <= seqs
    tl.store(buf_ptr + 3 * n + i, tl.load(cu_ptr + tl.minimum(i, b), mask=seq), mask=seq)


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


# ----------------------------------------------------------------- staging inside the graph
#
# A graph can also stage its own inputs: its first kernel reads where the caller's tensors
# are from a *call table* (``engine.fused.call_table``: int64 slots in pinned host memory,
# which kernels reach under unified addressing) and its last kernel copies the logits to
# the caller's tensor named there, then acknowledges. A call is then one graph launch:
# no staging launch in front, no copy launch behind. Where the GPU has programmatic
# dependent launch (``common``) the staging kernel lets the next kernel launch at once,
# and the output kernel launches while the kernel before it runs and reads the table
# (a round trip over the bus) before it waits for the logits.

_STAGE_BLOCK = 1024
# The two kernels use programmatic dependent launch where the GPU has it (fixed into a
# graph at capture; an A/B knob for ``--set`` of ``benchmarks/ab_replay.py`` and
# ``trace_pass.py``). H200, 2026-12-01, a traced BERT-base 1x128 call (calibrated FP8):
# span 253.6 vs 256.9 us, the output kernel's step 1.6 vs 3.4.
TABLE_PDL = True
# The call table's slots, as the kernels read them.
_IDS, _TOKEN_TYPES, _POSITIONS, _CU_SEQLENS = (tl.constexpr(ct.IDS), tl.constexpr(ct.TOKEN_TYPES),
                                               tl.constexpr(ct.POSITIONS),
                                               tl.constexpr(ct.CU_SEQLENS))
_TOKENS, _SEQS, _OUT, _SEQ, _ACK = (tl.constexpr(ct.TOKENS), tl.constexpr(ct.SEQS),
                                    tl.constexpr(ct.OUT), tl.constexpr(ct.SEQ),
                                    tl.constexpr(ct.ACK))


@triton.jit
def _stage_table_kernel(table_addr, buf_ptr, n, seqs, BLOCK: tl.constexpr,
                        USE_PDL: tl.constexpr):
    """One program: the table's batch (``t`` tokens, ``b`` sequences) into ``buf``, as
    ``_stage_kernel`` writes it; nothing when ``t`` is 0 (the host filled ``buf``)."""
    pdl_release(USE_PDL)  # the next kernel waits for this one's writes
    table = table_addr.to(tl.pointer_type(tl.int64))
    # Every slot in one round trip over the bus (the table is in host memory).
    ids = tl.load(table + _IDS).to(tl.pointer_type(tl.int32))
    tt = tl.load(table + _TOKEN_TYPES).to(tl.pointer_type(tl.int32))
    pos = tl.load(table + _POSITIONS).to(tl.pointer_type(tl.int32))
    cu = tl.load(table + _CU_SEQLENS).to(tl.pointer_type(tl.int32))
    t = tl.load(table + _TOKENS).to(tl.int32)
    b = tl.load(table + _SEQS).to(tl.int32)
    if t > 0:
        for start in range(0, t, BLOCK):
            i = start + tl.arange(0, BLOCK)
            tok = i < t
            tl.store(buf_ptr + i, tl.load(ids + i, mask=tok), mask=tok)
            tl.store(buf_ptr + n + i, tl.load(tt + i, mask=tok), mask=tok)
            tl.store(buf_ptr + 2 * n + i, tl.load(pos + i, mask=tok), mask=tok)
        for start in range(0, seqs + 1, BLOCK):
            i = start + tl.arange(0, BLOCK)
            seq = i <= seqs
            tl.store(buf_ptr + 3 * n + i, tl.load(cu + tl.minimum(i, b), mask=seq), mask=seq)


@triton.jit
def _logits_table_kernel(table_addr, logits_ptr, n, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr):
    """One program: the first ``t`` columns of ``logits`` [2, n] into the table's output
    tensor [2, t] (if it names one), then the table's sequence number into its
    acknowledgement slot: the stored value is the loaded one, so the store waits for that
    load, and the barrier orders it after every lane's copy."""
    table = table_addr.to(tl.pointer_type(tl.int64))
    t = tl.load(table + _TOKENS).to(tl.int32)  # the three slots in one round trip over the bus
    out_addr = tl.load(table + _OUT)
    seq = tl.load(table + _SEQ)
    pdl_enter(USE_PDL, False)  # the table needs no earlier kernel; the logits do
    if out_addr != 0:
        out = out_addr.to(tl.pointer_type(tl.float32))
        for start in range(0, t, BLOCK):
            i = start + tl.arange(0, BLOCK)
            m = i < t
            tl.store(out + i, tl.load(logits_ptr + i, mask=m), mask=m)
            tl.store(out + t + i, tl.load(logits_ptr + n + i, mask=m), mask=m)
    tl.debug_barrier()  # every lane's copy is done before the ack
    tl.store(table + _ACK, seq)


def stage_from_table(buf: torch.Tensor, tokens: int, table: torch.Tensor) -> None:
    """Launch the staging kernel on a bucket buffer whose token sections are ``tokens``
    long; ``table`` is the pinned call table (its address is baked into a captured graph).
    Where the GPU has PDL it lets the next kernel launch at once."""
    seqs = buf.shape[0] - 3 * tokens - 1
    _stage_table_kernel[(1,)](table.data_ptr(), buf, tokens, seqs, BLOCK=_STAGE_BLOCK,
                              USE_PDL=TABLE_PDL and pdl_available(buf), num_warps=4)


def logits_to_table(logits: torch.Tensor, table: torch.Tensor) -> None:
    """Launch the output kernel on a graph's static float32 logits [2, tokens] (with PDL
    where the GPU has it: it reads the table while the kernel before it runs)."""
    pdl = TABLE_PDL and pdl_available(logits)
    _logits_table_kernel[(1,)](table.data_ptr(), logits, logits.shape[1], BLOCK=_STAGE_BLOCK,
                               USE_PDL=pdl, num_warps=4, **launch_options(pdl))
