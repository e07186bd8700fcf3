"""Checkpoint tensors -> the re-packed weights the fused encoder runs on.

Accepts HF ``BertForQuestionAnswering`` key names with or without the ``bert.`` prefix
(and the old TF-converted ``LayerNorm.gamma``/``beta`` spelling). Packing happens once,
at load:

- Q, K and V projections become one ``[3*hidden, hidden]`` weight (one GEMM, and the
  attention kernel reads Q, K and V from its ``[tokens, 3*hidden]`` output);
- GEMM weights stay ``[out, in]`` in the model dtype (cuBLAS reads them transposed for free);
- biases, LayerNorm parameters and the QA head are kept in float32: they are tiny and the
  kernels add them in float32 anyway;
- with ``fp8=True`` the QKV and both FFN weights also get an e4m3 copy with one scale per
  output row (``w ~= w8 * scale``), or with ``fp8_blocks=True`` one per 128x128 block
  (``engine.fused.fp8``). The attention-output projection stays in the model
  dtype: its input comes straight from the attention kernel, which has no whole-row view
  to compute a per-token scale from. Calibration (``calibrated``) adds a per-tensor
  e4m3 copy of all four, the out-projection included (used when the attention output is
  one of the engine's ``fp8_static_inputs``: attention then writes e4m3 with a calibrated
  scale);
- every layer's matrices live in one buffer and its vectors in another (``FlatLayers``),
  layer after layer at a fixed stride, and the per-layer tensors are views into them: the
  persistent kernel finds any layer's weights from two base pointers, and a layer's
  weights are one contiguous span to prefetch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.fused.config import BertQAConfig
from engine.fused.fp8 import CalibratedLayer, quantize_rows, quantize_weight_blocks
from engine.fused.int8 import Int8Layer

if TYPE_CHECKING:
    from engine.fused.folding import DeferredFP8Layer, FoldedLayer

_PREFIXES = ("bert.",)


@dataclass(frozen=True)
class Linear:
    """``y = x @ weight.T + bias``; ``w8``/``w8_scale`` set when an FP8 copy exists."""

    weight: torch.Tensor  # [out, in], model dtype
    bias: torch.Tensor  # [out], float32
    w8: torch.Tensor | None = None  # [out, in], float8_e4m3fn
    w8_scale: torch.Tensor | None = None  # [1, out] float32 (blocks: [out/128, in/128])


@dataclass(frozen=True)
class LayerWeights:
    qkv: Linear  # [3*hidden, hidden]: rows are Q, then K, then V
    attn_out: Linear
    ln1_weight: torch.Tensor
    ln1_bias: torch.Tensor
    ffn_in: Linear
    ffn_out: Linear
    ln2_weight: torch.Tensor
    ln2_bias: torch.Tensor


@dataclass(frozen=True)
class FlatLayers:
    """All layers' weights at a fixed stride. Per layer (element offsets, d = hidden,
    f = FFN width): ``mats`` (model dtype) holds Wqkv [3d, d], Wo [d, d], W1 [f, d],
    W2 [d, f]; ``vecs`` (float32) holds bqkv [3d], bo, ln1 gamma, ln1 beta [d each],
    b1 [f], b2, ln2 gamma, ln2 beta [d each]."""

    mats: torch.Tensor  # [layers, 4*d*d + 2*d*f]
    vecs: torch.Tensor  # [layers, 9*d + f]


def flat_strides(d: int, f: int) -> tuple[int, int]:
    """(elements per layer in ``FlatLayers.mats``, in ``FlatLayers.vecs``)."""
    return 4 * d * d + 2 * d * f, 9 * d + f


class _Cursor:
    """Copies tensors one after another into a 1-D buffer and hands back views of them."""

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf, self.at = buf, 0

    def take(self, t: torch.Tensor) -> torch.Tensor:
        view = self.buf[self.at : self.at + t.numel()].view(t.shape)
        view.copy_(t)
        self.at += t.numel()
        return view


def _flatten(layers: list[LayerWeights], d: int, f: int) -> tuple[list[LayerWeights], FlatLayers]:
    """Copy the layers into one ``FlatLayers`` and return them as views into it."""
    ms, vs = flat_strides(d, f)
    w0 = layers[0].qkv.weight
    mats = torch.empty((len(layers), ms), device=w0.device, dtype=w0.dtype)
    vecs = torch.empty((len(layers), vs), device=w0.device, dtype=torch.float32)
    out = []
    for i, ly in enumerate(layers):
        m, v = _Cursor(mats[i]), _Cursor(vecs[i])
        # Order = the layout in FlatLayers' docstring.
        qkv = Linear(m.take(ly.qkv.weight), v.take(ly.qkv.bias), ly.qkv.w8, ly.qkv.w8_scale)
        wo, w1, w2 = m.take(ly.attn_out.weight), m.take(ly.ffn_in.weight), m.take(ly.ffn_out.weight)
        bo, ln1g, ln1b = v.take(ly.attn_out.bias), v.take(ly.ln1_weight), v.take(ly.ln1_bias)
        b1, b2 = v.take(ly.ffn_in.bias), v.take(ly.ffn_out.bias)
        ln2g, ln2b = v.take(ly.ln2_weight), v.take(ly.ln2_bias)
        assert (m.at, v.at) == (ms, vs), "flat layout does not match flat_strides"
        out.append(LayerWeights(
            qkv, Linear(wo, bo), ln1g, ln1b, Linear(w1, b1, ly.ffn_in.w8, ly.ffn_in.w8_scale),
            Linear(w2, b2, ly.ffn_out.w8, ly.ffn_out.w8_scale), ln2g, ln2b))
    return out, FlatLayers(mats, vecs)


@dataclass(frozen=True)
class BertQAWeights:
    config: BertQAConfig
    dtype: torch.dtype
    word_embeddings: torch.Tensor  # [vocab, hidden], model dtype
    position_embeddings: torch.Tensor  # [max_pos, hidden]
    token_type_embeddings: torch.Tensor  # [types, hidden]
    emb_ln_weight: torch.Tensor  # float32
    emb_ln_bias: torch.Tensor
    layers: tuple[LayerWeights, ...]
    qa_weight: torch.Tensor  # [2, hidden] float32: row 0 start, row 1 end
    qa_bias: torch.Tensor  # [2] float32
    flat: FlatLayers | None = None  # the layers' storage (None: separate tensors)
    # QKV and FFN1 with the LayerNorm before them folded in (engine.fused.folding): the
    # small-batch path's GEMMs when it runs without LayerNorm kernels. Added by the engine
    # only for models that path serves (``folding.with_folded``): a second copy of those
    # matrices (fp16: BERT-base 99 MB, BERT-large 352 MB, MiniLM 12 MB).
    folded: tuple[FoldedLayer, ...] | None = None
    fp8_blocks: bool = False  # the e4m3 copies are block-scaled (engine.fused.fp8)
    # The FP8 GEMMs with calibrated per-tensor scales (engine.fused.calibration), per
    # layer: added by ``FusedEngine.load_calibration`` (``calibrating()``,
    # ``fp8_calibration=``); used by the large path from ``fp8_calibrated_min_tokens``
    # tokens. Another e4m3 copy of every matrix (beside the row-scaled copies of QKV and
    # the FFN, which calibrated passes do not read: BERT-large 302 MB).
    calibrated: tuple[CalibratedLayer, ...] | None = None
    # The deferred-LayerNorm path's GEMMs on e4m3 operands (folding.DeferredFP8Layer),
    # added with ``calibrated`` where the calibration holds the un-normalised inputs'
    # magnitudes and ``folded`` is there (e4m3 copies of QKV, FFN1 folded, and FFN2:
    # BERT-base 78 MB).
    folded8: tuple[DeferredFP8Layer, ...] | None = None
    # The out-projection and FFN1 in int8 with smoothing (engine.fused.int8), added with
    # ``calibrated`` where the engine's ``int8_gemms`` asks for them (BERT-large: 128 MB).
    int8: tuple[Int8Layer, ...] | None = None

    @property
    def fp8(self) -> bool:
        """Whether any GEMM has an e4m3 copy."""
        return any(lin.w8 is not None for ly in self.layers
                   for lin in (ly.qkv, ly.ffn_in, ly.ffn_out))


def read_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` (or ``pytorch_model.bin``) on the CPU."""
    model_dir = Path(model_dir)
    st = model_dir / "model.safetensors"
    if st.exists():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = model_dir / "pytorch_model.bin"
    if pt.exists():
        state: dict[str, torch.Tensor] = torch.load(pt, map_location="cpu", weights_only=True)
        return state
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {model_dir}")


def normalise_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the ``bert.`` prefix and spell LayerNorm parameters ``weight``/``bias``."""
    out = {}
    for key, value in state.items():
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                break
        if ".LayerNorm.gamma" in key or ".LayerNorm.beta" in key:
            key = key.replace(".gamma", ".weight").replace(".beta", ".bias")
        out[key] = value
    return out


def pack_weights(
    state: dict[str, torch.Tensor],
    config: BertQAConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    fp8: bool = False,
    fp8_blocks: bool = False,
) -> BertQAWeights:
    """Re-pack a (prefix-free or ``bert.``-prefixed) state dict for the fused encoder."""
    s = normalise_keys(state)
    missing: list[str] = []

    def get(key: str) -> torch.Tensor:
        if key not in s:
            missing.append(key)
            return torch.zeros(1)
        return s[key]

    def mat(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype).contiguous()

    def vec(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.float32).contiguous()

    def linear(w: torch.Tensor, b: torch.Tensor, quantize: bool) -> Linear:
        w = mat(w)
        if not quantize:
            return Linear(w, vec(b))
        if fp8_blocks:
            return Linear(w, vec(b), *quantize_weight_blocks(w))
        q = quantize_rows(w)  # one scale per output channel
        return Linear(w, vec(b), q.data, q.scale.t().contiguous())

    layers = []
    for i in range(config.num_layers):
        p = f"encoder.layer.{i}."
        a = p + "attention."
        names = [a + f"self.{n}." for n in ("query", "key", "value")]
        qkv_w = torch.cat([get(n + "weight") for n in names], 0)
        qkv_b = torch.cat([get(n + "bias") for n in names], 0)
        layers.append(
            LayerWeights(
                qkv=linear(qkv_w, qkv_b, fp8),
                attn_out=linear(get(a + "output.dense.weight"), get(a + "output.dense.bias"),
                                False),
                ln1_weight=vec(get(a + "output.LayerNorm.weight")),
                ln1_bias=vec(get(a + "output.LayerNorm.bias")),
                ffn_in=linear(get(p + "intermediate.dense.weight"),
                              get(p + "intermediate.dense.bias"), fp8),
                ffn_out=linear(get(p + "output.dense.weight"), get(p + "output.dense.bias"), fp8),
                ln2_weight=vec(get(p + "output.LayerNorm.weight")),
                ln2_bias=vec(get(p + "output.LayerNorm.bias")),
            )
        )
    flat = None
    if not missing:
        layers, flat = _flatten(layers, config.hidden_size, config.intermediate_size)
    e = "embeddings."
    weights = BertQAWeights(
        config=config,
        dtype=dtype,
        word_embeddings=mat(get(e + "word_embeddings.weight")),
        position_embeddings=mat(get(e + "position_embeddings.weight")),
        token_type_embeddings=mat(get(e + "token_type_embeddings.weight")),
        emb_ln_weight=vec(get(e + "LayerNorm.weight")),
        emb_ln_bias=vec(get(e + "LayerNorm.bias")),
        layers=tuple(layers),
        qa_weight=vec(get("qa_outputs.weight")),
        qa_bias=vec(get("qa_outputs.bias")),
        flat=flat,
        fp8_blocks=fp8 and fp8_blocks,
    )
    if missing:
        raise KeyError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]}")
    h = config.hidden_size
    if weights.word_embeddings.shape != (config.vocab_size, h) or weights.qa_weight.shape != (2, h):
        raise ValueError("checkpoint shapes do not match config.json (or no 2-logit QA head)")
    return weights
