"""Instructions per key block of the packed attention kernel, read from its Hopper SASS
(no GPU needed: Triton compiles for sm_90a here and its wheel's cuobjdump disassembles).

    python3 benchmarks/attention_sass.py [--module engine/fused/kernels/attention.py] \\
        [--tiles 64x32x4,64x64x4,128x64x8] [--maxnreg 128] [--keep-sass DIR]

On the H200 the kernel is bound by instruction issue (v14: 60% of issue slots busy,
174 TFLOP/s of tensor work), so the instructions a warp executes per key block of its main
loop predict its time better than FLOPs do. For each tile (BLOCK_M x BLOCK_N x warps, 3
stages, 64-wide heads, fp16, the tile-list launch the engine uses on many sequences) this
prints the loop's length, its HGMMA and masking instructions, registers, spills and
shared memory per program, for the forms of the key loop: ``masked`` (every block's keys
masked) and ``split`` (full blocks unmasked, then one masked partial block), the latter
also under each ``--maxnreg`` register cap and with its partial block's loads issued
before the loop (``EARLY_TAIL``; the table counts the tile loads left after the loop).
``PYTHONPATH`` pointing at another unpacked Triton wheel compiles with that version (the
device runs 3.6). ``--module`` reads another copy of ``attention.py`` (a variant under
test) with the same kernel names and arguments (since v30 these include the timeline's
``trace_ptr`` and ``TRACE``: an older copy fails to compile). The pointer, stride and
width arguments are marked divisible by 16, as Triton's launcher specializes them in the
engine (without that the loads compile to scalar 16-bit loads and the counts mean
nothing).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODULE = REPO / "engine" / "fused" / "kernels" / "attention.py"
_SIGNATURE = {
    "qkv_ptr": "*fp16", "bias_ptr": "*fp16", "out_ptr": "*fp16", "cu_ptr": "*i32",
    "scale_ptr": "*fp16", "tiles_ptr": "*i32", "qk_scale": "fp32", "stride_qkv": "i32",
    "stride_out": "i32", "D": "i32", "HEAD_DIM": "constexpr", "BLOCK_DH": "constexpr",
    "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "USE_PDL": "constexpr",
    "PREFETCH": "constexpr", "FP8_OUT": "constexpr", "TILED": "constexpr",
    "SPLIT": "constexpr", "LATE_RELEASE": "constexpr", "EARLY_TAIL": "constexpr",
    "trace_ptr": "*i64", "TRACE": "constexpr", "OUT8_VEC": "constexpr",
}
_DIVISIBLE = ("qkv_ptr", "bias_ptr", "out_ptr", "cu_ptr", "scale_ptr", "tiles_ptr",
              "stride_qkv", "stride_out", "D")
_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA (0x[0-9a-f]+)")
_LOAD128 = re.compile(r"(@!?U?P\w+\s+)?LDG\.E\.128\b")


@dataclass(frozen=True)
class LoopStats:
    """The longest loop of a kernel's SASS: its instructions (one iteration, per warp) by
    opcode, and the kernel's registers per thread and shared memory per program."""

    instructions: int
    opcodes: Counter[str]
    registers: int
    shared_bytes: int
    spills: int = 0  # local-memory stores (STL) anywhere in the kernel
    # 128-bit global loads to registers after the loop (the split loop's partial last key
    # block, unless ``EARLY_TAIL`` requests it before the loop)
    loads_after: int = 0
    # waits for outstanding wgmmas in the loop (WARPGROUP.DEPBAR): one or two a loop where
    # the wgmmas of a product stay in flight together, one per HGMMA where ptxas serializes
    # them (its C7510-C7515 "Potential Performance Loss" notes, e.g. for want of registers)
    wgmma_waits: int = 0


def parse_tile(text: str) -> tuple[int, int, int]:
    """``64x32x4`` -> (BLOCK_M, BLOCK_N, warps)."""
    try:
        bm, bn, warps = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BMxBNxWARPS, got {text!r}") from None
    return bm, bn, warps


def _code(sass: str) -> list[tuple[int, str]]:
    return [(int(m.group(1), 16), m.group(2)) for m in map(_LINE.match, sass.splitlines()) if m]


def _loop_span(code: list[tuple[int, str]]) -> tuple[int, int] | None:
    """(first, last) address of the longest backward branch's body."""
    spans = [(int(b.group(1), 16), at) for at, text in code
             if (b := _BRANCH.search(text)) and int(b.group(1), 16) < at]
    return max(spans, key=lambda s: s[1] - s[0]) if spans else None


def longest_loop(sass: str) -> tuple[int, Counter[str]]:
    """Instructions of the longest backward branch's body in ``cuobjdump -sass`` output,
    and their opcodes (the mnemonic before the first '.', predicates dropped)."""
    code = _code(sass)
    span = _loop_span(code)
    if span is None:
        return 0, Counter()
    first, last = span
    body = [text for at, text in code if first <= at <= last]
    ops = Counter(opcode(t).split(".")[0] for t in body)
    return len(body), ops


def opcode(text: str) -> str:
    """An instruction's opcode with its modifiers (``HGMMA.64x64x16.F32``), predicate
    dropped."""
    return text.split()[1] if text.startswith("@") else text.split()[0]


def loop_wgmma_waits(sass: str) -> int:
    """``WARPGROUP.DEPBAR`` instructions (waits for outstanding wgmmas) in the longest
    loop's body."""
    code = _code(sass)
    span = _loop_span(code)
    return 0 if span is None else sum(
        1 for at, text in code
        if span[0] <= at <= span[1] and opcode(text).startswith("WARPGROUP.DEPBAR"))


def loads_after_loop(sass: str) -> int:
    """128-bit global loads into registers (``LDG.E.128``, predicated or not) after the
    longest loop's backward branch."""
    code = _code(sass)
    span = _loop_span(code)
    return 0 if span is None else sum(
        1 for at, text in code
        if at > span[1] and _LOAD128.match(text))


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("attention_under_test", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def cuda_tools() -> Path:
    """The folder of the CUDA binaries (``cuobjdump``, ``ptxas``) the Triton wheel ships."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def code_lines(sass: str) -> list[str]:
    """The instructions of ``cuobjdump -sass`` output, in order (each up to its ';')."""
    return [text for _, text in _code(sass)]


def compile_sass(fn: object, signature: Mapping[str, str], constexprs: Mapping[str, object],
                 divisible: tuple[str, ...], options: Mapping[str, object],
                 gluon: bool = False) -> tuple[str, str, int]:
    """(SASS, ``cuobjdump -res-usage``, shared bytes) of JIT function ``fn`` compiled for
    sm_90a on this machine, with the arguments named in ``divisible`` marked divisible by
    16 (as Triton's launcher specializes pointers and strides) and floating-point fusion
    on (as the launcher has it) unless ``options`` says otherwise. ``gluon``: ``fn`` is a
    Gluon kernel (``gluon.jit``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source: Any = ASTSource
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as source
    names = list(signature)
    src = source(fn, dict(signature),
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in divisible},
                    constexprs=dict(constexprs))
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"enable_fp_fusion": True, **options})
    tools = cuda_tools()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    return sass, usage, int(kernel.metadata.shared)


def compile_stats(module: ModuleType, bm: int, bn: int, warps: int,
                  keep: Path | None = None, split: bool = False,
                  maxnreg: int | None = None, early_tail: bool = False) -> LoopStats:
    options: dict[str, object] = {"num_warps": warps, "num_stages": 3}
    if maxnreg:
        options["maxnreg"] = maxnreg
    kernel = module._attn_varlen_kernel
    names = set(kernel.arg_names)  # (a module from before an argument was added lacks it)
    constexprs = {"HEAD_DIM": 64, "BLOCK_DH": 64, "BLOCK_M": bm, "BLOCK_N": bn,
                  "USE_PDL": False, "PREFETCH": False, "FP8_OUT": False, "TILED": True,
                  "SPLIT": split, "LATE_RELEASE": False, "EARLY_TAIL": early_tail,
                  "TRACE": False, "OUT8_VEC": 0}
    sass, usage, shared = compile_sass(
        kernel, {n: t for n, t in _SIGNATURE.items() if n in names},
        {n: v for n, v in constexprs.items() if n in names}, _DIVISIBLE, options)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        form = (("split" + ("-early-tail" if early_tail else "")
                 + (f"-maxnreg{maxnreg}" if maxnreg else "")) if split else "masked")
        (keep / f"attention-{bm}x{bn}x{warps}-{form}.sass").write_text(sass)
    count, ops = longest_loop(sass)
    regs = re.search(r"REG:(\d+)", usage)
    spills = sum(1 for m in map(_LINE.match, sass.splitlines())
                 if m and re.search(r"\bSTL\b", m.group(2)))
    return LoopStats(count, ops, int(regs.group(1)) if regs else -1, shared, spills,
                     loads_after_loop(sass), loop_wgmma_waits(sass))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module", type=Path, default=DEFAULT_MODULE)
    p.add_argument("--tiles", default="64x32x4,64x64x4,128x64x8")
    p.add_argument("--keep-sass", type=Path, default=None)
    p.add_argument("--maxnreg", default="128",
                   help="register caps to compile the split loop with too ('' for none)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    module = load_module(args.module)
    import triton

    print(f"{args.module}: sm_90a, 64-wide heads, fp16, 3 stages, tile-list launch, "
          f"triton {triton.__version__}")
    print("| tile | loop | registers cap | loop instructions per warp | per 32 keys | HGMMA "
          "| wgmma waits | FSEL (masks) | registers | spills (STL) | shared KB "
          "| tile loads after the loop |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    caps = [None] + [int(v) for v in filter(None, args.maxnreg.split(","))]
    for text in filter(None, args.tiles.split(",")):
        bm, bn, warps = parse_tile(text)
        forms = ([(False, None, False)] + [(True, cap, False) for cap in caps]
                 + [(True, None, True)])
        for split, cap, early in forms:
            s = compile_stats(module, bm, bn, warps, args.keep_sass, split, cap, early)
            form = ("split, early tail" if early else "split") if split else "masked"
            print(f"| {bm}x{bn}x{warps} | {form} | {cap or '-'} "
                  f"| {s.instructions} | {s.instructions * 32 / bn:.0f} "
                  f"| {s.opcodes['HGMMA']} | {s.wgmma_waits} | {s.opcodes['FSEL']} "
                  f"| {s.registers} "
                  f"| {s.spills} | {s.shared_bytes / 1024:.0f} | {s.loads_after} |", flush=True)


if __name__ == "__main__":
    main()
