"""Would an int8 engine path pay at the power cap? ``kernels.gluon_gemm``'s int8 kernel
timed alone against the engine's GEMMs, then as stand-ins in the settled BERT-large SQuAD
mix pass (``engine/fused/NOTES.md`` v49's next step, v50).

    python3 benchmarks/int8_standin.py --commit SHA --out standin.json [--windows 256]
        [--settle-s 3] [--timed-s 1] [--order ...] [--configs 4:128:32:128,...]

v49 found F1 room in int8 (QKV, the out-projection and FFN1 int8 with per-channel
weights and static smoothed inputs: +0.004 F1 loss where the e4m3 default loses +0.093),
room that would let the out-projection run 8-bit (+3.6%, v39). That only pays if int8
GEMMs with their epilogues run about as fast as the engine's cuBLASLt FP8 ones. Two parts:

1. **Alone** (burst clocks, CUDA graphs of 24 calls, a ratio between forms): at the mix's
   token count, each GEMM as the engine runs it (cuBLASLt FP8 for QKV and FFN1 with
   FFN1's bias + GELU + e4m3 epilogue, the 16-bit out-projection, and the out-projection
   in cuBLASLt FP8 as the all-static path has it), and ``gluon_gemm`` in e4m3 and in int8
   (per-channel weight scales, the same epilogues) at each of ``--configs``. int8 runs on
   quantized normal operands and on e4m3 bytes read as int8 (what the stand-ins read);
   its error against float math on the first 256 rows is recorded beside cuBLASLt's.
2. **Stand-ins** (settled, ``benchmarks/settled``): one pass of the calibrated FP8
   default is recorded (``mix_ablation.StepMemo``); in each variant the named GEMMs run
   as the int8 kernel (each at its fastest configuration from part 1) into a buffer of
   their own, and the recorded outputs go downstream, so every other kernel reads the
   values it would have read and the logits are the default's exactly (checked). The
   int8 operands are the step's real inputs read as int8 bytes (the LayerNorms' e4m3
   copies; the out-projection's first K bytes of each 16-bit context row) and int8 copies
   of the weights made once: the bytes and the L2 traffic of the int8 design, the data's
   bit patterns not its own (e4m3 bytes read as int8 are larger than a calibrated int8
   copy's values: if anything more power). Variants: ``int8_all`` (QKV, the
   out-projection and FFN1), ``int8_qkv_ffn1``, ``int8_out``, ``int8_qkv_out``,
   ``int8_ffn1_out`` (the rest on cuBLASLt FP8 as today), and ``all_static`` (the
   out-projection in cuBLASLt FP8: v39's +3.6%) for reference; the baseline first,
   between and last.

The int8 design's other changes are not in the pass: the LayerNorms writing int8 copies
(same bytes as e4m3) and attention writing an int8 context (half the bytes it writes
now: not credited, so the out-projection's stand-in is conservative).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIGS = "4:128:32:128,3:128:16:256,3:128:32:256,6:64:16:256"
GEMMS = ("qkv", "out_proj", "ffn1")  # the kinds the int8 design changes (mix_ablation's)
SHAPES = {"qkv": (3072, 1024), "out_proj": (1024, 1024), "ffn1": (4096, 1024)}  # (N, K)
# variant -> the kinds run by the int8 kernel; ``all_static``: the engine in its all-static
# form (the out-projection in cuBLASLt FP8), no stand-in
VARIANTS: dict[str, frozenset[str]] = {
    "baseline": frozenset(), "int8_all": frozenset(GEMMS),
    "int8_qkv_ffn1": frozenset({"qkv", "ffn1"}), "int8_out": frozenset({"out_proj"}),
    "int8_qkv_out": frozenset({"qkv", "out_proj"}),
    "int8_ffn1_out": frozenset({"ffn1", "out_proj"}), "all_static": frozenset(),
}
ORDER = "baseline,int8_all,int8_qkv_ffn1,baseline,int8_out,all_static,int8_all,baseline"


def parse_config(text: str) -> tuple[int, int, int, int]:
    """``STAGES:BLOCK_K:SUB_M:BLOCK_N`` (``gluon_gemm.CONFIG``'s order)."""
    values = tuple(int(v) for v in text.split(":"))
    if len(values) != 4:
        raise ValueError(f"bad config {text!r}: STAGES:BLOCK_K:SUB_M:BLOCK_N")
    return values  # type: ignore[return-value]


def epilogue_of(kind: str) -> dict[str, Any]:
    """The epilogue each GEMM has in the int8 design: FFN1 bias + GELU + e4m3 (FFN2's
    input), QKV and the out-projection 16-bit without bias (attention and the LayerNorm
    add theirs)."""
    return {"gelu": 1, "out8": True, "bias": True} if kind == "ffn1" else {
        "gelu": 0, "out8": False, "bias": False}


def alone_row(kind: str, tokens: int, configs: list[tuple[int, int, int, int]], g: Any,
              replays: int) -> dict[str, Any]:
    """Part 1 for one GEMM: every form's µs a call, and the error of each output."""
    import torch

    from benchmarks.attn_backends import _time_graph
    from engine.fused.cublaslt import fp8_linear, tuned_half_linear
    from engine.fused.fp8 import FP8_DTYPE, gelu_tanh
    from engine.fused.int8 import column_scales, quantize_channels
    from engine.fused.kernels.gluon_gemm import gemm

    n, k = SHAPES[kind]
    epi = epilogue_of(kind)
    x = torch.randn((tokens, k), generator=g, device="cuda").half()
    w = (torch.randn((n, k), generator=g, device="cuda") * 0.03).half()
    bias = (torch.randn(n, generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    xs8 = (x.float().abs().amax() / 127).reshape(1)
    x8 = (x.float() / xs8).round().clamp(-127, 127).to(torch.int8)
    w8, sw = quantize_channels(w)
    w_top, col = column_scales(sw)
    xsf = (x.float().abs().amax() / 448).reshape(1)
    wsf = (w.float().abs().amax() / 448).reshape(1)
    xf8, wf8 = (x.float() / xsf).to(FP8_DTYPE), (w.float() / wsf).to(FP8_DTYPE)
    # FFN1's output multiplier: e4m3's range over the GELU output's amax (the calibrated
    # FFN1's h_inv), from float math on a sample of rows
    sample = x[:2048].float() @ w.float().t() + bias.float()
    h_inv = (448 / gelu_tanh(sample).abs().amax()).reshape(1) if epi["out8"] else None
    out_dtype = FP8_DTYPE if epi["out8"] else torch.float16

    def out() -> Any:
        return torch.empty((tokens, n), device="cuda", dtype=out_dtype)

    def reference(a: Any, b: Any) -> Any:  # float math on the first 256 rows
        y = a[:256].float() @ b.float().t() + (bias.float() if epi["bias"] else 0)
        y = gelu_tanh(y) if epi["gelu"] else y
        return y * h_inv if epi["out8"] else y

    ref = reference(x, w)
    forms: dict[str, tuple[Callable[[], Any], Any]] = {}
    lib_bias = bias if epi["bias"] else None
    if kind == "out_proj":
        def engine_16bit() -> Any:  # the engine's ``encoder._linear`` without an e4m3 copy
            tuned = tuned_half_linear(x, w)
            return torch.mm(x, w.t()) if tuned is None else tuned

        forms["engine_16bit"] = (engine_16bit, None)
    forms["cublaslt_fp8"] = (lambda: fp8_linear(
        xf8, xsf, wf8, wsf, out_dtype, bias=lib_bias, gelu=bool(epi["gelu"]),
        out_scale=h_inv, fast_accum=True), None)
    for cfg in configs:
        tag = ":".join(map(str, cfg))
        common = {"bias": lib_bias, "gelu": epi["gelu"], "config": cfg,
                  "out_scale": h_inv}
        o_f, o_8, o_b = out(), out(), out()
        forms[f"gluon_e4m3 {tag}"] = (
            lambda o=o_f, c=common: gemm(xf8, xsf, wf8, wsf, o, **c), o_f)
        forms[f"gluon_int8 {tag}"] = (
            lambda o=o_8, c=common: gemm(x8, xs8, w8, w_top, o, col_scale=col, **c), o_8)
        forms[f"gluon_int8_e4m3_bytes {tag}"] = (
            lambda o=o_b, c=common: gemm(xf8.view(torch.int8), xs8, wf8.view(torch.int8),
                                         w_top, o, col_scale=col, **c), o_b)
    row: dict[str, Any] = {"gemm": kind, "n": n, "k": k, "tokens": tokens, "us": {},
                           "rel_err": {}, "failed": {}}
    for name, (fn, buf) in forms.items():
        try:
            got = fn()
            torch.cuda.synchronize()
            row["us"][name] = _time_graph(fn, 24, replays)[0]
        except Exception as exc:  # a configuration that does not fit is recorded
            row["failed"][name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        got = (buf if buf is not None else got)[:256].float()
        if name.startswith("gluon_int8 "):
            want = reference(x8.float() * xs8, w8.float() * sw[:, None])
        elif "e4m3_bytes" in name:
            continue  # not a quantization of x and w: timing only
        elif name == "engine_16bit":
            want = ref
        else:
            want = reference(xf8.float() * xsf, wf8.float() * wsf)
        # the form's error against float math on its own operands, and their error
        # against the unquantized x and w
        row["rel_err"][name] = float((got - want).norm() / want.norm())
    for name in ("int8", "e4m3"):
        a, b = ((x8.float() * xs8, w8.float() * sw[:, None]) if name == "int8"
                else (xf8.float() * xsf, wf8.float() * wsf))
        row["rel_err"][f"operands_{name}"] = float((reference(a, b) - ref).norm() / ref.norm())
    flops = 2.0 * tokens * n * k
    row["tflops"] = {name: flops / us / 1e6 for name, us in row["us"].items()}
    return row


def best_config(row: dict[str, Any]) -> tuple[int, int, int, int]:
    """The fastest configuration of the int8 kernel on the stand-ins' data."""
    times = {name.split(" ")[1]: us for name, us in row["us"].items()
             if name.startswith("gluon_int8_e4m3_bytes ")}
    if not times:
        raise RuntimeError(f"{row['gemm']}: no int8 configuration ran: {row['failed']}")
    return parse_config(min(times, key=times.__getitem__))


class Int8StandIns:
    """``StepMemo.replace`` stand-ins that run the int8 kernel on a step's inputs read as
    int8 bytes and hand on the recorded output; int8 weights made once a layer."""

    def __init__(self, configs: dict[str, tuple[int, int, int, int]]) -> None:
        self.configs = configs
        self._weights: dict[int, tuple[Any, Any, Any]] = {}
        self._out: dict[tuple[str, int], Any] = {}
        self._ctx_scale: Any = None

    def _run(self, kind: str, a: Any, x_scale: Any, lin: Any, weight: Callable[[], Any],
             **epi: Any) -> None:
        """The int8 kernel for one step; ``weight()`` gives the float weight the first
        time a layer's GEMM is seen."""
        import torch

        from engine.fused.fp8 import FP8_DTYPE
        from engine.fused.int8 import column_scales, quantize_channels
        from engine.fused.kernels.gluon_gemm import gemm

        if id(lin) not in self._weights:
            w8, s = quantize_channels(weight())
            self._weights[id(lin)] = (w8, *column_scales(s))
        w8, w_top, col = self._weights[id(lin)]
        key = (kind, a.shape[0])
        if key not in self._out:
            self._out[key] = torch.empty((a.shape[0], w8.shape[0]), device=a.device,
                                         dtype=FP8_DTYPE if kind == "ffn1" else torch.float16)
        gemm(a, x_scale, w8, w_top, self._out[key], col_scale=col,
             config=self.configs[kind], **epi)

    def qkv(self, recorded: Any, xq: Any, lin: Any, *_: Any, **__: Any) -> Any:
        import torch

        self._run("qkv", xq.data.view(torch.int8), lin.x_scale, lin,
                  lambda: lin.w8.float() * lin.w_scale)
        return recorded

    def ffn1(self, recorded: Any, xq: Any, cal: Any, *_: Any, **__: Any) -> Any:
        import torch

        lin = cal.ffn_in
        self._run("ffn1", xq.data.view(torch.int8), lin.x_scale, lin,
                  lambda: lin.w8.float() * lin.w_scale, bias=cal.b1, out_scale=cal.h_inv,
                  gelu=1)
        return recorded

    def out_proj(self, recorded: Any, x: Any, xq: Any, lin: Any, *_: Any, **__: Any) -> Any:
        import torch

        d = lin.weight.shape[1]  # the context's first d bytes a row, read as int8
        if self._ctx_scale is None:
            self._ctx_scale = torch.full((1,), 1.0 / 127, device=x.device)
        self._run("out_proj", x.view(torch.int8)[:, :d], self._ctx_scale, lin,
                  lambda: lin.weight)
        return recorded


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--order", default=ORDER, help="comma-separated variants, repeats allowed")
    p.add_argument("--configs", default=CONFIGS,
                   help="the int8 kernel's configurations timed alone, STAGES:BLOCK_K:SUB_M:"
                        "BLOCK_N comma-separated; each stand-in takes its GEMM's fastest")
    p.add_argument("--replays", type=int, default=10, help="graph replays a timing alone")
    p.add_argument("--alone-only", action="store_true", help="part 1 only")
    sys.path.insert(0, str(REPO))
    from benchmarks.settled import add_mix_args, finish, mix_result, variant_checks

    add_mix_args(p)
    args = p.parse_args()
    order = [v for v in args.order.split(",") if v]
    if bad := set(order) - set(VARIANTS):
        p.error(f"unknown variants {sorted(bad)}; choose from {', '.join(VARIANTS)}")
    configs = [parse_config(c) for c in args.configs.split(",") if c]
    import json

    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows, static_everywhere
    from benchmarks.mix_ablation import StepMemo, memo_engine
    from benchmarks.settled import ordered_variants, settled_rows

    batch = mix_windows(np.random.default_rng(3), args.windows)
    tokens = int(batch[1].sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    alone = []
    for kind in GEMMS:
        row = alone_row(kind, tokens, configs, g, args.replays)
        alone.append(row)
        print(json.dumps(row), flush=True)
    chosen = {row["gemm"]: best_config(row) for row in alone}
    print(f"stand-in configurations: {chosen}", flush=True)
    if args.alone_only:
        result = mix_result(args, tokens, alone=alone, configs=chosen)
        finish(args, result)
        return

    engine = mix_engine("bert-large", int8_gemms=None)  # calibrated e4m3 (no int8 GEMM)
    all_static = static_everywhere(engine)
    packed = device_packed(*batch)
    memo, stand_ins = StepMemo(), Int8StandIns(chosen)

    def use(name: str) -> Callable[[Any], Any]:
        eng = all_static if name == "all_static" else engine
        memo.replace = {k: getattr(stand_ins, k) for k in VARIANTS[name]}

        def run(x: Any) -> Any:
            memo.start_pass()
            return eng._run_device(*x)
        return run

    with torch.inference_mode(), memo_engine(engine, memo):
        memo.recording = True
        reference = use("baseline")(packed)
        torch.cuda.synchronize()
        memo.recording = False
        # the stand-ins hand on recorded outputs: logits the default's exactly
        # (all_static is another engine: its own rounding)
        result = mix_result(args, tokens, alone=alone, configs=chosen,
                            **variant_checks(["baseline", *order], use, packed, reference))
        print(f"logit differences: {result['max_abs_logit_diff']}", flush=True)
        result["rows"] = settled_rows(ordered_variants(order, use), packed, args.windows,
                                      args.settle_s, args.timed_s)
    finish(args, result)


if __name__ == "__main__":
    main()
