"""The deferred GEMM's early weight slices compiled for sm_90a on this CPU machine (skipped
where the Triton wheel has no cuobjdump): through TMA descriptors (``deferred.EARLY_TMA``)
each chunk is one bulk tensor copy issued before the PDL wait, and the slice no longer
passes through the registers (fewer registers, fewer loads before the wait)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from benchmarks.attention_sass import code_lines
from tests.sass_tools import qkv_fp8_sass, tools_or_skip


def _qkv(tma: bool) -> tuple[list[str], str]:
    """BERT-base's calibrated FP8 QKV launch with early weights: its SASS lines and
    resource usage, the slice loaded through the registers or (``tma``) a descriptor."""
    sass, usage, _ = (qkv_fp8_sass(W_TMA=True, w_desc="tensordesc<fp8e4nv[64, 256]>")
                      if tma else qkv_fp8_sass())
    return code_lines(sass), usage


def test_early_weights_through_tma_are_bulk_copies_before_the_wait() -> None:
    import re

    tools_or_skip()
    (loads, loads_usage), (tma, tma_usage) = _qkv(False), _qkv(True)

    def at(code: list[str], key: str) -> list[int]:
        return [i for i, line in enumerate(code) if key in line]

    assert not at(loads, "UTMALDG")
    copies, (wait,) = at(tma, "UTMALDG"), at(tma, "ACQBULK")
    assert len(copies) == 3 and max(copies) < wait  # one a chunk, all before the wait
    (loads_wait,) = at(loads, "ACQBULK")
    before = [i for i in at(tma, "LDG") if i < wait]
    assert len(before) < len([i for i in at(loads, "LDG") if i < loads_wait]) - 8

    def registers(usage: str) -> int:
        return int(re.search(r"REG:(\d+)", usage).group(1))  # type: ignore[union-attr]

    assert registers(tma_usage) < registers(loads_usage)
