"""``benchmarks/attention_sass.py``: its SASS loop reader on a hand-written listing, and
the engine's attention kernel compiled for sm_90a on this CPU (skipped where the Triton
wheel has no cuobjdump)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.attention_sass import (
    DEFAULT_MODULE,
    longest_loop,
    loop_wgmma_waits,
    parse_tile,
)
from tests.sass_tools import tools_or_skip

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x000 */
        /*0010*/                   HGMMA.64x32x16.F32 R56, R72, gdesc[UR16], RZ ;  /* 0x1 */
        /*0020*/              @!P0 LDG.E.U16 R60, desc[UR32][R56.64] ;    /* 0x2 */
        /*0030*/                   FSEL R3, R3, -INF , P1 ;               /* 0x3 */
        /*0040*/              @!P4 BRA 0x10 ;                             /* 0x4 */
        /*0050*/                   FADD R1, R2, R3 ;                      /* 0x5 */
        /*0060*/                   @P0 BRA 0x50 ;                         /* 0x6 */
        /*0070*/                   EXIT ;                                 /* 0x7 */
        /*0080*/                   BRA 0x80;                              /* 0x8 */
"""


def test_longest_loop_reads_the_longest_backward_branch() -> None:
    count, ops = longest_loop(LISTING)
    assert count == 4  # 0x10..0x40: HGMMA, LDG (predicated), FSEL, BRA; not 0x50..0x60
    assert ops == {"HGMMA": 1, "LDG": 1, "FSEL": 1, "BRA": 1}
    assert longest_loop("        /*0000*/    EXIT ;\n") == (0, {})


SERIALIZED = """
        /*0000*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;        /* 0x0 */
        /*0010*/                   WARPGROUP.ARRIVE ;                     /* 0x1 */
        /*0020*/                   HGMMA.64x64x16.F32 R24, R96, gdesc[UR16], RZ, gsb0 ; /* 0x2 */
        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;        /* 0x3 */
        /*0040*/                   HGMMA.64x64x16.F32 R24, R100, gdesc[UR16], R24, gsb0 ; /* 0x4 */
        /*0050*/              @P1  WARPGROUP.DEPBAR.LE gsb0, 0x0 ;        /* 0x5 */
        /*0060*/              @!P0 BRA 0x10 ;                             /* 0x6 */
        /*0070*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;        /* 0x7 */
"""


def test_loop_wgmma_waits_counts_the_loops_depbars() -> None:
    # 0x10..0x60: two waits (one predicated), not the ones before and after the loop
    assert loop_wgmma_waits(SERIALIZED) == 2
    assert loop_wgmma_waits(LISTING) == 0


def test_parse_tile() -> None:
    assert parse_tile("128x64x8") == (128, 64, 8)
    for bad in ("64x32", "64x32x4x3", "axbxc"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_tile(bad)


def test_engine_attention_loop_on_sm90() -> None:
    tools_or_skip()
    from benchmarks.attention_sass import compile_stats, load_module

    stats = compile_stats(load_module(DEFAULT_MODULE), 64, 32, 4)
    # QK^T over 64-wide heads is 4 HGMMA of k=16, P.V over 32 keys 2; the masked loop
    # selects scores (16 a thread at 64x32 with 128 threads, triton 3.9).
    assert stats.opcodes["HGMMA"] == 6
    assert stats.opcodes["FSEL"] > 0
    assert 100 < stats.instructions < 1000
    assert stats.registers > 0 and stats.shared_bytes > 0
    # The split loop's full blocks select nothing and take fewer instructions (-21% with
    # triton 3.9 at 64x32, -22% with 3.6).
    split = compile_stats(load_module(DEFAULT_MODULE), 64, 32, 4, split=True)
    assert split.opcodes["HGMMA"] == 6 and split.opcodes["FSEL"] == 0
    assert split.instructions < 0.9 * stats.instructions
    # At 64x64 it takes more than 128 registers (146), and the cap brings it down to 128.
    wide = compile_stats(load_module(DEFAULT_MODULE), 64, 64, 4, split=True)
    capped = compile_stats(load_module(DEFAULT_MODULE), 64, 64, 4, split=True, maxnreg=128)
    assert wide.registers > 128 >= capped.registers
    # The split loop loads its partial last key block after the loop (K and V, 128-bit
    # loads); with EARLY_TAIL before it, so no tile load is left after the loop.
    assert wide.loads_after > 0
    early = compile_stats(load_module(DEFAULT_MODULE), 64, 64, 4, split=True, early_tail=True)
    assert early.loads_after == 0 and early.opcodes["HGMMA"] == wide.opcodes["HGMMA"]
