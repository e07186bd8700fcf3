"""``engine/fused/kernels/gluon_gemm.py``: the warp-specialized Gluon GEMM compiles for
sm_90a on this CPU with the installed Triton (skipped where the Triton wheel has no
cuobjdump or no Gluon), in its ping-pong and cooperative forms, on e4m3 and on int8
operands, with FFN1's epilogue and with a 16-bit one; the calibrated FFN1 takes it only
where ``fp8.FFN1_GLUON_MIN_ROWS`` and the operands allow; and ``int8.column_scales``. Its
outputs are checked on the GPU (``tests/gpu``: against cuBLASLt and float math)."""

from __future__ import annotations

import re

import pytest

from tests.sass_tools import tools_or_skip

SMEM_PER_BLOCK = 227 * 1024  # sm_90's largest dynamic shared memory a block


@pytest.mark.parametrize(("stages", "block_k", "sub_m", "block_n", "acc16"), [
    (4, 128, 32, 128, 1), (3, 128, 32, 128, 0), (3, 128, 16, 256, 1), (6, 64, 16, 256, 1)])
def test_kernel_compiles_for_hopper(stages: int, block_k: int, sub_m: int, block_n: int,
                                    acc16: int) -> None:
    """Each form fits one program an SM without spills: a loader that issues TMA loads,
    two MMA partitions of FP8 wgmmas (8 n128 instructions each a K-block of 128), tanh on
    the special-function unit in the epilogue, and ``setmaxnreg`` between partitions."""
    tools_or_skip()
    pytest.importorskip("triton.experimental.gluon")
    from benchmarks.gluon_ffn1 import sm90_sass

    sass, usage, shared = sm90_sass(stages, block_k, sub_m, 1, acc16, block_n)
    assert "STL" not in sass and "LDL" not in sass
    assert shared <= SMEM_PER_BLOCK
    # the ring's A and B blocks, and two accumulator buffers
    acc_rows = 128 if block_n == 128 else 64
    assert shared >= stages * (128 + block_n) * block_k + 2 * acc_rows * block_n * (2 if acc16
                                                                                 else 4)
    wgmmas = re.findall(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3", sass)
    assert len(wgmmas) == 2 * 2 * block_k // 32  # two partitions, two halves, k = 32 each
    assert "UTMALDG" in sass and "MUFU.TANH" in sass and "SETMAXREG" in sass
    assert int(re.search(r"REG:(\d+)", usage).group(1)) <= 128  # type: ignore[union-attr]
    # fp16 accumulators go over in the wgmma layout's swizzle: one stmatrix a thread stores
    # 16 bytes (8 accumulators): two partitions, each acc_rows x block_n over 128 threads
    stsm = len(re.findall(r"\bSTSM\.16", sass))
    assert stsm == (2 * acc_rows * block_n // 128 // 8 if acc16 else 0), stsm


def test_generic_handoff_stores_4_bytes() -> None:
    """``NVMMA_HANDOFF`` off: v41's generic swizzle, no stmatrix and 4x the 16-byte form's
    store instructions (4 bytes each)."""
    tools_or_skip()
    pytest.importorskip("triton.experimental.gluon")
    from benchmarks.gluon_ffn1 import sm90_sass

    generic = sm90_sass(3, 128, 32, 1, 1, 256, "int8", bias=True, col_scale=True,
                        nvmma_acc=False)[0]
    nvmma = sm90_sass(3, 128, 32, 1, 1, 256, "int8", bias=True, col_scale=True)[0]
    assert "STSM" not in generic
    assert len(re.findall(r"\bSTS(?!M)", generic)) >= 4 * len(re.findall(r"\bSTSM\.16", nvmma))


def test_split_handoff_stores_a_half_while_wgmmas_run() -> None:
    """``SPLIT_HANDOFF``: a cooperative warpgroup stores its first column half after a wait
    that leaves the second half's wgmmas in flight, and ptxas keeps the wgmmas pipelined (a
    wgmma wait a K-block, not one a wgmma: what it does when it serializes them)."""
    tools_or_skip()
    pytest.importorskip("triton.experimental.gluon")
    from benchmarks.attention_sass import code_lines
    from benchmarks.gluon_ffn1 import sm90_sass

    for split in (True, False):
        code = code_lines(sm90_sass(3, 128, 32, 1, 1, 256, "int8", col_scale=True,
                                    split=split)[0])
        waits = [i for i, text in enumerate(code) if "WARPGROUP.DEPBAR" in text]
        wgmmas = [i for i, text in enumerate(code) if "IGMMA" in text]
        assert len(waits) <= len(wgmmas) // 2
        stores = [i for i, text in enumerate(code) if "STSM" in text]
        drained = min(i for i in waits if code[i].rstrip().endswith("0x0"))
        # the first stmatrix of a partition comes before it drains its wgmmas (split) or
        # after (whole); split, after a wait that leaves one group (the second half's)
        assert (stores[0] < drained) == split
        if split:
            last_wgmma = max(i for i in wgmmas if i < stores[0])
            assert any(last_wgmma < i < stores[0] and code[i].rstrip().endswith("0x1")
                       for i in waits)


@pytest.mark.parametrize("split", [False, True])
def test_diagnostic_forms_keep_what_they_time(split: bool) -> None:
    """``gluon_gemm.DIAGNOSTIC`` 3 keeps the epilogue's reads, math and (predicated) stores;
    4 its math and stores without the handoff buffer's reads; 1 neither (the benchmarks'
    bounds), with the cooperative handoff whole and split. (That 1-3 write nothing is
    checked on the GPU.)"""
    tools_or_skip()
    pytest.importorskip("triton.experimental.gluon")
    from benchmarks.gluon_ffn1 import sm90_sass

    def counts(diag: int) -> tuple[int, int, int]:
        sass = sm90_sass(3, 128, 32, 1, 1, 256, "int8", col_scale=True, diag=diag,
                         split=split)[0]
        return (len(re.findall(r"\bSTG\.", sass)), len(re.findall(r"\bLDS\.128", sass)),
                len(re.findall(r"\bMUFU\.TANH", sass)))

    full = counts(0)
    assert full[0] > 0 and full[1] > 0 and full[2] > 0
    assert counts(3) == full
    no_read = counts(4)
    assert no_read[0] == full[0] and no_read[1] == 0 and no_read[2] == full[2]
    assert counts(1)[:2] == (0, 0)


@pytest.mark.parametrize(("block_n", "out", "n", "add"), [
    (128, "e4m3", 4096, ""), (256, "fp16", 3072, ""), (128, "fp16", 1024, "ldg"),
    (128, "fp16", 1024, "tma")])
def test_int8_kernel_compiles_for_hopper(block_n: int, out: str, n: int, add: str) -> None:
    """On int8 operands: int8 wgmmas (``IGMMA``, int32 accumulators, n128 as the e4m3
    form's), the accumulators converted to float32 before the handoff (on the fast
    ``I2FP`` path, not the quarter-rate ``I2F``), no spills; GELU only in FFN1's form; the
    out-projection adding the residual reads it in the epilogue: by 16-bit global loads,
    or (``ADD_BY_TMA``) by one more TMA load into a tile of shared memory that still fits
    a program (``tma_addend_fits`` says so too), with no more global loads than the plain
    form."""
    tools_or_skip()
    pytest.importorskip("triton.experimental.gluon")
    from benchmarks.gluon_ffn1 import sm90_sass

    stages, sub_m = (4, 32) if block_n == 128 else (3, 16)
    ffn1 = out == "e4m3"
    sass, usage, shared = sm90_sass(stages, 128, sub_m, int(ffn1), 1, block_n, "int8", out,
                                    bias=ffn1, col_scale=True, n=n, add=bool(add),
                                    add_tma=add == "tma")
    plain, _, plain_shared = sm90_sass(stages, 128, sub_m, int(ffn1), 1, block_n, "int8", out,
                                       bias=ffn1, col_scale=True, n=n) if add else (
                                           sass, usage, shared)
    loads = len(re.findall(r"\bLDG\.E", sass)) - len(re.findall(r"\bLDG\.E", plain))
    tma = len(re.findall(r"\bUTMALDG", sass)) - len(re.findall(r"\bUTMALDG", plain))
    assert (loads > 0) == (add == "ldg")
    assert tma == (add == "tma")
    assert "STL" not in sass and "LDL" not in sass
    assert shared <= SMEM_PER_BLOCK
    if add == "tma":
        from engine.fused.kernels.gluon_gemm import tma_addend_fits

        assert shared >= plain_shared + 128 * block_n * 2  # the addend's tile
        assert tma_addend_fits((stages, 128, sub_m, block_n), 1)
        assert not tma_addend_fits((3, 128, 16, 256), 1)  # FFN1's cooperative form
    assert len(re.findall(r"IGMMA\.64x128x32\.S8\.S8", sass)) == 2 * 2 * 128 // 32
    assert "QGMMA" not in sass
    # one conversion an accumulator element: ROWS x BLOCK_N over 128 threads, two partitions
    assert len(re.findall(r"I2FP\.F32\.S32", sass)) == 2 * 128 * 128 // 128
    assert ("MUFU.TANH" in sass) == ffn1
    assert int(re.search(r"REG:(\d+)", usage).group(1)) <= 128  # type: ignore[union-attr]


def test_column_scales() -> None:
    """Per-channel scales as the kernel takes them: the largest, and each over it (so the
    fp16 handoff holds values no larger than the largest channel's)."""
    torch = pytest.importorskip("torch")
    from engine.fused.int8 import column_scales

    s = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float16)
    top, col = column_scales(s)
    assert top.dtype == col.dtype == torch.float32 and top.shape == (1,)
    assert top.item() == 2.0 and col.tolist() == [0.25, 1.0, 0.5]
    assert torch.equal(top * col, s.float())


def test_calibrated_ffn1_keeps_cublaslt_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The routing: off by default, off below the row threshold, and never for CPU
    tensors (``supports``) even when asked."""
    torch = pytest.importorskip("torch")
    from engine.fused import fp8

    xq = torch.zeros((4096, 1024), dtype=fp8.FP8_DTYPE)
    w8 = torch.zeros((4096, 1024), dtype=fp8.FP8_DTYPE)
    assert fp8.FFN1_GLUON_MIN_ROWS is None
    assert fp8._gluon_ffn1(xq, w8) is None
    monkeypatch.setattr(fp8, "FFN1_GLUON_MIN_ROWS", 8192)
    assert fp8._gluon_ffn1(xq, w8) is None
    monkeypatch.setattr(fp8, "FFN1_GLUON_MIN_ROWS", 1)
    assert fp8._gluon_ffn1(xq, w8) is None  # CPU tensors


def test_variant_strings() -> None:
    from benchmarks.gluon_ffn1 import parse_variant

    assert parse_variant("4:128:32:1:1") == {"config": (4, 128, 32, 128), "gelu": 1, "acc16": 1}
    assert parse_variant("3:128:16:0:1:256")["config"] == (3, 128, 16, 256)
    with pytest.raises(ValueError, match="STAGES"):
        parse_variant("4:128")


def test_gemm_refuses_mismatched_operands() -> None:
    """``gemm`` checks its operands before any launch: the weight's K and type, the
    vectors' lengths, the output's shape (CPU tensors: the checks come first)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton.experimental.gluon")
    from engine.fused.kernels.gluon_gemm import gemm

    x = torch.zeros((256, 128), dtype=torch.int8)
    w = torch.zeros((128, 128), dtype=torch.int8)
    one = torch.ones(1)
    out = torch.empty((256, 128), dtype=torch.float16)
    cases = [((x, one, torch.zeros((128, 256), dtype=torch.int8), one, out), {}, "w8 must be"),
             ((x, one, w.view(torch.float8_e4m3fn), one, out), {}, "w8 must be"),
             ((x, one, w, one, out), {"bias": torch.zeros(64)}, r"bias must be \[128\]"),
             ((x, one, w, one, out), {"col_scale": torch.ones(3)}, "col_scale must be"),
             ((x, one, w, one, out[:100]), {}, "out must be"),
             ((x, one, w, one, out.to(torch.float8_e4m3fn)), {}, "out_scale")]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            gemm(*args, **kwargs)
