"""FP8-aware fine-tuning (``training.fp8_aware``, ``finetune --fp8-aware``) on the CPU:
the training pass rounds as the fused engine's calibrated FP8 GEMMs do, and the saved
weights sit on the grids the engine rounds them to."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from engine.fused.calibration import GEMMS
from engine.fused.fp8 import FP8_MAX, quantize_static, quantize_tiles
from tests.training.test_finetune_smoke import write_first_questions
from tests.unit.test_folding import _tiny_bert
from training import finetune, fp8_aware


def _hf_logits(model: nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids).long(),
                    attention_mask=torch.ones(ids.shape, dtype=torch.long),
                    token_type_ids=torch.zeros(ids.shape, dtype=torch.long))
    return torch.stack([out.start_logits, out.end_logits]).numpy()


def _fused_qkv(layer: nn.Module) -> torch.Tensor:
    a = layer.attention.self
    return torch.cat([a.query.weight, a.key.weight, a.value.weight]).detach()


def test_fake_rounding_is_the_engines_and_passes_gradients_through() -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 48, generator=g) * 3).requires_grad_()
    scale = torch.tensor(4 * 9.0 / FP8_MAX)
    y = fp8_aware.fake_e4m3(x, scale)
    q = quantize_static(x.detach(), scale.reshape(1))
    assert torch.equal(y.detach(), q.data.float() * q.scale)
    assert not torch.equal(y.detach(), x.detach())  # it does round
    y.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.ones_like(x))
    huge = fp8_aware.fake_e4m3(torch.tensor([1e6, -1e6]), scale)  # saturates at +-448 scales
    assert torch.equal(huge, torch.tensor([FP8_MAX, -FP8_MAX]) * scale)


def test_wrapping_keeps_the_parameters_and_refuses_mistakes() -> None:
    model, _ = _tiny_bert(1)
    before = [id(p) for p in model.parameters()]
    assert fp8_aware.wrap(model, ("qkv", "ffn_out")) == 2 * (3 + 1)
    assert [id(p) for p in model.parameters()] == before
    layer = model.bert.encoder.layer[0]
    assert isinstance(layer.attention.self.key, fp8_aware.FakeE4M3Linear)
    assert isinstance(layer.intermediate.dense, nn.Linear)  # ffn_in not asked for
    with pytest.raises(ValueError, match="already FP8-aware"):
        fp8_aware.wrap(model, ("qkv",))
    with pytest.raises(ValueError, match="unknown GEMMs"):
        fp8_aware.wrap(_tiny_bert(1)[0], ("qkv", "attention"))


def _calibrated_engine(seed: int):  # type: ignore[no-untyped-def]
    """(HF model with float16-exact weights, calibrated FP8 engine of it with all four GEMM
    inputs static on the CPU ops, its calibration batch's ids)."""
    from engine.fused.engine import FusedEngine

    model, cfg = _tiny_bert(seed)
    with torch.no_grad():  # the engine keeps float16 weights: the same amax, the same scale
        for p in model.parameters():
            p.copy_(p.half().float())
    ids = np.random.default_rng(seed).integers(1, 100, (3, 20)).astype(np.int32)
    eng = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu", dtype="fp8",  # type: ignore[arg-type]
                                      backend="torch", fp8_calibrated_min_tokens=1,
                                      fp8_static_inputs=GEMMS)
    eng.calibrate(ids, np.ones_like(ids), np.zeros_like(ids))
    return model, eng, ids


def test_each_wrapped_gemm_computes_the_engines_calibrated_gemm() -> None:
    """Per layer and GEMM, on an input whose amax is the one the engine calibrated (so both
    take the same input scale): the wrapped linear's product is the engine's
    ``static_linear`` on its calibrated e4m3 operands (QKV's three as one fused weight)."""
    from engine.fused.fp8 import static_linear

    model, eng, _ = _calibrated_engine(2)
    fp8_aware.wrap(model)
    g = torch.Generator().manual_seed(6)
    for i, layer in enumerate(model.bert.encoder.layer):
        a = layer.attention.self
        sites = {"qkv": (a.query, a.key, a.value), "attn_out": (layer.attention.output.dense,),
                 "ffn_in": (layer.intermediate.dense,), "ffn_out": (layer.output.dense,)}
        for gemm, wrappers in sites.items():
            lin = getattr(eng.weights.calibrated[i], gemm)
            x = torch.randn(40, lin.w8.shape[1], generator=g)
            x *= eng.calibration.amax[gemm][i] / float(x.abs().amax())
            want = static_linear(quantize_static(x, lin.x_scale), lin, torch.float32)
            with torch.no_grad():
                ours = torch.cat([w(x) - w.linear.bias for w in wrappers], dim=1)
            torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)


def test_the_training_pass_rounds_as_much_as_the_engine() -> None:
    """Whole logits: the activations' roundings cannot match the engine's one for one (a
    scale a hair apart is another grid), so what must match is how far each moves the
    logits from the fp32 model's: the wrapped model as far as the engine, within 2x."""
    model, eng, ids = _calibrated_engine(3)
    plain = _hf_logits(model, ids)
    engine = np.abs(np.stack(eng.infer(ids, np.ones_like(ids), np.zeros_like(ids))) - plain)
    fp8_aware.wrap(model)
    ours = np.abs(_hf_logits(model, ids) - plain)
    assert 0.5 < ours.mean() / engine.mean() < 2.0, (ours.mean(), engine.mean())


def test_projection_leaves_weights_the_engine_rounds_to_themselves() -> None:
    """After training moved the weights, :func:`project` puts each on its e4m3 grid: the
    engine's per-tensor rounding (QKV as one fused tensor) gives them back exactly, in
    float32 and after the float16 save; the model is plain again and its state dict has
    the original keys."""
    model, _ = _tiny_bert(4)
    keys = list(model.state_dict())
    fp8_aware.wrap(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    assert fp8_aware.project(model) == 2 * 6
    assert list(model.state_dict()) == keys
    assert not any(isinstance(m, fp8_aware.FakeE4M3Linear) for m in model.modules())
    for layer in model.bert.encoder.layer:
        for w in (_fused_qkv(layer), layer.attention.output.dense.weight.detach(),
                  layer.intermediate.dense.weight.detach(), layer.output.dense.weight.detach()):
            codes, scale = quantize_tiles(w, *w.shape)
            assert torch.equal(codes.float() * scale, w)
            half = w.half()
            codes16, _ = quantize_tiles(half, *half.shape)
            assert torch.equal(codes16.float(), codes.float())


def _tiny_run(tmp_path: Path, shipped_model_dir: Path, data_dir: Path, seed: int,
              steps: int, lr: str) -> tuple[Path, list[str]]:
    """(base checkpoint dir, fine-tuning arguments less ``--out``): :func:`_tiny_bert` with
    the shipped vocabulary and tokenizer, 8 training questions in 64-token windows, on the
    CPU."""
    model, _ = _tiny_bert(seed)
    model.config.vocab_size = 30522
    model.resize_token_embeddings(30522)
    base = tmp_path / "base"
    model.save_pretrained(str(base))
    for name in finetune.TOKENIZER_FILES:
        shutil.copy(shipped_model_dir / name, base / name)
    data = tmp_path / "train8.json.xz"
    write_first_questions(data_dir / "train-subset-v1.1.json.xz", data, 8)
    return base, ["--base-model", str(base), "--phase", f"{data}@1", "--max-seq-len", "64",
                  "--overlap", "16", "--max-question-len", "16", "--batch-size", "4",
                  "--max-steps", str(steps), "--lr", lr, "--device", "cpu"]


def test_finetune_saves_an_fp8_aware_checkpoint(tmp_path: Path, shipped_model_dir: Path,
                                                data_dir: Path) -> None:
    """``finetune --fp8-aware qkv,ffn_in`` trains a few steps and saves those GEMMs'
    weights on their grids (float16, as shipped); the out-projection, not named, is not."""
    base, args = _tiny_run(tmp_path, shipped_model_dir, data_dir, 5, 3, "1e-3")
    finetune.main([*args, "--out", str(tmp_path / "out"), "--fp8-aware", "qkv,ffn_in"])
    from transformers import BertForQuestionAnswering

    saved = BertForQuestionAnswering.from_pretrained(str(tmp_path / "out"), dtype=torch.float16)
    start = BertForQuestionAnswering.from_pretrained(str(base), dtype=torch.float16)
    for layer, before in zip(saved.bert.encoder.layer, start.bert.encoder.layer, strict=True):
        for w, on_grid in ((_fused_qkv(layer), True),
                           (layer.intermediate.dense.weight.detach(), True),
                           (layer.attention.output.dense.weight.detach(), False)):
            codes, scale = quantize_tiles(w, *w.shape)
            w32 = w.float()
            # relative to each weight (e4m3's subnormal step below 2**-6 scales): on the
            # grid only float16's rounding of the weight and of its scale (measured < 4.1e-3,
            # most of it float16's own subnormals), off it e4m3's (up to 2**-4)
            rel = ((codes.float() * scale - w32).abs() / w32.abs().clamp(min=scale * 2**-6)).max()
            assert (rel < 2**-7) == on_grid, float(rel)
        assert not torch.equal(layer.intermediate.dense.weight, before.intermediate.dense.weight)


def test_distillation_loss_compares_real_tokens_only() -> None:
    """``finetune.distill_loss``: zero for the teacher's own logits, whatever the padding
    holds; positive otherwise; ``weight`` 0 is the labelled loss alone."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(7)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[:, 7:] = 0
    t = SimpleNamespace(start_logits=torch.randn(3, 10, generator=g),
                        end_logits=torch.randn(3, 10, generator=g))
    noisy_pad = t.start_logits.clone()
    noisy_pad[:, 7:] = 50.0
    same = SimpleNamespace(start_logits=noisy_pad, end_logits=t.end_logits.clone(),
                           loss=torch.tensor(3.0))
    assert float(finetune.distill_loss(same, t, mask)) == pytest.approx(0.0, abs=1e-6)
    other = SimpleNamespace(start_logits=t.start_logits + torch.randn(3, 10, generator=g),
                            end_logits=t.end_logits, loss=torch.tensor(3.0))
    kl = float(finetune.distill_loss(other, t, mask))
    assert kl > 0.05
    assert float(finetune.distill_loss(other, t, mask, 0.0)) == pytest.approx(3.0)
    assert float(finetune.distill_loss(other, t, mask, 0.5)) == pytest.approx(0.5 * kl + 1.5)


def test_finetune_distils_from_a_teacher(tmp_path: Path, shipped_model_dir: Path,
                                         data_dir: Path) -> None:
    """``--distill-from`` the base model itself with ``--fp8-aware``: the loss is the
    rounded model's divergence from its own fp32 outputs, far below the labelled loss
    (about ln(64) for a model that cannot answer)."""
    base, args = _tiny_run(tmp_path, shipped_model_dir, data_dir, 8, 2, "1e-4")
    common = [*args, "--fp8-aware", "qkv,attn_out,ffn_in,ffn_out"]
    [taught] = finetune.main([*common, "--out", str(tmp_path / "a"), "--distill-from", str(base)])
    [labelled] = finetune.main([*common, "--out", str(tmp_path / "b")])
    assert 0.0 < taught.first_loss < 0.1 < 3.0 < labelled.first_loss, (taught, labelled)


def test_a_distillation_share_outside_0_1_is_refused() -> None:
    base = ["--base-model", "m", "--out", "o", "--phase", "d.json@1"]
    assert finetune.parse_args([*base, "--distill-weight", "0.5"]).distill_weight == 0.5
    for bad in ("-0.1", "1.5"):
        with pytest.raises(SystemExit):
            finetune.parse_args([*base, "--distill-weight", bad])
