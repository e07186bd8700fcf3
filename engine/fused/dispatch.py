"""The deferred layer's attention launch choices that move the kernels around it, as
measured per layer and sequence count: how many query blocks a sequence gets in the grid
(:func:`query_blocks`), and whether the partial last key block is loaded early
(:func:`early_tail`).

Query blocks: the fewest its bucket's longest sequence needs, or more where the pass
measured faster with more (the extra blocks lie past every sequence's end, so their
programs wait and write nothing: the grid over-states ``max_seqlen``, which
``kernels.attention_varlen`` allows).

With programmatic dependent launch each kernel's programs become resident while the one
before it still runs, so where the block scheduler puts them depends on the kernels around
them; the attention grid's shape moves the whole layer. On the H200, BERT-base's
calibrated FP8 deferred layer at 128 tokens (2026-12-01, CUDA-graph calls on device
tensors back to back, ``benchmarks/attn_grid_sweep.py``; NOTES v28):

* 2 sequences (2 x 12 heads x 2 blocks = 48 programs) run the pass in 0.273 ms, at 4
  blocks a sequence in 0.249 (-9%), about the time of one 128-token sequence;
* 8 sequences: 0.279 at 2 blocks, 0.262 at 3;
* 1, 4 and 16 sequences are fastest at the fewest blocks (2).

It is the block count that matters, not the programs': the same counts reached by extra
heads' worth of empty programs (at the grid's end) changed nothing at 1 or 2 sequences
and cost 10% at 4. The order of the grid's axes changed nothing either. (Past 396
programs the launch also caps every program's registers, ``register_cap`` counting the
empty ones: the sweep's 16-sequence rows above 2 blocks and 8-sequence rows from 5 ran
capped, as the engine would run them.) Whether the pattern holds elsewhere is not known:
the shipped MiniLM in fp16 does not show it, so entries are per layer shape, GPU and
operand type, and a layer without one keeps the fewest blocks.
"""

from __future__ import annotations

import functools

import torch

# A layer: (multiprocessors, hidden, heads, intermediate, tokens a pass, e4m3 GEMMs).
Key = tuple[int, int, int, int, int, bool]
# Layer -> {sequences in the pass: query blocks a sequence}, where more than the fewest
# measured faster (H200, 2026-12-01; see the docstring). Passes are CUDA-graph buckets
# (tokens and sequences rounded up); an entry for 8 sequences serves every batch of 5 to 8
# in 65 to 128 tokens, of which 8x16 was measured. Entries keep each launch's tiles and
# register cap (``kernels.attention.register_cap`` counts the empty programs too).
QUERY_BLOCKS: dict[Key, dict[int, int]] = {
    (132, 768, 12, 3072, 128, True): {2: 4, 8: 3},
}


@functools.lru_cache(maxsize=8)
def multiprocessors(device: torch.device) -> int:
    """The device's multiprocessor count (0 off CUDA: no entry matches)."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def query_blocks(seqs: int, key: Key, table: dict[Key, dict[int, int]] | None = None) -> int:
    """The table's query blocks a sequence for the layer ``key`` in a bucket of ``seqs``
    sequences; 0 where it has none. (The caller never goes under the fewest blocks the
    bucket's longest sequence needs: ``encoder._attention_seqlen``.)"""
    return (QUERY_BLOCKS if table is None else table).get(key, {}).get(seqs, 0)


# The deferred layer on e4m3 operands asks attention for the early partial key block
# (``kernels.attention.ATTN_EARLY_TAIL``) only in passes of at most this many sequences;
# more keep the late load. H200, BERT-base calibrated FP8, graph replay back to back, ms,
# late -> early (NOTES v29, v30): one sequence 1x96 0.2562 -> 0.2475 (v29), 1x48 0.2319 ->
# 0.2270; but 2x48 0.2541 -> 0.2728 (and 0.2534 -> 0.2732 with the variants' order
# swapped), 4x24 0.2514 -> 0.2730, and at 2x64, 4x32, 8x16 8-25% slower (v30; the table
# above was measured with the late load). The kernel trace of 2x48 puts it outside
# attention (its step 3.74 -> 3.34 us a layer): the out-projection 4.34 -> 4.86 and FFN2
# 5.84 -> 7.45, as the grid shapes above moved the kernels around attention. 16-bit layers
# keep the kernel's choice: the shipped MiniLM's shape 4x24 0.1052 -> 0.1031, BERT-base
# fp16 2x48 0.3278 -> 0.3273.
EARLY_TAIL_E4M3_MAX_SEQS = 1


def early_tail(seqs: int, e4m3: bool) -> bool | None:
    """The deferred layer's ``early_tail`` for attention in a pass of ``seqs`` sequences:
    False (the late load) on e4m3 operands past ``EARLY_TAIL_E4M3_MAX_SEQS``, else None
    (the kernel's own choice)."""
    return False if e4m3 and seqs > EARLY_TAIL_E4M3_MAX_SEQS else None
