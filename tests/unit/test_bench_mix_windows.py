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


def test_dev_sweep_takes_every_dev_window_once_in_full_batches() -> None:
    from benchmarks.mix_dev_sweep import sweep_batches

    dev = squad_lengths()
    batches = sweep_batches(dev, 256, seed=0)
    sizes = [b[1].shape[0] for b in batches]
    assert sizes[:-1] == [256] * (len(batches) - 1) and 0 < sizes[-1] <= 256
    assert sum(sizes) == len(dev)
    lengths = np.concatenate([b[1].sum(axis=1) for b in batches])
    assert sorted(lengths.tolist()) == sorted(dev.tolist())  # each window once
    assert not (lengths == dev).all()  # shuffled
    assert all(b[0].shape[1] == 384 and (b[2] <= b[1]).all() for b in batches)
    again = sweep_batches(dev, 256, seed=0)
    assert all((x == y).all() for a, b in zip(batches, again, strict=True)
               for x, y in zip(a, b, strict=True))
