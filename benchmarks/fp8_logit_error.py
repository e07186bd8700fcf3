"""Logit error of the FP8 schemes against the fp32 reference on real SQuAD windows: a finer
accuracy signal than F1 (whose run-to-run spread under FP8 is ~0.1), and ablations that
say which per-tensor scale of the calibrated FFN costs accuracy.

    python3 benchmarks/fp8_logit_error.py --out err.json [--questions 2000] [--engines fp16 ...]

Windows: the first ``--questions`` dev v1.1 questions of the shipped checkpoint, in
batches of 64 (FP8 runs from 4,096 tokens, so every batch takes it). Calibration: 512
training-subset questions. Per engine: mean and max |logit - reference| over real tokens
(start and end), and the share of windows whose argmax start and end both match the
reference's. Engines (all but the reference through the fused engine):

* ``fp16``, ``fp8_rows`` (the default FP8), ``calibrated`` (cuBLASLt FFN1);
* ``fp8_rows_fast``, ``calibrated_fast``: the same with ``fp8.FAST_ACCUM`` (cuBLAS's fast
  accumulation);
* ``cal_torch_math``: the calibrated scheme as float32 torch math (tanh GELU);
* ``cal_erf``: ... with the exact GELU;
* ``cal_w1_rows``: ... with W1's per-channel scales instead of one;
* ``cal_h_rows``: ... with FFN1's output quantized per row (dynamic) instead of calibrated;
* ``cal_x_rows``: ... with FFN1's input quantized per row (dynamic) instead of calibrated;
* ``cal_w1_{tensor,rows}_grid_F``: ... with W1 (one scale, or per channel) rounded on a grid
  F times coarser: the same precision, another rounding, i.e. how far the error moves by
  chance.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _windows(path: Path, questions: int, batch: int) -> list[tuple[Any, Any, Any]]:
    import numpy as np

    from benchmarks.bench_gpu import CHECKPOINT
    from service.windowing import QATokenizer, WindowSpec
    from training.features import _encoded_groups
    from training.squad import load_examples

    tok = QATokenizer.from_dir(CHECKPOINT)
    wins = [w for _, w in _encoded_groups(load_examples(path)[:questions], tok,
                                           WindowSpec(max_seq_len=384, overlap=128), "predict")]
    out = []
    for i in range(0, len(wins), batch):
        group = wins[i:i + batch]
        seq = max(w.seq_len for w in group)
        padded = [w.padded_to(seq, tok.pad_id) for w in group]
        out.append(tuple(np.concatenate([getattr(w, k) for w in padded])
                         for k in ("input_ids", "attention_mask", "token_type_ids")))
    return out


@contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=2000)
    p.add_argument("--engines", nargs="+", default=None,
                   help="engines to run, in order (default: all)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch
    import torch.nn.functional as F

    from benchmarks.bench_gpu import CHECKPOINT, DEV_SET, TRAIN_SET
    from engine.fused import encoder, fp8
    from engine.fused.engine import FusedEngine
    from engine.registry import load_engine

    batches = _windows(DEV_SET, args.questions, 64)
    cal_batches = _windows(TRAIN_SET, 512, 64)
    ref_engine = load_engine("reference", CHECKPOINT, device="cuda", dtype="float32")
    refs = [ref_engine.infer(*b) for b in batches]
    del ref_engine
    fp16 = FusedEngine.from_pretrained(CHECKPOINT, device="cuda", dtype="float16")
    rows = FusedEngine.from_pretrained(CHECKPOINT, device="cuda", dtype="fp8")
    cal = FusedEngine(rows.weights, "cuda")
    with cal.calibrating():
        for b in cal_batches:
            cal.infer(*b)
    calw = cal.weights
    assert calw.calibrated is not None
    # Per-channel W1 in the calibrated layers (torch math broadcasts [N, 1] scales).
    w1_rows = replace(calw, calibrated=tuple(
        replace(c, w1=ly.ffn_in.w8, w1_scale=ly.ffn_in.w8_scale.t().contiguous())  # type: ignore[union-attr,arg-type]
        for c, ly in zip(calw.calibrated, calw.layers, strict=True)))

    def w1_grid(per_channel: bool, factor: float) -> Any:
        """The calibrated weights with W1 re-rounded on a grid ``factor`` times coarser:
        the same precision, another rounding (how much the error moves by chance)."""
        layers = []
        for c, ly in zip(calw.calibrated, calw.layers, strict=True):  # type: ignore[arg-type]
            w = ly.ffn_in.weight.float()
            rows = w.shape[0] if not per_channel else 1
            _, scale = fp8.quantize_tiles(w, rows, w.shape[1])  # [1, 1] or [N, 1]
            scale = scale * factor
            q = (w / scale).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8_DTYPE)
            layers.append(replace(c, w1=q, w1_scale=scale if per_channel else scale.reshape(1)))
        return FusedEngine(replace(calw, calibrated=tuple(layers)), "cuda", cuda_graphs=False)

    def torch_math(gelu: Callable[[Any], Any], h_rows: bool) -> Callable[[Any, Any], Any]:
        def ffn1(xq: Any, c: Any) -> Any:
            y = gelu(fp8.dequantize(xq) @ (c.w1.float() * c.w1_scale).t() + c.b1.float())
            if h_rows:
                return fp8.quantize_rows(y)
            return fp8.Quantized(fp8.quantize_static(y, c.h_scale).data, c.row_scales(len(y)))
        return ffn1

    class _RowsLN:  # an op set whose LayerNorms ignore the calibrated scale
        def __init__(self, ops: Any) -> None:
            self._ops = ops

        def __getattr__(self, name: str) -> Any:
            return getattr(self._ops, name)

        def bias_residual_layernorm(self, *a: Any, **kw: Any) -> Any:
            kw.pop("fp8_scale", None)
            return self._ops.bias_residual_layernorm(*a, **kw)

    tanh_math = torch_math(fp8.gelu_tanh, False)
    plain = FusedEngine(calw, "cuda", cuda_graphs=False)
    x_rows = FusedEngine(calw, "cuda", cuda_graphs=False)
    x_rows.ops = _RowsLN(x_rows.ops)  # type: ignore[assignment]
    kernel = fp8.calibrated_ffn1  # what the encoder calls

    def as_is() -> Any:
        return _patched(encoder, "calibrated_ffn1", kernel)

    def fast() -> Any:
        return _patched(fp8, "FAST_ACCUM", True)

    def eager(weights: Any) -> Callable[[], Any]:
        return lambda: FusedEngine(weights, "cuda", cuda_graphs=False)

    # name -> (engine factory, context the engine runs in); engines are built on demand.
    variants: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "fp16": (lambda: fp16, as_is),
        "fp8_rows": (lambda: rows, as_is),
        "fp8_rows_fast": (eager(rows.weights), fast),
        "calibrated": (lambda: cal, as_is),
        "calibrated_fast": (eager(calw), fast),
        "cal_torch_math": (lambda: plain, lambda: _patched(encoder, "calibrated_ffn1", tanh_math)),
        "cal_erf": (lambda: plain, lambda: _patched(encoder, "calibrated_ffn1",
                                                    torch_math(F.gelu, False))),
        "cal_w1_rows": (eager(w1_rows), lambda: _patched(encoder, "calibrated_ffn1", tanh_math)),
        "cal_h_rows": (lambda: plain, lambda: _patched(encoder, "calibrated_ffn1",
                                                       torch_math(fp8.gelu_tanh, True))),
        "cal_x_rows": (lambda: x_rows, lambda: _patched(encoder, "calibrated_ffn1", tanh_math)),
        **{f"cal_w1_{kind}_grid_{f}": (lambda kind=kind, f=f: w1_grid(kind == "rows", f),
                                       lambda: _patched(encoder, "calibrated_ffn1", tanh_math))
           for kind in ("tensor", "rows") for f in (1.03, 1.07, 1.13)},
    }
    unknown = set(args.engines or ()) - set(variants)
    if unknown:
        p.error(f"unknown engines {sorted(unknown)}; choose from {sorted(variants)}")
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "questions": args.questions,
                              "windows": int(sum(len(b[0]) for b in batches)), "engines": {}}
    for name in args.engines or variants:
        make, patch = variants[name]
        eng = make()
        abs_sum, count, worst, agree, windows = 0.0, 0, 0.0, 0, 0
        with patch():
            for b, (rs, re) in zip(batches, refs, strict=True):
                s, e = eng.infer(*b)
                keep = b[1].astype(bool)
                for ours, ref in ((s, rs), (e, re)):
                    d = np.abs(ours[keep] - ref[keep])
                    abs_sum += float(d.sum())
                    count += d.size
                    worst = max(worst, float(d.max()))
                masked = [np.where(keep, a, -1e9) for a in (s, e, rs, re)]
                agree += int(((masked[0].argmax(1) == masked[2].argmax(1))
                              & (masked[1].argmax(1) == masked[3].argmax(1))).sum())
                windows += len(keep)
        row = {"mean_abs": abs_sum / count, "max_abs": worst, "argmax_agree": agree / windows}
        result["engines"][name] = row
        print(f"{name:16s} mean|d| {row['mean_abs']:.4f}  max|d| {row['max_abs']:.3f}  "
              f"argmax agree {row['argmax_agree']:.4f}", flush=True)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
