"""Helpers of the GPU experiment tools that run without a GPU: ``cutlass_ffn1``'s output
comparison, ``gemm_workspace``'s per-configuration environments and ``fp8_accuracy``'s FP8
attention emulation."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest


def test_cutlass_ffn1_compares_e4m3_outputs() -> None:
    """``cutlass_ffn1.compare``: the share of differing elements and the largest difference
    (in units of the output scale) between two e4m3 outputs."""
    torch = pytest.importorskip("torch")
    from benchmarks.cutlass_ffn1 import compare

    ref = torch.tensor([[1.0, -2.0, 448.0, 0.0]] * 2).to(torch.float8_e4m3fn)
    assert compare(ref.clone(), ref) == {"differ": 0.0, "max_abs": 0.0}
    out = ref.clone()
    out[1, 2] = torch.tensor(416.0).to(torch.float8_e4m3fn)  # one e4m3 step below 448
    assert compare(out, ref) == {"differ": 1 / 8, "max_abs": 32.0}


def test_run_for_calls_in_order_for_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rounds.run_for``: ``fn(0)``, ``fn(1)``, ... until the time is up, the GPU synchronised
    every 4 calls and once at the end; the count returned."""
    torch = pytest.importorskip("torch")
    from benchmarks import rounds

    events: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    clock = iter(float(t) for t in range(100))  # each perf_counter read is a second later
    monkeypatch.setattr("time.perf_counter", lambda: next(clock))
    assert rounds.run_for(events.append, 9.5) == 9  # reads 1..9 are before the end at 9.5
    assert events == [0, 1, 2, 3, "sync", 4, 5, 6, 7, "sync", 8, "sync"]


def test_gemm_workspace_child_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each configuration's child gets its own settings and none of the others', even when
    the caller's shell has one set (the default must be the default)."""
    from benchmarks.gemm_workspace import CONFIGS, child_env

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setenv("LT_WORKSPACE_BYTES", "0")
    default = child_env("default")
    assert "CUBLAS_WORKSPACE_CONFIG" not in default and "LT_WORKSPACE_BYTES" not in default
    assert child_env("lt0")["LT_WORKSPACE_BYTES"] == "0"
    assert "CUBLAS_WORKSPACE_CONFIG" not in child_env("lt0")
    assert child_env("lt0_torch0")["CUBLAS_WORKSPACE_CONFIG"] == ":0:0"
    assert set(CONFIGS) == {"default", "lt0", "lt0_torch0"}


def _attention_spec(qkv, bias, cu, heads, q_round, k_round, v_round, p_round):  # type: ignore[no-untyped-def]
    """Attention written out per sequence with the given roundings of Q (bias and softmax
    scale in), K, V and P (row sums from the unrounded P; V bias added after)."""
    import math

    import torch

    n, d = qkv.shape[0], qkv.shape[1] // 3
    hd = d // heads
    x = qkv.float().view(n, 3, heads, hd)
    b = bias.float().view(3, heads, hd)
    q, k, v = q_round((x[:, 0] + b[0]) / math.sqrt(hd)), k_round(x[:, 1]), v_round(x[:, 2])
    out = torch.zeros(n, d)
    c = cu.tolist()
    for a, e in itertools.pairwise(c):
        qs, ks, vs = (t[a:e].transpose(0, 1) for t in (q, k, v))
        sc = qs @ ks.transpose(1, 2)
        p = torch.exp(sc - sc.amax(-1, keepdim=True))
        out[a:e] = ((p_round(p) @ vs) / p.sum(-1, keepdim=True)).transpose(0, 1).reshape(-1, d)
    return out + b[2].reshape(d)


def test_fp8_attention_emulation() -> None:
    """``fp8_accuracy.fp8_attention`` against attention written out with each rounding:
    none (then also the engine's spec, ``torch_ops.attention_varlen``), Q/K/V per tensor,
    P in e4m3, both, and Q/K per token and head with V per head; its e4m3 output equals
    the spec's with the same scale; the schemes map to their flags."""
    torch = pytest.importorskip("torch")
    from benchmarks.fp8_accuracy import _e4m3_tensor, attention_flags, fp8_attention
    from engine.fused import torch_ops
    from engine.fused.fp8 import FP8_DTYPE

    g = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 70, 71, 200], dtype=torch.int32)
    qkv = torch.randn(200, 3 * 128, generator=g)
    qkv = qkv * torch.tensor([0.1, 1.0, 4.0, 0.5]).repeat_interleave(32).repeat(3)
    bias = torch.randn(3 * 128, generator=g) * 0.1

    def keep(t):  # type: ignore[no-untyped-def]
        return t

    def tensor(t):  # type: ignore[no-untyped-def]
        return _e4m3_tensor(t)

    def p8(t):  # type: ignore[no-untyped-def]
        return t.to(FP8_DTYPE).float()

    def rows(t):  # type: ignore[no-untyped-def]
        return _e4m3_tensor(t, (2,))

    def heads(t):  # type: ignore[no-untyped-def]
        return _e4m3_tensor(t, (0, 2))

    exact = fp8_attention(qkv, bias, cu, 129, 3, 4, qkv8=False, p8=False)
    # (the spec adds the K bias that softmax cancels: float32 rounding apart)
    assert torch.allclose(exact, torch_ops.attention_varlen(qkv, bias, cu, 129, 3, 4),
                          atol=1e-4)
    cases = {
        (False, False, False): (keep, keep, keep, keep),
        (True, False, False): (tensor, tensor, tensor, keep),
        (False, True, False): (keep, keep, keep, p8),
        (True, True, False): (tensor, tensor, tensor, p8),
        (True, False, True): (rows, rows, heads, keep),
    }
    outs = {}
    for (qkv8, p_8, fine), rounds in cases.items():
        out = fp8_attention(qkv, bias, cu, 129, 3, 4, config=None, tiles=None, qkv8=qkv8,
                            p8=p_8, fine=fine)
        assert torch.allclose(out, _attention_spec(qkv, bias, cu, 4, *rounds), atol=1e-5)
        outs[(qkv8, p_8, fine)] = out
    assert len({o.sum().item() for o in outs.values()}) == len(outs)  # each rounding counts
    scale = torch.tensor([0.01])
    q8 = fp8_attention(qkv, bias, cu, 129, 3, 4, fp8_scale=scale, qkv8=False, p8=False)
    ref8 = torch_ops.attention_varlen(qkv, bias, cu, 129, 3, 4, fp8_scale=scale)
    assert q8.dtype == FP8_DTYPE and torch.equal(q8.view(torch.uint8), ref8.view(torch.uint8))
    assert attention_flags("calibrated_attn_fp8") == {"qkv8": True, "p8": True, "fine": False}
    assert attention_flags("calibrated_attn_fp8_qkv") == {"qkv8": True, "p8": False,
                                                         "fine": False}
    assert attention_flags("calibrated_attn_fp8_p") == {"qkv8": False, "p8": True,
                                                       "fine": False}
    assert attention_flags("calibrated_attn_fp8_fine")["fine"] is True
    assert attention_flags("calibrated_attn_rows") is None


def test_fp8_accuracy_regrids_the_deferred_layers() -> None:
    """``fp8_accuracy._regrid_deferred``: each layer's three e4m3 weights re-rounded on a
    coarser grid (another rounding of the same weights), the products' scales and the
    folded weights' row sums remade from them, the input multipliers kept; grid 1 keeps
    the engine's own weights."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from benchmarks.fp8_accuracy import _regrid
    from engine.fused.engine import FusedEngine

    model = Path(__file__).resolve().parents[2] / "models" / "minilm-l6-squad"
    eng = FusedEngine.from_pretrained(model, device="cpu", dtype="fp8", backend="torch")
    rng = np.random.default_rng(8)
    eng.calibrate(rng.integers(1000, 20000, (2, 48)).astype(np.int32),
                  np.ones((2, 48), np.int32), np.zeros((2, 48), np.int32))
    w = eng.weights
    assert w.folded8 is not None and w.folded is not None
    assert _regrid(w, 1.0).folded8 is w.folded8
    got = _regrid(w, 1.07).folded8
    assert got is not None
    for old, new, fold in zip(w.folded8, got, w.folded, strict=True):
        pairs = ((old.qkv, new.qkv, fold.qkv, old.qkv_inv),
                 (old.ffn_in, new.ffn_in, fold.ffn_in, old.ffn_in_inv))
        for o, n, f, inv in pairs:
            w_scale = n.scale * inv  # the product's scale over the input's (1 / inv)
            deq = n.w8.float() * w_scale
            assert not torch.equal(n.w8.float(), o.w8.float())
            assert torch.allclose(n.colsum, deq.sum(1), rtol=1e-5, atol=1e-4)
            assert (deq - f.weight.float()).abs().max() <= 0.07 * f.weight.float().abs().max()
        assert torch.equal(new.qkv_inv, old.qkv_inv)
        assert torch.equal(new.ffn_out_inv, old.ffn_out_inv)
        assert not torch.equal(new.ffn_out_w8.float(), old.ffn_out_w8.float())
