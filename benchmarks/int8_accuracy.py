"""F1 room from INT8: the SQuAD F1 and logit error of fake-quantized GEMM schemes.

    python3 benchmarks/int8_accuracy.py --out acc.json [--schemes fp8,fp8_all,int8_s,...]
        [--grids 1,1.03,1.07,1.13] [--alpha 0.75] [--device cuda]
    python3 benchmarks/int8_accuracy.py --summarize acc1.json acc2.json ...

Why (``engine/fused/NOTES.md`` v49): every lever left for the mix target that changes
rounding is gated by F1, because the engine's e4m3 default already loses +0.093-0.095
against a 0.1 budget. e4m3 keeps 3 mantissa bits whatever the scale, so one scale per
output channel does not make its weights finer; int8 with a scale per output channel is
uniform, ~3x finer for weights without outliers, and SmoothQuant's per-input-channel
factors (folded into the LayerNorm or the V projection before each GEMM, free at run time)
take the activations' outlier channels out of their scale. A CPU study of the shipped
MiniLM's GEMM outputs (relative error against fp32) found the int8 forms 2-3x finer at
QKV, the out-projection and FFN1. This script asks whether that shows in F1.

Every scheme runs on the same fp32 transformers model (TF32 off) with its GEMMs replaced
by fake-quantized ones: operands rounded and dequantized, products in float32. So the
schemes differ only in rounding, not in kernels; ``fp8`` emulates the engine's calibrated
default and says how far this emulation is from the engine's own protocol
(``fp8_accuracy.py``, +0.093-0.095). Schemes (GEMM by GEMM; "-" stays fp32):

===========  ================  ================  ================  ================
scheme       qkv               attn_out          ffn_in            ffn_out
===========  ================  ================  ================  ================
fp8          e4m3 W/T, X/S4    -                 e4m3 W/T, X/S4    e4m3 W/T, X/S4
fp8_all      e4m3 W/T, X/S4    e4m3 W/T, X/S4    e4m3 W/T, X/S4    e4m3 W/T, X/S4
int8_s       int8 W/C, X/Ss    int8 W/C, X/Ss    int8 W/C, X/Ss    e4m3 W/T, X/S4
int8_t       int8 W/C, X/Ts    int8 W/C, X/Ts    int8 W/C, X/Ts    e4m3 W/T, X/S4
int8_s3      int8 W/C, X/Ss    -                 int8 W/C, X/Ss    e4m3 W/T, X/S4
int8_o       e4m3 W/T, X/S4    int8 W/C, X/Ss    e4m3 W/T, X/S4    e4m3 W/T, X/S4
int8_qo      int8 W/C, X/Ss    int8 W/C, X/Ss    e4m3 W/T, X/S4    e4m3 W/T, X/S4
int8_fo      e4m3 W/T, X/S4    int8 W/C, X/Ss    int8 W/C, X/Ss    e4m3 W/T, X/S4
===========  ================  ================  ================  ================

The last three (v50) keep some GEMMs in e4m3 on cuBLASLt, whose kernels hold the pass's
clock where the Gluon int8 ones lower it (``int8_standin.py``).

W/T one weight scale per tensor (QKV's three as one), W/C one per output channel; X/S4
one static input scale, 4 x the calibration's largest |x| (the engine's margin), X/Ss the
same for int8 with margin 1 after smoothing, X/Ts one scale per token after smoothing.
Smoothing divides input channel j by ``s_j = max|x_j|^alpha / max|W_:j|^(1-alpha)`` and
multiplies the weight's column j by it (exact before rounding). ``grid`` F multiplies
every weight scale by F (the same precision, another rounding), as ``fp8_accuracy.py``
does; activations keep their scales. Calibration: the windows of the first 512
training-subset questions, one unpadded window a call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
E4M3_MAX = 448.0
INT8_MAX = 127.0
FP8_MARGIN = 4.0  # engine.fused.calibration.CALIBRATION_MARGIN
GEMMS = ("qkv", "attn_out", "ffn_in", "ffn_out")

# scheme -> GEMM -> (weight format, input format); absent GEMMs stay fp32
_FP8 = ("e4m3_tensor", "e4m3_static")
_I8S = ("int8_channel", "int8_static")
_I8T = ("int8_channel", "int8_token")
SCHEMES: dict[str, dict[str, tuple[str, str]]] = {
    "fp8": {"qkv": _FP8, "ffn_in": _FP8, "ffn_out": _FP8},
    "fp8_all": {g: _FP8 for g in GEMMS},
    "int8_s": {"qkv": _I8S, "attn_out": _I8S, "ffn_in": _I8S, "ffn_out": _FP8},
    "int8_t": {"qkv": _I8T, "attn_out": _I8T, "ffn_in": _I8T, "ffn_out": _FP8},
    "int8_s3": {"qkv": _I8S, "ffn_in": _I8S, "ffn_out": _FP8},
    "int8_o": {"qkv": _FP8, "attn_out": _I8S, "ffn_in": _FP8, "ffn_out": _FP8},
    "int8_qo": {"qkv": _I8S, "attn_out": _I8S, "ffn_in": _FP8, "ffn_out": _FP8},
    "int8_fo": {"qkv": _FP8, "attn_out": _I8S, "ffn_in": _I8S, "ffn_out": _FP8},
}


def e4m3(t: Any, scale: Any) -> Any:
    """``t`` rounded to e4m3 on ``scale`` (saturating at +-448 scale), dequantized."""
    import torch

    return (t / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(t.dtype) * scale


def int8(t: Any, scale: Any) -> Any:
    """``t`` rounded to int8 on ``scale`` (saturating at +-127 scale), dequantized."""
    return (t / scale).round().clamp(-INT8_MAX, INT8_MAX) * scale


def smoothing(x_colmax: Any, w: Any, alpha: float) -> Any:
    """SmoothQuant's per-input-channel factors for weight ``w`` [N, K] whose inputs' largest
    magnitudes per channel are ``x_colmax`` [K]: ``x / s`` and ``w * s`` multiply to the
    same product."""
    return (x_colmax.clamp_min(1e-5) ** alpha
            / w.abs().amax(0).clamp_min(1e-5) ** (1 - alpha))


def quantize_weight(w: Any, form: str, grid: float = 1.0) -> Any:
    """``w`` [N, K] rounded as ``form`` (e4m3 with one scale, int8 with one per output
    channel) on a grid ``grid`` times coarser than its amax scale, dequantized."""
    if form == "e4m3_tensor":
        return e4m3(w, w.abs().amax() / E4M3_MAX * grid)
    if form == "int8_channel":
        return int8(w, w.abs().amax(1, keepdim=True).clamp_min(1e-12) / INT8_MAX * grid)
    raise ValueError(f"unknown weight form {form!r}")


def input_quantizer(form: str, amax: Any) -> Callable[[Any], Any]:
    """The rounding of a GEMM's input (already smoothed) as ``form``, where ``amax`` (a
    number or a 0-d tensor) is its largest magnitude over the calibration (the static forms
    use it)."""
    if form == "e4m3_static":
        scale = FP8_MARGIN * amax / E4M3_MAX
        return lambda x: e4m3(x, scale)
    if form == "int8_static":
        scale = amax / INT8_MAX
        return lambda x: int8(x, scale)
    if form == "int8_token":
        return lambda x: int8(x, x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / INT8_MAX)
    raise ValueError(f"unknown input form {form!r}")


@dataclass
class InputStats:
    """A GEMM input's largest magnitude per channel over the calibration."""

    colmax: Any = None

    def add(self, x: Any) -> None:
        """Take in ``x`` [tokens, K]."""
        m = x.abs().amax(0).float()
        self.colmax = m if self.colmax is None else self.colmax.maximum(m)


def gemm_modules(model: Any) -> list[dict[str, list[Any]]]:
    """Per layer, each GEMM's ``nn.Linear`` modules (QKV's three share one input)."""
    out = []
    for layer in model.base_model.encoder.layer:
        s = layer.attention.self
        out.append({"qkv": [s.query, s.key, s.value],
                    "attn_out": [layer.attention.output.dense],
                    "ffn_in": [layer.intermediate.dense], "ffn_out": [layer.output.dense]})
    return out


def unpadded_windows(path: Path, questions: int, tok: Any,
                     spec: Any) -> list[tuple[Any, Any, Any]]:
    """The windows of the first ``questions`` questions of ``path``, each alone and
    unpadded: (ids, mask, token types) arrays of one row."""
    from training.features import encoded_groups
    from training.squad import load_examples

    out = []
    for _, w in encoded_groups(load_examples(path)[:questions], tok, spec, "predict"):
        for r in range(len(w.input_ids)):
            keep = w.attention_mask[r].astype(bool)
            out.append(tuple(a[r][keep][None] for a in (
                w.input_ids, w.attention_mask, w.token_type_ids)))
    return out


def run_seeing_inputs(model: Any, windows: list[tuple[Any, Any, Any]],
                      run: Callable[..., Any], see: Callable[[int, str, Any], None]) -> None:
    """``run`` each window, with ``see(layer, gemm, x)`` called on every GEMM input ``x``
    (QKV's once: its three share it) as a [tokens, K] view."""
    hooks = []
    for i, mods in enumerate(gemm_modules(model)):
        for g in GEMMS:
            def hook(_m: Any, inp: Any, _out: Any, i: int = i, g: str = g) -> None:
                see(i, g, inp[0].detach().reshape(-1, inp[0].shape[-1]))
            hooks.append(mods[g][0].register_forward_hook(hook))
    try:
        for w in windows:
            run(*w)
    finally:
        for h in hooks:
            h.remove()


def calibrate(model: Any, windows: list[tuple[Any, Any, Any]],
              run: Callable[..., Any]) -> list[dict[str, InputStats]]:
    """Each layer's GEMM inputs' per-channel largest magnitudes over ``windows``."""
    stats = [{g: InputStats() for g in GEMMS} for _ in gemm_modules(model)]
    run_seeing_inputs(model, windows, run, lambda i, g, x: stats[i][g].add(x))
    return stats


def quantized_forwards(model: Any, stats: list[dict[str, InputStats]], scheme: str,
                       grid: float, alpha: float) -> list[tuple[Any, Callable[..., Any]]]:
    """(module, forward) for every GEMM the scheme rounds: its weight rounded once, its
    input rounded at each call (smoothed first for the int8 forms)."""
    import torch
    import torch.nn.functional as F

    plan = SCHEMES[scheme]
    out: list[tuple[Any, Callable[..., Any]]] = []
    for mods, layer_stats in zip(gemm_modules(model), stats, strict=True):
        for g, (w_form, x_form) in plan.items():
            lins = mods[g]
            w = torch.cat([m.weight.detach() for m in lins])  # [N, K]
            colmax = layer_stats[g].colmax.to(w.device)
            s = smoothing(colmax, w, alpha) if w_form.startswith("int8") else None
            wq = quantize_weight(w if s is None else w * s, w_form, grid)
            amax = float(colmax.max() if s is None else (colmax / s).max())
            xq = input_quantizer(x_form, amax)
            start = 0
            for m in lins:
                n = m.weight.shape[0]
                w_m, start = wq[start:start + n], start + n

                def forward(x: Any, w_m: Any = w_m, bias: Any = m.bias, s: Any = s,
                            xq: Callable[[Any], Any] = xq) -> Any:
                    return F.linear(xq(x if s is None else x / s), w_m, bias)
                out.append((m, forward))
    return out


def summarize(results: list[dict[str, Any]], paired: tuple[str, str] = ("fp8", "int8_s")
              ) -> dict[str, Any]:
    """Runs pooled over result files (each scheme's F1 loss: mean, sd, standard error,
    range; mean logit error and argmax agreement), and the paired difference of the
    ``paired`` schemes' losses at the grids both ran (rounding grids of one format are
    independent of the other's, so the pairing only cancels what the grid does to both)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for res in results:
        for r in res["runs"]:
            runs.setdefault(r["scheme"], []).append(r)

    def stats(xs: list[float]) -> dict[str, float]:
        sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
        return {"n": len(xs), "mean": statistics.mean(xs), "sd": sd,
                "se": sd / len(xs) ** 0.5, "min": min(xs), "max": max(xs)}

    out: dict[str, Any] = {"schemes": {
        s: {"f1_loss": stats([r["f1_loss"] for r in rs]),
            "mean_abs": statistics.mean(r["mean_abs"] for r in rs),
            "argmax_agree": statistics.mean(r["argmax_agree"] for r in rs)}
        for s, rs in runs.items()}}
    a, b = paired
    if a in runs and b in runs:
        by_grid = {r["grid"]: r["f1_loss"] for r in runs[a]}
        diffs = [by_grid[r["grid"]] - r["f1_loss"] for r in runs[b] if r["grid"] in by_grid]
        if diffs:
            out["paired"] = {"schemes": [a, b], **stats(diffs)}
    return out


def print_summary(summary: dict[str, Any]) -> None:
    for scheme, s in summary["schemes"].items():
        f = s["f1_loss"]
        print(f"  {scheme:10s} n {f['n']:2d}  F1 loss {f['mean']:+.3f} (se {f['se']:.3f}, "
              f"{f['min']:+.3f} to {f['max']:+.3f})  mean|d| {s['mean_abs']:.4f}  "
              f"argmax agree {s['argmax_agree']:.3f}")
    if p := summary.get("paired"):
        print(f"  {p['schemes'][0]} - {p['schemes'][1]}, paired by grid: {p['mean']:+.3f} "
              f"(se {p['se']:.3f}, n {p['n']})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--summarize", type=Path, nargs="+", default=None,
                   help="only pool earlier --out files and print their table")
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--grids", default="1,1.03,1.07,1.13")
    p.add_argument("--alpha", type=float, default=0.75, help="SmoothQuant's migration")
    p.add_argument("--questions", type=int, default=2000, help="for the logit error")
    p.add_argument("--calibration-questions", type=int, default=512)
    p.add_argument("--f1-questions", type=int, default=0, help="first N dev questions (0: all)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.summarize:
        print_summary(summarize([json.loads(f.read_text()) for f in args.summarize]))
        return
    schemes = args.schemes.split(",")
    if unknown := set(schemes) - set(SCHEMES):
        p.error(f"unknown schemes {sorted(unknown)}; choose from {', '.join(SCHEMES)}")
    grids = [float(g) for g in args.grids.split(",")]
    sys.path.insert(0, str(REPO))
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from benchmarks.bench_gpu import CHECKPOINT, DEV_SET, TRAIN_SET
    from benchmarks.fp8_accuracy import _windows, logit_error
    from engine.registry import load_engine
    from service.decoding import DecodeSpec
    from service.windowing import QATokenizer, WindowSpec
    from training.features import predict_with_margins
    from training.squad import load_examples, score

    tok = QATokenizer.from_dir(CHECKPOINT)
    spec, decode = WindowSpec(max_seq_len=384, overlap=128), DecodeSpec()
    dev = load_examples(DEV_SET)
    if args.f1_questions:
        dev = dev[:args.f1_questions]
    eng = load_engine("reference", CHECKPOINT, device=args.device, dtype="float32")
    model = eng.model

    def f1_of() -> Any:
        return score(dev, {k: t for k, (t, _) in predict_with_margins(
            dev, tok, eng.infer, spec, decode, 64).items()})

    batches = _windows(DEV_SET, args.questions, 64, spec, CHECKPOINT)
    refs = [eng.infer(*b) for b in batches]
    ref = f1_of()
    print(f"fp32 reference: F1 {ref.f1:.3f} EM {ref.exact:.3f}", flush=True)
    cal_windows = unpadded_windows(TRAIN_SET, args.calibration_questions, tok, spec)
    stats = calibrate(model, cal_windows, eng.infer)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "date": time.strftime("%Y-%m-%d"), "alpha": args.alpha, "grids": grids,
        "f1_questions": len(dev), "questions_for_logits": args.questions,
        "calibration_windows": len(cal_windows),
        "reference": {"f1": ref.f1, "exact": ref.exact}, "runs": []}
    for grid in grids:  # every scheme at each grid: a run cut short still pairs them
        for scheme in schemes:
            patched = quantized_forwards(model, stats, scheme, grid, args.alpha)
            for m, fwd in patched:
                m.forward = fwd
            try:
                errors = logit_error(eng.infer, batches, refs)
                f1 = f1_of()
            finally:
                for m, _ in patched:
                    del m.forward  # back to the class's forward
            row = {"scheme": scheme, "grid": grid, "f1": f1.f1, "exact": f1.exact,
                   "f1_loss": ref.f1 - f1.f1, **errors}
            result["runs"].append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))
    print(f"\nF1 loss against fp32 ({ref.f1:.2f}) and mean |logit - fp32|, grids {grids}:")
    print_summary(summarize([result]))


if __name__ == "__main__":
    main()
