"""Launch choices of the seven-kernel small-batch layer that the engine makes per batch,
checked through the torch spec backend (the same calls as the Triton kernels get)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _tiny_engine(dtype: str, **options: Any):  # type: ignore[no-untyped-def]
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
    return _tiny_engine("float16").weights


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


def _record_launches(monkeypatch: pytest.MonkeyPatch, keyword: str = "late_release",
                     raw: bool = False) -> list[tuple[str, Any]]:
    """The torch spec backend's small-batch ops replaced by recorders of (kernel role,
    the launch keyword ``keyword`` as a bool, or with ``raw`` as passed: "not passed"
    where it was not), each role named as ``LATE_RELEASE_KERNELS`` names it; the ops
    still compute. A GEMM's role comes from its weight's shape, a LayerNorm's from the
    order."""
    from engine.fused import torch_ops

    seen: list[tuple[str, Any]] = []
    lns = 0

    def gemm_role(x: Any, w: Any) -> str:
        d = x.shape[1]
        return {3 * d: "qkv", 2 * d: "ffn1"}.get(w.shape[0], "ffn2" if d == 96 else "out")

    def wrap(name: str) -> None:
        spec = getattr(torch_ops, name)

        def launch(*args: Any, **kw: Any) -> Any:
            nonlocal lns
            if name == "attention_varlen":
                role = "attention"
            elif name == "bias_residual_layernorm":
                role, lns = ("ln1", "ln2")[lns % 2], lns + 1
            else:
                role = gemm_role(args[0], args[1])
            seen.append((role, kw.get(keyword, "not passed") if raw
                         else bool(kw.get(keyword, False))))
            return spec(*args, **kw)

        monkeypatch.setattr(torch_ops, name, launch)

    for name in ("linear", "folded_linear", "residual_linear", "attention_varlen",
                 "bias_residual_layernorm"):
        wrap(name)
    return seen


@pytest.mark.parametrize("layer", ["deferred", "seven"])
@pytest.mark.parametrize("kernel", ["qkv", "attention", "out", "ln1", "ffn1", "ffn2", "ln2"])
def test_late_release_reaches_the_named_kernel_only(
        tiny: Any, monkeypatch: pytest.MonkeyPatch, layer: str, kernel: str) -> None:
    """``late_release`` makes exactly the named kernel of every layer release late, on
    either small-batch layer (the deferred one has no LayerNorm kernels: naming them
    changes nothing there)."""
    from engine.fused.encoder import LATE_RELEASE_KERNELS
    from engine.fused.engine import FusedEngine

    assert kernel in LATE_RELEASE_KERNELS
    seen = _record_launches(monkeypatch)
    engine = FusedEngine(tiny, "cpu", backend="torch", qkv_late_release_min_seqs=None,
                         deferred_ln_max_hidden=48 if layer == "deferred" else None,
                         late_release=kernel)
    ids = np.random.default_rng(7).integers(1, 100, (1, 20)).astype(np.int32)
    engine.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    roles = {"deferred": ["qkv", "attention", "out", "ffn1", "ffn2"],
             "seven": ["qkv", "attention", "out", "ln1", "ffn1", "ffn2", "ln2"]}[layer]
    layers = 2
    # The last layer's LN2 is the QA head's kernel (bias_residual_layernorm_qa), not recorded.
    expected = (roles * layers)[: -1 if layer == "seven" else None]
    assert [role for role, _ in seen] == expected
    assert [role for role, late in seen if late] == [r for r in expected if r == kernel]


def test_late_release_option_is_checked(tiny: Any) -> None:
    from engine.fused.engine import FusedEngine

    engine = FusedEngine(tiny, "cpu", backend="torch", late_release=" ffn2, out")
    assert engine.options.late_release == ("out", "ffn2")  # canonical order
    assert FusedEngine(tiny, "cpu", backend="torch").options.late_release == ()
    with pytest.raises(ValueError, match="late_release: unknown kernels"):
        FusedEngine(tiny, "cpu", backend="torch", late_release=("qkv", "softmax"))


@pytest.fixture(scope="module")
def tiny8():  # type: ignore[no-untyped-def]
    """``tiny``'s model in FP8, calibrated: with the deferred layer's e4m3 copies."""
    never = 1 << 30  # every batch on the small-batch path
    engine = _tiny_engine("fp8", fp8_min_tokens=never, fp8_calibrated_min_tokens=never,
                          deferred_ln_max_hidden=48)
    ids = np.random.default_rng(9).integers(1, 100, (2, 20)).astype(np.int32)
    engine.calibrate(ids, np.ones_like(ids), np.zeros_like(ids))
    assert engine.weights.folded8 is not None
    return engine.weights


@pytest.mark.parametrize(("names", "fp8"),
                         [(("qkv",), True), (("ffn2", "ffn1"), True), ((), True), (None, True),
                          (("out",), True), (("qkv", "out", "ffn1", "ffn2"), False),
                          (None, False), ((), False)])
def test_early_weights_reach_the_named_gemms_only(
        tiny8: Any, monkeypatch: pytest.MonkeyPatch,
        names: tuple[str, ...] | None, fp8: bool) -> None:
    """``early_weights`` asks exactly the named GEMMs of every deferred layer to load their
    weights before their wait (None: the default, ``encoder.EARLY_WEIGHTS``), on e4m3
    operands and on 16-bit ones (``fp8_deferred`` off) alike: whether a slice fits is the
    kernel's ``early_weights_fit``."""
    from engine.fused.encoder import EARLY_WEIGHTS
    from engine.fused.engine import FusedEngine

    seen = _record_launches(monkeypatch, "early")
    kw = {} if names is None else {"early_weights": names}
    never = 1 << 30
    engine = FusedEngine(tiny8, "cpu", backend="torch", deferred_ln_max_hidden=48,
                         fp8_min_tokens=never, fp8_calibrated_min_tokens=never,
                         fp8_deferred=fp8, **kw)
    ids = np.random.default_rng(8).integers(1, 100, (2, 20)).astype(np.int32)
    engine.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    expected = ["qkv", "attention", "out", "ffn1", "ffn2"] * 2
    assert [role for role, _ in seen] == expected
    named = EARLY_WEIGHTS if names is None else names
    assert [role for role, early in seen if early] == [r for r in expected if r in named]


@pytest.mark.parametrize(("names", "fp8"), [((), True), (("out",), True), (("ffn2",), True),
                                            (("out", "ffn2"), True), (("out", "ffn2"), False)])
def test_settled_residuals_reach_the_named_gemms_only(
        tiny8: Any, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...], fp8: bool) -> None:
    """``encoder.SETTLED_RESIDUAL_GEMMS`` asks exactly the named residual GEMMs of every
    deferred layer to build their addend before their wait (``residual_linear``'s
    ``settled``), on e4m3 and 16-bit operands alike; nothing else is asked."""
    from engine.fused import encoder
    from engine.fused.engine import FusedEngine

    monkeypatch.setattr(encoder, "SETTLED_RESIDUAL_GEMMS", names)
    seen = _record_launches(monkeypatch, "settled")
    never = 1 << 30
    engine = FusedEngine(tiny8, "cpu", backend="torch", deferred_ln_max_hidden=48,
                         fp8_min_tokens=never, fp8_calibrated_min_tokens=never,
                         fp8_deferred=fp8)
    ids = np.random.default_rng(8).integers(1, 100, (2, 20)).astype(np.int32)
    engine.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    expected = ["qkv", "attention", "out", "ffn1", "ffn2"] * 2
    assert [role for role, _ in seen] == expected
    assert [role for role, settled in seen if settled] == [r for r in expected if r in names]


@pytest.mark.parametrize(("fp8", "windows", "max_seqs", "want"), [
    (True, 1, None, None),   # one sequence: the kernel's choice (early where uncapped)
    (True, 2, None, False),  # several on e4m3 operands: the late load
    (True, 2, 2, None),      # ... unless the limit allows them
    (False, 2, None, None),  # 16-bit operands: the kernel's choice
    (True, 3, None, False),  # 3 sequences: the same
])
def test_attention_early_tail_in_the_deferred_layer(
        tiny8: Any, monkeypatch: pytest.MonkeyPatch, fp8: bool, windows: int,
        max_seqs: int | None, want: bool | None) -> None:
    """The deferred layer on e4m3 operands asks attention for the late tail in passes of
    more than ``dispatch.EARLY_TAIL_E4M3_MAX_SEQS`` sequences (its default: 1) and
    leaves the choice to the kernel otherwise; every layer's launch alike."""
    from engine.fused import dispatch
    from engine.fused.engine import FusedEngine

    assert dispatch.EARLY_TAIL_E4M3_MAX_SEQS == 1
    if max_seqs is not None:
        monkeypatch.setattr(dispatch, "EARLY_TAIL_E4M3_MAX_SEQS", max_seqs)
    seen = _record_launches(monkeypatch, "early_tail", raw=True)
    never = 1 << 30
    engine = FusedEngine(tiny8, "cpu", backend="torch", deferred_ln_max_hidden=48,
                         fp8_min_tokens=never, fp8_calibrated_min_tokens=never,
                         fp8_deferred=fp8)
    ids = np.random.default_rng(8).integers(1, 100, (windows, 20)).astype(np.int32)
    engine.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    assert [tail for role, tail in seen if role == "attention"] == [want, want]  # a layer


def test_early_weights_option_is_checked(tiny: Any) -> None:
    from engine.fused.encoder import EARLY_WEIGHTS
    from engine.fused.engine import FusedEngine

    engine = FusedEngine(tiny, "cpu", backend="torch", early_weights="ffn2, qkv")
    assert engine.options.early_weights == ("qkv", "ffn2")  # canonical order
    assert FusedEngine(tiny, "cpu", backend="torch").options.early_weights == EARLY_WEIGHTS
    for none in ("", None, ()):
        assert FusedEngine(tiny, "cpu", backend="torch",
                           early_weights=none).options.early_weights == ()
    with pytest.raises(ValueError, match="early_weights: unknown GEMMs"):
        FusedEngine(tiny, "cpu", backend="torch", early_weights=("qkv", "attention"))


@pytest.mark.parametrize(("config", "k_slice", "element_bytes", "fits"), [
    ((64, 64, 256, 4, 3), 768, 1, True),     # BERT-base QKV/FFN1 on e4m3: 3 chunks, 96 KB
    ((64, 64, 128, 4, 4), 768, 1, True),     # FFN2's K slice at 128 tokens: 6 chunks
    ((64, 64, 128, 4, 3), 768, 2, False),    # 16-bit: 192 KB
    ((64, 64, 128, 4, 3), 384, 2, True),     # MiniLM's QKV/FFN1 in 16-bit: 96 KB
    ((32, 32, 128, 4, 3), 768, 2, False),    # the out-projection's 32-row tiles
    ((128, 64, 128, 8, 3), 384, 1, False),   # 128-row tiles
    ((64, 64, 64, 4, 4), 768, 1, False),     # 12 chunks
    ((64, 64, 256, 4, 3), 640, 1, False),    # a slice not in whole chunks
    ((64, 64, 256, 4, 3), 128, 1, False),    # less than one chunk
    ((64, 64, 256, 4, 3), 0, 1, False),      # no chunk at all
])
def test_early_weights_fit(config: tuple[int, ...], k_slice: int, element_bytes: int,
                           fits: bool) -> None:
    pytest.importorskip("triton")
    from engine.fused.kernels.deferred import early_weights_fit

    assert early_weights_fit(config, k_slice, element_bytes) is fits
