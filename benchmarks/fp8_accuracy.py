"""Accuracy protocol for the FP8 schemes: F1 and logit error over several weight roundings.

    python3 benchmarks/fp8_accuracy.py --out acc.json [--grids 1,1.03,1.07,1.13]
        [--schemes fp16,rows,calibrated] [--questions 2000]

One F1 run of an FP8 engine moves by ~0.1-0.2 with rounding details (which way each
weight happens to round), as much as the differences between schemes. So every FP8
scheme is measured with its weights rounded on several grids: ``grid`` F re-quantizes
every FP8 weight with its scales multiplied by F (the same precision, another rounding;
1 is the engine's own). Per (scheme, grid), on the shipped checkpoint:

* ``f1`` / ``exact``: SQuAD v1.1 dev, every question (``training.evaluate``'s pipeline);
* ``mean_abs`` / ``max_abs``: |start/end logit - fp32 reference| over the real tokens of the
  windows of the first ``--questions`` dev questions, in batches of 64 (FP8 runs from 4,096
  tokens, calibrated FP8 from 129, so every batch takes it), and ``argmax_agree``: the share
  of those windows whose argmax start and end both match the reference's.

Schemes: ``fp16``; ``rows`` (per-token and per-channel scales, the default FP8);
``calibrated`` (static per-tensor scales for all four GEMM inputs, not the engine's
default three; ``FusedEngine.calibrating`` on the first 512 training-subset questions,
``--margin``); a ``_exact`` suffix turns fast accumulation off.
Ablations: ``rows_wtensor`` is ``rows`` with one scale per weight tensor (repeated per
channel), activations still per token; ``calibrated_erf`` is ``calibrated`` with FFN1 as
float32 torch math with the exact GELU and a float32 bias (cuBLASLt's epilogue has the
tanh form and a bf16 bias). Together they split the calibrated scheme's extra error into
weights, FFN1's epilogue and static activation scales. ``static:G1+G2`` is ``calibrated``
with only the named GEMMs' inputs (of ``qkv``, ``attn_out``, ``ffn_in``, ``ffn_out``) on
their static scales and the others per token (``fp8_static_inputs``), to split the static
activations' cost GEMM by GEMM. ``calibrated_attn_rows`` is the calibrated default
(attention output per token) with the out-projection in FP8 as well, its input scaled per
token and its weight per output channel (quantized by torch ops: an accuracy ablation, not
a fast path): whether FP8 itself, rather than a static scale, costs at that GEMM.
``calibrated_attn_w8`` / ``_x8`` round only the out-projection's weight / only its input
to e4m3 that way and multiply in float32: which operand's rounding costs there.
``deferred8`` is calibrated, with the deferred small-batch layer's QKV, FFN1 and FFN2 on
e4m3 operands (``fp8_deferred``; the large path never runs: run it with
``--max-seq-len 128 --window-batch 1`` so that every window is one small batch, and
compare it with ``fp16`` in the same run, which then runs the 16-bit deferred layer).
``calibrated_attn_fp8`` is the calibrated default with attention itself on FP8 operands
(:func:`fp8_attention`, emulated in float32): what an FP8 attention kernel would cost in
accuracy before one is written; ``_qkv`` / ``_p`` round only Q, K and V / only the
probabilities; ``_fine`` scales Q and K per token and head and V per head.
``int8:G1+G2`` is the calibrated default (``fp8_static_inputs`` the engine's) with the
named GEMMs (of ``attn_out``, ``ffn_in``) in int8 with SmoothQuant smoothing
(``int8_gemms``, ``engine.fused.int8``), their int8 weights re-rounded on each grid too.
Ends with a table: mean and spread over the grids, against the fp32 reference's F1.
``--checkpoint`` measures another model than the shipped one (its own fp32 reference);
``--baseline`` also scores a second checkpoint in fp32 and takes the losses against it
too: for an FP8-aware fine-tune (``training.fp8_aware``), the checkpoint it started from,
since a fine-tune compared only with its own fp32 reference hides what the fine-tune cost.
``--out-proj-adds-residual`` runs every scheme with the out-projection adding the residual
(``encoder.OUT_PROJ_ADDS_RESIDUAL``; where a scheme's static inputs allow it).

A ``~gptq`` suffix on a calibrated or ``static:`` scheme rounds its calibrated weights by
GPTQ (``engine.fused.gptq``: error-compensated against the calibration inputs' Gram
matrices) instead of to nearest, on every grid.

``--device cpu`` runs the same protocol on the CPU (the engine's torch ops: FP8 GEMMs as
dequantized float32 math, without the GPU's fast accumulation), for comparisons between
schemes where no GPU is at hand; ``--f1-questions N`` scores F1 on the first N dev
questions only (reference and schemes alike). ``--max-seq-len`` windows the questions
(overlap a third of it; default 384 with 128) and ``--window-batch`` is how many windows
each call takes (default 64), for the logit error and F1 alike (F1 batches whole
questions' windows; with 1, each window is still its own call).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMES = ("fp16", "rows", "rows_exact", "rows_wtensor", "calibrated", "calibrated_exact",
           "calibrated_erf", "calibrated_attn_rows", "calibrated_attn_w8", "calibrated_attn_x8",
           "calibrated_attn_fp8", "calibrated_attn_fp8_qkv", "calibrated_attn_fp8_p",
           "calibrated_attn_fp8_fine", "deferred8")


def _windows(path: Path, questions: int, batch: int, spec: Any,
             checkpoint: Path) -> list[tuple[Any, Any, Any]]:
    """Padded ``[windows, seq]`` batches of the first ``questions`` questions' windows."""
    import numpy as np

    from service.windowing import QATokenizer
    from training.features import encoded_groups
    from training.squad import load_examples

    tok = QATokenizer.from_dir(checkpoint)
    wins = [w for _, w in encoded_groups(load_examples(path)[:questions], tok, spec,
                                          "predict")]
    out = []
    for i in range(0, len(wins), batch):
        group = wins[i:i + batch]
        seq = max(w.seq_len for w in group)
        padded = [w.padded_to(seq, tok.pad_id) for w in group]
        out.append(tuple(np.concatenate([getattr(w, k) for w in padded])
                         for k in ("input_ids", "attention_mask", "token_type_ids")))
    return out


def logit_error(infer: Callable[..., Any], batches: list[tuple[Any, Any, Any]],
                refs: list[tuple[Any, Any]]) -> dict[str, float]:
    """``infer``'s start/end logits on each padded batch against ``refs`` (the reference's on
    the same batches), over real tokens: mean and max |difference| (``mean_abs``,
    ``max_abs``), and the share of windows whose argmax start and end both match
    (``argmax_agree``)."""
    import numpy as np

    abs_sum, count, worst, agree, windows = 0.0, 0, 0.0, 0, 0
    for b, (rs, re) in zip(batches, refs, strict=True):
        s, e = infer(*b)
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
    return {"mean_abs": abs_sum / count, "max_abs": worst, "argmax_agree": agree / windows}


def _window_calls(infer: Callable[..., Any]) -> Callable[..., Any]:
    """``infer`` called once per window (row) of a padded batch, the rows' logits stacked:
    every call then holds one window's tokens, as a batch-1 service call would."""
    import numpy as np

    def per_window(ids: Any, mask: Any, tt: Any) -> tuple[Any, Any]:
        outs = [infer(ids[i:i + 1], mask[i:i + 1], tt[i:i + 1]) for i in range(len(ids))]
        return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs])
    return per_window


def _rounded(w: Any, rows: int, factor: float) -> tuple[Any, Any]:
    """e4m3 copy of weight ``w`` [N, K] with one scale per ``rows`` rows ([N/rows, 1]), on
    a grid ``factor`` times coarser than amax / 448."""
    from engine.fused import fp8

    _, scale = fp8.quantize_tiles(w, rows, w.shape[1])  # [N, 1] or [1, 1]
    scale = scale * factor
    return (w.float() / scale.repeat_interleave(rows, 0)[: w.shape[0]]).clamp(
        -fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8_DTYPE), scale


def _regrid(weights: Any, factor: float, rows_per_tensor: bool = False,
            grams: Any = None) -> Any:
    """``weights`` with every FP8 weight re-rounded on a grid ``factor`` times coarser than
    its own scales (row-scaled copies per output channel, or with ``rows_per_tensor`` one
    scale for the tensor repeated per channel; calibrated copies per tensor, by GPTQ with
    ``grams``, the calibration's Gram matrices, else to nearest)."""
    if factor == 1.0 and not rows_per_tensor:
        return weights

    def rounded(w: Any, rows: int) -> tuple[Any, Any]:
        return _rounded(w, rows, factor)

    layers = []
    for ly in weights.layers:
        lins = {}
        for name in ("qkv", "ffn_in", "ffn_out"):
            lin = getattr(ly, name)
            n = lin.weight.shape[0]
            w8, scale = rounded(lin.weight, n if rows_per_tensor else 1)
            lins[name] = replace(lin, w8=w8, w8_scale=scale.reshape(1, -1).expand(1, n).contiguous())
        layers.append(replace(ly, **lins))
    cal = []
    for i, (c, ly) in enumerate(zip(weights.calibrated or (), weights.layers, strict=False)):
        lins = {}
        for name in ("qkv", "attn_out", "ffn_in", "ffn_out"):
            w = getattr(ly, name).weight
            w8, scale = rounded(w, w.shape[0])
            if grams is not None:
                from engine.fused.gptq import gptq_e4m3

                w8 = gptq_e4m3(w, grams[name][i], scale)
            lins[name] = replace(getattr(c, name), w8=w8, w_scale=scale.reshape(1))
        cal.append(replace(c, **lins))
    return replace(weights, layers=tuple(layers),
                   calibrated=tuple(cal) if weights.calibrated is not None else None,
                   folded8=_regrid_deferred(weights, factor))


def _regrid_deferred(weights: Any, factor: float) -> Any:
    """``weights.folded8`` with its three e4m3 weights per layer re-rounded on a grid
    ``factor`` times coarser (one scale per tensor), the input scales kept."""
    from engine.fused.folding import FoldedFP8

    if weights.folded8 is None:
        return None

    def refold(w: Any, x_scale: Any) -> Any:
        w8, scale = _rounded(w, w.shape[0], factor)
        return FoldedFP8.of(w8, scale.reshape(1), x_scale)

    out = []
    for d8, fold, ly in zip(weights.folded8, weights.folded, weights.layers, strict=True):
        w2, s2 = _rounded(ly.ffn_out.weight, ly.ffn_out.weight.shape[0], factor)
        out.append(replace(
            d8, qkv=refold(fold.qkv.weight, 1.0 / d8.qkv_inv),
            ffn_in=refold(fold.ffn_in.weight, 1.0 / d8.ffn_in_inv), ffn_out_w8=w2,
            ffn_out_scale=(s2.reshape(1) / d8.ffn_out_inv).contiguous()))
    return tuple(out)


def _scheme_gemms(scheme: str, kind: str, allowed: tuple[str, ...],
                  empty: bool) -> tuple[str, ...] | None:
    """The GEMMs a ``kind:G1+G2`` scheme names, each of ``allowed`` (none only where
    ``empty``); None for another scheme or a malformed one."""
    prefix, sep, names = scheme.partition(":")
    gemms = tuple(g for g in names.split("+") if g)
    if prefix != kind or not sep or not (gemms or empty) or not set(gemms) <= set(allowed):
        return None
    return gemms


def _int8_gemms(scheme: str) -> tuple[str, ...] | None:
    """The GEMMs of an ``int8:G1+G2`` scheme (None for another or a malformed one)."""
    from engine.fused.calibration import INT8_GEMMS

    return _scheme_gemms(scheme, "int8", INT8_GEMMS, empty=False)


def _regrid_int8(weights: Any, factor: float) -> Any:
    """``weights.int8`` with every int8 weight re-rounded on a grid ``factor`` times
    coarser than its per-channel scales (``int8.regrid``)."""
    from engine.fused.int8 import regrid

    if weights.int8 is None or factor == 1.0:
        return weights.int8
    return tuple(replace(i8, attn_out=regrid(i8.attn_out, ly.attn_out.weight, factor),
                         ffn_in=regrid(i8.ffn_in, ly.ffn_in.weight, factor))
                 for i8, ly in zip(weights.int8, weights.layers, strict=True))


def _static_inputs(scheme: str) -> tuple[str, ...] | None:
    """The GEMMs of a ``static:G1+G2`` scheme (None for another or a malformed one)."""
    from engine.fused.calibration import GEMMS

    return _scheme_gemms(scheme, "static", GEMMS, empty=True)


def _e4m3_tensor(t: Any, dims: tuple[int, ...] | None = None) -> Any:
    """``t`` rounded to e4m3, dequantized: one scale (amax / 448) for the tensor, or one per
    slice that ``dims`` reduce over (e.g. ``(0, 2)`` of [tokens, heads, dim]: per head)."""
    from engine.fused.fp8 import FP8_MAX, dequantize, quantize_static

    amax = t.abs().amax() if dims is None else t.abs().amax(dim=dims, keepdim=True)
    return dequantize(quantize_static(t, amax.clamp_min(1e-12) / FP8_MAX))


def fp8_attention(qkv: Any, qkv_bias: Any, cu_seqlens: Any, max_seqlen: int, n_seqs: int,
                  num_heads: int, *args: Any, fp8_scale: Any = None, qkv8: bool = True,
                  p8: bool = True, fine: bool = False, **kwargs: Any) -> Any:
    """``attention_varlen`` on FP8 operands, FlashAttention-3's recipe emulated in float32:
    with ``qkv8`` Q (its bias added, the softmax scale folded in), K and V rounded to e4m3
    with one scale per tensor (this call's amax: dynamic, an optimistic stand-in for
    calibrated scales); with ``p8`` the probabilities (in [0, 1] after each row's max)
    rounded to e4m3 for P.V, their row sums kept in float32. The K bias is dropped and the
    V bias added after, as the engine's kernel does. ``fine`` scales Q and K per token and
    head (a kernel folds those into each score's row and column) and V per head (folded
    into the output), the finest scaling an FP8 kernel could apply for free. The remaining
    arguments (tiles, launch options) are ignored."""
    import torch

    from engine.fused.fp8 import FP8_DTYPE, quantize_static

    n, three_d = qkv.shape
    d = three_d // 3
    hd = d // num_heads
    x = qkv.float().view(n, 3, num_heads, hd)
    b = qkv_bias.float().view(3, num_heads, hd)
    q, k, v = (x[:, 0] + b[0]) / math.sqrt(hd), x[:, 1], x[:, 2]
    if qkv8:
        rows, heads = ((2,), (0, 2)) if fine else (None, None)
        q, k, v = _e4m3_tensor(q, rows), _e4m3_tensor(k, rows), _e4m3_tensor(v, heads)
    out = torch.zeros((n, d), device=qkv.device, dtype=torch.float32)
    cu = cu_seqlens.tolist()
    for i in range(n_seqs):
        a, e = int(cu[i]), int(cu[i + 1])
        if e <= a:
            continue
        qs, ks, vs = (t[a:e].transpose(0, 1) for t in (q, k, v))  # [heads, len, hd]
        scores = qs @ ks.transpose(1, 2)
        p = torch.exp(scores - scores.amax(-1, keepdim=True))
        pv = p.to(FP8_DTYPE).to(torch.float32) if p8 else p
        out[a:e] = ((pv @ vs) / p.sum(-1, keepdim=True)).transpose(0, 1).reshape(e - a, d)
    out = out + b[2].reshape(d)
    return out.to(qkv.dtype) if fp8_scale is None else quantize_static(out, fp8_scale).data


def attention_flags(scheme: str) -> dict[str, bool] | None:
    """:func:`fp8_attention`'s flags for a ``calibrated_attn_fp8*`` scheme, else None."""
    if not scheme.startswith("calibrated_attn_fp8"):
        return None
    return {"qkv8": not scheme.endswith("_p"), "p8": not scheme.endswith("_qkv"),
            "fine": scheme.endswith("_fine")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schemes", default="fp16,rows,calibrated",
                   help=f"comma-separated, from {', '.join(SCHEMES)}")
    p.add_argument("--grids", default="1,1.03,1.07,1.13")
    p.add_argument("--questions", type=int, default=2000, help="for the logit error")
    p.add_argument("--margin", type=float, default=None, help="calibration margin")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (see the docstring)")
    p.add_argument("--f1-questions", type=int, default=0,
                   help="score F1 on the first N dev questions (0: all)")
    p.add_argument("--max-seq-len", type=int, default=384, help="window length (tokens)")
    p.add_argument("--window-batch", type=int, default=64, help="windows per call")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="the model (default: the shipped checkpoint)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="another checkpoint whose fp32 F1 the losses are also taken against "
                   "(e.g. the one an FP8-aware fine-tune started from)")
    p.add_argument("--out-proj-adds-residual", action="store_true",
                   help="every scheme's engine with encoder.OUT_PROJ_ADDS_RESIDUAL on")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from engine.fused.calibration import GEMMS

    schemes = args.schemes.split(",")
    for full in schemes:
        base, _, rounding = full.partition("~")
        if rounding and (rounding != "gptq" or not (base.startswith("calibrated")
                                                    or _static_inputs(base) is not None)):
            p.error(f"{full}: the one suffix is ~gptq, on calibrated and static: schemes")
    if unknown := {s for s in (x.partition("~")[0] for x in schemes)
                   if _static_inputs(s) is None and _int8_gemms(s) is None} - set(SCHEMES):
        p.error(f"unknown schemes {sorted(unknown)}; choose from {', '.join(SCHEMES)} "
                f"or static:G1+G2 (GEMMs {', '.join(GEMMS)}) or int8:G1+G2 (attn_out, "
                "ffn_in)")
    grids = [float(g) for g in args.grids.split(",")]
    import torch
    import torch.nn.functional as F

    from benchmarks.bench_gpu import CHECKPOINT, DEV_SET, TRAIN_SET
    from engine.fused import encoder, fp8
    from engine.fused.encoder import FP8_STATIC_INPUTS
    from engine.fused.engine import FusedEngine
    from engine.registry import load_engine
    from service.decoding import DecodeSpec
    from service.windowing import QATokenizer, WindowSpec
    from training.calibrate import calibrate_on
    from training.features import predict_with_margins
    from training.squad import load_examples, score

    checkpoint = args.checkpoint or CHECKPOINT
    tok = QATokenizer.from_dir(checkpoint)
    spec = WindowSpec(max_seq_len=args.max_seq_len, overlap=args.max_seq_len // 3)
    decode, wb = DecodeSpec(), args.window_batch
    dev = load_examples(DEV_SET)
    if args.f1_questions:
        dev = dev[:args.f1_questions]
    batches = _windows(DEV_SET, args.questions, wb, spec, checkpoint)
    device = args.device

    def fp32_f1(path: Path) -> Any:
        ref_engine = load_engine("reference", path, device=device, dtype="float32")
        return ref_engine, score(dev, {k: t for k, (t, _) in predict_with_margins(
            dev, tok, ref_engine.infer, spec, decode, 64).items()})  # fp32: batching is moot

    ref_engine, ref_f1 = fp32_f1(checkpoint)
    refs = [ref_engine.infer(*b) for b in batches]
    del ref_engine
    base_f1 = fp32_f1(args.baseline)[1] if args.baseline else None
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "device": device, "date": time.strftime("%Y-%m-%d"),
        "f1_questions": len(dev), "questions_for_logits": args.questions, "grids": grids,
        "max_seq_len": args.max_seq_len, "window_batch": wb,
        "windows_for_logits": int(sum(len(b[0]) for b in batches)),
        "checkpoint": str(checkpoint), "out_proj_adds_residual": args.out_proj_adds_residual,
        "reference": {"f1": ref_f1.f1, "exact": ref_f1.exact}, "runs": []}
    print(f"fp32 reference: F1 {ref_f1.f1:.2f} EM {ref_f1.exact:.2f}", flush=True)
    if base_f1 is not None:
        result["baseline"] = {"checkpoint": str(args.baseline), "f1": base_f1.f1,
                              "exact": base_f1.exact}
        print(f"fp32 baseline ({args.baseline}): F1 {base_f1.f1:.2f} EM {base_f1.exact:.2f}",
              flush=True)

    def engine(full: str, grid: float) -> FusedEngine:
        scheme, _, rounding = full.partition("~")
        dtype = "float16" if scheme == "fp16" else "fp8"
        base = FusedEngine.from_pretrained(checkpoint, device=device, dtype=dtype)
        static = _static_inputs(scheme)
        int8 = _int8_gemms(scheme)
        if (scheme.startswith("calibrated") or static is not None or int8 is not None
                or scheme == "deferred8"):
            calibrate_on(base, load_examples(TRAIN_SET)[:512], tok, spec, args.margin,
                         gptq=rounding == "gptq")
        grams = base.calibration.grams if base.calibration is not None else None
        if scheme == "deferred8":
            if base.weights.folded8 is None:
                raise RuntimeError("deferred8: the model has no deferred layer's e4m3 copies")
            return FusedEngine(_regrid(base.weights, grid), device, fp8_deferred=True,
                               fp8_calibrated_min_tokens=1 << 30)
        if int8 is not None:
            assert base.calibration is not None
            weights = replace(_regrid(base.weights, grid),
                              int8=base.calibration.int8_for(base.weights))
            return FusedEngine(replace(weights, int8=_regrid_int8(weights, grid)), device,
                               fp8_static_inputs=FP8_STATIC_INPUTS, int8_gemms=int8)
        default = scheme.startswith("calibrated_attn_")  # the engine's static inputs
        return FusedEngine(_regrid(base.weights, grid, scheme == "rows_wtensor", grams), device,
                           int8_gemms=None,  # e4m3 GEMMs (int8 runs in int8: schemes)
                           fp8_fast_accum=not scheme.endswith("_exact"),
                           cuda_graphs=not (scheme == "calibrated_erf"
                                            or scheme.startswith("calibrated_attn_fp8")),
                           fp8_static_inputs=(FP8_STATIC_INPUTS if default
                                              else GEMMS if static is None else static))

    def ffn1_erf(model: FusedEngine) -> Callable[[Any, Any, bool], Any]:
        """``calibrated_ffn1`` as float32 math: exact GELU, float32 bias (ablation)."""
        bias = {id(c): ly.ffn_in.bias.float() for c, ly in zip(
            model.weights.calibrated or (), model.weights.layers, strict=True)}

        def ffn1(xq: Any, cal: Any, fast: bool = False) -> Any:
            y = F.gelu(fp8._static_math(xq, cal.ffn_in) + bias[id(cal)])
            return fp8.quantize_static(y, cal.ffn_out.x_scale)
        return ffn1

    def attn_rows(model: FusedEngine, grid: float, operands: str) -> Callable[..., Any]:
        """``encoder._linear`` with the attention output's GEMM in FP8: its input with a
        scale per token (torch ops quantize it) and its weight per output channel, rounded
        on ``grid``; ``operands`` "xw" both through ``_scaled_mm``, "w" or "x" only that
        one rounded, the product in float32."""
        copies = {}
        for ly in model.weights.layers:
            q, scale = _rounded(ly.attn_out.weight, 1, grid)
            copies[id(ly.attn_out)] = (q, scale.reshape(1, -1).contiguous(), ly.attn_out.weight)
        real = encoder._linear

        def linear(x: Any, xq: Any, lin: Any, out: Any, fast: bool) -> Any:
            if xq is not None or id(lin) not in copies:
                return real(x, xq, lin, out, fast)
            q, scale, w = copies[id(lin)]
            if operands == "xw":
                return fp8.scaled_linear(fp8.quantize_rows(x), q, scale, out, fast)
            a = fp8.dequantize(fp8.quantize_rows(x)) if "x" in operands else x.float()
            b = q.float() * scale.t() if "w" in operands else w.float()
            return (a @ b.t()).to(out)
        return linear

    def measure(eng: FusedEngine) -> dict[str, float]:
        """F1 over the dev set and logit error against the fp32 reference's."""
        errors = logit_error(eng.infer, batches, refs)
        f1 = score(dev, {k: t for k, (t, _) in predict_with_margins(
            dev, tok, eng.infer if wb > 1 else _window_calls(eng.infer), spec, decode,
            wb).items()})
        return {"f1": f1.f1, "exact": f1.exact, **errors}

    def patch(full: str, eng: FusedEngine, grid: float) -> tuple[Any, str, Any]:
        """(module, attribute, replacement) that scheme runs with (itself where none)."""
        scheme = full.partition("~")[0]
        if scheme == "calibrated_erf":
            return encoder, "calibrated_ffn1", ffn1_erf(eng)
        if (flags := attention_flags(scheme)) is not None:
            return eng.ops, "attention_varlen", functools.partial(fp8_attention, **flags)
        if scheme.startswith("calibrated_attn_"):
            return encoder, "_linear", attn_rows(eng, grid, {
                "calibrated_attn_rows": "xw", "calibrated_attn_w8": "w",
                "calibrated_attn_x8": "x"}[scheme])
        return encoder, "calibrated_ffn1", encoder.calibrated_ffn1

    encoder.OUT_PROJ_ADDS_RESIDUAL = args.out_proj_adds_residual  # read at each call
    for scheme in schemes:
        for grid in grids if scheme != "fp16" else [1.0]:
            eng = engine(scheme, grid)
            module, name, replacement = patch(scheme, eng, grid)
            saved = getattr(module, name)
            setattr(module, name, replacement)
            try:
                row = {"scheme": scheme, "grid": grid, **measure(eng)}
            finally:
                setattr(module, name, saved)
            result["runs"].append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))
            del eng
            if device == "cuda":
                torch.cuda.empty_cache()
    against = [("fp32", ref_f1.f1)] + ([("baseline", base_f1.f1)] if base_f1 else [])
    for name, f1 in against:
        print(f"\nF1 loss against {name} ({f1:.2f}) and logit error, over grids {grids}:")
        for scheme in schemes:
            runs = [r for r in result["runs"] if r["scheme"] == scheme]
            losses = [f1 - r["f1"] for r in runs]
            errs = [r["mean_abs"] for r in runs]
            print(f"  {scheme:18s} F1 loss mean {statistics.mean(losses):+.3f} "
                  f"(min {min(losses):+.3f}, max {max(losses):+.3f})  mean|d| "
                  f"{statistics.mean(errs):.4f} ({min(errs):.4f}-{max(errs):.4f})")


if __name__ == "__main__":
    main()
