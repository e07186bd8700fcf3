"""What fusing the residual LayerNorms into their GEMMs could gain the BERT-large SQuAD mix
pass at the power cap, measured on a pass that moves that design's bytes.

    python3 benchmarks/ln_fusion_bound.py --commit SHA --out bound.json [--windows 256]
        [--settle-s 3] [--timed-s 1]

Today each residual LayerNorm reads the GEMM's output and the residual (4 bytes an
element) and writes the 16-bit residual stream and its e4m3 copy (3 bytes): with the
GEMM's 2-byte write, 9 bytes an element, 48 times a pass. The fused design
(``engine/fused/NOTES.md`` v42) keeps the residual stream as the *un-normalized* sums:
the out-projection's and FFN2's epilogues read the previous sum and its row moments,
normalize it as they read it, add it and write the new sum (4 bytes); the LayerNorm step
(``kernels.layernorm_quant``) reads that sum once and writes only the e4m3 copy and the
moments (3 bytes): 7 bytes an element. The epilogues need custom GEMMs; before building
them, this tool times a pass with exactly those bytes, on the real kernels where they
exist:

* ``gemm_residual``: the out-projection (cuBLAS, 16-bit) and FFN2 (cuBLASLt, FP8) read
  the residual as their C (beta = 1; the out-projection in place on a buffer per call,
  the product's sign alternating from one use to the next so its values stay bounded),
  the LayerNorms as today;
* ``ln_quant``: each residual LayerNorm replaced by ``layernorm_quant`` of its GEMM
  output, handing on the outputs the recorded pass had (``mix_ablation.StepMemo``), so
  every later kernel reads real values;
* ``fused_bytes``: both, the design's bytes (the epilogues' per-element normalization, a
  few FMAs, is not emulated);
* ``without_layernorm``: the LayerNorms taken out (the ceiling, v39's ablation);
* ``half_ffn2``, ``half_out``: what library GEMMs allow without a custom epilogue
  (``half_out`` is what ``encoder.OUT_PROJ_ADDS_RESIDUAL`` builds). A GEMM
  that reads its residual through C needs it normalized and written, so only one
  LayerNorm a layer can drop its 16-bit output: in ``half_ffn2`` FFN2 adds the residual
  (cuBLASLt's C) and the LayerNorm after it is ``layernorm_quant`` (the one after the
  out-projection would read that sum and its moments, normalizing it as it reads: the
  bytes it reads today); in ``half_out`` the out-projection adds it (cuBLAS in place on
  the residual, which nothing reads after it) and the LayerNorm after it is
  ``layernorm_quant``.

Each variant is timed settled (``benchmarks/settled``), the baseline first, between and
last. One pass of each is profiled first: its kernels by name, checked to be the design's
(no copies added). Ends with a table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# variant -> (step kinds skipped, {step kind: the StandIns method replacing it})
VARIANTS: dict[str, tuple[frozenset[str], dict[str, str]]] = {
    "baseline": (frozenset(), {}),
    "gemm_residual": (frozenset(), {"out_proj": "out_proj", "ffn2": "ffn2"}),
    "ln_quant": (frozenset(), {"layernorm": "layernorm"}),
    "fused_bytes": (frozenset(), {"out_proj": "out_proj", "ffn2": "ffn2",
                                  "layernorm": "layernorm"}),
    "without_layernorm": (frozenset({"layernorm"}), {}),
    "half_ffn2": (frozenset(), {"ffn2": "ffn2", "layernorm": "layernorm_after_ffn2"}),
    "half_out": (frozenset(), {"out_proj": "out_proj", "layernorm": "layernorm_after_out"}),
}
ORDER = ("baseline,fused_bytes,gemm_residual,ln_quant,baseline,without_layernorm,"
         "fused_bytes,baseline")


class StandIns:
    """The stand-ins for ``StepMemo.replace``, and the residual stream they read: the
    latest hidden states the embeddings or a LayerNorm handed on (recorded or real)."""

    def __init__(self, real_layernorm: Callable[..., Any] | None = None) -> None:
        self.residual: Any = None
        self.real_layernorm = real_layernorm  # the residual LayerNorm the halves keep
        self._buffers: dict[int, tuple[Any, float]] = {}  # per call: buffer, next sign
        self._calls = self._ln_calls = 0

    def start_pass(self) -> None:
        self._calls = self._ln_calls = 0

    def out_proj(self, recorded: Any, x: Any, xq: Any, lin: Any, *_: Any) -> Any:
        """The 16-bit out-projection reading the residual: ``buf += sign * ctx @ W^T`` in
        place (cuBLAS's C = D, beta = 1) on a buffer per call that started as the
        residual, the sign flipping at each use: its values alternate between the
        residual plus the product and the residual."""
        i, self._calls = self._calls, self._calls + 1
        buf, sign = self._buffers.get(i) or (self.residual.clone(), 1.0)
        self._buffers[i] = (buf, -sign)
        return buf.addmm_(x, lin.weight.t(), alpha=sign)

    def ffn2(self, recorded: Any, xq: Any, lin: Any, out_dtype: Any, fast_accum: bool = False,
             ) -> Any:
        """FFN2 (cuBLASLt, calibrated FP8) with the residual as its addend."""
        from engine.fused.cublaslt import fp8_linear

        return fp8_linear(xq.data, lin.x_scale, lin.w8, lin.w_scale, out_dtype,
                          fast_accum=fast_accum, addend=self.residual)

    @staticmethod
    def layernorm(recorded: Any, a: Any, bias: Any, residual: Any, gamma: Any, beta: Any,
                  eps: float, **kwargs: Any) -> Any:
        """``layernorm_quant`` of the GEMM output plus bias (its e4m3 copy with the
        calibrated scale, and the moments), handing on the recorded pass's outputs."""
        from engine.fused.kernels import layernorm_quant

        layernorm_quant(a, bias, gamma, beta, eps, fp8_scale=kwargs.get("fp8_scale"))
        return recorded

    def _one_of_two(self, second: bool, recorded: Any, *args: Any, **kwargs: Any) -> Any:
        """:meth:`layernorm` for every other residual LayerNorm of the pass (a layer's
        first follows its out-projection, its second FFN2), the real one for the rest."""
        i, self._ln_calls = self._ln_calls, self._ln_calls + 1
        if i % 2 == int(second):
            return self.layernorm(recorded, *args, **kwargs)
        assert self.real_layernorm is not None
        return self.real_layernorm(*args, **kwargs)

    def layernorm_after_out(self, recorded: Any, *args: Any, **kwargs: Any) -> Any:
        return self._one_of_two(False, recorded, *args, **kwargs)

    def layernorm_after_ffn2(self, recorded: Any, *args: Any, **kwargs: Any) -> Any:
        return self._one_of_two(True, recorded, *args, **kwargs)


class TrackResidual:
    """An op set that notes the hidden states its embeddings and residual LayerNorms
    return in ``stand_ins.residual``."""

    def __init__(self, ops: Any, stand_ins: StandIns) -> None:
        self._ops, self._stand_ins = ops, stand_ins

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def embed_layernorm(self, *args: Any, **kwargs: Any) -> Any:
        out = self._ops.embed_layernorm(*args, **kwargs)
        self._stand_ins.residual = out[0]
        return out

    def bias_residual_layernorm(self, *args: Any, **kwargs: Any) -> Any:
        out = self._ops.bias_residual_layernorm(*args, **kwargs)
        self._stand_ins.residual = out[0]
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sys.path.insert(0, str(REPO))
    from benchmarks.mix_ablation import StepMemo, memo_engine
    from benchmarks.settled import (
        add_mix_args,
        finish,
        mix_result,
        ordered_variants,
        settled_rows,
        variant_checks,
    )

    p.add_argument("--order", default=ORDER,
                   help="comma-separated variants in the order timed (repeats allowed)")
    add_mix_args(p)
    args = p.parse_args()
    order = [v for v in args.order.split(",") if v]
    if bad := set(order) - set(VARIANTS):
        p.error(f"unknown variants {sorted(bad)}; choose from {', '.join(VARIANTS)}")
    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows

    engine = mix_engine("bert-large", int8_gemms=None)  # calibrated e4m3 (no int8 GEMM)
    batch = mix_windows(np.random.default_rng(3), args.windows)
    packed = device_packed(*batch)
    memo, stand_ins = StepMemo(), StandIns(engine.ops.bias_residual_layernorm)

    def run(x: Any) -> Any:
        memo.start_pass()
        stand_ins.start_pass()
        return engine._run_device(*x)

    def use(name: str) -> Callable[[Any], Any]:
        skip, replaced = VARIANTS[name]
        memo.skip = skip
        memo.replace = {k: getattr(stand_ins, m) for k, m in replaced.items()}
        return run

    with torch.inference_mode(), memo_engine(engine, memo):
        engine.ops = TrackResidual(engine.ops, stand_ins)
        memo.recording = True
        reference = run(packed)
        torch.cuda.synchronize()
        memo.recording = False
        # A pass of each first (the out-projection's buffers are made in the first that
        # replaces it), then one more, and one profiled.
        result = mix_result(args, int(batch[1].sum()), **variant_checks(
            ["baseline", *order], use, packed, reference))
        for name, changed in result["kernels_changed"].items():
            print(f"{name}: {result['kernels_per_pass'][name]} kernels; changed {changed}",
                  flush=True)
        result["rows"] = settled_rows(ordered_variants(order, use), packed, args.windows,
                                      args.settle_s, args.timed_s)
    finish(args, result)


if __name__ == "__main__":
    main()
