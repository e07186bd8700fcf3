"""QKV projection and attention as one kernel at small batches: does a layer with one
kernel fewer, at the same parallelism, beat the engine's two?

The kernel (``benchmarks/cutlass/qkv_attention.cu``, built by ``engine/fused/cuda/build.sh
qkv-attn`` into ``build/cuda/libqa_qkv_attention.so``) runs one cluster of 8 CTAs per head:
split-K partials of the head's Q|K|V columns, summed through distributed shared memory,
then attention of each CTA's 16 query rows. Up to 128 tokens, head size 64, hidden 768 or
1024 (BERT-base, BERT-large). With ``fold`` it takes the deferred layer's un-normalised
rows and row sums (``engine.fused.kernels.folded_linear``'s contract) and zeroes its
scratch, so it replaces that layer's QKV GEMM and attention; without, the seven-kernel
layer's plain QKV GEMM and attention.

    python3 benchmarks/qkv_attention.py --check --chain --out qkv_attention.json

``--check`` compares it with the engine's two kernels over token counts and packings;
``--chain`` times graphs of ``--layers`` dependent (PDL) layers, each with its own weights,
both ways, and reads per-phase clock stamps. :func:`install` swaps it into the engine's
passes for ``ab_replay.py --setup benchmarks.qkv_attention:install``, with ``--set
'NAME:benchmarks.qkv_attention.FUSE=("folded",)'`` (or ``"plain"``) choosing it per
variant.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LIB = REPO / "build" / "cuda" / "libqa_qkv_attention.so"
HEAD_DIM, CLUSTER, MAX_ROWS, STAMPS = 64, 8, 128, 9
PHASES = ("weights+wait", "activations", "partial GEMM", "cluster barrier 1", "reduce+epilogue",
          "cluster barrier 2", "gather K|V", "attention")
FUSE: tuple[str, ...] = ()  # which layer kinds install() fuses: "folded", "plain"
CALLS = 0  # fused launches made by install()'s wrappers


def _declare(lib: ctypes.CDLL) -> None:
    lib.qa_qkv_attention.restype = ctypes.c_int
    lib.qa_qkv_attention.argtypes = ([ctypes.c_void_p] * 8 + [ctypes.c_longlong, ctypes.c_void_p]
                                     + [ctypes.c_int] * 4 + [ctypes.c_float] * 2
                                     + [ctypes.c_int] * 2 + [ctypes.c_void_p])


def load(lib_path: Path = DEFAULT_LIB) -> ctypes.CDLL:
    from engine.fused.native import load_library

    return load_library(lib_path, _declare, "benchmarks/qkv_attention.py",
                        "build it with engine/fused/cuda/build.sh qkv-attn")


def supported(m: int, d: int, heads: int) -> bool:
    return 0 < m <= MAX_ROWS and d in (768, 1024) and heads * HEAD_DIM == d


def fused(lib: Any, x: Any, w: Any, bias: Any, cu: Any, n_seqs: int, heads: int,
          u: Any = None, stats: Any = None, eps: float = 1e-12, zero: Any = None,
          pdl: bool = False, timing: Any = None, out: Any = None) -> Any:
    """attention(x W^T + bias) [M, d] fp16 (with ``u``/``stats``: of LN(x), folded)."""
    import torch

    from engine.fused.kernels.attention import softmax_scale

    m, d = x.shape
    out = torch.empty((m, d), device=x.device, dtype=x.dtype) if out is None else out

    def ptr(t: Any) -> int:
        return 0 if t is None else int(t.data_ptr())

    rc = lib.qa_qkv_attention(
        ptr(x), ptr(w), ptr(u), ptr(stats), ptr(bias), ptr(cu), ptr(out), ptr(zero),
        0 if zero is None else zero.numel(), ptr(timing), m, d, heads, n_seqs, eps,
        softmax_scale(HEAD_DIM), int(u is not None), int(pdl),
        torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0)
    if rc:
        raise RuntimeError(f"qa_qkv_attention {m}x{d} returned {rc}")
    return out


def install(lib_path: Path = DEFAULT_LIB, lib: Any = None) -> None:
    """Route the engine's small-batch QKV GEMM + attention pairs of the kinds in
    :data:`FUSE` to the fused kernel. The GEMM's wrapper returns a placeholder and records
    its operands; the attention call that receives the placeholder runs the fused kernel.
    Shapes the kernel does not take stay on Triton. ``lib`` replaces the loaded library
    (tests)."""
    import torch

    from engine.fused import kernels

    lib = load(lib_path) if lib is None else lib
    pending: dict[int, tuple[Any, ...]] = {}
    tri_folded, tri_linear, tri_attn = (kernels.folded_linear, kernels.linear,
                                        kernels.attention_varlen)

    def placeholder(x: Any, args: tuple[Any, ...]) -> Any:
        out = torch.empty((x.shape[0], 3 * x.shape[1]), device=x.device, dtype=x.dtype)
        pending[out.data_ptr()] = args
        return out

    # The engine's other launch keywords (tiles, prefetch, release placement) pass through
    # to its kernels untouched, so new ones need no change here.
    def folded_linear(x: Any, w: Any, colsum: Any, bias: Any, stats: Any, eps: float,
                      act: str | None = None, zero: Any = None, pdl: bool = False,
                      **kw: Any) -> Any:
        if ("folded" in FUSE and act is None and bias is None and w.shape[0] == 3 * x.shape[1]
                and x.dtype == torch.float16 and supported(x.shape[0], x.shape[1], x.shape[1] // 64)):
            return placeholder(x, (x, w, colsum, stats, eps, zero, pdl))
        return tri_folded(x, w, colsum, bias, stats, eps, act=act, zero=zero, pdl=pdl, **kw)

    def linear(x: Any, w: Any, bias: Any = None, act: str | None = None, splits: int = 1,
               pdl: bool = False, **kw: Any) -> Any:
        if ("plain" in FUSE and bias is None and act is None and splits == 1
                and w.shape[0] == 3 * x.shape[1] and x.dtype == torch.float16
                and supported(x.shape[0], x.shape[1], x.shape[1] // 64)):
            return placeholder(x, (x, w, None, None, 0.0, None, pdl))
        return tri_linear(x, w, bias, act=act, splits=splits, pdl=pdl, **kw)

    def attention_varlen(qkv: Any, qkv_bias: Any, cu_seqlens: Any, max_seqlen: int,
                         n_seqs: int, num_heads: int, **kw: Any) -> Any:
        args = pending.pop(qkv.data_ptr(), None)
        if args is None:
            return tri_attn(qkv, qkv_bias, cu_seqlens, max_seqlen, n_seqs, num_heads, **kw)
        x, w, u, stats, eps, zero, pdl = args
        global CALLS
        CALLS += 1
        return fused(lib, x, w, qkv_bias, cu_seqlens, n_seqs, num_heads, u=u, stats=stats,
                     eps=eps, zero=zero, pdl=pdl)

    kernels.folded_linear, kernels.linear = folded_linear, linear
    kernels.attention_varlen = attention_varlen


def _inputs(m: int, d: int, lengths: list[int], seed: int = 0) -> dict[str, Any]:
    """Un-normalised rows with an offset (the fold's cancellation), their sums, a folded
    QKV weight, its row sums, a float32 bias and the packing."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn((m, d), device="cuda", generator=g) * 2 + 0.5).half()
    xf = x.float()
    stats = torch.stack([xf.sum(1), (xf * xf).sum(1)], 1).contiguous()
    w = (torch.randn((3 * d, d), device="cuda", generator=g) * d**-0.5).half()
    bias = torch.randn(3 * d, device="cuda", generator=g) * 0.1
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    return {"x": x, "stats": stats, "w": w, "u": w.float().sum(1).contiguous(),
            "bias": bias, "cu": cu, "n_seqs": len(lengths), "max_seqlen": max(lengths)}


def engine_pair(inp: dict[str, Any], heads: int, fold: bool, eps: float = 1e-12,
                zero: Any = None, pdl: bool = False) -> Any:
    """The engine's QKV GEMM (folded or plain) and attention on the same operands."""
    from engine.fused import kernels

    if fold:
        qkv = kernels.folded_linear(inp["x"], inp["w"], inp["u"], None, inp["stats"], eps,
                                    zero=zero, pdl=pdl, prefetch=pdl)
    else:
        qkv = kernels.linear(inp["x"], inp["w"], pdl=pdl, prefetch=pdl)
    return kernels.attention_varlen(qkv, inp["bias"], inp["cu"], inp["max_seqlen"],
                                    inp["n_seqs"], heads, pdl=pdl, prefetch=pdl)


def check(lib: Any) -> list[dict[str, Any]]:
    """Max |fused - engine| over rows inside sequences, per shape, packing and fold; also
    that the fold's scratch comes back zeroed."""
    import torch

    rows = []
    for d, heads in ((768, 12), (1024, 16)):
        for m in (1, 8, 37, 64, 100, 128):
            packings = {"one": [m]}
            if m >= 8:
                packings["three+pad"] = [m // 2, m - m // 2 - 3, 2]  # one row outside
            for name, lengths in packings.items():
                lengths = [n for n in lengths if n > 0]
                for fold in (True, False):
                    inp = _inputs(m, d, lengths)
                    zero = torch.ones(m * d + 77, device="cuda") if fold else None
                    ref = engine_pair(inp, heads, fold)
                    got = fused(lib, inp["x"], inp["w"], inp["bias"], inp["cu"],
                                inp["n_seqs"], heads, u=inp["u"] if fold else None,
                                stats=inp["stats"] if fold else None, zero=zero, pdl=True)
                    torch.cuda.synchronize()
                    used = int(inp["cu"][-1])
                    diff = (got[:used].float() - ref[:used].float()).abs().max().item()
                    rows.append({"d": d, "tokens": m, "packing": name, "fold": fold,
                                 "max_abs_diff": diff,
                                 "ref_max": ref[:used].float().abs().max().item(),
                                 "zeroed": None if zero is None else bool((zero == 0).all())})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def chain(lib: Any, d: int, heads: int, m: int, layers: int, rounds: int, reps: int
          ) -> dict[str, Any]:
    """µs per layer of ``layers`` dependent (PDL) QKV + attention steps in one graph, each
    layer with its own weights (more than L2 holds), fused vs the engine's kernels, folded
    and plain; and the fused kernel's per-phase clock stamps (one eager call)."""
    import torch

    from benchmarks import rounds as timing

    ws = [_inputs(m, d, [m], seed=s) for s in range(layers)]
    zero = torch.zeros(m * d + 4 * m + 64, device="cuda")
    variants: dict[str, Callable[[], object]] = {}
    for fold in (True, False):
        def run_engine(fold: bool = fold) -> None:
            for inp in ws:
                engine_pair(inp, heads, fold, zero=zero if fold else None, pdl=True)

        def run_fused(fold: bool = fold) -> None:
            for inp in ws:
                fused(lib, inp["x"], inp["w"], inp["bias"], inp["cu"], 1, heads,
                      u=inp["u"] if fold else None, stats=inp["stats"] if fold else None,
                      zero=zero if fold else None, pdl=True)

        tag = "folded" if fold else "plain"
        graphs = {f"engine_{tag}": timing.capture_graph(run_engine, 1),
                  f"fused_{tag}": timing.capture_graph(run_fused, 1)}
        for name, g in graphs.items():
            variants[name] = g.replay
    per_round = timing.interleaved(variants, rounds, reps)
    result: dict[str, Any] = {"d": d, "tokens": m, "layers": layers}
    for name, times in per_round.items():
        result[name + "_us_per_layer"] = round(statistics.median(times) * 1e3 / layers, 3)
    stamps = torch.zeros((heads, CLUSTER, STAMPS), device="cuda", dtype=torch.int64)
    inp = ws[0]
    for _ in range(3):  # warm, then the last call's stamps
        fused(lib, inp["x"], inp["w"], inp["bias"], inp["cu"], 1, heads, u=inp["u"],
              stats=inp["stats"], zero=zero, pdl=False, timing=stamps)
    torch.cuda.synchronize()
    deltas = (stamps[:, :, 1:] - stamps[:, :, :-1]).reshape(-1, STAMPS - 1).float()
    result["phase_cycles_median"] = dict(zip(PHASES, deltas.median(0).values.tolist(),
                                             strict=True))
    result["phase_cycles_max"] = dict(zip(PHASES, deltas.max(0).values.tolist(), strict=True))
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", type=Path, default=DEFAULT_LIB)
    p.add_argument("--check", action="store_true")
    p.add_argument("--chain", action="store_true")
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 64])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    lib = load(args.lib)
    report: dict[str, Any] = {}
    if args.check:
        report["check"] = check(lib)
    if args.chain:
        report["chain"] = []
        for d, heads in ((768, 12), (1024, 16)):
            for m in args.tokens:
                report["chain"].append(chain(lib, d, heads, m, args.layers, args.rounds,
                                             args.reps))
                print(json.dumps(report["chain"][-1]), flush=True)
                if args.out:
                    args.out.write_text(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
