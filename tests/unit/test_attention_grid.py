"""How many programs the deferred layer's attention launches (``engine.fused.dispatch``,
the engine's ``attention_grid`` option), checked without a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H200_BASE = (132, 768, 12, 3072, 128, True)  # BERT-base's FP8 deferred layer at 128 tokens


@pytest.mark.parametrize(("minimum", "step", "key", "want"), [
    (24, 12, H200_BASE, 24),    # 1x128: 24 is good already
    (48, 4, H200_BASE, 96),     # 2x64: 48 and 60 are the bad class; 96 the first good count
    (96, 48, H200_BASE, 96),    # 4x32
    (192, 16, H200_BASE, 288),  # 8x16: 192 = 60 mod 132; 288 = 24 mod 132
    (384, 32, H200_BASE, 384),  # 16x8: no good count within 132 more programs
    (48, 4, (114, 768, 12, 3072, 128, True), 48),  # another GPU: no entry
    (48, 4, (132, 768, 12, 3072, 64, True), 48),   # 64 tokens: no entry
    (48, 4, (132, 768, 12, 3072, 128, False), 48),  # 16-bit operands: no entry
    (0, 0, H200_BASE, 0),
])
def test_attention_programs_pick_the_first_good_count(
        minimum: int, step: int, key: tuple[int, int, int, int, int, bool], want: int) -> None:
    from engine.fused.dispatch import attention_programs

    assert attention_programs(minimum, step, key) == want


def test_a_table_can_be_passed() -> None:
    from engine.fused.dispatch import attention_programs

    key = (10, 1, 1, 1, 1, False)
    assert attention_programs(4, 3, key, {key: (3,)}) == 13  # 4, 7, 10 = 0, 13 = 3 (mod 10)
    assert attention_programs(4, 3, key, {key: (5,)}) == 4  # 5 mod 10 unreachable by 3s from 4


def test_no_multiprocessors_off_cuda() -> None:
    from engine.fused.dispatch import multiprocessors

    assert multiprocessors(torch.device("cpu")) == 0


def _tiny(dtype: str, **options: Any):  # type: ignore[no-untyped-def]
    from engine.fused.config import BertQAConfig
    from engine.fused.engine import FusedEngine

    torch.manual_seed(5)
    hf = transformers.BertConfig(vocab_size=100, hidden_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=96,
                                 max_position_embeddings=64)
    model = transformers.BertForQuestionAnswering(hf).eval()
    return FusedEngine.from_state_dict(model.state_dict(), BertQAConfig.from_dict(hf.to_dict()),
                                       device="cpu", dtype=dtype, backend="torch", **options)


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    return _tiny("float16").weights


def _attention_programs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ``programs`` argument of every attention launch of the torch spec backend."""
    from engine.fused import torch_ops

    seen: list[Any] = []
    spec = torch_ops.attention_varlen

    def attention(*args: Any, **kw: Any) -> Any:
        seen.append(kw.get("programs"))
        return spec(*args, **kw)

    monkeypatch.setattr(torch_ops, "attention_varlen", attention)
    return seen


@pytest.mark.parametrize(("grid", "deferred", "want"), [
    (40, True, 40), ("fewest", True, None), ("table", True, None),  # no entry off CUDA
    (40, False, None),  # the seven-kernel layer keeps its grid
])
def test_attention_grid_reaches_the_deferred_layer(
        tiny: Any, monkeypatch: pytest.MonkeyPatch, grid: int | str, deferred: bool,
        want: int | None) -> None:
    from engine.fused.engine import FusedEngine

    seen = _attention_programs(monkeypatch)
    engine = FusedEngine(tiny, "cpu", backend="torch", attention_grid=grid,
                         deferred_ln_max_hidden=48 if deferred else None)
    ids = np.random.default_rng(7).integers(1, 100, (2, 20)).astype(np.int32)
    engine.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    assert seen == [want, want]  # one attention a layer


def test_the_table_sizes_the_grid_from_the_layer(tiny: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With an entry for the layer (its multiprocessors, shape, token count and operand
    type), ``"table"`` asks for the first good count. The Triton grid of 2 sequences with
    max_seqlen 128 has 2 query blocks x 2 sequences a head, 16 programs for 4 heads; with
    10 multiprocessors 16 is residue 6, 20 is 0 and 24 is 4, the good one."""
    from engine.fused import dispatch, encoder, kernels
    from engine.fused.encoder import EncodeOptions

    monkeypatch.setattr(dispatch, "multiprocessors", lambda device: 10)
    key = (10, 48, 4, 96, 64, False)
    monkeypatch.setattr(dispatch, "GOOD_RESIDUES", {key: (4,)})

    def programs(tokens: int, e4m3: bool = False, grid: int | str = "table") -> int | None:
        return encoder._attention_programs(kernels, tiny, EncodeOptions(attn_grid=grid),
                                           tokens, 2, 128, e4m3, torch.device("cpu"))

    assert programs(64) == 24
    assert programs(128) is None and programs(64, e4m3=True) is None  # other keys
    assert programs(64, grid="fewest") is None and programs(64, grid=7) == 7


@pytest.mark.parametrize("bad", ["best", "", 0, -3, True, 2.5])
def test_attention_grid_option_is_checked(tiny: Any, bad: Any) -> None:
    from engine.fused.engine import FusedEngine

    with pytest.raises(ValueError, match="attention_grid"):
        FusedEngine(tiny, "cpu", backend="torch", attention_grid=bad)
