"""Padded ``[windows, seq]`` batches <-> packed tokens, and the buckets CUDA graphs use.

Packing keeps exactly the tokens whose ``attention_mask`` is 1, row by row. A kept token's
position id is its column in the padded row, which is what HF BERT computes for the same
padded input, so packed results equal padded ones for any mask (right padding or not).

A bucket rounds (tokens, sequences, longest sequence) up so that a small set of
captured graphs covers every batch: tokens to multiples of 64 below 128 * per_octave
tokens (1,024 at the default 8 buckets per power of two) and to at most 1/per_octave over
above (12.5% at the default), sequences to a power of two, the longest sequence to a
multiple of 128.
The bucket's inputs live in one int32 buffer ``[ids | token types | positions | cu_seqlens]``
so a batch reaches the device in one copy.
"""

from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I32 = npt.NDArray[np.int32]

# Token buckets per power of two (padding < 1/8 of the tokens): the engine's default, its
# ``graph_buckets_per_octave`` option.
TOKEN_BUCKETS_PER_OCTAVE = 8


@dataclass(frozen=True)
class PackedHost:
    """Packed tokens of a padded batch, with where each came from."""

    input_ids: I32  # [T]
    token_type_ids: I32  # [T]
    position_ids: I32  # [T]
    cu_seqlens: I32  # [B + 1], cu_seqlens[b]:cu_seqlens[b+1] are row b's tokens
    keep: npt.NDArray[np.bool_]  # [B, S] the packed tokens' places, row-major (x[keep])
    max_seqlen: int

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seqs(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1


def pack_padded(input_ids: I32, attention_mask: I32, token_type_ids: I32) -> PackedHost:
    """Pack the mask-1 tokens of ``[windows, seq]`` int arrays (any int dtype)."""
    if not (input_ids.shape == attention_mask.shape == token_type_ids.shape):
        raise ValueError("input_ids, attention_mask and token_type_ids must share one shape")
    if input_ids.ndim != 2:
        raise ValueError(f"expected [windows, seq] arrays, got shape {input_ids.shape}")
    # Written for the batch-1 request, where numpy's per-call overhead is the cost:
    # boolean indexing (row-major, each row's tokens contiguous) rather than index arrays,
    # offsets summed in Python (the rows are few). One 128-token window, 2026-12-01: 15.6
    # -> 9.0 us on the 2-core CI machine; on the H200 host 22-25 us before, 24-40 after
    # (that host's noise).
    keep = np.asarray(attention_mask) != 0
    lengths = keep.sum(axis=1, dtype=np.int32).tolist()
    return PackedHost(
        input_ids=np.asarray(np.asarray(input_ids)[keep], dtype=np.int32),
        token_type_ids=np.asarray(np.asarray(token_type_ids)[keep], dtype=np.int32),
        position_ids=np.nonzero(keep)[1].astype(np.int32),
        cu_seqlens=np.array([0, *itertools.accumulate(lengths)], dtype=np.int32),
        keep=keep,
        max_seqlen=max(lengths, default=0),
    )


@dataclass(frozen=True)
class Bucket:
    """Padded sizes one CUDA graph is captured for."""

    tokens: int
    seqs: int
    max_seqlen: int

    @property
    def buffer_len(self) -> int:
        return 3 * self.tokens + self.seqs + 1


def buckets_per_octave(per_octave: int) -> int:
    """``per_octave`` if it is a power of two (so every bucket step is a multiple of 64),
    else ValueError."""
    per_octave = operator.index(per_octave)
    if per_octave < 1 or per_octave & (per_octave - 1):
        raise ValueError(f"per_octave must be a power of two, got {per_octave}")
    return per_octave


def round_tokens(tokens: int, per_octave: int = TOKEN_BUCKETS_PER_OCTAVE) -> int:
    """Round up to a multiple of max(64, 2**floor(log2 tokens) / per_octave) (a power of
    two): under 1/per_octave padding from 64 * per_octave tokens up (12.5% at the
    default 8)."""
    per_octave = buckets_per_octave(per_octave)
    tokens = max(tokens, 1)
    step = max(64, (1 << (tokens.bit_length() - 1)) // per_octave)
    return -(-tokens // step) * step


@functools.lru_cache(maxsize=4096)  # on every call's path: ~1.5 µs computed, 0.1-0.4 cached
def bucket_for(tokens: int, seqs: int, max_seqlen: int,
               per_octave: int = TOKEN_BUCKETS_PER_OCTAVE) -> Bucket:
    """The bucket a batch of this size replays (``per_octave``: :func:`round_tokens`)."""
    return Bucket(
        tokens=round_tokens(tokens, per_octave),
        seqs=1 << max(0, (max(seqs, 1) - 1).bit_length()),
        max_seqlen=-(-max(max_seqlen, 1) // 128) * 128,
    )


def bucket_layout(
    ids: I32, token_types: I32, positions: I32, cu_seqlens: I32, bucket: Bucket,
    out: I32 | None = None,
) -> I32:
    """The bucket's int32 input buffer (written into ``out``, int32 [bucket.buffer_len],
    if given): padding tokens are id 0 at position 0, and extra sequences are empty
    (their cu_seqlens entries repeat the real token count)."""
    t, b = ids.shape[0], cu_seqlens.shape[0] - 1
    if t > bucket.tokens or b > bucket.seqs:
        raise ValueError(f"batch ({t} tokens, {b} sequences) does not fit {bucket}")
    n = bucket.tokens
    if out is None:
        buf = np.zeros(bucket.buffer_len, dtype=np.int32)
    else:
        if out.shape != (bucket.buffer_len,) or out.dtype != np.int32:
            raise ValueError(f"out must be int32 [{bucket.buffer_len}], got {out.dtype} "
                             f"{out.shape}")
        buf = out
        buf[t:n] = 0  # the padding rows: ids, then token types and positions below
        buf[n + t : 2 * n] = 0
        buf[2 * n + t : 3 * n] = 0
    buf[:t] = ids
    buf[n : n + t] = token_types
    buf[2 * n : 2 * n + t] = positions
    buf[3 * n : 3 * n + b + 1] = cu_seqlens
    buf[3 * n + b + 1 :] = t
    return buf


def chunks_by_tokens(lengths: npt.NDArray[np.int64], max_tokens: int) -> list[slice]:
    """Consecutive row ranges whose token counts stay within ``max_tokens`` (a row alone may
    exceed it)."""
    out, start, total = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if total and total + n > max_tokens:
            out.append(slice(start, i))
            start, total = i, 0
        total += n
    out.append(slice(start, len(lengths)))
    return out
