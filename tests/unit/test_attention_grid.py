"""How many programs the deferred layer's attention launches (``engine.fused.dispatch``,
the engine's ``attention_grid`` option), checked without a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H200_BASE = (132, 768, 12, 3072, 128, True)  # BERT-base's FP8 deferred layer at 128 tokens


TABLE = {H200_BASE: {2: 4, 8: 3}}


@pytest.mark.parametrize(("seqs", "key", "want"), [
    (1, H200_BASE, 0),   # no count for one sequence: none (the fewest)
    (2, H200_BASE, 4),
    (8, H200_BASE, 3),
    (2, (114, 768, 12, 3072, 128, True), 0),   # another GPU: no entry
    (2, (132, 768, 12, 3072, 64, True), 0),    # 64 tokens: no entry
    (2, (132, 768, 12, 3072, 128, False), 0),  # 16-bit operands: no entry
])
def test_query_blocks_from_a_table(seqs: int, key: tuple[int, int, int, int, int, bool],
                                   want: int) -> None:
    from engine.fused.dispatch import query_blocks

    assert query_blocks(seqs, key, TABLE) == want


def test_the_shipped_table() -> None:
    """The measured entry (NOTES v28): BERT-base's calibrated FP8 layer on the H200, 4
    blocks at 2 sequences and 3 at 8 (re-measuring it means updating this test)."""
    from engine.fused.dispatch import QUERY_BLOCKS, query_blocks

    assert QUERY_BLOCKS == TABLE
    assert query_blocks(2, H200_BASE) == 4


def test_table_entries_keep_the_launch_tiles_and_register_cap() -> None:
    """Every entry's grid launches with the tiles and the register cap of the fewest
    grid: ``attention_config`` and ``register_cap`` see the enlarged grid, and what was
    measured was the block count alone."""
    from engine.fused.dispatch import QUERY_BLOCKS
    from engine.fused.kernels import attention as attn

    for (_, hidden, heads, _, tokens, _), counts in QUERY_BLOCKS.items():
        for seqs, blocks in counts.items():
            fewest = attn.attention_config(128, seqs, heads, hidden // heads, tokens)
            bm, warps = fewest[0], fewest[2]
            padded = attn.attention_config(blocks * bm, seqs, heads, hidden // heads, tokens)
            assert padded == fewest, (seqs, blocks)
            assert (attn.register_cap(blocks * seqs * heads, warps)
                    == attn.register_cap(-(-128 // bm) * seqs * heads, warps)), (seqs, blocks)


def test_a_table_can_be_passed() -> None:
    from engine.fused.dispatch import query_blocks

    key = (10, 1, 1, 1, 1, False)
    assert query_blocks(3, key, {key: {3: 6}}) == 6
    assert query_blocks(4, key, {key: {3: 6}}) == 0


def test_no_multiprocessors_off_cuda() -> None:
    from engine.fused.dispatch import multiprocessors

    assert multiprocessors(torch.device("cpu")) == 0


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    from tests.unit.test_small_batch_options import _tiny_engine

    return _tiny_engine("float16").weights


def _attention_seqlens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``max_seqlen`` of every attention launch of the torch spec backend."""
    from engine.fused import torch_ops

    seen: list[int] = []
    spec = torch_ops.attention_varlen

    def attention(qkv: Any, bias: Any, cu: Any, max_seqlen: int, *args: Any,
                  **kw: Any) -> Any:
        seen.append(max_seqlen)
        return spec(qkv, bias, cu, max_seqlen, *args, **kw)

    monkeypatch.setattr(torch_ops, "attention_varlen", attention)
    return seen


@pytest.mark.parametrize(("grid", "deferred"), [
    (4, True), ("fewest", True), ("table", True), (4, False)])
def test_the_torch_spec_sizes_no_grid(tiny: Any, monkeypatch: pytest.MonkeyPatch,
                                      grid: int | str, deferred: bool) -> None:
    """The torch spec backend loops over the sequences: every ``attention_grid`` leaves
    its ``max_seqlen`` the batch's, on either small-batch layer."""
    from engine.fused.engine import FusedEngine

    seen = _attention_seqlens(monkeypatch)
    engine = FusedEngine(tiny, "cpu", backend="torch", attention_grid=grid,
                         deferred_ln_max_hidden=48 if deferred else None)
    ids = np.random.default_rng(7).integers(1, 100, (2, 20)).astype(np.int32)
    engine.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    assert seen == [20, 20]  # one attention a layer


@pytest.mark.parametrize(("grid", "tokens", "seqs", "max_seqlen", "e4m3", "want"), [
    ("table", 64, 2, 128, False, 6 * 64),  # the entry: 6 blocks of 64 queries
    ("table", 64, 2, 100, False, 6 * 64),
    ("table", 64, 3, 128, False, 128),     # no count for 3 sequences
    ("table", 64, 4, 128, False, 128),     # a count under the fewest: the fewest
    ("table", 64, 4, 20, False, 20),       # ... equal to it: the batch's own max_seqlen
    ("table", 128, 2, 128, False, 128),    # other keys
    ("table", 64, 2, 128, True, 128),
    ("fewest", 64, 2, 128, False, 128),
    (3, 64, 2, 128, False, 3 * 64),        # a number: at least that many blocks
    (1, 64, 2, 128, False, 128),           # never under the fewest
    (3, 64, 0, 0, False, 0),               # an empty batch
])
def test_the_table_sizes_the_triton_grid(
        tiny: Any, monkeypatch: pytest.MonkeyPatch, grid: int | str, tokens: int, seqs: int,
        max_seqlen: int, e4m3: bool, want: int) -> None:
    """``encoder._attention_seqlen`` with the Triton kernels' tiles (64-query blocks for
    these batches): the ``max_seqlen`` the grid is sized for, from the table's entry for
    the layer (its multiprocessors, shape, token count and operand type) and the bucket's
    sequence count, the fewest, or a number of blocks."""
    from engine.fused import dispatch, encoder, kernels
    from engine.fused.encoder import EncodeOptions

    monkeypatch.setattr(dispatch, "multiprocessors", lambda device: 10)
    monkeypatch.setattr(dispatch, "QUERY_BLOCKS",
                        {(10, 48, 4, 96, 64, False): {2: 6, 4: 1}})
    got = encoder._attention_seqlen(kernels, tiny, EncodeOptions(attn_grid=grid), tokens,
                                    seqs, max_seqlen, e4m3, torch.device("cpu"))
    assert got == want


@pytest.mark.parametrize("bad", ["best", "", 0, -3, True, 2.5])
def test_attention_grid_option_is_checked(tiny: Any, bad: Any) -> None:
    from engine.fused.engine import FusedEngine

    with pytest.raises(ValueError, match="attention_grid"):
        FusedEngine(tiny, "cpu", backend="torch", attention_grid=bad)


@pytest.mark.parametrize(("seqs", "e4m3", "want"), [
    (1, True, None), (2, True, False), (8, True, False),   # e4m3: late past one sequence
    (0, True, None), (2, False, None), (16, False, None),  # 16-bit: the kernel's choice
])
def test_early_tail_choice(seqs: int, e4m3: bool, want: bool | None) -> None:
    from engine.fused.dispatch import EARLY_TAIL_E4M3_MAX_SEQS, early_tail

    assert EARLY_TAIL_E4M3_MAX_SEQS == 1
    assert early_tail(seqs, e4m3) is want
