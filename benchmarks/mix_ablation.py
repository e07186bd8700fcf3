"""What each kind of step costs the BERT-large SQuAD mix pass at the power cap.

    python3 benchmarks/mix_ablation.py --commit SHA --out ablation.json [--windows 256]
        [--settle-s 3] [--timed-s 1]

At the H200's 700 W limit a kernel's share of an unsettled trace is not what removing it
would save: the clock the limit settles at depends on the energy of the whole pass
(``engine/fused/NOTES.md`` v36-v37). This tool measures the saving directly. One pass of
the calibrated FP8 default (random BERT-large weights, 256 windows of SQuAD dev lengths)
is recorded once; then each variant runs the same pass with one kind of step replaced
by the outputs the recorded pass produced (no launch, no work; every other kernel reads
the values it would have read, so its data and power are the real ones):

* ``qkv``, ``ffn2``: the static-scale FP8 GEMMs (cuBLASLt), ``ffn1``: FFN1 with its
  bias + GELU + e4m3 epilogue (one cuBLASLt GEMM), ``out_proj``: the 16-bit
  out-projection (cuBLAS);
* ``attention``: the packed attention kernel; ``layernorm``: the 47 residual + LayerNorm
  kernels (the last, with the QA head, stays).

Each variant runs ``--settle-s`` at load (the power limit settles), then is timed for
``--timed-s`` with its SM clock and board power (``benchmarks/gpu_clocks``). The
step's saving at the cap is the baseline's ms less the variant's: an upper bound on
what fusing that step away, or making it free, could gain. The all-static FP8 pass (the
out-projection in FP8 as well) is timed beside them for reference, and the baseline
again last (the drift over the run). Ends with a table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KINDS = ("qkv", "attention", "out_proj", "layernorm", "ffn1", "ffn2")


class StepMemo:
    """Records the outputs of one pass's steps by kind (``record``), then returns them in
    place of the steps named in ``skip`` (a pass with the same inputs, same call order),
    or runs a stand-in for the steps in ``replace`` (``benchmarks/ln_fusion_bound.py``)."""

    def __init__(self) -> None:
        self.outputs: dict[str, list[Any]] = {k: [] for k in KINDS}
        self.recording = False
        self.skip: frozenset[str] = frozenset()
        # kind -> stand-in, called as ``stand_in(recorded output, *the step's arguments)``;
        # what it returns goes downstream
        self.replace: dict[str, Callable[..., Any]] = {}
        self._next = dict.fromkeys(KINDS, 0)

    def start_pass(self) -> None:
        self._next = dict.fromkeys(KINDS, 0)

    def taken(self, kind: str) -> int:
        """How many recorded outputs of ``kind`` this pass has returned so far."""
        return self._next[kind]

    def step(self, kind: str, real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``real(*args, **kwargs)``, recorded while recording; the recorded output when
        ``kind`` is skipped; its stand-in's result when it is replaced."""
        if self.recording:
            out = real(*args, **kwargs)
            self.outputs[kind].append(out)
            return out
        if kind in self.skip or kind in self.replace:
            i = self._next[kind]
            self._next[kind] = i + 1
            recorded = self.outputs[kind][i]
            if kind in self.skip:
                return recorded
            return self.replace[kind](recorded, *args, **kwargs)
        return real(*args, **kwargs)


class MemoOps:
    """The engine's op set with attention and the residual LayerNorms through a memo."""

    def __init__(self, ops: Any, memo: StepMemo) -> None:
        self._ops, self._memo = ops, memo

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def attention_varlen(self, *args: Any, **kwargs: Any) -> Any:
        return self._memo.step("attention", self._ops.attention_varlen, *args, **kwargs)

    def bias_residual_layernorm(self, *args: Any, **kwargs: Any) -> Any:
        return self._memo.step("layernorm", self._ops.bias_residual_layernorm, *args, **kwargs)


@contextmanager
def memo_engine(engine: Any, memo: StepMemo) -> Iterator[None]:
    """``engine``'s passes with every step kind of ``KINDS`` through ``memo``: the encoder's
    GEMM functions patched (told apart by the weights they are called with), its op set
    wrapped. The residual LayerNorms run as two kernels a layer, the form these kinds
    name: ``encoder.OUT_PROJ_ADDS_RESIDUAL`` is off inside (it would also overwrite
    recorded hidden states in place)."""
    from engine.fused import encoder

    static_kind: dict[int, str] = {}
    for c in engine.weights.calibrated or ():
        static_kind.update({id(c.qkv): "qkv", id(c.ffn_out): "ffn2", id(c.attn_out): "out_proj"})
    out_proj = {id(ly.attn_out) for ly in engine.weights.layers}
    real_static, real_linear, real_ffn1 = (encoder.static_linear, encoder._linear,
                                           encoder.calibrated_ffn1)

    def static_linear(xq: Any, lin: Any, *args: Any, **kwargs: Any) -> Any:
        kind = static_kind.get(id(lin))
        if kind is None:
            return real_static(xq, lin, *args, **kwargs)
        return memo.step(kind, real_static, xq, lin, *args, **kwargs)

    def linear(x: Any, xq: Any, lin: Any, *args: Any, **kwargs: Any) -> Any:
        if id(lin) not in out_proj:
            return real_linear(x, xq, lin, *args, **kwargs)
        return memo.step("out_proj", real_linear, x, xq, lin, *args, **kwargs)

    def ffn1(*args: Any, **kwargs: Any) -> Any:
        return memo.step("ffn1", real_ffn1, *args, **kwargs)

    ops, adds_residual = engine.ops, encoder.OUT_PROJ_ADDS_RESIDUAL
    encoder.static_linear, encoder._linear, encoder.calibrated_ffn1 = static_linear, linear, ffn1
    encoder.OUT_PROJ_ADDS_RESIDUAL = False
    engine.ops = MemoOps(ops, memo)
    try:
        yield
    finally:
        encoder.static_linear, encoder._linear, encoder.calibrated_ffn1 = (
            real_static, real_linear, real_ffn1)
        encoder.OUT_PROJ_ADDS_RESIDUAL = adds_residual
        engine.ops = ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(KINDS),
                   help="comma-separated variants, each the step kinds it takes out "
                        "joined by '+' (e.g. attention+layernorm)")
    sys.path.insert(0, str(REPO))
    from benchmarks.settled import add_mix_args, finish, mix_result, settled_rows

    add_mix_args(p)
    args = p.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if bad := {k for v in variants for k in v.split("+")} - set(KINDS):
        p.error(f"unknown step kinds {sorted(bad)}; choose from {', '.join(KINDS)}")
    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows, static_everywhere

    engine = mix_engine("bert-large", int8_gemms=None)  # calibrated e4m3 (no int8 GEMM)
    all_static = static_everywhere(engine)
    batch = mix_windows(np.random.default_rng(3), args.windows)
    packed = device_packed(*batch)
    memo = StepMemo()

    def run(eng: Any) -> Callable[[Any], Any]:
        def one(x: Any) -> Any:
            memo.start_pass()
            return eng._run_device(*x)
        return one

    with torch.inference_mode(), memo_engine(engine, memo):
        memo.recording = True
        reference = run(engine)(packed)
        torch.cuda.synchronize()
        memo.recording = False
        counts = {k: len(v) for k, v in memo.outputs.items()}
        check = run(engine)(packed)  # through the memo, nothing skipped: the same pass
        same = bool(torch.equal(check, reference))
    result = mix_result(args, int(batch[1].sum()), steps_per_pass=counts,
                        memo_pass_equals_plain=same)
    print(f"steps recorded per pass: {counts}; memo pass equals plain: {same}", flush=True)
    plan: list[tuple[str, Any, frozenset[str]]] = [("baseline", engine, frozenset())]
    plan += [(f"without_{v}", engine, frozenset(v.split("+"))) for v in variants]
    plan += [("all_static", all_static, frozenset()), ("baseline_again", engine, frozenset())]
    skips = {name: skip for name, _, skip in plan}

    def ready(eng: Any, skip: frozenset[str]) -> Callable[[], Callable[[Any], Any]]:
        def go() -> Callable[[Any], Any]:
            memo.skip = skip
            return run(eng)
        return go

    def taken_from_memo(name: str) -> None:  # a graph replay would skip nothing
        if any(memo.taken(k) != counts[k] for k in skips[name]):
            raise RuntimeError(f"{name}: the pass did not take its steps from the memo")

    with torch.inference_mode(), memo_engine(engine, memo):
        result["rows"] = settled_rows([(name, ready(eng, skip)) for name, eng, skip in plan],
                                      packed, args.windows, args.settle_s, args.timed_s,
                                      taken_from_memo)
        memo.skip = frozenset()
    finish(args, result)


if __name__ == "__main__":
    main()
