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


# ------------------------------------------------------ staging inside the graph, per call
#
# A graph can also stage its own inputs: its first kernel takes the caller's tensors as
# arguments and copies them into the graph's input buffer, and its last copies the logits
# into the caller's output tensor. A call sets those arguments in the instantiated graph
# (``engine.fused.graph_args``) and launches it: one launch, no staging launch in front, no
# copy launch behind, and nothing read from host memory on the GPU. The arguments a call
# sets lead each kernel's list and are never specialised by triton (a graph captures one
# compiled kernel, which must hold for every call's values). Where the GPU has
# programmatic dependent launch (``common``) the staging kernel lets the next kernel launch
# at once, and the output kernel launches while the kernel before it runs.

_STAGE_BLOCK = 1024
# The two kernels use programmatic dependent launch where the GPU has it (fixed into a
# graph at capture; an A/B knob for ``--set`` of ``benchmarks/ab_replay.py`` and
# ``trace_pass.py``). H200, 2026-12-01, a traced BERT-base 1x128 call (calibrated FP8,
# the kernels then reading a call table in host memory): span 253.6 vs 256.9 us, the
# output kernel's step 1.6 vs 3.4.
TABLE_PDL = True
# What a call sets: the staging kernel's first six arguments, the output kernel's first two.
STAGE_ARGS, OUTPUT_ARGS = "QQQQii", "Qi"
_STAGE_SET = ("ids_ptr", "tt_ptr", "pos_ptr", "cu_ptr", "t", "b")
_OUTPUT_SET = ("out_ptr", "t")


@triton.jit(do_not_specialize=_STAGE_SET, do_not_specialize_on_alignment=_STAGE_SET[:4])
def _stage_call_kernel(ids_ptr, tt_ptr, pos_ptr, cu_ptr, t, b, buf_ptr, n, seqs,
                       BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """The caller's batch (``t`` tokens, ``b`` sequences) into ``buf``, as ``_stage_kernel``
    writes it, a block of it per program; nothing when ``t`` is 0 (the host filled it)."""
    pdl_release(USE_PDL)  # the next kernel waits for this one's writes
    if t > 0:
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tok = i < t
        tl.store(buf_ptr + i, tl.load(ids_ptr + i, mask=tok), mask=tok)
        tl.store(buf_ptr + n + i, tl.load(tt_ptr + i, mask=tok), mask=tok)
        tl.store(buf_ptr + 2 * n + i, tl.load(pos_ptr + i, mask=tok), mask=tok)
        seq = i <= seqs
        tl.store(buf_ptr + 3 * n + i, tl.load(cu_ptr + tl.minimum(i, b), mask=seq), mask=seq)


@triton.jit(do_not_specialize=_OUTPUT_SET, do_not_specialize_on_alignment=_OUTPUT_SET[:1])
def _logits_call_kernel(out_ptr, t, logits_ptr, n, BLOCK: tl.constexpr,
                        USE_PDL: tl.constexpr):
    """The first ``t`` columns of ``logits`` [2, n] into ``out`` [2, t], a block per program."""
    pdl_enter(USE_PDL, False)  # the logits are the previous kernel's
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < t
    tl.store(out_ptr + i, tl.load(logits_ptr + i, mask=m), mask=m)
    tl.store(out_ptr + t + i, tl.load(logits_ptr + n + i, mask=m), mask=m)


def _function(compiled: object) -> int | None:
    """The CUDA function handle of what a triton launch ran (None under the interpreter)."""
    handle = getattr(compiled, "function", None)
    return int(handle) if handle is not None else None


def stage_call(buf: torch.Tensor, tokens: int, ids: torch.Tensor, tt: torch.Tensor,
               pos: torch.Tensor, cu: torch.Tensor) -> int | None:
    """Launch the graph's staging kernel on a bucket buffer whose token sections are
    ``tokens`` long: int32 ``ids``/``tt``/``pos`` [T] and ``cu`` [B + 1] into it, or
    nothing when T is 0. Its grid covers the whole bucket, so any batch that fits can be
    set later (``STAGE_ARGS``: the four addresses, T and B). Returns the kernel's CUDA
    function handle (None under the interpreter)."""
    t, b = ids.shape[0], cu.shape[0] - 1
    seqs = buf.shape[0] - 3 * tokens - 1
    if t > tokens or b > seqs:
        raise ValueError(f"batch ({t} tokens, {b} sequences) does not fit the buffer")
    grid = (triton.cdiv(max(tokens, seqs + 1), _STAGE_BLOCK),)
    return _function(_stage_call_kernel[grid](
        ids, tt, pos, cu, t, b, buf, tokens, seqs, BLOCK=_STAGE_BLOCK,
        USE_PDL=TABLE_PDL and pdl_available(buf), num_warps=4))


def logits_call(logits: torch.Tensor, out: torch.Tensor, t: int) -> int | None:
    """Launch the graph's output kernel: the first ``t`` columns of its static float32
    logits [2, tokens] into ``out`` (float32 [2, t], contiguous; nothing when ``t`` is 0),
    with PDL where the GPU has it. Its grid covers every column, so any ``t`` can be set
    later (``OUTPUT_ARGS``: the address and T). Returns the kernel's function handle."""
    tokens = logits.shape[1]
    pdl = TABLE_PDL and pdl_available(logits)
    return _function(_logits_call_kernel[(triton.cdiv(tokens, _STAGE_BLOCK),)](
        out, t, logits, tokens, BLOCK=_STAGE_BLOCK, USE_PDL=pdl, num_warps=4,
        **launch_options(pdl)))
