"""Packed (variable-length) attention: our Triton kernel against the library kernels torch
ships, on the same inputs, in one run.

    python3 benchmarks/attn_backends.py --out attn.json [--shapes bert-large:mix256,...]

Competitors, all over the same packed QKV GEMM output and ``cu_seqlens``:

* ``triton``: ``kernels.attention_varlen`` (takes the bias-free QKV and the bias);
* ``triton_tiles``: the same over the batch's tile list (``kernels.attention_tiles``, built
  once as the engine does per pass), the engine's default where the list saves programs;
* ``flash``: ``aten._flash_attention_forward`` with cumulative lengths (FlashAttention 2);
* ``cudnn``: ``aten._cudnn_attention_forward`` with cumulative lengths (ragged layout);
* ``efficient``: ``aten._efficient_attention_forward`` (xFormers' CUTLASS kernel);
* ``cudnn_fe``: cuDNN's fused SDPA through the cuDNN frontend's Python graph API
  (``nvidia-cudnn-frontend``, carried as a wheel to the device), built once per shape over
  the packed QKV output (t3hd layout, ragged offsets from ``cu_seqlens``).

The library kernels get Q, K, V as strided views of the QKV output with the bias already
added (in the engine a GEMM epilogue would add it). Each competitor is timed by replaying a
CUDA graph of ``--layers`` calls (one per layer, as in a pass), so host launch cost is
excluded; a competitor that cannot be captured is timed eagerly and says so. Outputs are
compared with the Triton kernel's. Shapes: ``MODEL:BxS`` (full-length windows) or
``MODEL:mixN`` (N windows with lengths drawn from the SQuAD dev windows). Random inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("triton", "triton_tiles", "flash", "cudnn", "efficient", "cudnn_fe")


def parse_shape(item: str) -> tuple[str, int, int | None]:
    """``bert-large:1x384`` -> (model, 1, 384); ``bert-large:mix256`` -> (model, 256, None)."""
    name, spec = item.split(":")
    if spec.startswith("mix"):
        return name, int(spec[3:]), None
    b, s = spec.split("x")
    return name, int(b), int(s)


def attention_flops(lengths: list[int], hidden: int) -> float:
    """FLOPs of QK^T and PV over packed sequences: 4 * s^2 * hidden per sequence."""
    return float(sum(4 * s * s * hidden for s in lengths))


def _library_call(backend: str, qkv_b: Any, cu: Any, max_len: int, heads: int,
                  scale: float) -> Callable[[], Any]:
    import torch

    t, three_d = qkv_b.shape
    d = three_d // 3
    v3 = qkv_b.view(t, 3, heads, d // heads)
    q, k, v = v3[:, 0], v3[:, 1], v3[:, 2]
    aten = torch.ops.aten
    if backend == "flash":
        return lambda: aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0,
                                                     False, False, scale=scale)[0]
    if backend == "cudnn":
        return lambda: aten._cudnn_attention_forward(q, k, v, None, cu, cu, max_len, max_len,
                                                     False, 0.0, False, False, scale=scale)[0]
    if backend == "efficient":
        return lambda: aten._efficient_attention_forward(
            q[None], k[None], v[None], None, cu, cu, max_len, max_len, 0.0, 0, False,
            scale=scale)[0][0]
    if backend == "cudnn_fe":
        return _cudnn_fe_call(qkv_b, cu, max_len, heads, scale)
    raise ValueError(backend)


def _cudnn_fe_call(qkv_b: Any, cu: Any, max_len: int, heads: int,
                   scale: float) -> Callable[[], Any]:
    """cuDNN SDPA over the packed QKV output: one graph for ``len(cu) - 1`` sequences of at
    most ``max_len`` tokens, sequence lengths and ragged offsets as device tensors."""
    import cudnn  # nvidia-cudnn-frontend
    import torch

    t, three_d = qkv_b.shape
    d = three_d // 3
    hd = d // heads
    b = cu.numel() - 1
    seq = (cu[1:] - cu[:-1]).to(torch.int32).view(b, 1, 1, 1).contiguous()
    starts = cu.to(torch.int64).view(b + 1, 1, 1, 1)
    off_qkv, off_o = (starts * three_d).contiguous(), (starts * d).contiguous()
    dims = [b, heads, max_len, hd]
    s_qkv = [max_len * three_d, hd, three_d, 1]
    s_o = [max_len * d, hd, d, 1]
    # The graph's tensors carry the (padded) shape; the pack only their start addresses,
    # which ragged offsets move to each sequence's first token.
    q, k, v = qkv_b, qkv_b[:, d:], qkv_b[:, 2 * d:]
    out = torch.empty((t, d), device=qkv_b.device, dtype=qkv_b.dtype)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF,
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    tq, tk, tv = (g.tensor(name=n, dim=dims, stride=s_qkv, data_type=cudnn.data_type.HALF)
                  for n in "qkv")
    tseq = g.tensor_like(seq)
    toff, tooff = g.tensor_like(off_qkv), g.tensor_like(off_o)
    for x in (tq, tk, tv):
        x.set_ragged_offset(toff)
    to, _ = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, generate_stats=False, attn_scale=scale,
                   use_padding_mask=True, seq_len_q=tseq, seq_len_kv=tseq)
    to.set_output(True).set_dim(dims).set_stride(s_o).set_ragged_offset(tooff)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = torch.empty(max(1, g.get_workspace_size()), device=qkv_b.device, dtype=torch.uint8)
    pack = {tq: q, tk: k, tv: v, tseq: seq, toff: off_qkv, tooff: off_o, to: out}

    def call() -> Any:
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        g.execute(pack, ws, handle=handle)
        return out
    return call


def _time_graph(fn: Callable[[], Any], layers: int, replays: int) -> tuple[float, bool]:
    """Median µs per call of ``fn`` replayed as a graph of ``layers`` calls (or eagerly)."""
    import torch

    from benchmarks.rounds import capture_graph, idle_ms

    try:
        run, graphed = capture_graph(fn, layers).replay, True
    except Exception:
        torch.cuda.synchronize()

        def run() -> None:
            for _ in range(layers):
                fn()
        graphed = False
    for _ in range(3):
        run()
    return idle_ms(run, replays) * 1e3 / layers, graphed


def packed_qkv(lengths: list[int], hidden: int) -> tuple[Any, Any, Any]:
    """Random attention inputs on the GPU for sequences of ``lengths``: ``cu_seqlens``
    (int32), a packed fp16 QKV GEMM output [tokens, 3 * hidden] and its bias."""
    import numpy as np
    import torch

    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32,
                      device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn((sum(lengths), 3 * hidden), generator=g, device="cuda",
                      dtype=torch.float16)
    bias = torch.randn((3 * hidden,), generator=g, device="cuda", dtype=torch.float16) * 0.1
    return cu, qkv, bias


def run_shape(name: str, batch: int, seq: int | None, layers: int, replays: int,
              tiles: tuple[tuple[int, int, int, int], ...] = (),
              backends: tuple[str, ...] = BACKENDS,
              split_caps: tuple[int, ...] = ()) -> dict[str, Any]:
    import numpy as np

    from benchmarks.bench_gpu import MODELS, squad_lengths
    from engine.fused.kernels import attention_tiles, attention_varlen

    cfg = MODELS[name]
    d, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    rng = np.random.default_rng(3)
    lengths = ([int(v) for v in rng.choice(squad_lengths(), batch)] if seq is None
               else [seq] * batch)
    t, max_len = sum(lengths), max(lengths)
    cu, qkv, bias = packed_qkv(lengths, d)
    qkv_b = qkv + bias
    scale = (d // heads) ** -0.5
    label = f"{name} {'mix' if seq is None else 'x'.join(map(str, (batch, seq)))}"
    row: dict[str, Any] = {"shape": label, "tokens": t, "windows": batch,
                           "gflop_per_call": attention_flops(lengths, d) / 1e9}
    ref = attention_varlen(qkv, bias, cu, max_len, batch, heads)
    for backend in backends:
        try:
            if backend in ("triton", "triton_tiles"):
                tl_ = (attention_tiles(cu, t, batch, max_len, heads, d // heads)
                       if backend == "triton_tiles" else None)

                def fn(tl_: Any = tl_) -> Any:
                    return attention_varlen(qkv, bias, cu, max_len, batch, heads, tiles=tl_)
            else:
                fn = _library_call(backend, qkv_b, cu, max_len, heads, scale)
            out = fn().reshape(t, d)
            err = float((out.float() - ref.float()).abs().max())
            us, graphed = _time_graph(fn, layers, replays)
            row[backend] = {"us": us, "tflops": row["gflop_per_call"] / us * 1e3,
                            "max_abs_vs_triton": err, "graphed": graphed}
        except Exception as exc:
            row[backend] = {"error": repr(exc)[:300]}
        print(f"{label} {backend}: {row[backend]}", flush=True)
    for cfg in tiles:  # the Triton kernel with imposed tiles
        key = "triton " + "x".join(map(str, cfg))
        try:
            def tiled(cfg: tuple[int, int, int, int] = cfg) -> Any:
                return attention_varlen(qkv, bias, cu, max_len, batch, heads, config=cfg)
            err = float((tiled().float() - ref.float()).abs().max())
            us, _ = _time_graph(tiled, layers, replays)
            row.setdefault("tiles", {})[key] = {"us": us, "max_abs_vs_triton": err}
        except Exception as exc:
            row.setdefault("tiles", {})[key] = {"error": repr(exc)[:300]}
        print(f"{label} {key}: {row['tiles'][key]}", flush=True)
    if split_caps:
        row["split"] = split_forms(qkv, bias, cu, t, max_len, batch, heads, layers, replays,
                                   tiles, split_caps, label)
    return row


def split_forms(qkv: Any, bias: Any, cu: Any, t: int, max_len: int, batch: int, heads: int,
                layers: int, replays: int, tiles: tuple[tuple[int, int, int, int], ...],
                caps: tuple[int, ...], label: str) -> dict[str, Any]:
    """The key loop's two forms over the batch's tile list (forced), at the default tiles
    and each of ``tiles``: masked, then split under each register cap of ``caps`` (0: the
    compiler's choice). A cap the engine would not apply to this launch
    (``attention.register_cap``: too few programs) is recorded as such, not timed. Each
    split output must equal its masked one bit for bit."""
    import torch

    from engine.fused.kernels import attention as attn

    head_dim = qkv.shape[1] // 3 // heads
    out: dict[str, Any] = {}
    for cfg in (None, *tiles):
        c = cfg or attn.attention_config(max_len, batch, heads, head_dim, t)
        tl_ = attn.attention_tiles(cu, t, batch, max_len, heads, head_dim, config=c,
                                   force=True)
        assert tl_ is not None  # forced
        tile, programs = "x".join(map(str, c)), tl_.slots.shape[0] * heads

        def fn(split: bool, c: tuple[int, int, int, int] = c, tl_: Any = tl_) -> Any:
            return attn.attention_varlen(qkv, bias, cu, max_len, batch, heads, config=c,
                                         tiles=tl_, split=split)

        saved = attn.ATTN_MAXNREG
        try:
            masked = fn(False)
            us, _ = _time_graph(lambda: fn(False), layers, replays)
            out[f"{tile} masked"] = {"us": us}
            for cap in caps:
                key = f"{tile} split" + (f" maxnreg {cap}" if cap else "")
                attn.ATTN_MAXNREG = cap or None  # read at launch, fixed into the graph
                if cap and attn.register_cap(programs, c[2]) is None:
                    out[key] = {"not_applied": f"{programs} programs"}
                    continue
                try:
                    same = bool(torch.equal(fn(True), masked))
                    us, _ = _time_graph(lambda: fn(True), layers, replays)
                    out[key] = {"us": us, "equal_to_masked": same}
                except Exception as exc:
                    out[key] = {"error": repr(exc)[:300]}
                print(f"{label} {key}: {out[key]}", flush=True)
        finally:
            attn.ATTN_MAXNREG = saved
    return out


def gemm_bias(name: str, windows: int, replays: int) -> dict[str, Any]:
    """What a library attention costs upstream: the QKV GEMM adding the bias itself.

    Per SQuAD-mix batch of ``windows``, µs of the QKV GEMM without and with a bias in the
    GEMM's epilogue, for fp16 (``mm`` vs cuBLASLt ``addmm``) and row-scaled FP8
    (``_scaled_mm`` with and without ``bias=``)."""
    import numpy as np
    import torch

    from benchmarks.bench_gpu import MODELS, squad_lengths
    from engine.fused.fp8 import quantize_rows

    d = MODELS[name]["hidden_size"]
    t = int(np.random.default_rng(3).choice(squad_lengths(), windows).sum())
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn((t, d), generator=g, device="cuda", dtype=torch.float16)
    w = torch.randn((3 * d, d), generator=g, device="cuda", dtype=torch.float16) * 0.03
    b = torch.randn((3 * d,), generator=g, device="cuda", dtype=torch.float16)
    xq, wq = quantize_rows(x), quantize_rows(w)
    sw = wq.scale.t().contiguous()
    calls = {
        "mm": lambda: torch.mm(x, w.t()),
        "addmm_bias": lambda: torch.addmm(b, x, w.t()),
        "scaled_mm": lambda: torch._scaled_mm(xq.data, wq.data.t(), scale_a=xq.scale,
                                              scale_b=sw, out_dtype=torch.float16),
        "scaled_mm_bias": lambda: torch._scaled_mm(xq.data, wq.data.t(), scale_a=xq.scale,
                                                   scale_b=sw, bias=b,
                                                   out_dtype=torch.float16),
    }
    row: dict[str, Any] = {"shape": f"{name} mix{windows} QKV GEMM", "tokens": t}
    ref = calls["addmm_bias"]().float()
    for key, fn in calls.items():
        try:
            out = fn().float()
            err = float(((out if "bias" in key else out + b.float()) - ref).abs().max())
            us, graphed = _time_graph(fn, 24, replays)
            row[key] = {"us": us, "max_abs_vs_addmm": err, "graphed": graphed}
        except Exception as exc:
            row[key] = {"error": repr(exc)[:300]}
        print(f"{row['shape']} {key}: {row[key]}", flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| shape | tokens | " + " | ".join(f"{b}: µs (TFLOP/s)" for b in BACKENDS) + " |",
             "|---|---|" + "---|" * len(BACKENDS)]
    for r in rows:
        cells = []
        for b in BACKENDS:
            v = r.get(b, {})
            cells.append(f"{v['us']:.1f} ({v['tflops']:.0f})" + ("" if v["graphed"] else " eager")
                         if "us" in v else "n/a")
        lines.append(f"| {r['shape']} | {r['tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="bert-large:mix256,bert-large:1x384,bert-base:1x128,"
                                       "bert-base:mix256")
    p.add_argument("--layers", type=int, default=24, help="calls per captured graph")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--tiles", default="",
                   help="extra Triton tiles, 'BMxBNxWARPSxSTAGES,...' (e.g. 64x64x4x3)")
    p.add_argument("--split-caps", default="",
                   help="also time the split key loop over the tile list, under these "
                        "register caps ('0' for none; e.g. '0,128')")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--gemm", default="bert-large:mix256",
                   help="also time the QKV GEMM with its bias in the epilogue ('' skips)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    rows: list[dict[str, Any]] = []
    gemms: list[dict[str, Any]] = []

    def save() -> None:  # after every shape: a cut-short run keeps what it measured
        if args.out:
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                            "torch": torch.__version__,
                                            "cudnn": torch.backends.cudnn.version(),
                                            "rows": rows, "gemm_bias": gemms}, indent=1))

    caps = tuple(int(v) for v in filter(None, args.split_caps.split(",")))
    for item in filter(None, args.shapes.split(",")):
        tiles = [tuple(int(v) for v in c.split("x")) for c in filter(None, args.tiles.split(","))]
        rows.append(run_shape(*parse_shape(item), args.layers, args.replays,
                              tuple(tiles),  # type: ignore[arg-type]
                              tuple(filter(None, args.backends.split(","))), caps))
        save()
    for item in filter(None, args.gemm.split(",")):
        name, windows, _ = parse_shape(item)
        gemms.append(gemm_bias(name, windows, args.replays))
        save()
    print(table(rows))


if __name__ == "__main__":
    main()
