"""The deferred GEMM's early weight slices compiled for sm_90a on this CPU machine (skipped
where the Triton wheel has no cuobjdump): through TMA descriptors (``deferred.EARLY_TMA``)
each chunk is one bulk tensor copy issued before the PDL wait, and the slice no longer
passes through the registers (fewer registers, no weight loads before the wait)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.sass_tools import GEMM_POINTERS, code_lines, gemm_sass, tools_or_skip


def _qkv(tma: bool) -> tuple[list[str], str]:
    """BERT-base's calibrated FP8 QKV launch with early weights (64x64x256, 3 chunks):
    its SASS lines and resource usage."""
    types = {p: "*fp8e4nv" if p in ("x_ptr", "w_ptr") else "*i32" if p == "cnt_ptr"
             else "*fp16" if p == "out_ptr" else "*fp32" for p in GEMM_POINTERS}
    constexprs: dict[str, object] = dict(
        BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, GROUP_M=8, FOLD_LN=True, GELU=False, TANH=False,
        HAS_BIAS=False, RESIDUAL=False, ATOMIC=False, STATS_OUT=False, ZERO=True,
        USE_PDL=True, PREFETCH=True, W_BYTES=1, LATE_RELEASE=False, SCALED=True, Q_OUT=False,
        COPY8=False, EARLY=True, NCH=3, TRACE=False, W_TMA=tma)
    if tma:
        types["w_desc"] = "tensordesc<fp8e4nv[64, 256]>"
    else:
        constexprs["w_desc"] = None
    sass, usage, _ = gemm_sass(types, constexprs, 4, 3)
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
