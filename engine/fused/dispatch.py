"""How many programs the deferred layer's attention launches: the fewest its grid needs,
or more where the GPU's block scheduler then places the layer's kernels better (the extra
programs wait and do nothing; ``kernels.attention_varlen(programs=...)``).

With programmatic dependent launch each kernel's programs become resident while the one
before it still runs, and where the block scheduler puts them depends on how many programs
the kernels before them launched, modulo the multiprocessor count. On the H200 (132
multiprocessors), BERT-base's calibrated FP8 deferred layer at 128 tokens (QKV 72
programs, the out-projection, FFN1 and FFN2 96 each) runs a whole pass in 0.247-0.250 ms
when attention launches 24, 36 or 96 programs modulo 132, and in 0.274-0.280 ms at 48 or
60 (2026-12-01, CUDA-graph calls back to back, ``benchmarks/attn_grid_sweep.py``): the
same classes at 156/168/180/192 and 288-324 programs, each extra program costing ~0.03 µs
a pass; which programs are empty (their order in the grid) made no difference. Batches of
two sequences launch 48 programs (two query blocks per sequence, 12 heads), of eight 192:
the bad class. BERT-base's out-projection and FFN2 take the difference (+1 and +1.8 µs a
layer at 48 programs, kernel trace). The shipped MiniLM in fp16 does not show the pattern
(48 programs as fast as 24), so entries are per layer shape, GPU and operand type, and a
layer without one launches the fewest programs.
"""

from __future__ import annotations

import functools

import torch

# (multiprocessors, hidden, heads, intermediate, tokens a layer, e4m3 GEMMs) -> attention
# program counts modulo the multiprocessors at which the pass measured within 1% of the
# best count (H200, 2026-12-01, ``benchmarks/attn_grid_sweep.py``; see the docstring).
GOOD_RESIDUES: dict[tuple[int, int, int, int, int, bool], tuple[int, ...]] = {
    (132, 768, 12, 3072, 128, True): (24, 36, 96),
}


@functools.lru_cache(maxsize=8)
def multiprocessors(device: torch.device) -> int:
    """The device's multiprocessor count (0 off CUDA: no entry matches)."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def attention_programs(minimum: int, step: int, key: tuple[int, int, int, int, int, bool],
                       table: dict[tuple[int, int, int, int, int, bool], tuple[int, ...]]
                       | None = None) -> int:
    """The fewest programs ``minimum + j * step`` (``step``: one more head's worth of the
    grid) whose count modulo the multiprocessors (``key[0]``) is one of the key's good
    residues, adding at most one multiprocessor count of programs; ``minimum`` where the
    key has no entry or no such count exists."""
    residues = (GOOD_RESIDUES if table is None else table).get(key)
    if not residues or minimum <= 0 or step <= 0:
        return minimum
    sms = key[0]
    for programs in range(minimum, minimum + sms + 1, step):
        if programs % sms in residues:
            return programs
    return minimum
