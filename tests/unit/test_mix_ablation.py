"""``benchmarks/mix_ablation.py``'s step memo on the CPU: a pass that takes a kind of step
out gets the outputs the recorded pass had, so everything downstream reads real values."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_skipped_steps_return_the_recorded_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.mix_ablation import KINDS, StepMemo, memo_engine
    from engine.fused import encoder
    from tests.unit.test_folding import calibrated_tiny_fp8

    eng, _, (ids, mask, tt) = calibrated_tiny_fp8()
    # The memo runs the residual LayerNorms as two kernels a layer (and gives the setting
    # back): the plain pass to compare with is that one.
    monkeypatch.setattr(encoder, "OUT_PROJ_ADDS_RESIDUAL", False)
    plain = eng.infer(ids, mask, tt)
    monkeypatch.setattr(encoder, "OUT_PROJ_ADDS_RESIDUAL", True)
    memo = StepMemo()
    with memo_engine(eng, memo):
        memo.recording = True
        memo.start_pass()
        recorded = eng.infer(ids, mask, tt)
        memo.recording = False
        assert {k: len(v) for k, v in memo.outputs.items()} == {
            "qkv": 2, "attention": 2, "out_proj": 2, "layernorm": 3, "ffn1": 2, "ffn2": 2}
        for kind in KINDS:
            memo.skip = frozenset({kind})
            memo.start_pass()
            for a, b in zip(eng.infer(ids, mask, tt), recorded, strict=True):
                assert np.array_equal(a, b), kind
            assert memo.taken(kind) == len(memo.outputs[kind])
        # Taken out for real: other recorded values change the logits.
        memo.outputs["attention"] = [torch.zeros_like(t) for t in memo.outputs["attention"]]
        memo.skip = frozenset({"attention"})
        memo.start_pass()
        assert not np.array_equal(eng.infer(ids, mask, tt)[0], recorded[0])
    for a, b in zip(plain, recorded, strict=True):
        assert np.array_equal(a, b)
    assert eng.ops.__name__.endswith("torch_ops")  # the op set is given back
    assert encoder.OUT_PROJ_ADDS_RESIDUAL is True  # and the setting


def test_unknown_step_kinds_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import mix_ablation

    monkeypatch.setattr("sys.argv", ["mix_ablation.py", "--variants", "qkv,softmax"])
    with pytest.raises(SystemExit):
        mix_ablation.main()
