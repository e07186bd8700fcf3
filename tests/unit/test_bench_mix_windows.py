"""``benchmarks.bench_gpu.mix_windows``: the SQuAD-mix batches every mix benchmark draws
(no GPU)."""

from __future__ import annotations

import numpy as np

from benchmarks.bench_gpu import mix_windows, squad_lengths


def test_mix_windows_draw_squad_dev_lengths_reproducibly() -> None:
    ids, mask, tt = mix_windows(np.random.default_rng(3), 64)
    assert ids.shape == mask.shape == tt.shape == (64, 384)
    lengths = mask.sum(axis=1)
    assert set(lengths.tolist()) <= set(squad_lengths().tolist())
    assert (mask[:, 0] == 1).all() and (tt <= mask).all()  # left-aligned, types inside
    again = mix_windows(np.random.default_rng(3), 64)
    assert all((a == b).all() for a, b in zip((ids, mask, tt), again, strict=True))
    assert not (mix_windows(np.random.default_rng(4), 64)[1] == mask).all()
