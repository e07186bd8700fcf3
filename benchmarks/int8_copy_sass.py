"""The kernels that write the int8 GEMMs' input copies, read from their Hopper SASS (no GPU
needed: Triton compiles for sm_90a here and its wheel's cuobjdump disassembles).

    python3 benchmarks/int8_copy_sass.py [--maxnreg 0]

In the BERT-large mix the int8 engine path (``int8_gemms``) gained +0.5% where its GEMMs'
stand-ins gained +4%: the residual LayerNorm and attention, which write the int8 copies,
took ~1.8 ms a pass more than their e4m3 / 16-bit forms (``engine/fused/NOTES.md`` v51).
This prints, for each form of both kernels as the mix launches them, the registers a
thread, spills, shared memory, all instructions and, for the LayerNorm's loop over tiles
(``rows.ROW_LOOP``), the loop's instructions and its barriers and shared-memory traffic.
The LayerNorm loop is compiled under its launch's register cap
(``rows.loop_register_cap``; ``--maxnreg 0``: uncapped, to see what the kernel asks for)
and attention under the mix's 128 (``attention.register_cap``), its 8-bit forms storing
``attention.ATTN_OUT8_VECTOR`` bytes a thread at once as the engine launches them.
:func:`attention_memory_ops` counts attention's global loads and stores by opcode: the
8-bit forms left to the compiler's 16-byte store load Q and the K/V tiles in another
layout than the 16-bit form (NOTES v52).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

# (kernel, form, FP8_OUT mode, output pointer type) as the BERT-large mix runs them
FORMS = (("residual LayerNorm", "e4m3 copy", 3, "*fp8e4nv"),
         ("residual LayerNorm", "int8 copy", 4, "*i8"),
         ("attention", "16-bit output", 0, "*fp16"),
         ("attention", "e4m3 output", 1, "*fp8e4nv"),
         ("attention", "int8 output", 4, "*i8"))
_LN_POINTERS = ("a_ptr", "bias_ptr", "res_ptr", "g_ptr", "b_ptr", "out_ptr", "q_ptr",
                "qs_ptr", "qa_w_ptr", "qa_b_ptr", "logits_ptr", "mom_ptr", "sb_ptr",
                "sg_ptr", "sbeta_ptr")


@dataclass(frozen=True)
class CopyStats:
    """One compiled form: registers a thread, spill stores, shared bytes, instructions,
    and (0 where the kernel has no loop over tiles) the loop's instructions, barriers,
    shared-memory loads and stores."""

    registers: int
    spills: int
    shared_bytes: int
    instructions: int
    loop: int
    loop_bar: int
    loop_lds: int
    loop_sts: int


def _stats(sass: str, usage: str, shared: int, looped: bool) -> CopyStats:
    from benchmarks.attention_sass import code_lines, longest_loop

    lines = code_lines(sass)
    count, ops = longest_loop(sass) if looped else (0, {})
    regs = re.search(r"REG:(\d+)", usage)
    return CopyStats(int(regs.group(1)) if regs else 0, sum("STL" in t for t in lines),
                     shared, len(lines), count, ops.get("BAR", 0), ops.get("LDS", 0),
                     ops.get("STS", 0))


def layernorm_stats(mode: int, out_type: str, maxnreg: int | None) -> CopyStats:
    """``_residual_ln_kernel`` in ``ROW_LOOP``'s form (BERT-large: 1,024 columns) with the
    copy ``mode`` (``store_rows_fp8``), under ``maxnreg`` (None: uncapped)."""
    from benchmarks.attention_sass import compile_sass
    from engine.fused.kernels import rows

    assert rows.ROW_LOOP is not None
    _, tile_rows, warps = rows.ROW_LOOP
    sig: dict[str, Any] = {p: "*fp16" for p in _LN_POINTERS}
    sig.update(q_ptr=out_type, qs_ptr="*fp32", logits_ptr="*fp32", n_rows="i32",
               logits_stride="i32", split_stride="i32", D="i32", eps="fp32")
    constexprs = {"BLOCK_D": 1024, "ROWS": tile_rows, "SPLITS": 1, "FP8_OUT": mode,
                  "QA_HEAD": False, "USE_PDL": False, "LATE_RELEASE": False,
                  "SUM_RESIDUAL": False, "LOOP": True}
    sig.update(dict.fromkeys(constexprs, "constexpr"))
    options: dict[str, object] = {"num_warps": warps, "num_stages": 3}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return _stats(*compile_sass(rows._residual_ln_kernel, sig, constexprs,
                                (*_LN_POINTERS, "split_stride", "D"), options), looped=True)


def _attention_sass(mode: int, out_type: str, maxnreg: int,
                    vector: int | None) -> tuple[str, str, int]:
    from benchmarks.attention_sass import _DIVISIBLE, _SIGNATURE, compile_sass
    from engine.fused.kernels import attention

    sig = dict(_SIGNATURE, out_ptr=out_type, scale_ptr="*fp16" if mode == 0 else "*fp32")
    vec = attention.ATTN_OUT8_VECTOR if vector is None else vector
    constexprs = {"HEAD_DIM": 64, "BLOCK_DH": 64, "BLOCK_M": 64, "BLOCK_N": 64,
                  "USE_PDL": False, "PREFETCH": False, "FP8_OUT": mode, "TILED": True,
                  "SPLIT": True, "LATE_RELEASE": False, "EARLY_TAIL": False, "TRACE": False,
                  "OUT8_VEC": vec or 0}
    return compile_sass(attention._attn_varlen_kernel, sig, constexprs, _DIVISIBLE,
                        {"num_warps": 4, "num_stages": 3, "maxnreg": maxnreg})


def attention_stats(mode: int, out_type: str, maxnreg: int = 128,
                    vector: int | None = None) -> CopyStats:
    """``_attn_varlen_kernel`` as the mix runs it (64x64 tiles, 4 warps, the split loop
    and tile list, 64-wide heads, PDL off) with output ``mode`` (``FP8_OUT``), its 8-bit
    forms storing ``vector`` bytes a thread at once (None: ``ATTN_OUT8_VECTOR``; 0: the
    compiler's choice)."""
    return _stats(*_attention_sass(mode, out_type, maxnreg, vector), looped=False)


def attention_memory_ops(mode: int, out_type: str, maxnreg: int = 128,
                         vector: int | None = None) -> Counter[str]:
    """:func:`attention_stats`'s kernel's global loads, asynchronous copies and stores,
    counted by opcode (e.g. ``LDG.E.128``, ``LDGSTS.E.BYPASS.128``, ``STG.E.64``)."""
    from benchmarks.attention_sass import code_lines, opcode

    ops = map(opcode, code_lines(_attention_sass(mode, out_type, maxnreg, vector)[0]))
    return Counter(op for op in ops if op.startswith(("LDG", "STG")))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--maxnreg", type=int, default=None,
                   help="the LayerNorm loop's register cap (default: its launch's; 0: none)")
    args = p.parse_args(argv)
    import triton
    from rich.console import Console
    from rich.table import Table

    from engine.fused.kernels import rows

    assert rows.ROW_LOOP is not None
    per_sm, _, warps = rows.ROW_LOOP
    cap = rows.loop_register_cap(per_sm, warps) if args.maxnreg is None else args.maxnreg
    table = Table(title=f"int8 copies' kernels, sm_90a, triton {triton.__version__} "
                        f"(LayerNorm loop cap: {cap or 'none'})")
    for col in ("kernel", "form", "registers", "spills", "shared B", "instructions",
                "loop", "loop BAR / LDS / STS"):
        table.add_column(col)
    for kernel, form, mode, out_type in FORMS:
        s = (layernorm_stats(mode, out_type, cap or None) if kernel.startswith("residual")
             else attention_stats(mode, out_type))
        loop = f"{s.loop_bar} / {s.loop_lds} / {s.loop_sts}" if s.loop else "-"
        table.add_row(kernel, form, str(s.registers), str(s.spills), str(s.shared_bytes),
                      str(s.instructions), str(s.loop or "-"), loop)
    Console().print(table)


if __name__ == "__main__":
    main()
