"""The few hyper-parameters of a BERT-family QA checkpoint that the fused encoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# HF ``hidden_act`` names -> the GELU form the kernels implement.
_GELU_FORMS = {"gelu": "erf", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


@dataclass(frozen=True)
class BertQAConfig:
    """Shape and numerics of a BERT encoder with a 2-logit QA head.

    ``gelu`` is ``"erf"`` (exact GELU, what BERT uses) or ``"tanh"`` (the approximation
    some descendants use).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    gelu: str = "erf"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> BertQAConfig:
        """Build from a HF ``config.json`` dict; raises ``ValueError`` on what we cannot run."""
        act = str(cfg.get("hidden_act", "gelu"))
        if act not in _GELU_FORMS:
            raise ValueError(f"hidden_act {act!r} not supported (supported: {sorted(_GELU_FORMS)})")
        pos_type = cfg.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ValueError(f"position_embedding_type {pos_type!r} not supported (only absolute)")
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_heads {heads}")
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            intermediate_size=int(cfg["intermediate_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 512)),
            type_vocab_size=int(cfg.get("type_vocab_size", 2)),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            gelu=_GELU_FORMS[act],
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> BertQAConfig:
        """Read ``model_dir/config.json``."""
        return cls.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))
