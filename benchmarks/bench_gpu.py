"""GPU benchmark of the fused BERT-QA engine against stock PyTorch, in one run.

    python benchmarks/bench_gpu.py --out DIR [--commit SHA] [--deadline-s 540]
    python benchmarks/bench_gpu.py --make-lengths       # CPU: SQuAD dev window lengths file

Sections, each guarded (a failure is recorded and the run goes on), results written to
``DIR/results.json`` and ``DIR/results.md`` after every section:

1. ceilings   measured bf16 GEMM rate and device-copy bandwidth (the floors' denominators)
2. parity     random BERT-base (fp16, bf16, fp8) vs HF fp32, random lengths
3. latency    BERT-base / BERT-large, RANDOM WEIGHTS, full-length batches 1/32/128 x 128/384:
              HF eager (SDPA), HF + CUDA graph, ours (graph at every shape, no graph,
              FP8 + graph); median and p99 of CUDA-event times, 4 rotating random
              input sets
4. mix        windows whose lengths are drawn from the tokenized SQuAD v1.1 dev set:
              ours packed (padding-free; at ~45k tokens the defaults run eagerly, and
              one column replays graphs) vs ours and HF padded to 384; windows/s,
              each variant timed after 3 s at load (the 700 W limit settled), with
              the median SM clock and power over its timing (nvidia-smi beside it)
5. stages     per-kernel time per forward pass (each stage graph-captured over all layers'
              weights) against its bytes/FLOPs floor
6. f1         SQuAD v1.1 dev EM/F1 of models/minilm-l6-squad: reference fp32 vs fused fp16/fp8
7. compile    torch.compile(mode="max-autotune") in a child process with a time cap
8. attn_sweep attention tiles per layer (output checked); the fastest on the mix, if >3%
              faster, is timed as a whole pass in ``mix`` (run before it)
9. ffn1_sweep FFN1 as cuBLAS + bias_gelu vs the fused Triton GEMM, and torch.mm vs
              cuBLASLt addmm for every GEMM, per layer
10. small     (only when named in --sections) the small-batch path: whole passes of its
              variants (persistent kernel, PDL off, large path); with ``small_sweep`` also
              named, first the tiles and K splits of each Triton GEMM in a PDL chain
              (``bench_small.py``)

``--fast`` times only hf_graph against ours (no eager columns, no padded mix columns);
``--shapes`` and ``--f1`` pick latency rows and F1 runs, for short device calls.

Timing: CUDA events around each call after warm-up, median and p99; every timed call
starts from fresh random data (never zeros) rotated over 4 input sets. The HF baselines
get ``attention_mask=None`` on full-length batches so SDPA can use its flash kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LENGTHS_FILE = REPO / "benchmarks" / "squad_dev_window_lengths.json"
CHECKPOINT = REPO / "models" / "minilm-l6-squad"
DEV_SET = REPO / "data" / "dev-v1.1.json.xz"
TRAIN_SET = REPO / "data" / "train-subset-v1.1.json.xz"

MODELS = {
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072),
    "bert-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                       intermediate_size=4096),
}
# Shapes that tools build by name (``make_hf``: ``ab_replay.py --model``, ``trace_pass.py``)
# but that no section of this benchmark runs: the shipped MiniLM-L6's, the service's model.
TOOL_MODELS = {
    "minilm-l6": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                      intermediate_size=1536),
}
SHAPES = [(1, 128), (1, 384), (32, 128), (32, 384), (128, 128), (128, 384)]
# --fast: fewer competitors per row (ours + hf_graph), for short device calls.
OPTS: dict[str, Any] = {"fast": False, "shapes": None}


# ----------------------------------------------------------------------------- lengths


def make_lengths() -> None:
    """Tokenize SQuAD v1.1 dev (question + context, 384/128 windows); store window lengths."""
    sys.path.insert(0, str(REPO))
    from service.windowing import QATokenizer, WindowSpec
    from training.features import encoded_groups
    from training.squad import load_examples

    spec = WindowSpec(max_seq_len=384, overlap=128)
    tok = QATokenizer.from_dir(CHECKPOINT)
    lengths: list[int] = []
    for _, win in encoded_groups(load_examples(DEV_SET), tok, spec, "windows"):
        lengths.extend(int(n) for n in win.lengths)
    LENGTHS_FILE.write_text(json.dumps({
        "source": "data/dev-v1.1.json.xz via service.windowing.QATokenizer(models/minilm-l6-squad)",
        "max_seq_len": 384, "overlap": 128, "windows": len(lengths),
        "mean": sum(lengths) / len(lengths), "lengths": lengths,
    }, separators=(",", ":")))
    print(f"{len(lengths)} windows, mean {sum(lengths) / len(lengths):.1f} -> {LENGTHS_FILE}")


# ----------------------------------------------------------------------------- timing


@dataclass
class Timing:
    median_ms: float
    p99_ms: float
    iters: int

    def as_dict(self) -> dict[str, float]:
        return {"median_ms": self.median_ms, "p99_ms": self.p99_ms, "iters": self.iters}


def time_calls(fn: Callable[[Any], Any], inputs: list[Any], target_s: float = 0.35,
               warmup: int = 5, min_iters: int = 15, max_iters: int = 300) -> Timing:
    """CUDA-event time of ``fn(inputs[i % k])``, one event pair per call, after warm-up."""
    import torch

    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(3):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - t0) / 3
    iters = int(min(max_iters, max(min_iters, target_s / max(per_call, 1e-6))))
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        start[i].record()
        fn(inputs[i % len(inputs)])
        end[i].record()
        end[i].synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(start, end, strict=True))
    p99 = times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)]
    return Timing(statistics.median(times), p99, iters)


def graph_time_ms(fn: Callable[[], Any], reps: int = 10) -> float:
    """Median ms of one ``fn()`` when ``reps`` calls are replayed from one CUDA graph."""
    import torch

    from benchmarks.rounds import capture_graph

    g = capture_graph(fn, reps, warm=1)
    g.replay()
    times = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / reps)
    del g
    return statistics.median(times)


# ----------------------------------------------------------------------------- models


def make_hf(name: str, seed: int = 0):  # type: ignore[no-untyped-def]
    """Random-weight HF BertForQuestionAnswering (fp16, SDPA) and its config, on the GPU."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(seed)
    cfg = BertConfig(**(MODELS | TOOL_MODELS)[name], attn_implementation="sdpa")
    with torch.device("cuda"):
        model = BertForQuestionAnswering(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)  # biases and LayerNorms off their 0/1 init
    return model.half(), cfg


def make_ours(model, cfg, **kw):  # type: ignore[no-untyped-def]
    from engine.fused.config import BertQAConfig
    from engine.fused.engine import FusedEngine

    return FusedEngine.from_state_dict(model.state_dict(), BertQAConfig.from_dict(cfg.to_dict()),
                                       device="cuda", **kw)


def static_everywhere(calibrated, **kw):  # type: ignore[no-untyped-def]
    """``calibrated``'s weights (with their static scales) and every GEMM's input static,
    all e4m3 (no int8 GEMM): the opt-in all-static FP8 path (the default leaves the
    attention output per token)."""
    from engine.fused.calibration import GEMMS
    from engine.fused.engine import FusedEngine

    return FusedEngine(calibrated.weights, "cuda", fp8_static_inputs=GEMMS,
                       **{"int8_gemms": None, **kw})


def calibrate_on_mix(engine, windows: int = 256, seed: int = 4) -> None:  # type: ignore[no-untyped-def]
    """Static FP8 scales for ``engine`` from ``windows`` random windows of SQuAD dev lengths
    (a seed of their own: not the windows a benchmark then times)."""
    import numpy as np

    engine.calibrate(*mix_windows(np.random.default_rng(seed), windows))


def mix_windows(rng, windows: int):  # type: ignore[no-untyped-def]
    """``windows`` random windows (ids, mask, token types, padded to 384) with lengths
    drawn from the SQuAD dev windows: a batch of the mix."""
    return random_padded(rng, windows, 384, rng.choice(squad_lengths(), windows))


def mix_engine(name: str, dtype: str = "fp8", **kw):  # type: ignore[no-untyped-def]
    """The engine a mix benchmark starts from: random-weight ``name`` in ``dtype``, and in
    FP8 calibrated on mix windows of its own (the engine's default FP8 path, or with
    ``kw``'s engine options, e.g. ``int8_gemms=None`` for the e4m3 GEMMs)."""
    model, cfg = make_hf(name)
    engine = make_ours(model, cfg, dtype=dtype, **kw)
    del model
    if dtype == "fp8":
        calibrate_on_mix(engine)
    return engine


def random_padded(rng, windows: int, seq: int, lengths=None):  # type: ignore[no-untyped-def]
    import numpy as np

    if lengths is None:
        lengths = np.full(windows, seq)
    ids = rng.integers(1000, 30000, (windows, seq)).astype(np.int32)
    mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    qlen = rng.integers(8, 40, (windows, 1))
    tt = ((np.arange(seq)[None, :] >= qlen) & (mask == 1)).astype(np.int32)
    return ids, mask, tt


def device_packed(ids, mask, tt):  # type: ignore[no-untyped-def]
    """Packed int32 CUDA tensors (ids, token types, positions, cu_seqlens, max_seqlen)."""
    import torch

    from engine.fused.packing import pack_padded

    p = pack_padded(ids, mask, tt)
    dev = [torch.from_numpy(a).cuda() for a in (p.input_ids, p.token_type_ids, p.position_ids,
                                                p.cu_seqlens)]
    return (*dev, p.max_seqlen)


@contextlib.contextmanager
def hf_capture_as_eager(enabled: bool) -> Iterator[None]:
    """Let transformers take its eager code path while a CUDA graph is captured.

    transformers treats stream capture like tracing (``is_tracing``) and then keeps code
    paths it would skip eagerly (on 2026-11-29 its captured SDPA graph ran 2-4x slower than
    eager at batch 32-128). With ``attention_mask=None`` the eager path has nothing
    data-dependent, so it is safe to capture as is; with a mask it is not (``mask.all()``).
    """
    import transformers.utils.import_utils as iu

    original = getattr(iu, "is_cuda_stream_capturing", None)
    if not enabled or original is None:
        yield
        return
    iu.is_cuda_stream_capturing = lambda: False
    try:
        yield
    finally:
        iu.is_cuda_stream_capturing = original


class HFRunner:
    """HF model on static CUDA tensors, eager or replayed from a CUDA graph."""

    def __init__(self, model, batch: int, seq: int, use_mask: bool, graph: bool) -> None:  # type: ignore[no-untyped-def]
        import torch

        self.model, self.use_mask = model, use_mask
        self.ids = torch.zeros((batch, seq), dtype=torch.long, device="cuda")
        self.mask = torch.ones_like(self.ids)
        self.tt = torch.zeros_like(self.ids)
        self.graph = None
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(2):
                    self._forward()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with hf_capture_as_eager(not use_mask), torch.cuda.graph(self.graph), \
                    torch.inference_mode():
                self.out = self._forward()

    def _forward(self):  # type: ignore[no-untyped-def]
        out = self.model(input_ids=self.ids, token_type_ids=self.tt,
                         attention_mask=self.mask if self.use_mask else None)
        return out.start_logits, out.end_logits

    def __call__(self, x):  # type: ignore[no-untyped-def]
        import torch

        ids, mask, tt = x
        with torch.inference_mode():
            self.ids.copy_(ids)
            self.mask.copy_(mask)
            self.tt.copy_(tt)
            if self.graph is None:
                return self._forward()
            self.graph.replay()
            return self.out


# ----------------------------------------------------------------------------- sections


def section_env(res: dict[str, Any], args: argparse.Namespace) -> None:
    import torch
    import transformers
    import triton

    p = torch.cuda.get_device_properties(0)
    res["env"] = {
        "date": time.strftime("%Y-%m-%d"), "commit": args.commit, "gpu": p.name,
        "sms": p.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
        "transformers": transformers.__version__, "cuda": torch.version.cuda,
    }
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = graph_time_ms(lambda: a @ b, reps=5)
    src = torch.randn(1 << 30, device="cuda", dtype=torch.float16)  # 2 GiB
    dst = torch.empty_like(src)
    cms = time_calls(lambda _x: dst.copy_(src), [None], target_s=0.1, min_iters=10).median_ms
    res["ceilings"] = {"bf16_tflops": 2 * 8192**3 / ms / 1e9,
                       "copy_tb_s": 2 * src.numel() * 2 / cms / 1e9}


def section_parity(res: dict[str, Any]) -> None:
    import numpy as np
    import torch

    model, cfg = make_hf("bert-base")
    ref_model = make_hf("bert-base")[0].float()  # same seed: the same weights, in fp32
    rng = np.random.default_rng(1)
    ids, mask, tt = random_padded(rng, 16, 384, rng.integers(20, 385, 16))
    with torch.inference_mode():
        ref = ref_model(input_ids=torch.from_numpy(ids).long().cuda(),
                        attention_mask=torch.from_numpy(mask).long().cuda(),
                        token_type_ids=torch.from_numpy(tt).long().cuda())
        hf16 = model(input_ids=torch.from_numpy(ids).long().cuda(),
                     attention_mask=torch.from_numpy(mask).long().cuda(),
                     token_type_ids=torch.from_numpy(tt).long().cuda())
    keep = mask.astype(bool)
    rs, re_ = ref.start_logits.float().cpu().numpy(), ref.end_logits.float().cpu().numpy()
    out = {}

    def err(s, e):  # type: ignore[no-untyped-def]
        a = max(np.abs(s[keep] - rs[keep]).max(), np.abs(e[keep] - re_[keep]).max())
        return {"max_abs": float(a),
                "max_rel": float(a / max(np.abs(rs[keep]).max(), np.abs(re_[keep]).max()))}

    out["hf_fp16_sdpa"] = err(hf16.start_logits.float().cpu().numpy(),
                              hf16.end_logits.float().cpu().numpy())
    for dtype in ("float16", "bfloat16", "fp8"):
        eng = make_ours(ref_model, cfg, dtype=dtype, fp8_min_tokens=0)  # FP8 at any size
        out[f"ours_{dtype}"] = err(*eng.infer(ids, mask, tt))
    res["parity_bert_base_random"] = out


LATENCY_ROUNDS = 3
# The mix: each variant runs at load this long before its timing, so the timing sees the
# clock the 700 W limit settles at, not a part fresh from idle at its top clock (v36: a
# fresh part's first variants ran at 1,920-1,980 MHz, settled ones at 1,600-1,700).
MIX_LOADED_S = 3.0
MIX_TIMED_S = 1.0


def section_latency(res: dict[str, Any], name: str, deadline: float) -> None:
    """Every variant timed in LATENCY_ROUNDS interleaved rounds; cells are the median of
    the rounds' medians (and of their p99s)."""
    import numpy as np
    import torch

    from engine.fused.torch_ops import stage_inputs as torch_stage

    model, cfg = make_hf(name)
    # Graphs at every shape, 128 x 384 too (the defaults run batches above
    # max_graph_tokens eagerly): the graph and replay columns time graphs.
    graphs = {"max_graph_tokens": 1 << 20}
    ours = make_ours(model, cfg, dtype="float16", **graphs)
    from engine.fused.engine import FusedEngine

    ours_eager = FusedEngine(ours.weights, "cuda", cuda_graphs=False)
    alt = {  # the same weights through other paths (A/B in one run)
        "ours_graph_large_path": {"small_batch_max_tokens": None},  # v3's batch-1 path
        "ours_graph_seven_kernels": {"deferred_ln_max_hidden": None},  # v5's small path
        "ours_graph_deferred_ln": {"deferred_ln_max_hidden": 4096},  # v6, every model
        "ours_graph_no_pdl": {"pdl": False},
        "ours_graph_attn_64x128": {"attention_tiles": (64, 128, 4, 2)},
        # v10's call: staging kernel + graph + logits copy (three launches)
        "ours_graph_three_launches": {"graph_staging": False},
    }
    alt_engines = {key: FusedEngine(ours.weights, "cuda", **{**graphs, **kw})  # type: ignore[arg-type]
                   for key, kw in alt.items()}
    ours_fp8 = make_ours(model, cfg, dtype="fp8", **graphs)
    # Static FP8 scales (every GEMM per-tensor, FFN1's epilogue writing FFN2's input),
    # calibrated on other random windows: FP8 from 129 tokens up.
    ours_cal = FusedEngine(ours_fp8.weights, "cuda", **graphs)
    ours_cal.calibrate(*random_padded(np.random.default_rng(7), 64, 384))
    ours_all = static_everywhere(ours_cal, **graphs)
    rows = res.setdefault("latency", [])
    rng = np.random.default_rng(2)
    shapes = [s for s in SHAPES if OPTS["shapes"] is None or f"{name}:{s[0]}x{s[1]}" in OPTS["shapes"]]
    for batch, seq in shapes:
        if time.time() > deadline:
            rows.append({"model": name, "batch": batch, "seq": seq, "skipped": "deadline"})
            continue
        sets = [random_padded(rng, batch, seq) for _ in range(4)]
        hf_in = [tuple(torch.from_numpy(a).long().cuda() for a in s) for s in sets]
        packed = [device_packed(*s) for s in sets]
        row: dict[str, Any] = {"model": name, "batch": batch, "seq": seq}
        variants: dict[str, tuple[Callable[[Any], Any], list[Any]]] = {}
        if not OPTS["fast"]:
            hf_eager = HFRunner(model, batch, seq, use_mask=False, graph=False)
            variants["hf_eager"] = (hf_eager, hf_in)
        hf_graph = HFRunner(model, batch, seq, use_mask=False, graph=True)
        variants["hf_graph"] = (hf_graph, hf_in)
        variants["ours_graph"] = (lambda x: ours._run_device(*x), packed)
        for key, eng in alt_engines.items():
            variants[key] = (lambda x, eng=eng: eng._run_device(*x), packed)
        if not OPTS["fast"]:
            variants["ours_eager"] = (lambda x: ours_eager._run_device(*x), packed)
        variants["ours_fp8_graph"] = (lambda x: ours_fp8._run_device(*x), packed)
        variants["ours_fp8_calibrated_graph"] = (lambda x: ours_cal._run_device(*x), packed)
        variants["ours_fp8_static_all_graph"] = (lambda x: ours_all._run_device(*x), packed)
        try:  # the graph alone on inputs already in its buffer (TensorRT-style GPU time)
            x = packed[0]
            for key, eng in (("ours_replay", ours),
                             ("ours_replay_seven_kernels", alt_engines["ours_graph_seven_kernels"]),
                             ("ours_replay_deferred_ln", alt_engines["ours_graph_deferred_ln"]),
                             ("ours_fp8_calibrated_replay", ours_cal),
                             ("ours_fp8_static_all_replay", ours_all)):
                with torch.inference_mode():
                    eng._run_device(*x)
                bucket = eng._graph_bucket(x[0].shape[0], x[3].shape[0] - 1, x[4])
                graphs = eng._graphs
                assert bucket is not None and graphs is not None
                variants[key] = (lambda _, g=graphs, bk=bucket: g.replay(bk), packed)
            assert ours._graphs is not None  # staging alone: one Triton launch vs 5 torch ops
            buf = ours._graphs.inputs(bucket)
            for key, stage in (("stage_triton", ours.ops.stage_inputs),
                               ("stage_torch_ops", torch_stage)):
                variants[key] = (lambda x, st=stage, b=buf, n=bucket.tokens: st(b, n, *x[:4]),
                                 packed)
        except Exception as exc:  # record and go on
            row["ours_replay"] = {"error": repr(exc)[:300]}
        rounds: dict[str, list[Timing]] = {}
        for _ in range(LATENCY_ROUNDS):  # interleaved: drift hits every variant alike
            for key, (fn, inputs) in variants.items():
                if isinstance(row.get(key), dict) and "error" in row[key]:
                    continue
                try:
                    with torch.inference_mode():
                        rounds.setdefault(key, []).append(
                            time_calls(fn, inputs, target_s=0.35 / LATENCY_ROUNDS))
                except Exception as exc:  # record and go on
                    row[key] = {"error": repr(exc)[:300]}
        for key, ts in rounds.items():
            if "error" not in row.get(key, {}):
                row[key] = {"median_ms": statistics.median(t.median_ms for t in ts),
                            "p99_ms": statistics.median(t.p99_ms for t in ts),
                            "round_medians_ms": [t.median_ms for t in ts],
                            "iters": sum(t.iters for t in ts)}
        if batch == 1:  # the numpy QAEngine.infer path, host packing and copies included
            t0 = time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < 0.3:
                ours.infer(*sets[n % 4])
                n += 1
            row["ours_infer_numpy_ms"] = (time.perf_counter() - t0) / n * 1e3
        rows.append(row)
        print(f"latency {name} {batch}x{seq}: " + " ".join(
            f"{k}={v['median_ms']:.3f}" for k, v in row.items()
            if isinstance(v, dict) and "median_ms" in v), flush=True)


@functools.cache
def squad_lengths():  # type: ignore[no-untyped-def]
    """The SQuAD v1.1 dev windows' token counts (read once; callers must not modify it)."""
    import numpy as np

    data = json.loads(LENGTHS_FILE.read_text())
    return np.asarray(data["lengths"], dtype=np.int64)


def section_mix(res: dict[str, Any], name: str, windows: int) -> None:
    import numpy as np
    import torch

    model, cfg = make_hf(name)
    ours = make_ours(model, cfg, dtype="float16")
    ours_fp8 = make_ours(model, cfg, dtype="fp8")
    rng = np.random.default_rng(3)
    sets = [mix_windows(rng, windows) for _ in range(4)]
    tokens = float(np.mean([s[1].sum() for s in sets]))
    packed = [device_packed(*s) for s in sets]
    full = [random_padded(rng, windows, 384) for _ in range(4)]  # padded to 384 = all real
    packed_full = [device_packed(*s) for s in full]
    hf_in = [tuple(torch.from_numpy(a).long().cuda() for a in s) for s in sets]
    row: dict[str, Any] = {"model": name, "windows": windows, "mean_tokens_per_window":
                           tokens / windows}
    from engine.fused.engine import FusedEngine

    no_pdl = {key: FusedEngine(eng.weights, "cuda", pdl=False)
              for key, eng in (("ours_packed_no_pdl", ours), ("ours_fp8_packed_no_pdl", ours_fp8))}
    # Static FP8 scales (engine.fused.fp8, "Calibrated"), calibrated on other random windows:
    # the default, whose out-projection and FFN1 run in int8 from INT8_AUTO_MIN_TOKENS
    ours_cal = FusedEngine(ours_fp8.weights, "cuda")
    calibrate_on_mix(ours_cal)
    ours_all = static_everywhere(ours_cal)
    # The engine's defaults run these batches (~45k tokens) eagerly, above
    # max_graph_tokens; this one replays a graph of each batch's bucket instead.
    cal_graph = FusedEngine(ours_cal.weights, "cuda", max_graph_tokens=1 << 20)
    variants: dict[str, Any] = {
        "ours_packed": (lambda x: ours._run_device(*x), packed),
        "ours_fp8_packed": (lambda x: ours_fp8._run_device(*x), packed),
        "ours_fp8_calibrated_packed": (lambda x: ours_cal._run_device(*x), packed),
        "ours_fp8_static_all_packed": (lambda x: ours_all._run_device(*x), packed),
        "ours_fp8_calibrated_packed_graph": (lambda x: cal_graph._run_device(*x), packed),
        **{key: (lambda x, e=eng: e._run_device(*x), packed) for key, eng in no_pdl.items()},
    }
    best = OPTS.get("attn_best", {}).get(f"{name}:mix")
    if best is not None:  # the attention sweep's fastest tile on this mix, whole pass
        e16 = FusedEngine(ours.weights, "cuda", attention_tiles=best)
        e8 = FusedEngine(ours_fp8.weights, "cuda", attention_tiles=best)
        row["attn_best"] = list(best)
        variants["ours_packed_attn_best"] = (lambda x: e16._run_device(*x), packed)
        variants["ours_fp8_packed_attn_best"] = (lambda x: e8._run_device(*x), packed)
    if not OPTS["fast"]:
        variants["ours_padded_384"] = (lambda x: ours._run_device(*x), packed_full)
        variants["hf_graph_padded_384"] = (HFRunner(model, windows, 384, use_mask=True,
                                                    graph=True), hf_in)
        variants["hf_eager_padded_384"] = (HFRunner(model, windows, 384, use_mask=True,
                                                    graph=False), hf_in)
    from benchmarks.gpu_clocks import ClockSampler, clock_fields, torch_gpu_id
    from benchmarks.rounds import run_for

    timed: dict[str, tuple[datetime, datetime]] = {}
    # At the power cap windows/s follows the part's clock: sample it beside each timing.
    with ClockSampler(gpu=torch_gpu_id()) as sampler:
        for key, (fn, inputs) in variants.items():
            try:
                with torch.inference_mode():
                    # The power limit settles first (the lambda runs within this turn).
                    run_for(lambda i: fn(inputs[i % len(inputs)]), MIX_LOADED_S)  # noqa: B023
                    start = sampler.now()
                    t = time_calls(fn, inputs, target_s=MIX_TIMED_S, warmup=0, min_iters=8)
                    timed[key] = (start, sampler.now())
                row[key] = {**t.as_dict(), "windows_per_s": windows / t.median_ms * 1e3}
            except Exception as exc:
                row[key] = {"error": repr(exc)[:300]}
    for key, window in timed.items():
        row[key].update(clock_fields(sampler.between(*window)))
    res.setdefault("mix", []).append(row)
    print(f"mix {name} x{windows}: " + " ".join(
        f"{k}={v['windows_per_s']:.0f}/s" + (f"@{v['sm_mhz']:.0f}MHz" if "sm_mhz" in v else "")
        for k, v in row.items() if isinstance(v, dict) and "windows_per_s" in v), flush=True)


def section_stages(res: dict[str, Any], name: str, label: str, windows: int, seq: int,
                   mix: bool, ceilings: dict[str, float]) -> None:
    """Per-stage time of one forward pass: each stage captured over all layers' weights."""
    import numpy as np
    import torch

    from engine.fused import kernels as k
    from engine.fused.fp8 import scaled_linear

    model, cfg = make_hf(name)
    ours = make_ours(model, cfg, dtype="float16")
    ours8 = make_ours(model, cfg, dtype="fp8")
    w, w8 = ours.weights, ours8.weights
    rng = np.random.default_rng(4)
    lengths = rng.choice(squad_lengths(), windows) if mix else None
    ids, tt, pos, cu, max_len = device_packed(*random_padded(rng, windows, seq, lengths))
    t, d, f, L = ids.shape[0], cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    with torch.inference_mode():
        x, _ = k.embed_layernorm(ids, tt, pos, w.word_embeddings, w.position_embeddings,
                                 w.token_type_embeddings, w.emb_ln_weight, w.emb_ln_bias, 1e-12)
        _, xq = k.embed_layernorm(ids, tt, pos, w.word_embeddings, w.position_embeddings,
                                  w.token_type_embeddings, w.emb_ln_weight, w.emb_ln_bias, 1e-12,
                                  fp8=True)
        qkv = torch.mm(x, w.layers[0].qkv.weight.t())
        h = torch.mm(x, w.layers[0].ffn_in.weight.t())
        hq = k.bias_gelu(h.clone(), w.layers[0].ffn_in.bias, fp8=True)[1]
        seqs = cu.shape[0] - 1
        lay, lay8 = w.layers, w8.layers
        stages: dict[str, tuple[Callable[[], Any], float, float]] = {
            # name: (fn over all layers, FLOPs, bytes)  per forward pass
            "embed+LN": (lambda: k.embed_layernorm(ids, tt, pos, w.word_embeddings,
                         w.position_embeddings, w.token_type_embeddings, w.emb_ln_weight,
                         w.emb_ln_bias, 1e-12), 0, t * d * 2 * 4),
            "QKV GEMM": (lambda: [torch.mm(x, ly.qkv.weight.t()) for ly in lay],
                         L * 2 * t * d * 3 * d, L * (3 * d * d + t * d + 3 * t * d) * 2),
            "attention": (lambda: [k.attention_varlen(qkv, ly.qkv.bias, cu, max_len, seqs, heads)
                                   for ly in lay],
                          L * 4 * d * float((np.diff(cu.cpu().numpy()) ** 2).sum()),
                          L * 4 * t * d * 2),
            "out-proj GEMM": (lambda: [torch.mm(x, ly.attn_out.weight.t()) for ly in lay],
                              L * 2 * t * d * d, L * (d * d + 2 * t * d) * 2),
            "bias+res+LN x2": (lambda: [k.bias_residual_layernorm(x, ly.ln1_bias, x, ly.ln1_weight,
                               ly.ln1_bias, 1e-12) for ly in lay + lay], 0, 2 * L * 3 * t * d * 2),
            "FFN1 GEMM": (lambda: [torch.mm(x, ly.ffn_in.weight.t()) for ly in lay],
                          L * 2 * t * d * f, L * (d * f + t * d + t * f) * 2),
            "bias+GELU": (lambda: [k.bias_gelu(h, ly.ffn_in.bias) for ly in lay], 0,
                          L * 2 * t * f * 2),
            "FFN2 GEMM": (lambda: [torch.mm(h, ly.ffn_out.weight.t()) for ly in lay],
                          L * 2 * t * d * f, L * (d * f + t * d + t * f) * 2),
            "FFN1 GEMM+bias+GELU fused (triton)": (lambda: [k.linear(
                x, ly.ffn_in.weight, ly.ffn_in.bias, act="gelu") for ly in lay],
                L * 2 * t * d * f, L * (d * f + t * d + t * f) * 2),
            "FFN1 cuBLASLt addmm+GELU(tanh), info": (lambda: [torch._addmm_activation(
                ly.ffn_in.bias, x, ly.ffn_in.weight.t(), use_gelu=True) for ly in lay],
                L * 2 * t * d * f, L * (d * f + t * d + t * f) * 2),
            "attention small tile": (lambda: [k.attention_varlen(
                qkv, ly.qkv.bias, cu, max_len, seqs, heads, config=k.ATTN_SMALL) for ly in lay],
                L * 4 * d * float((np.diff(cu.cpu().numpy()) ** 2).sum()), L * 4 * t * d * 2),
            "attention large tile": (lambda: [k.attention_varlen(
                qkv, ly.qkv.bias, cu, max_len, seqs, heads, config=k.ATTN_LARGE) for ly in lay],
                L * 4 * d * float((np.diff(cu.cpu().numpy()) ** 2).sum()), L * 4 * t * d * 2),
            "QKV GEMM fp8": (lambda: [scaled_linear(xq, ly.qkv.w8, ly.qkv.w8_scale, torch.float16)
                                      for ly in lay8], L * 2 * t * d * 3 * d,
                             L * (3 * d * d + t * d + 6 * t * d)),
            "FFN1 GEMM fp8": (lambda: [scaled_linear(xq, ly.ffn_in.w8, ly.ffn_in.w8_scale,
                                                     torch.float16) for ly in lay8],
                              L * 2 * t * d * f, L * (d * f + t * d + 2 * t * f)),
            "FFN2 GEMM fp8": (lambda: [scaled_linear(hq, ly.ffn_out.w8, ly.ffn_out.w8_scale,
                                                     torch.float16) for ly in lay8],
                              L * 2 * t * d * f, L * (d * f + t * f + 2 * t * d)),
        }
        out: dict[str, Any] = {"model": name, "shape": label, "tokens": t}
        peak = ceilings.get("bf16_tflops", 790.0) * 1e12
        bw = ceilings.get("copy_tb_s", 4.3) * 1e12
        for key, (fn, flops, nbytes) in stages.items():
            try:
                ms = graph_time_ms(fn, reps=1 if t > 8192 else 3)
                rate = peak * (2 if "fp8" in key else 1)
                out[key] = {"ms": ms, "floor_ms": max(flops / rate, nbytes / bw) * 1e3,
                            "tflops": flops / ms / 1e9 if flops else None,
                            "tb_s": nbytes / ms / 1e9}
            except Exception as exc:
                out[key] = {"error": repr(exc)[:300]}
        full = time_calls(lambda _x: ours._run_device(ids, tt, pos, cu, max_len), [None])
        out["whole forward (graph)"] = {"ms": full.median_ms}
        if w8.fp8 and t >= ours8.options.fp8_min_tokens:
            full8 = time_calls(lambda _x: ours8._run_device(ids, tt, pos, cu, max_len), [None])
            out["whole forward fp8 (graph)"] = {"ms": full8.median_ms}
    res.setdefault("stages", []).append(out)
    print(f"stages {name} {label}: " + " ".join(
        f"{k}={v['ms']:.3f}" for k, v in out.items() if isinstance(v, dict) and "ms" in v),
        flush=True)


ATTN_SWEEP = [(64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (64, 32, 4, 2), (64, 64, 4, 2),
              (64, 64, 4, 4), (128, 64, 4, 3), (128, 128, 8, 3), (128, 32, 8, 3), (32, 64, 4, 3),
              (64, 64, 8, 3)]
# The full sweep ran on 2026-11-29 (v3 in NOTES.md); these are the two tiles in use.
GEMM_GELU_SWEEP = [(128, 256, 64, 8, 3), (64, 64, 64, 4, 4),
                   # TMA loads (sixth entry 1)
                   (128, 256, 64, 8, 3, 1), (128, 256, 64, 8, 4, 1), (128, 128, 64, 8, 4, 1),
                   (128, 64, 64, 4, 4, 1), (64, 64, 128, 4, 3, 1)]


def parse_shapes(spec: str) -> list[tuple[str, int, int]]:
    """``"bert-base:1x128,bert-large:1x384"`` -> [(model, batch, seq), ...]."""
    out = []
    for item in spec.split(","):
        name, bs = item.split(":")
        b, s = bs.split("x")
        out.append((name, int(b), int(s)))
    return out


def gemm_key(config: tuple[int, ...]) -> str:
    """'BMxBNxBK wW sS' (+ ' tma') of a ``linear`` config."""
    loads = " tma" if len(config) > 5 and config[5] == 1 else ""
    return "x".join(map(str, config[:3])) + f" w{config[3]} s{config[4]}{loads}"


def _sweep_inputs(name: str, label: str, windows: int, seq: int, mix: bool):  # type: ignore[no-untyped-def]
    import numpy as np
    import torch

    cfg = MODELS[name]
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    rng = np.random.default_rng(6)
    lengths = rng.choice(squad_lengths(), windows) if mix else None
    ids, _tt, _pos, cu, max_len = device_packed(*random_padded(rng, windows, seq, lengths))
    t = ids.shape[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    return cfg, d, f, t, cu, max_len, g


def section_attn_sweep(res: dict[str, Any]) -> None:
    """Attention tiles (BLOCK_M x BLOCK_N, warps, stages), per layer, output checked against
    the default tile. The fastest tile on the mix, if >3% faster, is timed whole-pass in mix."""
    import numpy as np
    import torch

    from engine.fused import kernels as k

    out = []
    for name, label, windows, seq, mix in [("bert-large", "mix x256", 256, 384, True),
                                           ("bert-large", "1x384", 1, 384, False),
                                           ("bert-base", "1x128", 1, 128, False)]:
        cfg, d, _f, t, cu, max_len, g = _sweep_inputs(name, label, windows, seq, mix)
        heads = cfg["num_attention_heads"]
        qkv = torch.randn(t, 3 * d, device="cuda", dtype=torch.float16, generator=g)
        bias = torch.randn(3 * d, device="cuda", dtype=torch.float16, generator=g) * 0.1
        seqs = cu.shape[0] - 1
        lens = np.diff(cu.cpu().numpy()).astype(np.float64)
        flops = 4 * d * float((lens**2).sum())
        with torch.inference_mode():
            ref = k.attention_varlen(qkv, bias, cu, max_len, seqs, heads, config=k.ATTN_SMALL)
            row: dict[str, Any] = {"model": name, "shape": label, "tokens": t}
            for conf in ATTN_SWEEP:
                key = f"{conf[0]}x{conf[1]} w{conf[2]} s{conf[3]}"
                try:
                    o = k.attention_varlen(qkv, bias, cu, max_len, seqs, heads, config=conf)
                    err = float((o.float() - ref.float()).abs().max())
                    ms = graph_time_ms(lambda conf=conf: [k.attention_varlen(
                        qkv, bias, cu, max_len, seqs, heads, config=conf)  # noqa: B023
                        for _ in range(4)], reps=2) / 4
                    row[key] = {"ms": ms, "tflops": flops / ms / 1e9, "max_abs_vs_v2": err}
                except Exception as exc:
                    row[key] = {"error": repr(exc)[:200]}
        out.append(row)
        best = sorted(((v["ms"], kk) for kk, v in row.items() if isinstance(v, dict) and "ms" in v))
        base_ms = row.get("64x64 w4 s3", {}).get("ms")
        if mix and best and base_ms and best[0][0] < 0.97 * base_ms:
            conf = next(c for c in ATTN_SWEEP
                        if f"{c[0]}x{c[1]} w{c[2]} s{c[3]}" == best[0][1])
            OPTS.setdefault("attn_best", {})[f"{name}:mix"] = conf
        print(f"attn sweep {name} {label}: " + " ".join(f"{kk}={m * 1e3:.1f}us" for m, kk in best[:6]),
              flush=True)
    res["attn_sweep"] = out


def section_ffn1_sweep(res: dict[str, Any]) -> None:
    """Per layer: FFN1 as cuBLAS + bias_gelu vs the fused Triton GEMM (per tile), and each
    GEMM through plain cuBLAS (``torch.mm``) vs cuBLASLt (``torch.addmm``, zero bias)."""
    import torch

    from engine.fused import kernels as k

    out = []
    for name, label, windows, seq, mix in [("bert-large", "mix x256", 256, 384, True),
                                           ("bert-large", "1x384", 1, 384, False),
                                           ("bert-base", "1x128", 1, 128, False),
                                           ("bert-base", "32x128", 32, 128, False)]:
        _cfg, d, f, t, _cu, _max_len, g = _sweep_inputs(name, label, windows, seq, mix)
        xs = [torch.randn(t, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(2)]
        ws = [torch.randn(f, d, device="cuda", dtype=torch.float16, generator=g) * 0.03
              for _ in range(4)]
        bs = [torch.randn(f, device="cuda", dtype=torch.float16, generator=g) * 0.1
              for _ in range(4)]
        flops = 2 * t * d * f
        row: dict[str, Any] = {"model": name, "shape": label, "tokens": t}
        with torch.inference_mode():
            ref = k.bias_gelu(torch.mm(xs[0], ws[0].t()), bs[0])[0]
            ms = graph_time_ms(lambda: [k.bias_gelu(
                torch.mm(xs[i % 2], ws[i].t()), bs[i]) for i in range(4)], reps=2) / 4  # noqa: B023
            row["cuBLAS + bias_gelu"] = {"ms": ms, "tflops": flops / ms / 1e9}
            ms = graph_time_ms(lambda: [torch.mm(xs[i % 2], ws[i].t())  # noqa: B023
                                        for i in range(4)], reps=2) / 4
            row["cuBLAS alone"] = {"ms": ms, "tflops": flops / ms / 1e9}
            zero = {n: torch.zeros(n, device="cuda", dtype=torch.float16) for n in (d, 3 * d, f)}
            gemms = {"QKV": (d, 3 * d), "out-proj": (d, d), "FFN1": (d, f), "FFN2": (f, d)}
            for gname, (kk_, nn_) in gemms.items():
                xg = torch.randn(t, kk_, device="cuda", dtype=torch.float16, generator=g)
                wg = [torch.randn(nn_, kk_, device="cuda", dtype=torch.float16, generator=g) * 0.03
                      for _ in range(4)]
                fl = 2 * t * kk_ * nn_
                for api in ("mm", "lt"):
                    def call(xg=xg, wg=wg, api=api, b_=zero[nn_]) -> list[Any]:  # type: ignore[no-untyped-def]
                        if api == "mm":
                            return [torch.mm(xg, w_.t()) for w_ in wg]
                        return [torch.addmm(b_, xg, w_.t()) for w_ in wg]
                    ms = graph_time_ms(call, reps=2) / 4
                    row[f"{gname} {api}"] = {"ms": ms, "tflops": fl / ms / 1e9}
            for conf in GEMM_GELU_SWEEP:
                key = "triton " + gemm_key(conf)
                try:
                    o = k.linear(xs[0], ws[0], bs[0], act="gelu", config=conf)
                    err = float((o.float() - ref.float()).abs().max())
                    ms = graph_time_ms(lambda conf=conf: [k.linear(
                        xs[i % 2], ws[i], bs[i], act="gelu", config=conf)  # noqa: B023
                        for i in range(4)], reps=2) / 4
                    row[key] = {"ms": ms, "tflops": flops / ms / 1e9, "max_abs_vs_cublas": err}
                    if len(conf) > 5:  # the same tiles without bias + GELU: the epilogue's cost
                        ms = graph_time_ms(lambda conf=conf: [k.linear(
                            xs[i % 2], ws[i], config=conf) for i in range(4)],  # noqa: B023
                            reps=2) / 4
                        row[key + " plain"] = {"ms": ms, "tflops": flops / ms / 1e9}
                except Exception as exc:
                    row[key] = {"error": repr(exc)[:200]}
        out.append(row)
        items = [(kk, v["ms"]) for kk, v in row.items() if isinstance(v, dict) and "ms" in v]
        print(f"ffn1/gemm sweep {name} {label} ({t} tok): " + " ".join(
            f"{kk}={m * 1e3:.1f}us" for kk, m in items), flush=True)
    res["ffn1_sweep"] = out


def section_f1(res: dict[str, Any]) -> None:
    from training.evaluate import main as evaluate

    base = ["--model-dir", str(CHECKPOINT), "--data", str(DEV_SET), "--device", "cuda"]
    out = {}
    runs = [("reference_fp32", ["--engine", "reference", "--dtype", "float32"]),
            ("fused_fp16", ["--engine", "fused", "--dtype", "float16"]),
            # one window a batch, every one through the small-batch path / persistent kernel
            ("fused_fp16_small", ["--engine", "fused", "--dtype", "float16", "--batch-windows",
                                  "1", "--engine-option", "small_batch_max_tokens=512"]),
            ("fused_fp16_persistent", ["--engine", "fused", "--dtype", "float16",
                                       "--batch-windows", "1", "--engine-option",
                                       "small_batch_max_tokens=512", "--engine-option",
                                       "persistent=true"]),
            ("fused_fp8", ["--engine", "fused", "--dtype", "fp8"]),
            ("fused_fp8_blocks", ["--engine", "fused", "--dtype", "fp8", "--engine-option",
                                  "fp8_scaling=blocks"]),
            # static FP8 scales calibrated on 512 training questions (not the dev set scored)
            ("fused_fp8_calibrated", ["--engine", "fused", "--dtype", "fp8",
                                      "--calibrate-with", str(TRAIN_SET)])]
    for label, extra in [r for r in runs if OPTS.get("f1") is None or r[0] in OPTS["f1"]]:
        t0 = time.time()
        score = evaluate(base + extra)
        out[label] = {"exact": score.exact, "f1": score.f1, "seconds": time.time() - t0}
        res["f1"] = out
        print(f"f1 {label}: EM {score.exact:.2f} F1 {score.f1:.2f}", flush=True)


def compile_child(shapes: list[tuple[int, int]]) -> None:
    """Run in a child: torch.compile(max-autotune) BERT-base, print one JSON line per shape."""
    import numpy as np
    import torch

    model, _ = make_hf("bert-base")
    compiled = torch.compile(model, mode="max-autotune", dynamic=False)
    rng = np.random.default_rng(5)
    for batch, seq in shapes:
        sets = [tuple(torch.from_numpy(a).long().cuda() for a in random_padded(rng, batch, seq))
                for _ in range(4)]

        def call(x):  # type: ignore[no-untyped-def]
            with torch.no_grad():
                out = compiled(input_ids=x[0], token_type_ids=x[2])
            return out.start_logits

        t0 = time.time()
        call(sets[0])
        torch.cuda.synchronize()
        compile_s = time.time() - t0
        t = time_calls(call, sets)
        print(json.dumps({"batch": batch, "seq": seq, "compile_s": compile_s, **t.as_dict()}),
              flush=True)


def section_compile(res: dict[str, Any], cap_s: float) -> None:
    shapes = [(1, 128), (32, 128)]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-child",
           json.dumps(shapes)]
    rows: list[dict[str, Any]] = []
    status = "completed"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cap_s, cwd=REPO)
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = ""
        status = f"stopped at the {cap_s:.0f} s compile cap"
    for line in stdout.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
    done = {(r["batch"], r["seq"]) for r in rows}
    res["compile"] = {"status": status, "cap_s": cap_s, "rows": rows,
                      "skipped": [list(s) for s in shapes if tuple(s) not in done],
                      "stderr_tail": stderr[-800:]}


# ----------------------------------------------------------------------------- report


def fmt(v: Any, key: str = "median_ms") -> str:
    if isinstance(v, dict):
        if "error" in v:
            return "error"
        if key in v and v[key] is not None:
            return f"{v[key]:.3f}" if v[key] < 100 else f"{v[key]:.0f}"
    return "-"


def clocks(v: Any) -> str:
    """A mix cell's clock suffix: ``' [1650 MHz, 691 W]'``, or nothing where unsampled."""
    if isinstance(v, dict) and "sm_mhz" in v:
        return f" [{v['sm_mhz']:.0f} MHz, {v['power_w']:.0f} W]"
    return ""


def write_markdown(res: dict[str, Any], path: Path) -> str:
    lines = [f"# bench_gpu results {res.get('env', {}).get('date', '')}", ""]
    env = res.get("env", {})
    if env:
        lines += [", ".join(f"{k}: {v}" for k, v in env.items()), ""]
    if "ceilings" in res:
        c = res["ceilings"]
        lines += [f"Measured ceilings: bf16 GEMM {c['bf16_tflops']:.0f} TFLOP/s, "
                  f"device copy {c['copy_tb_s']:.2f} TB/s", ""]
    if "parity_bert_base_random" in res:
        lines += ["## Parity (random BERT-base, 16 windows, lengths 20-384, vs HF fp32)", "",
                  "| engine | max abs | max rel |", "|---|---|---|"]
        for k, v in res["parity_bert_base_random"].items():
            lines.append(f"| {k} | {v['max_abs']:.3e} | {v['max_rel']:.3e} |")
        lines.append("")
    if res.get("latency"):
        cols = ["hf_eager", "hf_graph", "ours_eager", "ours_graph", "ours_replay",
                "ours_graph_seven_kernels", "ours_replay_seven_kernels",
                "ours_graph_deferred_ln", "ours_replay_deferred_ln", "ours_graph_no_pdl",
                "ours_graph_attn_64x128", "ours_graph_large_path", "ours_graph_three_launches",
                "ours_fp8_graph", "ours_fp8_calibrated_graph", "ours_fp8_calibrated_replay",
                "ours_fp8_static_all_graph", "ours_fp8_static_all_replay",
                "stage_triton", "stage_torch_ops"]
        lines += ["## Latency, ms per batch (median / p99), random weights, full-length", "",
                  "| model | batch x seq | " + " | ".join(cols) + " | ours vs hf_graph |",
                  "|---|---|" + "---|" * (len(cols) + 1)]
        for r in res["latency"]:
            if "skipped" in r:
                lines.append(f"| {r['model']} | {r['batch']}x{r['seq']} | "
                             f"skipped: {r['skipped']} |")
                continue
            cells = [f"{fmt(r.get(c))} / {fmt(r.get(c), 'p99_ms')}" for c in cols]
            try:
                ratio = f"{r['hf_graph']['median_ms'] / r['ours_graph']['median_ms']:.2f}x"
            except (KeyError, TypeError, ZeroDivisionError):
                ratio = "-"
            lines.append(f"| {r['model']} | {r['batch']}x{r['seq']} | " + " | ".join(cells)
                         + f" | {ratio} |")
        lines.append("")
    if res.get("mix"):
        cols = ["ours_packed", "ours_fp8_packed", "ours_fp8_calibrated_packed",
                "ours_fp8_static_all_packed", "ours_fp8_calibrated_packed_graph",
                "ours_packed_no_pdl", "ours_fp8_packed_no_pdl",
                "ours_packed_attn_best",
                "ours_fp8_packed_attn_best", "ours_padded_384", "hf_graph_padded_384",
                "hf_eager_padded_384"]
        lines += ["## SQuAD dev length mix, windows/s (ms per batch) [median SM MHz, W]", "",
                  "| model | windows | mean tokens | " + " | ".join(cols) + " |",
                  "|---|---|---|" + "---|" * len(cols)]
        for r in res["mix"]:
            cells = [f"{fmt(r.get(c), 'windows_per_s')} ({fmt(r.get(c))}){clocks(r.get(c))}"
                     for c in cols]
            lines.append(f"| {r['model']} | {r['windows']} | {r['mean_tokens_per_window']:.1f} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    for st in res.get("stages", []):
        lines += [f"## Stages per forward: {st['model']} {st['shape']} ({st['tokens']} tokens)", "",
                  "| stage | ms | floor ms | TFLOP/s | TB/s |", "|---|---|---|---|---|"]
        for k, v in st.items():
            if not isinstance(v, dict):
                continue
            if "error" in v:
                lines.append(f"| {k} | error | | | |")
                continue
            tf = f"{v['tflops']:.0f}" if v.get("tflops") else ""
            tb = f"{v['tb_s']:.2f}" if v.get("tb_s") else ""
            fl = f"{v['floor_ms']:.3f}" if "floor_ms" in v else ""
            lines.append(f"| {k} | {v['ms']:.3f} | {fl} | {tf} | {tb} |")
        lines.append("")
    from benchmarks.bench_small import markdown as small_markdown

    lines += small_markdown(res)
    for key in ("attn_sweep", "ffn1_sweep"):
        for r in res.get(key, []):
            lines += [f"## {key}: {r['model']} {r['shape']} ({r['tokens']} tokens), per layer", "",
                      "| variant | us | TFLOP/s | max abs vs baseline |", "|---|---|---|---|"]
            for kk, v in r.items():
                if not isinstance(v, dict):
                    continue
                if "error" in v:
                    lines.append(f"| {kk} | error: {v['error'][:80]} | | |")
                    continue
                e = v.get("max_abs_vs_v2", v.get("max_abs_vs_cublas"))
                lines.append(f"| {kk} | {v['ms'] * 1e3:.1f} | {v['tflops']:.0f} | "
                             + (f"{e:.2e}" if e is not None else "") + " |")
            lines.append("")
    if "f1" in res:
        lines += ["## SQuAD v1.1 dev, models/minilm-l6-squad", "", "| engine | EM | F1 | s |",
                  "|---|---|---|---|"]
        for k, v in res["f1"].items():
            lines.append(f"| {k} | {v['exact']:.2f} | {v['f1']:.2f} | {v['seconds']:.0f} |")
        lines.append("")
    if "compile" in res:
        c = res["compile"]
        lines += [f"## torch.compile max-autotune, BERT-base ({c['status']})", ""]
        for r in c["rows"]:
            lines.append(f"- {r['batch']}x{r['seq']}: {r['median_ms']:.3f} ms median, "
                         f"{r['p99_ms']:.3f} p99, compile {r['compile_s']:.0f} s")
        if c["skipped"]:
            lines.append(f"- skipped (cap): {c['skipped']}")
        lines.append("")
    if res.get("errors"):
        lines += ["## Section errors", ""] + [f"- {e}" for e in res["errors"]] + [""]
    text = "\n".join(lines)
    path.write_text(text)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "build" / "bench_gpu")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.add_argument("--sections",
                   default="env,parity,latency,mix,stages,attn_sweep,ffn1_sweep,f1,compile")
    p.add_argument("--mix-windows", type=int, default=256)
    p.add_argument("--make-lengths", action="store_true")
    p.add_argument("--compile-child", default=None)
    p.add_argument("--fast", action="store_true",
                   help="latency: only hf_graph as competitor; mix: no padded variants")
    p.add_argument("--shapes", default=None,
                   help="latency rows to run, e.g. bert-base:1x128,bert-large:1x384")
    p.add_argument("--f1", default=None,
                   help="F1 runs, from reference_fp32,fused_fp16,fused_fp8 (default all)")
    p.add_argument("--mix-models", default="bert-large,bert-base")
    p.add_argument("--small-shapes", default=None,
                   help="small-section shapes, e.g. bert-base:1x192 (default: bench_small.SHAPES)")
    p.add_argument("--small-set", default=None, choices=["tma"],
                   help="small-section tiles: 'tma' tries the TMA-load tiles only")
    args = p.parse_args()
    OPTS["fast"] = args.fast
    OPTS["shapes"] = set(args.shapes.split(",")) if args.shapes else None
    OPTS["f1"] = set(args.f1.split(",")) if args.f1 else None
    sys.path.insert(0, str(REPO))
    if args.make_lengths:
        make_lengths()
        return
    if args.compile_child is not None:
        compile_child([tuple(s) for s in json.loads(args.compile_child)])
        return
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch

    started = time.time()
    deadline = started + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"errors": []}
    wanted = set(args.sections.split(","))

    def save() -> None:  # after every section (and within long ones), so a cut run keeps it
        (args.out / "results.json").write_text(json.dumps(res, indent=1))

    def run(label: str, fn: Callable[[], None], min_left_s: float = 20.0) -> None:
        if label.split(":")[0] not in wanted:
            return
        if time.time() > deadline - min_left_s:
            res["errors"].append(f"{label}: skipped, deadline")
            return
        t0 = time.time()
        try:
            fn()
        except Exception:
            res["errors"].append(f"{label}: {traceback.format_exc()[-1500:]}")
            print(f"SECTION {label} FAILED\n{traceback.format_exc()}", flush=True)
        gc.collect()  # the section's models die with its frame: hand their memory back
        torch.cuda.empty_cache()
        print(f"[{time.time() - started:6.1f}s] {label} done in {time.time() - t0:.1f}s",
              flush=True)
        save()
        write_markdown(res, args.out / "results.md")

    run("env", lambda: section_env(res, args))
    ceil = res.get("ceilings", {})
    run("parity", lambda: section_parity(res))
    if "small" in wanted:
        from benchmarks.bench_small import section_small_sweep

        run("small", lambda: section_small_sweep(res, deadline - 60.0,
                                                 sweep="small_sweep" in wanted,
                                                 shapes=args.small_shapes,
                                                 focus=args.small_set, save=save))
    run("attn_sweep", lambda: section_attn_sweep(res))  # before mix: it picks a tile to try
    run("ffn1_sweep", lambda: section_ffn1_sweep(res))
    for name in MODELS:
        run(f"latency:{name}", lambda name=name: section_latency(
            res, name, deadline - min(150.0, args.deadline_s / 3)))
    for name in args.mix_models.split(","):
        run(f"mix:{name}", lambda name=name: section_mix(res, name, args.mix_windows))
    run("stages:base-1x128",
        lambda: section_stages(res, "bert-base", "1x128", 1, 128, False, ceil))
    run("stages:large-1x384",
        lambda: section_stages(res, "bert-large", "1x384", 1, 384, False, ceil))
    run("stages:large-mix", lambda: section_stages(res, "bert-large", f"mix x{args.mix_windows}",
                                                   args.mix_windows, 384, True, ceil))
    run("f1", lambda: section_f1(res), min_left_s=60)
    left = deadline - time.time() - 10
    if left > 45:
        run("compile", lambda: section_compile(res, cap_s=min(left, 240.0)), min_left_s=45)
    else:
        res["errors"].append("compile: skipped, no time left under the deadline")
    save()
    print(write_markdown(res, args.out / "results.md"))


if __name__ == "__main__":
    main()
