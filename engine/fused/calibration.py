"""Calibrated FP8 scales (``engine.fused.fp8``, "Calibrated").

:class:`AmaxRecorder` stands in for an op set (``kernels`` or ``torch_ops``) while the
encoder runs un-quantized passes over calibration batches, and records per layer the
largest magnitude of the inputs of its FP8 GEMMs: QKV's (the embeddings' LayerNorm for
the first layer, the previous layer's second LayerNorm after that), the attention
output projection's (attention), FFN1's (the attention block's LayerNorm) and FFN2's
(bias + GELU); and the sums those LayerNorms normalise (``RAW_INPUTS``: the
deferred-LayerNorm path quantizes them, un-normalised): a :class:`Calibration`, which
can be saved and loaded as JSON and turns into per-tensor scales, ``margin * amax /
448``. The margin leaves room for activations larger than any seen (larger ones
saturate at +-448 * scale); a larger one costs precision only for values below ``margin
* amax / 2**15`` (e4m3's subnormals). Measured (H200, 2026-11-30, shipped MiniLM, mean
|logit - fp32| on 2,023 dev windows, QKV/FFN calibrated): margin 1 / 2 / 4 / 8 / 16 give
0.0609 / 0.0608 / 0.0608 / 0.0607 / 0.0606, so neither saturation nor subnormals is what
static scales cost (``engine/fused/NOTES.md``, v10).

It also records, for the GEMMs that can run in int8 (``INT8_GEMMS``: the out-projection
and FFN1), each input channel's largest magnitude: SmoothQuant's smoothing and the int8
input scale come from those (``engine.fused.int8``; saved with the rest).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from engine.fused.folding import DeferredFP8Layer, deferred_fp8_layers
from engine.fused.fp8 import FP8_MAX, SCALE_MIN, CalibratedLayer, StaticLinear, quantize_tiles
from engine.fused.gptq import gptq_e4m3
from engine.fused.int8 import SMOOTHING_ALPHA, Int8Layer, Int8Linear, int8_linear_of
from engine.fused.torch_ops import sum_splits
from engine.fused.weights import BertQAWeights

CALIBRATION_MARGIN = 4.0


GEMMS = ("qkv", "attn_out", "ffn_in", "ffn_out")
# QKV's and FFN1's inputs before their LayerNorm (the embeddings' sum for layer 0, the
# residual sums after that). Optional: calibrations saved before they were recorded
# lack them, and then the deferred-LayerNorm path stays 16-bit.
RAW_INPUTS = ("qkv_raw", "ffn_in_raw")
# The GEMMs whose inputs' per-channel largest magnitudes are recorded (``colmax``), for
# their int8 form (``engine.fused.int8``).
INT8_GEMMS = ("attn_out", "ffn_in")


class AmaxRecorder:
    """An op set that records the FP8 GEMMs' input magnitudes per layer and otherwise
    forwards every call to ``ops``. Each output is told apart by the parameters it was
    computed with: the embeddings' LayerNorm (a pass's first call) and each LayerNorm's
    gamma (LN2 of layer i feeds QKV of layer i + 1, LN1 feeds FFN1), the QKV bias
    (attention feeds the out-projection) and FFN1's bias (its GELU feeds FFN2); so the
    recording does not depend on call order. Passes must cover whole sequences (no rows
    outside them: ``FusedEngine`` trims them while calibrating)."""

    def __init__(self, ops: ModuleType, weights: BertQAWeights, grams: bool = False) -> None:
        self._ops = ops
        layers = weights.layers
        self._ln2 = {ly.ln2_weight.data_ptr(): i + 1 for i, ly in enumerate(layers[:-1])}
        self._ln1 = {ly.ln1_weight.data_ptr(): i for i, ly in enumerate(layers)}
        self._b1 = {ly.ffn_in.bias.data_ptr(): i for i, ly in enumerate(layers)}
        self._bqkv = {ly.qkv.bias.data_ptr(): i for i, ly in enumerate(layers)}
        dev = layers[0].ffn_in.bias.device
        self.amax = {g: torch.zeros(len(layers), device=dev) for g in GEMMS + RAW_INPUTS}
        self.colmax: dict[str, list[torch.Tensor | None]] = {
            g: [None] * len(layers) for g in INT8_GEMMS}
        self.model = model_shape(weights)
        self.passes = 0
        # With ``grams``: per GEMM and layer, the float32 Gram matrix X^T X of its inputs
        # (what error-compensated weight rounding needs: ``engine.fused.gptq``).
        self.grams: dict[str, list[torch.Tensor | None]] | None = (
            {g: [None] * len(layers) for g in GEMMS} if grams else None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def _record(self, gemm: str, i: int | None, y: torch.Tensor | None) -> None:
        if i is not None and y is not None:
            store = self.amax[gemm]
            if gemm in self.colmax:  # per channel, and the tensor's largest from those
                m = y.reshape(-1, y.shape[-1]).abs().amax(0).float()
                seen = self.colmax[gemm][i]
                self.colmax[gemm][i] = m if seen is None else torch.maximum(seen, m)
                store[i] = torch.maximum(store[i], m.amax())
            else:
                store[i] = torch.maximum(store[i], y.abs().amax().float())
            if self.grams is not None and gemm in self.grams:
                x = y.reshape(-1, y.shape[-1]).float()
                g = self.grams[gemm][i]
                self.grams[gemm][i] = x.t() @ x if g is None else g.addmm_(x.t(), x)

    def embed_layernorm(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                        position_ids: torch.Tensor, word: torch.Tensor, position: torch.Tensor,
                        token_type: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out, q = self._ops.embed_layernorm(input_ids, token_type_ids, position_ids, word,
                                           position, token_type, *args, **kwargs)
        self.passes += 1
        self._record("qkv", 0, out)
        self._record("qkv_raw", 0, word[input_ids.long()].float()
                     + position[position_ids.long()].float()
                     + token_type[token_type_ids.long()].float())
        return out, q

    def attention_varlen(self, qkv: torch.Tensor, qkv_bias: torch.Tensor,
                         *args: Any, **kwargs: Any) -> Any:
        out = self._ops.attention_varlen(qkv, qkv_bias, *args, **kwargs)
        self._record("attn_out", self._bqkv.get(qkv_bias.data_ptr()), out)
        return out

    def bias_residual_layernorm(self, a: torch.Tensor, bias: torch.Tensor,
                                residual: torch.Tensor, gamma: torch.Tensor,
                                *args: Any, **kwargs: Any) -> Any:
        out, q = self._ops.bias_residual_layernorm(a, bias, residual, gamma, *args, **kwargs)
        ln1, ln2 = self._ln1.get(gamma.data_ptr()), self._ln2.get(gamma.data_ptr())
        self._record("ffn_in", ln1, out)
        self._record("qkv", ln2, out)
        if ln1 is not None or ln2 is not None:
            raw = sum_splits(a) + bias.float() + residual
            self._record("ffn_in_raw", ln1, raw)
            self._record("qkv_raw", ln2, raw)
        return out, q

    def bias_gelu(self, h: torch.Tensor, bias: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out, q = self._ops.bias_gelu(h, bias, *args, **kwargs)
        self._record("ffn_out", self._b1.get(bias.data_ptr()), out)
        return out, q

    def calibration(self, margin: float = CALIBRATION_MARGIN) -> Calibration:
        """What was recorded, as a :class:`Calibration` (``margin`` kept with it)."""
        if self.passes == 0 or not bool((self.amax["ffn_out"] > 0).all()):
            raise RuntimeError("no calibration pass was recorded (did FFN1 run unfused?)")
        grams = None
        if self.grams is not None:
            if any(g is None for v in self.grams.values() for g in v):
                raise RuntimeError("a GEMM's inputs were not recorded in every layer")
            grams = {k: [g for g in v if g is not None] for k, v in self.grams.items()}
        colmax = {g: [[float(v) for v in t.tolist()] for t in ts if t is not None]
                  for g, ts in self.colmax.items()}
        return Calibration({g: [float(v) for v in t.tolist()] for g, t in self.amax.items()},
                           margin, self.passes, self.model, grams=grams, colmax=colmax)


def model_shape(weights: BertQAWeights) -> dict[str, int]:
    """What a calibration must match: layers, hidden and intermediate sizes."""
    cfg = weights.config
    return {"num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size}


@dataclass(frozen=True)
class Calibration:
    """Per layer, the largest |input| seen by each FP8 GEMM (``GEMMS``) on calibration
    data, the margin its scales take, how many passes it saw and the shape of the model it
    was taken on (:func:`model_shape`; empty: not checked). Saved as JSON (a calibration
    cache, as TensorRT keeps one): calibrate once, load at engine start
    (``FusedEngine(..., fp8_calibration=PATH)``)."""

    amax: dict[str, list[float]]
    margin: float = CALIBRATION_MARGIN
    passes: int = 0
    model: dict[str, int] = field(default_factory=dict)
    # Per GEMM and layer, the Gram matrix of its calibration inputs, where they were
    # recorded: the weights are then rounded by GPTQ (``engine.fused.gptq``), not to
    # nearest. Not saved: a calibration read back from JSON rounds to nearest.
    grams: dict[str, list[torch.Tensor]] | None = field(default=None, repr=False, compare=False)
    # Per int8-capable GEMM (``INT8_GEMMS``) and layer, its input's largest magnitude per
    # channel: what the int8 path's smoothing and scales come from (None: calibrated before
    # they were recorded; such a calibration serves no int8 GEMM).
    colmax: dict[str, list[list[float]]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if set(self.amax) not in (set(GEMMS), set(GEMMS + RAW_INPUTS)):
            raise ValueError(f"a calibration holds amax for {', '.join(GEMMS)} (and "
                             f"optionally {', '.join(RAW_INPUTS)}); "
                             f"got {', '.join(sorted(self.amax))}")
        layers = {len(v) for v in self.amax.values()}
        if len(layers) != 1:
            raise ValueError("a calibration needs the same number of layers for every GEMM")
        if not all(math.isfinite(a) and a > 0 for v in self.amax.values() for a in v):
            raise ValueError("calibration amax values must be finite and positive")
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise ValueError(f"calibration margin must be positive, got {self.margin}")
        if self.colmax is not None:
            if not set(self.colmax) <= set(INT8_GEMMS):
                raise ValueError(f"per-channel magnitudes are for {', '.join(INT8_GEMMS)}; "
                                 f"got {', '.join(sorted(self.colmax))}")
            if any(len(v) != self.layers for v in self.colmax.values()):
                raise ValueError("per-channel magnitudes need one vector a layer")
            if not all(math.isfinite(a) and a >= 0 for v in self.colmax.values()
                       for row in v for a in row):
                raise ValueError("per-channel magnitudes must be finite and non-negative")

    @property
    def layers(self) -> int:
        return len(self.amax["qkv"])

    @property
    def has_raw_inputs(self) -> bool:
        """Whether the un-normalised inputs were recorded (``RAW_INPUTS``)."""
        return all(g in self.amax for g in RAW_INPUTS)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        raw: dict[str, Any] = {"format": _FORMAT, "model": self.model, "margin": self.margin,
                               "passes": self.passes, "amax": self.amax}
        if self.colmax is not None:
            raw["colmax"] = self.colmax
        path.write_text(json.dumps(raw, indent=1))

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read :meth:`save`'s JSON; a file of another format or shape is a ValueError."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read FP8 calibration {path}: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
            raise ValueError(f"{path} is not an FP8 calibration ({_FORMAT})")
        try:
            amax, model, colmax = raw["amax"], raw.get("model", {}), raw.get("colmax")
            if not (isinstance(amax, dict) and isinstance(model, dict)
                    and all(isinstance(v, list) for v in amax.values())):
                raise TypeError("amax must map GEMM names to lists, model names to sizes")
            if colmax is not None and not (isinstance(colmax, dict) and all(
                    isinstance(v, list) and all(isinstance(r, list) for r in v)
                    for v in colmax.values())):
                raise TypeError("colmax must map GEMM names to lists of vectors")
            return cls({k: [float(a) for a in v] for k, v in amax.items()},
                       float(raw["margin"]), int(raw.get("passes", 0)),
                       {k: int(v) for k, v in model.items()},
                       colmax=None if colmax is None else {
                           k: [[float(a) for a in r] for r in v] for k, v in colmax.items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed FP8 calibration {path}: {exc}") from exc

    def layers_for(self, weights: BertQAWeights) -> tuple[CalibratedLayer, ...]:
        """Per-layer calibrated GEMMs of ``weights``: activation scales ``margin * amax /
        448``, each weight quantized with one scale."""
        if self.layers != len(weights.layers):
            raise ValueError(f"calibration is for {self.layers} layers, "
                             f"the model has {len(weights.layers)}")
        shape = model_shape(weights)
        if self.model and self.model != shape:
            raise ValueError(f"calibration was taken on a model of shape {self.model}, "
                             f"this one is {shape}")
        scale = self._scale_fn(weights)

        def static(x_scale: torch.Tensor, w: torch.Tensor, gemm: str, i: int) -> StaticLinear:
            w8, w_scale = quantize_tiles(w, w.shape[0], w.shape[1])
            if self.grams is not None:
                w8 = gptq_e4m3(w, self.grams[gemm][i], w_scale)
            return StaticLinear(x_scale, w8.contiguous(), w_scale.reshape(1).contiguous())

        out = []
        for i, ly in enumerate(weights.layers):
            h_scale = scale("ffn_out", i)
            out.append(CalibratedLayer(
                qkv=static(scale("qkv", i), ly.qkv.weight, "qkv", i),
                attn_out=static(scale("attn_out", i), ly.attn_out.weight, "attn_out", i),
                ffn_in=static(scale("ffn_in", i), ly.ffn_in.weight, "ffn_in", i),
                ffn_out=static(h_scale, ly.ffn_out.weight, "ffn_out", i),
                b1=ly.ffn_in.bias.to(torch.bfloat16), h_inv=(1.0 / h_scale).contiguous()))
        return tuple(out)

    def int8_for(self, weights: BertQAWeights,
                 alpha: float = SMOOTHING_ALPHA) -> tuple[Int8Layer, ...]:
        """Per layer, the int8 out-projection and FFN1 of ``weights`` (smoothed with
        migration ``alpha``, ``engine.fused.int8``); a ValueError where this calibration
        has no per-channel magnitudes."""
        if self.colmax is None or set(self.colmax) != set(INT8_GEMMS):
            raise ValueError("this calibration has no per-channel input magnitudes for "
                             f"{', '.join(INT8_GEMMS)} (taken before they were recorded): "
                             "calibrate again for int8 GEMMs")
        dev = weights.layers[0].qkv.weight.device

        def lin(gemm: str, i: int, w: torch.Tensor) -> Int8Linear:
            assert self.colmax is not None
            colmax = torch.tensor(self.colmax[gemm][i], device=dev, dtype=torch.float32)
            if colmax.shape != (w.shape[1],):
                raise ValueError(f"{gemm} layer {i}: {colmax.shape[0]} input channels "
                                 f"recorded, the weight has {w.shape[1]}")
            return int8_linear_of(w, colmax, alpha)

        return tuple(Int8Layer(attn_out=lin("attn_out", i, ly.attn_out.weight),
                               ffn_in=lin("ffn_in", i, ly.ffn_in.weight))
                     for i, ly in enumerate(weights.layers))

    def deferred_for(self, weights: BertQAWeights) -> tuple[DeferredFP8Layer, ...] | None:
        """The deferred-LayerNorm path's e4m3 layers for ``weights`` (checked by
        :meth:`layers_for` first), or None where that path cannot take them: no folded
        layers, or no un-normalised inputs recorded."""
        if weights.folded is None or not self.has_raw_inputs:
            return None
        scale = self._scale_fn(weights)
        n = self.layers
        return deferred_fp8_layers(weights, {
            "qkv": [scale("qkv_raw", i) for i in range(n)],
            "ffn_in": [scale("ffn_in_raw", i) for i in range(n)],
            "ffn_out": [scale("ffn_out", i) for i in range(n)]})

    def _scale_fn(self, weights: BertQAWeights) -> Callable[[str, int], torch.Tensor]:
        """``scale(gemm, layer)``: float32 [1] ``margin * amax / 448`` on the weights'
        device."""
        dev = weights.layers[0].qkv.weight.device

        def scale(gemm: str, i: int) -> torch.Tensor:
            s = max(self.amax[gemm][i] * self.margin / FP8_MAX, SCALE_MIN)
            return torch.tensor([s], device=dev, dtype=torch.float32)

        return scale


_FORMAT = "qa-fp8-calibration/1"
