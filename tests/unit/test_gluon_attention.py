"""``benchmarks/gluon_attention.py``: its Gluon attention kernels compile for sm_90a on this
CPU with the installed Triton (Gluon's names move between releases), and the tile form
keeps its wgmmas in flight (skipped where the Triton wheel has no cuobjdump or no Gluon).
Their outputs were checked on the GPU (``engine/fused/NOTES.md`` v40: bit for bit the
engine kernel's at 64-key blocks)."""

from __future__ import annotations

import re

import pytest

from benchmarks.attention_sass import longest_loop, loop_wgmma_waits
from tests.sass_tools import tools_or_skip


def _registers(usage: str) -> int:
    found = re.search(r"REG:(\d+)", usage)
    assert found, usage
    return int(found.group(1))


@pytest.mark.parametrize(("block_n", "maxnreg"), [(64, 0), (32, 0)])
def test_tile_form_compiles_with_its_wgmmas_in_flight(block_n: int, maxnreg: int) -> None:
    tools_or_skip()
    pytest.importorskip("triton.experimental.gluon")
    from benchmarks.gluon_attention import sm90_sass

    sass, usage, shared = sm90_sass("tiles", 3, 0, block_n, maxnreg)
    assert "HGMMA" in sass and "STL" not in sass
    assert _registers(usage) <= (maxnreg or 255)
    # Q, three K/V slots of block_n keys, four mbarriers
    assert shared >= (64 + 3 * 2 * block_n) * 64 * 2
    # QK^T and P V each issue 4 HGMMA (k = 16 over 64-wide heads) a key block at 64 keys;
    # the loop waits a few times, not once per HGMMA (ptxas's serialization)
    count, ops = longest_loop(sass)
    assert count > 0 and ops["HGMMA"] >= 8
    assert loop_wgmma_waits(sass) < ops["HGMMA"]


def test_sequence_form_compiles() -> None:
    tools_or_skip()
    pytest.importorskip("triton.experimental.gluon")
    from benchmarks.gluon_attention import sm90_sass

    sass, usage, shared = sm90_sass("seq")
    assert "HGMMA" in sass and "STL" not in sass
    assert shared >= 2 * 6 * 64 * 64 * 2  # K and V of six 64-key blocks
    assert 0 < _registers(usage) <= 255


def test_two_warpgroup_form_compiles_in_128_registers() -> None:
    """Two warp-specialized partitions (``setmaxnreg``) over one resident K/V, as launched
    (128 registers: two programs of 8 warps an SM), without spills."""
    tools_or_skip()
    pytest.importorskip("triton.experimental.gluon")
    from benchmarks.gluon_attention import sm90_sass

    sass, usage, shared = sm90_sass("seq2")
    assert sass.count("HGMMA") >= 16 and "STL" not in sass  # two partitions' QK^T and P V
    assert _registers(usage) <= 128
    assert shared <= 114 * 1024  # two programs an SM (228 KB)

