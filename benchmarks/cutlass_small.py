"""Batch-1 GEMMs with thread-block clusters: do CUTLASS kernels whose clusters share operand
tiles through TMA multicast beat the engine's Triton GEMM at 128 tokens?

    engine/fused/cuda/build.sh small-bench     # nvcc, no GPU needed
    python3 -m benchmarks.cutlass_small --lib build/cuda/libqa_small_gemm_bench.so --out small.json

``handoff.py`` put a PDL handoff at ~0.9 µs and a 768x768 GEMM chain with L2-resident
weights at ~3.1 µs a kernel: at 128 tokens each GEMM's programs pull its row blocks of
activations once per column tile and its weight tiles once per row tile, several times
the weight bytes (2.3-3.6 TB/s of L2-to-SM traffic over the whole step, ~5.7 TB/s net of
the handoff at 96 programs). ``weight_bytes.py`` found
one-byte weights slower, so halving the weight bytes is not the lever; cutting the re-reads
might be. A cluster of (cm, cn) CTAs loads each activation tile once for its cn column
tiles and each weight tile once for its cm row tiles (``benchmarks/cutlass/small_gemm.cu``).

Per shape of a BERT-base layer (``weight_bytes.SHAPES``, every GEMM unsplit here, also the
out-projection and FFN2 that the engine splits 4 ways), a chain of ``--steps`` GEMMs over
as many distinct weight copies (HBM-resident, as in a real pass), launched with PDL,
captured in one CUDA graph: every CUTLASS variant against ``weight_bytes``'s Triton kernel
(the engine's K loop and L2 weight prefetch) with the same tiles, interleaved rounds, µs
per GEMM. Every variant's output is checked against float32 math on the same operands.
Random data.

**In a pass** (:func:`install`, for ``ab_replay.py --setup``): the same 64x64x64 kernel, with
a bias + exact-GELU epilogue for FFN1 and float32 split-K partials (a batched GEMM over K
slices) for the out-projection and FFN2, takes the place of the Triton GEMMs of the
engine's *seven-kernel* small-batch layer (the layer with LayerNorm kernels, whose GEMMs
have plain epilogues; the default BERT-base layer folds its LayerNorms into the GEMMs and
is not covered). ``EARLY`` makes them let the next kernel launch as soon as their loads
start (as the Triton kernels do), not after their main loop (CUTLASS's own place).
``PASS_GEMMS`` names which calls go to CUTLASS (``plain``: QKV,
``gelu``: FFN1, ``partial``: out-projection and FFN2); ``ab_replay.py --set`` sets it per
variant while that variant's graph is captured:

    python3 benchmarks/ab_replay.py --model bert-large --shape 1x128 \
        --setup benchmarks.cutlass_small:install \
        --variant triton='{}' --variant ffn1='{}' \
        --set 'ffn1:benchmarks.cutlass_small.PASS_GEMMS=("gelu",)'
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LIB = REPO / "build" / "cuda" / "libqa_small_gemm_bench.so"


def _declare(lib: ctypes.CDLL) -> None:
    lib.qa_small_gemm_variants.restype = ctypes.c_int
    lib.qa_small_gemm_name.restype = ctypes.c_char_p
    lib.qa_small_gemm_name.argtypes = [ctypes.c_int]
    lib.qa_small_gemm.restype = ctypes.c_int
    lib.qa_small_gemm.argtypes = ([ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
                                  + [ctypes.c_void_p])
    lib.qa_small_gemm_pass.restype = ctypes.c_int
    lib.qa_small_gemm_pass.argtypes = ([ctypes.c_int] + [ctypes.c_void_p] * 4
                                       + [ctypes.c_int] * 5 + [ctypes.c_void_p])


def load(lib_path: Path) -> ctypes.CDLL:
    from engine.fused.native import load_library

    return load_library(lib_path, _declare, "benchmarks.cutlass_small",
                        "build it with engine/fused/cuda/build.sh small-bench")


PASS_GEMMS: tuple[str, ...] = ()  # see the module docstring; () = the engine's own kernels
EARLY = False  # swapped kernels let the next kernel launch as their loads start (EarlyTrigger)
LIB_CALLS = 0  # GEMMs routed to the library since install() (check_pass reports it)
_PASS_KINDS = {"plain": 0, "gelu": 1, "partial": 2}


def pass_kind(bias: Any, act: str | None, splits: int) -> str | None:
    """Which ``qa_small_gemm_pass`` kind a ``kernels.linear`` call is, or None where CUTLASS
    has no such kernel here (tanh GELU, bias without GELU)."""
    if splits > 1:
        return "partial" if bias is None and act is None else None
    if act is None:
        return "plain" if bias is None else None
    return "gelu" if act == "gelu" and bias is not None else None


def _current_stream() -> int:
    import torch

    return int(torch.cuda.current_stream().cuda_stream)


def install(lib_path: Path = DEFAULT_LIB, lib: Any = None,
            stream: Callable[[], int] = _current_stream) -> None:
    """Route ``engine.fused.kernels.linear`` calls of the kinds in :data:`PASS_GEMMS` to
    ``qa_small_gemm_pass`` where the operands are what its kernels take (fp16 activations
    and weights, a float32 bias, as the engine keeps them); every other call stays on
    Triton. A shape CUTLASS refuses raises (this is an experiment, not a fallback path).
    ``lib`` and ``stream`` replace the loaded library and the current CUDA stream (tests)."""
    import torch

    from engine.fused import kernels

    if lib is None:
        lib = load(lib_path)
    triton_linear = kernels.linear

    def linear(x: Any, w: Any, bias: Any = None, act: str | None = None, splits: int = 1,
               pdl: bool = False, **kw: Any) -> Any:
        # The engine's other launch keywords (tiles, prefetch, release placement) pass
        # through to Triton untouched, so new ones need no change here.
        kind = pass_kind(bias, act, splits)
        if (kind not in PASS_GEMMS or x.dtype != torch.float16 or w.dtype != torch.float16
                or (bias is not None and bias.dtype != torch.float32)):
            return triton_linear(x, w, bias, act=act, splits=splits, pdl=pdl, **kw)
        m, k = x.shape
        n = w.shape[0]
        out = (torch.empty((splits, m, n), device=x.device, dtype=torch.float32)
               if kind == "partial" else torch.empty((m, n), device=x.device, dtype=x.dtype))
        global LIB_CALLS
        LIB_CALLS += 1
        rc = lib.qa_small_gemm_pass(_PASS_KINDS[kind] + 3 * EARLY, x.data_ptr(), w.data_ptr(),
                                    0 if bias is None else bias.data_ptr(), out.data_ptr(),
                                    m, n, k, splits, int(pdl), stream())
        if rc:
            raise RuntimeError(f"qa_small_gemm_pass {kind} returned {rc}")
        return out

    kernels.linear = linear


def check_pass(lib_path: Path = DEFAULT_LIB, m: int = 128, k: int = 768, n: int = 3072,
               splits: int = 4) -> dict[str, float]:
    """Max relative error of each ``qa_small_gemm_pass`` kind against float32 torch math
    (through :func:`install`'s routing, so the swap itself is what is checked). Call it
    on the imported module (``main`` does): the routing reads this module's globals."""
    global PASS_GEMMS, EARLY
    import torch

    from engine.fused import kernels

    install(lib_path)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = (torch.randn(m, k, device="cuda", generator=g) * 0.5).half()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.05).half()
    b = torch.randn(n, device="cuda", generator=g) * 0.5
    prod = x.float() @ w.float().t()
    ks = k // splits
    parts = torch.stack([x[:, i * ks:(i + 1) * ks].float() @ w[:, i * ks:(i + 1) * ks].float().t()
                         for i in range(splits)])
    refs = {"plain": prod, "gelu": torch.nn.functional.gelu(prod + b), "partial": parts}
    calls = {"plain": lambda: kernels.linear(x, w),
             "gelu": lambda: kernels.linear(x, w, b, act="gelu"),
             "partial": lambda: kernels.linear(x, w, splits=splits)}
    errors: dict[str, float] = {}
    calls_before = LIB_CALLS
    for early in (False, True):
        for kind, call in calls.items():
            PASS_GEMMS, EARLY = (kind,), early
            try:
                out = call().float()
            finally:
                PASS_GEMMS, EARLY = (), False
            ref = refs[kind]
            errors[kind + (" early" if early else "")] = float((out - ref).abs().max()
                                                               / ref.abs().max())
    errors["library_calls"] = LIB_CALLS - calls_before  # 6 when every kind went to CUTLASS
    return errors


def cutlass_chain(lib: ctypes.CDLL, variant: int, x: Any, ws: list[Any], out: Any,
                  pdl: bool = True) -> None:
    """One CUTLASS GEMM per weight copy on the current stream (raises on a nonzero code)."""
    import torch

    stream = torch.cuda.current_stream().cuda_stream
    m, k = x.shape
    for w in ws:
        rc = lib.qa_small_gemm(variant, x.data_ptr(), w.data_ptr(), out.data_ptr(), m,
                               w.shape[0], k, int(pdl), stream)
        if rc:
            raise RuntimeError(f"qa_small_gemm variant {variant} returned {rc}")


def measure(lib: ctypes.CDLL, tokens: int, steps: int, rounds: int, reps: int,
            shapes: list[str], variants: list[int]) -> dict[str, Any]:
    import torch

    from benchmarks.rounds import capture_graph, cuda_ms, interleaved
    from benchmarks.weight_bytes import SHAPES, chain, gemm

    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict[str, Any] = {}
    for name in shapes:
        k, n, _, _ = SHAPES[name]
        x = (torch.randn(tokens, k, device="cuda", generator=gen) * 0.5).half()
        ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.02).half()
              for _ in range(steps)]
        dst = torch.empty(tokens, n, device="cuda", dtype=torch.float16)
        ref = x.float() @ ws[0].float().t()
        ones = torch.ones(n, device="cuda")
        fns: dict[str, Any] = {}
        errors: dict[str, float] = {}
        for cfg in ((64, 64, 64, 4, 4), (64, 64, 128, 4, 3)):
            label = "triton " + "x".join(map(str, cfg[:3]))
            gemm(x, ws[0], ones, dst, 1, cfg, pdl=False)
            errors[label] = float((dst.float() - ref).abs().max() / ref.abs().max())
            fns[label] = functools.partial(chain, x, [(w, ones) for w in ws], dst, 1, cfg,
                                           False)
        for v in variants:
            label = "cutlass " + lib.qa_small_gemm_name(v).decode()
            cutlass_chain(lib, v, x, ws[:1], dst, pdl=False)
            torch.cuda.synchronize()
            errors[label] = float((dst.float() - ref).abs().max() / ref.abs().max())
            fns[label] = functools.partial(cutlass_chain, lib, v, x, ws, dst)
        graphs = {label: capture_graph(fn, 1) for label, fn in fns.items()}
        times = interleaved({label: g.replay for label, g in graphs.items()}, rounds, reps,
                            timer=cuda_ms)
        us = {label: statistics.median(t) * 1e3 / steps for label, t in times.items()}
        out[name] = {"k": k, "n": n, "us_per_gemm": us, "rounds_ms": times,
                     "max_rel_err": errors}
        print(f"{name} K={k} N={n}:", flush=True)
        for label, v_us in sorted(us.items(), key=lambda kv: kv[1]):
            print(f"  {label:32s} {v_us:6.2f} us  err {errors[label]:.1e}", flush=True)
        del graphs, fns, ws
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", type=Path, default=DEFAULT_LIB)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--shapes", default="qkv,out,ffn1,ffn2")
    p.add_argument("--variants", default="", help="CUTLASS variant numbers (default: all)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--check-pass", action="store_true",
                   help="only check the pass kernels (install()'s swap) against torch")
    p.add_argument("--commit", default="")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    import torch

    if a.check_pass:  # (through the imported module, not __main__'s copy: see check_pass)
        from benchmarks import cutlass_small

        print(json.dumps(cutlass_small.check_pass(a.lib)))
        return
    lib = load(a.lib)
    variants = ([int(v) for v in a.variants.split(",")] if a.variants
                else list(range(lib.qa_small_gemm_variants())))
    res = {"gpu": torch.cuda.get_device_name(), "commit": a.commit, "tokens": a.tokens,
           "steps": a.steps,
           "results": measure(lib, a.tokens, a.steps, a.rounds, a.reps, a.shapes.split(","),
                              variants)}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
