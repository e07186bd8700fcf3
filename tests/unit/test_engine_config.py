"""Which engine Triton's model builds, and how one engine call serves several requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.batching import Backlog, RequestLimits, run_batched
from engine.config import REPO_ROOT, EngineConfig
from engine.onnx_cpu import OnnxEngine


def test_defaults_params_then_env_override() -> None:
    assert EngineConfig.resolve({}, env={}) == EngineConfig()
    cfg = EngineConfig.resolve({"engine": "fused", "device": "cuda"}, env={})
    assert (cfg.engine, cfg.device) == ("fused", "cuda")
    cfg = EngineConfig.resolve(
        {"engine": "fused", "device": "cuda"},
        env={"BERT_QA_ENGINE": "onnx", "BERT_QA_THREADS": "3", "BERT_QA_ONNX": "x/m.onnx",
             "BERT_QA_MODEL_DIR": "/abs/model"},
    )
    assert cfg.engine == "onnx" and cfg.device == "cuda" and cfg.threads == 3
    assert cfg.onnx == REPO_ROOT / "x" / "m.onnx"  # relative paths resolve against the repo
    assert cfg.model_dir == Path("/abs/model")


def test_config_pbtxt_defaults_name_real_fields() -> None:
    text = (REPO_ROOT / "model_repository" / "bert_qa" / "config.pbtxt").read_text()
    keys = [line.split('"')[1] for line in text.splitlines() if line.startswith("parameters")]
    assert keys and set(keys) <= set(EngineConfig.__dataclass_fields__)


def request(n: int, seq: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 20000, size=(n, seq), dtype=np.int32)
    ids[:, 0] = 101  # [CLS]
    types = np.zeros_like(ids)
    types[:, seq // 2 :] = 1
    return ids, np.ones_like(ids), types


def test_run_batched_matches_one_call_per_request() -> None:
    onnx = REPO_ROOT / "build" / "onnx" / "minilm-l6-squad" / "model-fused.onnx"
    if not onnx.exists():
        pytest.skip(f"{onnx} missing: run `make model` (make test builds it)")
    engine = OnnxEngine(onnx, threads=2)
    reqs = [request(2, 24, 0), request(1, 40, 1), request(3, 24, 2), request(1, 40, 3)]
    outs = run_batched(engine, reqs)
    assert len(outs) == len(reqs)
    for (ids, mask, types), (start, end) in zip(reqs, outs, strict=True):
        alone_start, alone_end = engine.infer(ids, mask, types)
        np.testing.assert_allclose(start, alone_start, atol=1e-3)
        np.testing.assert_allclose(end, alone_end, atol=1e-3)


def test_fused_engine_options_through_the_registry() -> None:
    """``load_engine`` (and ``training.evaluate --engine-option``) turn text into the
    FusedEngine keywords: none/true/false/integers, anything else stays text."""
    pytest.importorskip("torch")
    from engine.registry import _option_value, load_engine

    assert [_option_value(v) for v in ("none", "True", "false", "512", "fp16")] == [
        None, True, False, 512, "fp16"]
    engine = load_engine("fused", REPO_ROOT / "models" / "minilm-l6-squad", device="cpu",
                         dtype="float32", small_batch_max_tokens="none", persistent="true",
                         attention_tile_list="false", graph_buckets_per_octave="64")
    opts = engine.options  # type: ignore[attr-defined]
    assert opts.small_batch_max_tokens is None and opts.persistent is True
    assert opts.attn_tile_list is False
    assert engine.graph_buckets_per_octave == 64  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="graph_buckets_per_octave"):
        load_engine("fused", REPO_ROOT / "models" / "minilm-l6-squad", device="cpu",
                    graph_buckets_per_octave="0")
    with pytest.raises(TypeError):
        load_engine("fused", REPO_ROOT / "models" / "minilm-l6-squad", device="cpu", no_such="1")


def test_calibration_needs_a_row_scaled_fp8_engine() -> None:
    """``FusedEngine.calibrating`` refuses engines it cannot calibrate, before any pass,
    and leaves them as they were."""
    pytest.importorskip("torch")
    from engine.fused.engine import FusedEngine

    model = REPO_ROOT / "models" / "minilm-l6-squad"
    engine = FusedEngine.from_pretrained(model, device="cpu", dtype="float32", backend="torch")
    with pytest.raises(ValueError, match="row-wise scales"), engine.calibrating():
        pass
    assert engine.weights.calibrated is None and engine._recorder is None


def test_calibration_covers_every_fp8_gemm_and_applies_from_its_threshold() -> None:
    """After calibration every layer's four GEMMs have positive static scales;
    batches below ``fp8_calibrated_min_tokens`` run exactly as before calibration, and
    batches from it run the calibrated GEMMs (different logits, still close to the
    un-quantized ones). CPU, torch op set: the dequantized spec of the GPU path."""
    pytest.importorskip("torch")
    import numpy as np

    from engine.fused.engine import FusedEngine

    model = REPO_ROOT / "models" / "minilm-l6-squad"
    rng = np.random.default_rng(3)

    def batch(windows: int, seq: int) -> tuple[np.ndarray, ...]:
        ids = rng.integers(1000, 20000, (windows, seq)).astype(np.int32)
        ids[:, 0] = 101
        mask = np.ones((windows, seq), dtype=np.int32)
        tt = (np.arange(seq)[None, :] >= seq // 3).astype(np.int32).repeat(windows, 0)
        return ids, mask, tt

    engine = FusedEngine.from_pretrained(model, device="cpu", dtype="fp8", backend="torch")
    x = batch(3, 64)  # 192 tokens: below the row-scaled FP8 threshold, so un-quantized
    before = engine.infer(*x)
    engine.calibrate(*batch(4, 96))
    cal = engine.weights.calibrated
    assert cal is not None and len(cal) == len(engine.weights.layers)
    for layer in cal:
        for lin in (layer.qkv, layer.attn_out, layer.ffn_in, layer.ffn_out):
            assert float(lin.x_scale) > 0 and float(lin.w_scale) > 0
    above = FusedEngine(engine.weights, "cpu", backend="torch", fp8_calibrated_min_tokens=193)
    assert all(np.array_equal(a, b) for a, b in zip(above.infer(*x), before, strict=True))
    after = FusedEngine(engine.weights, "cpu", backend="torch", fp8_calibrated_min_tokens=192)
    got = after.infer(*x)
    for a, b in zip(got, before, strict=True):
        assert not np.array_equal(a, b)
        assert np.abs(a - b).max() < 0.1 * np.abs(b).max()


def test_static_inputs_choose_static_or_per_token_scales_per_gemm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``fp8_static_inputs`` picks, GEMM by GEMM, the calibrated scale or a scale per token:
    none static is exactly uncalibrated FP8, all static exactly the default calibrated
    pass, and each GEMM's choice changes the logits both ways (so every name reaches its
    GEMM), staying close to the un-quantized pass (mean error: FP8's worst logit is noisy,
    0.8 of ~7 for row scales alone on these random tokens). Every static GEMM's input
    arrives quantized with that GEMM's own calibrated scale. Unknown names are refused."""
    pytest.importorskip("torch")
    from engine.fused import encoder
    from engine.fused.calibration import GEMMS
    from engine.fused.encoder import FP8_STATIC_INPUTS
    from engine.fused.engine import FusedEngine
    from engine.fused.fp8 import CalibratedLayer, Quantized, StaticLinear

    seen: list[str] = []  # the static GEMMs run, by name, if their input had their scale

    def name_of(lin: StaticLinear) -> str:
        cal = base.weights.calibrated or ()
        return next(g for layer in cal for g in GEMMS if getattr(layer, g) is lin)

    def static_linear(xq: Quantized, lin: StaticLinear, *args: object) -> object:
        seen.append(name_of(lin) if xq.scale is lin.x_scale else "wrong scale")
        return real_linear(xq, lin, *args)

    def calibrated_ffn1(xq: Quantized, cal: CalibratedLayer, *args: object) -> Quantized:
        seen.append("ffn_in" if xq.scale is cal.ffn_in.x_scale else "wrong scale")
        return real_ffn1(xq, cal, *args)  # FFN2's static_linear checks its output

    real_linear, real_ffn1 = encoder.static_linear, encoder.calibrated_ffn1
    monkeypatch.setattr(encoder, "static_linear", static_linear)
    monkeypatch.setattr(encoder, "calibrated_ffn1", calibrated_ffn1)

    model = REPO_ROOT / "models" / "minilm-l6-squad"
    ids, mask, tt = request(3, 64, 5)
    base = FusedEngine.from_pretrained(model, device="cpu", dtype="fp8", backend="torch",
                                       fp8_min_tokens=0, int8_gemms=None)  # e4m3 GEMMs
    rows = base.infer(ids, mask, tt)
    plain = FusedEngine(base.weights, "cpu", backend="torch", fp8_min_tokens=10**9).infer(
        ids, mask, tt)
    base.calibrate(*request(4, 96, 6))

    def run(static: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        engine = FusedEngine(base.weights, "cpu", backend="torch", fp8_min_tokens=0,
                             fp8_static_inputs=static)
        seen.clear()
        out = engine.infer(ids, mask, tt)
        assert sorted(seen) == sorted(static * len(base.weights.layers)), static
        return out

    def same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
        return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    everything = run(GEMMS)
    assert same(run(()), rows)
    assert same(run(FP8_STATIC_INPUTS), base.infer(ids, mask, tt))  # the default
    assert not same(everything, rows) and not same(everything, base.infer(ids, mask, tt))
    for gemm in GEMMS:
        alone, all_but = run((gemm,)), run(tuple(g for g in GEMMS if g != gemm))
        assert not same(alone, rows) and not same(all_but, everything), gemm
        for got in (alone, all_but):
            for a, b in zip(got, plain, strict=True):
                assert np.abs(a - b).mean() < 0.02 * np.abs(b).max(), gemm
    with pytest.raises(ValueError, match="unknown GEMMs"):
        FusedEngine(base.weights, "cpu", backend="torch", fp8_static_inputs=("qkv", "ffn"))
    # As text (BERT_QA_FP8_STATIC_INPUTS, engine options): comma-separated names; None
    # (an engine option "none") or "" for none.
    text = FusedEngine(base.weights, "cpu", backend="torch", fp8_static_inputs=" ffn_out,qkv")
    assert text.options.fp8_static_inputs == ("qkv", "ffn_out")
    for empty in (None, ""):
        engine = FusedEngine(base.weights, "cpu", backend="torch", fp8_static_inputs=empty)
        assert engine.options.fp8_static_inputs == ()


def test_calibration_saves_loads_and_serves_through_engine_config(tmp_path: Path) -> None:
    """``python -m training.calibrate`` writes a calibration that, loaded through
    ``BERT_QA_FP8_CALIBRATION`` (``EngineConfig``), gives the same logits as the engine
    calibrated in process; re-calibrating a calibrated engine records the same
    magnitudes (its passes run un-quantized)."""
    pytest.importorskip("torch")
    from engine.fused.calibration import Calibration
    from training import calibrate

    model = REPO_ROOT / "models" / "minilm-l6-squad"
    path = tmp_path / "cal.json"
    cal = calibrate.main(["--model-dir", str(model), "--data",
                          str(REPO_ROOT / "data" / "train-subset-v1.1.json.xz"),
                          "--questions", "12", "--device", "cpu", "--out", str(path)])
    assert Calibration.load(path) == cal
    config = EngineConfig.resolve({"engine": "fused", "device": "cpu", "dtype": "fp8"},
                                  env={"BERT_QA_FP8_CALIBRATION": str(path)})
    served = config.build()
    assert served.calibration == cal  # type: ignore[attr-defined]
    every = EngineConfig.resolve(
        {"engine": "fused", "device": "cpu", "dtype": "fp8"},
        env={"BERT_QA_FP8_CALIBRATION": str(path),
             "BERT_QA_FP8_STATIC_INPUTS": "qkv,attn_out,ffn_in,ffn_out"}).build()
    assert every.options.fp8_static_inputs == ("qkv", "attn_out", "ffn_in", "ffn_out")  # type: ignore[attr-defined]
    none = EngineConfig.resolve(
        {"engine": "fused", "device": "cpu", "dtype": "fp8"},
        env={"BERT_QA_FP8_CALIBRATION": str(path), "BERT_QA_FP8_STATIC_INPUTS": "none"})
    assert none.build().options.fp8_static_inputs == ()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="set fp8_calibration"):
        EngineConfig(engine="fused", device="cpu", dtype="fp8", fp8_static_inputs="qkv").build()
    with pytest.raises(ValueError, match="unknown GEMMs"):
        EngineConfig.resolve({"engine": "fused", "device": "cpu", "dtype": "fp8"},
                             env={"BERT_QA_FP8_CALIBRATION": str(path),
                                  "BERT_QA_FP8_STATIC_INPUTS": "qkv,attn"}).build()
    rng = np.random.default_rng(5)
    ids = rng.integers(1000, 20000, (2, 100)).astype(np.int32)
    mask, tt = np.ones_like(ids), np.zeros_like(ids)
    from engine.fused.engine import FusedEngine

    fresh = FusedEngine.from_pretrained(model, device="cpu", dtype="fp8")
    fresh.load_calibration(cal)
    for a, b in zip(served.infer(ids, mask, tt), fresh.infer(ids, mask, tt), strict=True):
        assert np.array_equal(a, b)
    with fresh.calibrating():  # already calibrated: the recording must not quantize
        fresh.infer(ids, mask, tt)
    again = fresh.calibration
    with served.calibrating():  # type: ignore[attr-defined]
        served.infer(ids, mask, tt)
    assert again == served.calibration  # type: ignore[attr-defined]
    plain = FusedEngine.from_pretrained(model, device="cpu", dtype="fp8")
    with plain.calibrating():
        plain.infer(ids, mask, tt)
    assert plain.calibration == again

    # BERT_QA_INT8_GEMMS: the same engine as built in process with int8_gemms, whose
    # logits differ from the e4m3 GEMMs'; unset, the engine's default ("auto"), which has
    # no token threshold for MiniLM's width (engine.INT8_AUTO_MIN_TOKENS): e4m3, as "none"
    assert served.options.int8_gemms == ()  # type: ignore[attr-defined]
    int8 = EngineConfig.resolve({"engine": "fused", "device": "cpu", "dtype": "fp8"},
                                env={"BERT_QA_FP8_CALIBRATION": str(path),
                                     "BERT_QA_INT8_GEMMS": "attn_out,ffn_in"}).build()
    assert int8.options.int8_gemms == ("attn_out", "ffn_in")  # type: ignore[attr-defined]
    direct = FusedEngine.from_pretrained(model, device="cpu", dtype="fp8",
                                         fp8_calibration=cal, int8_gemms="ffn_in,attn_out")
    got = int8.infer(ids, mask, tt)
    for a, b in zip(got, direct.infer(ids, mask, tt), strict=True):
        assert np.array_equal(a, b)
    unset = EngineConfig.resolve({"engine": "fused", "device": "cpu", "dtype": "fp8"},
                                 env={"BERT_QA_FP8_CALIBRATION": str(path)}).build()
    off = EngineConfig.resolve({"engine": "fused", "device": "cpu", "dtype": "fp8"},
                               env={"BERT_QA_FP8_CALIBRATION": str(path),
                                    "BERT_QA_INT8_GEMMS": "none"}).build()
    assert off.options.int8_gemms == ()  # type: ignore[attr-defined]
    e4m3 = off.infer(ids, mask, tt)[0]
    assert np.array_equal(unset.infer(ids, mask, tt)[0], e4m3)
    assert not np.array_equal(got[0], e4m3)
    # "none" asks for nothing, so it needs no calibration and suits any engine
    assert EngineConfig.resolve({}, env={"BERT_QA_INT8_GEMMS": "None"}).int8_gemms == ""
    # and so does "auto", the fused engine's default (explicit, as unset)
    for engine in ("fused", "reference"):  # (onnx needs its file: the same check)
        for value in ("", "auto", " Auto"):
            EngineConfig(engine=engine, device="cpu", int8_gemms=value).build()
    auto = EngineConfig.resolve({"engine": "fused", "device": "cpu", "dtype": "fp8"},
                                env={"BERT_QA_FP8_CALIBRATION": str(path),
                                     "BERT_QA_INT8_GEMMS": "auto"}).build()
    assert auto.options.int8_gemms == ()  # type: ignore[attr-defined]  # (MiniLM: as unset)
    with pytest.raises(ValueError, match="int8_gemms runs on calibrated scales"):
        EngineConfig(engine="fused", device="cpu", dtype="fp8", int8_gemms="ffn_in").build()
    with pytest.raises(ValueError, match="int8_gemms"):
        EngineConfig.resolve({"engine": "fused", "device": "cpu", "dtype": "fp8"},
                             env={"BERT_QA_FP8_CALIBRATION": str(path),
                                  "BERT_QA_INT8_GEMMS": "qkv"}).build()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "cannot read"),
        ('{"format": "other"}', "not an FP8 calibration"),
        ('{"format": "qa-fp8-calibration/1", "margin": 4}', "malformed"),
        ('{"format": "qa-fp8-calibration/1", "margin": 4, "amax": {"qkv": [1.0]}}',
         "holds amax for"),
        ('{"format": "qa-fp8-calibration/1", "margin": 4, "amax": {"qkv": [1.0], '
         '"attn_out": [1.0], "ffn_in": [1.0], "ffn_out": [0.0]}}', "finite and positive"),
        ('{"format": "qa-fp8-calibration/1", "margin": 4, "amax": {"qkv": [1.0], '
         '"attn_out": [1.0], "ffn_in": [1.0], "ffn_out": [1.0]}}', "for 1 layers"),
        ('{"format": "qa-fp8-calibration/1", "margin": 4, "amax": {"qkv": "12", '
         '"attn_out": "12", "ffn_in": "12", "ffn_out": "12"}}', "lists"),
        ('{"format": "qa-fp8-calibration/1", "margin": 4, "model": {"hidden_size": 1024}, '
         '"amax": {"qkv": [1, 1, 1, 1, 1, 1], "attn_out": [1, 1, 1, 1, 1, 1], '
         '"ffn_in": [1, 1, 1, 1, 1, 1], "ffn_out": [1, 1, 1, 1, 1, 1]}}', "shape"),
    ],
)
def test_bad_calibration_files_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    pytest.importorskip("torch")
    from engine.fused.engine import FusedEngine

    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        FusedEngine.from_pretrained(REPO_ROOT / "models" / "minilm-l6-squad", device="cpu",
                                    dtype="fp8", fp8_calibration=path)


@pytest.mark.parametrize("engine", ["onnx", "reference"])
def test_fp8_calibration_is_refused_for_other_engines(engine: str) -> None:
    with pytest.raises(ValueError, match="fp8_calibration applies to the fused engine only"):
        EngineConfig(engine=engine, fp8_calibration=Path("cal.json")).build()
    with pytest.raises(ValueError, match="fp8_static_inputs applies to the fused engine only"):
        EngineConfig(engine=engine, fp8_static_inputs="qkv").build()
    with pytest.raises(ValueError, match="int8_gemms applies to the fused engine only"):
        EngineConfig(engine=engine, int8_gemms="ffn_in").build()


def test_calibrating_cannot_nest_and_leaves_the_engine_usable() -> None:
    pytest.importorskip("torch")
    from engine.fused.engine import FusedEngine

    engine = FusedEngine.from_pretrained(REPO_ROOT / "models" / "minilm-l6-squad",
                                         device="cpu", dtype="fp8", backend="torch")
    ids = np.full((1, 40), 2000, dtype=np.int32)
    mask, tt = np.ones_like(ids), np.zeros_like(ids)
    before = engine.infer(ids, mask, tt)
    with (pytest.raises(RuntimeError, match="already calibrating"), engine.calibrating(),
          engine.calibrating()):
        pass
    assert engine._recorder is None and engine.calibration is None
    assert all(np.array_equal(a, b) for a, b in zip(engine.infer(ids, mask, tt), before,
                                                     strict=True))


def test_infer_in_chunks_of_max_tokens_per_pass_matches_one_pass() -> None:
    """A batch over ``max_tokens_per_pass`` tokens runs as passes of whole rows (row
    lengths from the mask, padding and empty rows included) and gives one pass's logits;
    padding positions keep ``PAD_LOGIT``."""
    from engine.fused.engine import PAD_LOGIT, FusedEngine

    model = REPO_ROOT / "models" / "minilm-l6-squad"
    one = FusedEngine.from_pretrained(model, device="cpu", backend="torch", dtype="float32")
    ids, mask, tt = request(5, 40, 8)
    mask[1, 25:] = 0
    mask[3, :] = 0  # an empty row
    chunked = FusedEngine(one.weights, "cpu", backend="torch", max_tokens_per_pass=70)
    calls: list[int] = []
    real = chunked._run_host
    chunked._run_host = lambda p: calls.append(p.tokens) or real(p)  # type: ignore[method-assign]
    start, end = chunked.infer(ids, mask, tt)
    want_start, want_end = one.infer(ids, mask, tt)
    assert calls == [65, 40, 40]  # rows 0-1, then 2-3 (row 3 empty), then 4
    np.testing.assert_allclose(start, want_start, atol=1e-4)
    np.testing.assert_allclose(end, want_end, atol=1e-4)
    assert (start[mask == 0] == PAD_LOGIT).all() and (end[mask == 0] == PAD_LOGIT).all()


def test_request_limits_name_each_problem() -> None:
    """The Triton model's per-request check, without Triton (its integration tests send the
    same cases over HTTP)."""
    limits = RequestLimits.of_checkpoint(REPO_ROOT / "models" / "minilm-l6-squad")
    assert limits == RequestLimits(30522, 2, 512)
    ids, mask, types = request(2, 9, 0)
    assert limits.problem((ids, mask, types)) is None

    def poked(k: int, value: int, at: tuple[int, int] = (1, 3)) -> list[np.ndarray]:
        arrays = [ids.copy(), mask.copy(), types.copy()]
        arrays[k][at] = value
        return arrays

    cases = {
        "input_ids values must be in [0, 30522); got -1 at [1, 3]": poked(0, -1),
        "input_ids values must be in [0, 30522); got 30522 at [1, 3]": poked(0, 30522),
        "attention_mask values must be in [0, 2); got 2 at [1, 3]": poked(1, 2),
        "token_type_ids values must be in [0, 2); got 2 at [1, 3]": poked(2, 2),
        "attention_mask row 1 is all 0": [ids, np.vstack([mask[:1], 0 * mask[1:]]), types],
        "must have one shape [batch, seq]; got [2, 9], [2, 8], [2, 9]": [ids, mask[:, 1:], types],
        "empty batch": [ids[:0], mask[:0], types[:0]],
        "sequence length 0 is outside [1, 512]": [ids[:, :0], mask[:, :0], types[:, :0]],
        "sequence length 513 is outside [1, 512]": list(request(1, 513, 1)),
    }
    for expected, arrays in cases.items():
        problem = limits.problem(arrays)
        assert problem is not None and expected in problem, (expected, problem)


def test_backlog_is_a_batch_that_formed_while_the_engine_worked() -> None:
    backlog = Backlog(min_gap_s=0.002)
    assert not backlog.queued_behind_work(100.0)  # the first batch: nothing ran before it
    backlog.ended(100.001)  # a 1 ms execution
    assert backlog.queued_behind_work(100.002)  # 1 ms later: within the 2 ms floor
    backlog.ended(101.002)  # a 1 s execution
    assert backlog.queued_behind_work(101.030)  # 28 ms to hand over and batch: under 0.5 s
    backlog.ended(101.031)
    assert not backlog.queued_behind_work(101.100)  # idle 69 ms after a 1 ms execution
    backlog.ended(101.101)
    assert not backlog.queued_behind_work(101.104)  # 3 ms: over the floor and 0.5 ms
