"""Launch choices of the seven-kernel small-batch layer that the engine makes per batch,
checked through the torch spec backend (the same calls as the Triton kernels get)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    from engine.fused.config import BertQAConfig
    from engine.fused.engine import FusedEngine

    torch.manual_seed(5)
    hf = transformers.BertConfig(vocab_size=100, hidden_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=96,
                                 max_position_embeddings=64)
    model = transformers.BertForQuestionAnswering(hf).eval()
    return FusedEngine.from_state_dict(model.state_dict(), BertQAConfig.from_dict(hf.to_dict()),
                                       device="cpu", dtype="float16", backend="torch").weights


@pytest.mark.parametrize(("min_seqs", "windows", "late"),
                         [(2, 1, False), (2, 3, True), (None, 3, False), (1, 1, True)])
def test_qkv_releases_attention_late_in_multi_sequence_batches(
        tiny: Any, monkeypatch: pytest.MonkeyPatch, min_seqs: int | None, windows: int,
        late: bool) -> None:
    """The QKV GEMM lets attention launch only after its K loop in batches of at least
    ``qkv_late_release_min_seqs`` sequences (default 2), and no other GEMM does."""
    from engine.fused import torch_ops
    from engine.fused.engine import FusedEngine

    seen: list[tuple[bool, bool]] = []  # (is QKV, late_release)
    spec_linear = torch_ops.linear

    def linear(x: Any, w: Any, *args: Any, late_release: bool = False, **kw: Any) -> Any:
        seen.append((w.shape[0] == 3 * x.shape[1], late_release))
        return spec_linear(x, w, *args, **kw)

    monkeypatch.setattr(torch_ops, "linear", linear)
    engine = FusedEngine(tiny, "cpu", backend="torch", deferred_ln_max_hidden=None,
                         qkv_late_release_min_seqs=min_seqs)
    ids = np.random.default_rng(6).integers(1, 100, (windows, 20)).astype(np.int32)
    engine.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    assert [late for qkv, late in seen if qkv] == [late, late]  # one QKV a layer
    assert not any(late for qkv, late in seen if not qkv)
