"""``benchmarks/ln_fusion_bound.py`` on the CPU: the step memo's stand-ins get the recorded
output and the step's own arguments, the residual is tracked through the op set, and the
out-projection's stand-in keeps its buffers bounded (the GEMMs and ``layernorm_quant``
themselves run on the device)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def test_stand_ins_get_the_recorded_output_and_the_steps_arguments() -> None:
    from benchmarks.ln_fusion_bound import StandIns, TrackResidual
    from benchmarks.mix_ablation import StepMemo, memo_engine
    from tests.unit.test_folding import calibrated_tiny_fp8

    eng, _, (ids, mask, tt) = calibrated_tiny_fp8()
    memo, stand_ins = StepMemo(), StandIns()
    seen: list[tuple[Any, Any]] = []

    def layernorm(recorded: Any, a: Any, bias: Any, residual: Any, *args: Any,
                  **kwargs: Any) -> Any:
        seen.append((residual, stand_ins.residual))
        return recorded

    with memo_engine(eng, memo):
        eng.ops = TrackResidual(eng.ops, stand_ins)  # type: ignore[assignment]
        memo.recording = True
        memo.start_pass()
        recorded = eng.infer(ids, mask, tt)
        memo.recording = False
        memo.replace = {"layernorm": layernorm}
        memo.start_pass()
        again = eng.infer(ids, mask, tt)
        # A stand-in that hands on something else changes the logits: it ran.
        memo.replace = {"layernorm": lambda rec, *a, **k: (torch.zeros_like(rec[0]), rec[1])}
        memo.start_pass()
        other = eng.infer(ids, mask, tt)
    for a, b in zip(again, recorded, strict=True):
        assert np.array_equal(a, b)
    assert not np.array_equal(other[0], recorded[0])
    # 3 residual LayerNorms (2 layers; the last is the QA head's); each saw, as its
    # residual argument, the hidden states the op set noted last.
    assert len(seen) == 3
    assert all(arg is noted for arg, noted in seen)
    assert seen[1][0] is memo.outputs["layernorm"][0][0]


def test_out_projection_stand_in_alternates_around_the_residual() -> None:
    from benchmarks.ln_fusion_bound import StandIns

    g = torch.Generator().manual_seed(3)
    r, x = torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)
    lin = type("Lin", (), {"weight": torch.randn(8, 4, generator=g)})()
    s = StandIns()
    s.residual = r
    kept = r.clone()
    outs = []
    for _ in range(3):
        s.start_pass()
        first = s.out_proj(None, x, None, lin).clone()
        second = s.out_proj(None, x, None, lin).clone()  # the next call: its own buffer
        outs.append((first, second))
    product = x @ lin.weight.t()
    for i, (first, second) in enumerate(outs):
        want = r + product if i % 2 == 0 else r
        assert torch.allclose(first, want, atol=1e-5) and torch.allclose(second, want, atol=1e-5)
    assert torch.equal(r, kept)


def test_halves_replace_every_other_layernorm() -> None:
    """``half_out`` replaces each layer's first residual LayerNorm (after the
    out-projection: calls 0, 2, ...), ``half_ffn2`` its second; the others run the real
    op with the step's own arguments."""
    from benchmarks.ln_fusion_bound import VARIANTS, StandIns

    real: list[tuple[Any, ...]] = []
    s = StandIns(lambda *a, **k: real.append(a) or ("real", a[0]))
    s.layernorm = lambda recorded, *a, **k: ("quant", a[0])  # type: ignore[method-assign]
    for method, quant_calls in (("layernorm_after_out", [0, 2, 4]),
                                ("layernorm_after_ffn2", [1, 3])):
        assert VARIANTS["half_out" if "out" in method else "half_ffn2"][1]["layernorm"] == method
        s.start_pass()
        got = [getattr(s, method)(None, i, "bias", "res") for i in range(5)]
        assert [i for i, (kind, _) in enumerate(got) if kind == "quant"] == quant_calls
        assert all(arg == i for i, (_, arg) in enumerate(got))
    assert [a[1:] for a in real] == [("bias", "res")] * 5
