"""FP8-aware fine-tuning: the fused engine's calibrated FP8 rounding in the training pass.

The engine's calibrated FP8 GEMMs (``engine.fused.fp8``, "Calibrated") compute ``x @ w.T``
from e4m3 copies of both operands: the weight with one scale for the whole tensor (amax /
448; the query, key and value projections as one fused tensor with one scale) and the
input with one static scale (``margin * amax / 448``, from calibration data). Its F1 cost
on the shipped checkpoint sits at the 0.1 budget's edge (``engine/fused/NOTES.md``), so
every further FP8 step is gated on F1. :func:`wrap` replaces a BERT-family model's GEMMs
named in ``gemms`` (of ``engine.fused.calibration.GEMMS``) by :class:`FakeE4M3Linear`,
which rounds both operands that way in the forward pass and passes gradients straight
through (the straight-through estimator), so fine-tuning moves the weights to where the
rounding costs least; :func:`project` then puts every wrapped weight on its e4m3 grid and
unwraps the model, so the saved checkpoint holds weights the engine's rounding leaves
as they are.

Input scales are each batch's amax times the engine's calibration margin, not a
calibration's: e4m3 is a floating-point format, so its relative precision does not depend
on the scale, only where its range ends (the margin keeps saturation away; margins of 1 to
16 gave the engine the same logit error, ``engine.fused.calibration``). The engine
calibrates the fine-tuned checkpoint's own scales when it loads it, as for any other.

Measured (H100, 2026-12-06, shipped MiniLM, 15 fine-tuned checkpoints over four recipes;
``engine/fused/NOTES.md`` v46): the engine's logit error against each checkpoint's own fp32
outputs fell 24%, its F1 loss did not (all four GEMMs static +0.121, the default +0.094),
so this buys no F1 room for the levers the budget gates. Kept for studies of the scheme.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.fused.calibration import CALIBRATION_MARGIN, GEMMS
from engine.fused.fp8 import FP8_MAX, SCALE_MIN, dequantize, quantize_static


def fake_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to the e4m3 grid of ``scale`` (a float32 scalar tensor) as the engine
    rounds it (a multiply by the reciprocal, saturation at +-448), in ``x``'s dtype; the
    gradient passes through unchanged."""
    q = dequantize(quantize_static(x.detach(), scale))
    return x + (q.to(x.dtype) - x).detach()


def weight_scale(group: tuple[nn.Linear, ...]) -> torch.Tensor:
    """The one scale of a fused weight: amax over the group's weights / 448."""
    amax = torch.stack([lin.weight.detach().abs().amax().float() for lin in group]).amax()
    return (amax / FP8_MAX).clamp(min=SCALE_MIN)


class FakeE4M3Linear(nn.Module):
    """``linear`` on e4m3-rounded operands: its input with one scale for the batch
    (``margin`` * amax / 448), its weight with its group's scale (:func:`weight_scale`)."""

    def __init__(self, linear: nn.Linear, group: tuple[nn.Linear, ...],
                 margin: float = CALIBRATION_MARGIN) -> None:
        super().__init__()
        if not any(lin is linear for lin in group):
            raise ValueError("a wrapped linear must belong to its own weight group")
        self.linear = linear
        self.group = group  # a tuple: not registered as submodules (each is, where it is wrapped)
        self.margin = margin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_scale = (x.detach().abs().amax().float() * (self.margin / FP8_MAX)).clamp(min=SCALE_MIN)
        w = fake_e4m3(self.linear.weight, weight_scale(self.group))
        return F.linear(fake_e4m3(x, x_scale), w, self.linear.bias)


def _layers(model: nn.Module) -> nn.ModuleList:
    """The encoder layers of an HF BERT-family model (``model.bert.encoder.layer``)."""
    base: Any = getattr(model, getattr(model, "base_model_prefix", "bert"), model)
    layers = base.encoder.layer
    assert isinstance(layers, nn.ModuleList)
    return layers


def _sites(layer: Any) -> dict[str, list[tuple[nn.Module, str]]]:
    """Per engine GEMM, the (parent, attribute) of each HF linear it fuses."""
    attn = layer.attention.self
    return {"qkv": [(attn, "query"), (attn, "key"), (attn, "value")],
            "attn_out": [(layer.attention.output, "dense")],
            "ffn_in": [(layer.intermediate, "dense")],
            "ffn_out": [(layer.output, "dense")]}


def wrap(model: nn.Module, gemms: tuple[str, ...] = GEMMS,
         margin: float = CALIBRATION_MARGIN) -> int:
    """Replace the linears of ``gemms`` in every encoder layer by :class:`FakeE4M3Linear`
    (in place); returns how many were wrapped. The parameters stay the same objects, so an
    optimizer made before or after sees the same ones."""
    if unknown := set(gemms) - set(GEMMS):
        raise ValueError(f"unknown GEMMs {sorted(unknown)}; choose from {', '.join(GEMMS)}")
    wrapped = 0
    for layer in _layers(model):
        for gemm, sites in _sites(layer).items():
            if gemm not in gemms:
                continue
            group = tuple(getattr(parent, name) for parent, name in sites)
            if any(isinstance(lin, FakeE4M3Linear) for lin in group):
                raise ValueError("the model is already FP8-aware")
            for (parent, name), lin in zip(sites, group, strict=True):
                setattr(parent, name, FakeE4M3Linear(lin, group, margin))
                wrapped += 1
    return wrapped


@torch.no_grad()
def project(model: nn.Module) -> int:
    """Put every wrapped weight on its e4m3 grid (its group's scale, taken before any of
    the group moves) and put the plain linears back (in place); returns how many."""
    done = 0
    for layer in _layers(model):
        for sites in _sites(layer).values():
            wrappers = [getattr(parent, name) for parent, name in sites]
            if not all(isinstance(w, FakeE4M3Linear) for w in wrappers):
                continue
            scale = weight_scale(wrappers[0].group)
            for (parent, name), w in zip(sites, wrappers, strict=True):
                lin = w.linear
                lin.weight.copy_(fake_e4m3(lin.weight.float(), scale).to(lin.weight.dtype))
                setattr(parent, name, lin)
                done += 1
    return done
