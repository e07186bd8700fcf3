"""``FusedEngine``: the padding-free, CUDA-graph, Triton-kernel BERT-QA engine.

Three entry points, all returning float32 start/end logits:

- :meth:`FusedEngine.infer` -- the ``QAEngine`` contract: int numpy ``[windows, seq]`` in,
  numpy ``[windows, seq]`` out. Padding (``attention_mask == 0``) is dropped before the
  encoder runs; padded positions come back as ``PAD_LOGIT``.
- :meth:`FusedEngine.infer_torch` -- the same on torch tensors (CUDA tensors stay on the
  GPU: what a Triton python backend hands over through DLPack).
- :meth:`FusedEngine.infer_packed` -- already-packed CUDA tensors: flat tokens of all
  sequences plus ``cu_seqlens`` (Triton ragged batching).

Calls are serialised by a lock (static graph buffers, and the pinned host buffers that
``infer``'s results are copied out of, are shared). With ``cuda_graphs``
on, a batch replays the graph of its bucket (``packing.bucket_for``), captured the first
time that bucket is seen; batches above ``max_graph_tokens`` tokens run eagerly, where
launch overhead no longer matters and the exact token count beats the bucket's padding
(``graphs.MAX_GRAPH_TOKENS``). With ``graph_staging`` (and the Triton op set) a call is
one graph launch: the call sets where the inputs are and where the logits go as
arguments of the graph's first and last kernels (``engine.fused.graph_args``), the
caller's device tensors, or for ``infer`` the graph's own input buffer, which one copy
fills from a pinned host buffer, and pinned host logits that the GPU writes directly
(``GraphCache.run_host``). Calls on several streams are ordered one after
another (the graphs share their memory).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from engine.base import Float32Array, Int32Array
from engine.fused import graph_args, small_gemm
from engine.fused.calibration import (
    CALIBRATION_MARGIN,
    GEMMS,
    INT8_GEMMS,
    AmaxRecorder,
    Calibration,
)
from engine.fused.config import BertQAConfig
from engine.fused.encoder import (
    AUTO_SMALL_GEMMS_MIN_HIDDEN,
    DEFERRED_LN_MAX_HIDDEN,
    EARLY_WEIGHT_GEMMS,
    EARLY_WEIGHTS,
    FFN1_FUSED_MAX_TOKENS,
    FP8_CALIBRATED_MIN_TOKENS,
    FP8_DEFERRED,
    FP8_MIN_TOKENS,
    FP8_STATIC_INPUTS,
    LATE_RELEASE_KERNELS,
    QKV_LATE_RELEASE_MIN_SEQS,
    SMALL_BATCH_MAX_TOKENS,
    EncodeOptions,
    GemmPlan,
    encode_packed,
)
from engine.fused.folding import with_folded
from engine.fused.fp8 import rowwise_out_dtype
from engine.fused.graphs import MAX_GRAPH_TOKENS, GraphCache
from engine.fused.packing import (
    TOKEN_BUCKETS_PER_OCTAVE,
    Bucket,
    PackedHost,
    bucket_for,
    buckets_per_octave,
    chunks_by_tokens,
    pack_padded,
)
from engine.fused.weights import BertQAWeights, pack_weights, read_state_dict

PAD_LOGIT = -10000.0  # start/end logit reported at padded positions
# ``int8_gemms="auto"`` runs them on calibrated passes of at least this many tokens, by the
# model's hidden size; other sizes keep the e4m3 GEMMs (no measurement). The Gluon int8 GEMM
# loses to cuBLASLt's e4m3 one on short passes. H100, graph replay, int8 against e4m3
# (`benchmarks/ab_replay.py`, NOTES v52): BERT-large 1x384 +17.8%, 4x384 (1,536 tokens)
# +6.7%, mix16 (~2,960) -3.4%, 8x384 (3,072) -3.8%, mix32 -6.2%, 16x384 -6.6%, mix64 -7.0%,
# 128x128 -7.7%; BERT-base 4x384 +10.3%, 8x384 (3,072) +7.5%, mix32 (~5,900) -1.1%, 16x384
# (6,144) -2.0%, 32x384 -3.8%, mix64 -5.2%.
INT8_AUTO_MIN_TOKENS = {1024: 2048, 768: 6144}

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
_FP8_NAMES = ("fp8", "float8", "float8_e4m3fn")


def parse_dtype(name: str, fp8: bool = False) -> tuple[torch.dtype, bool]:
    """Activation dtype and FP8 flag of a dtype name; ``"fp8"`` means fp16 + FP8 GEMMs."""
    if name in _FP8_NAMES:
        return torch.float16, True
    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r} not supported; use one of {[*_DTYPES, *_FP8_NAMES]}")
    return _DTYPES[name], fp8


def _option_names(option: str, value: Sequence[str] | str | None,
                  allowed: Sequence[str], what: str = "GEMMs") -> list[str]:
    """An option naming GEMMs (or kernels, ``what``), as a sequence or as text
    (``"qkv,ffn_in"``; None or ``""``: none), checked against ``allowed``."""
    if value is None:
        return []
    names = ([g.strip() for g in value.split(",") if g.strip()] if isinstance(value, str)
             else list(value))
    if unknown := set(names) - set(allowed):
        raise ValueError(f"{option}: unknown {what} {sorted(unknown)}; "
                         f"choose from {', '.join(allowed)}")
    return names


def int8_runs_on(device: torch.device) -> bool:
    """Whether ``int8_gemms`` run on this device as they are meant to: the CPU (float math,
    the same numbers) or a CUDA GPU the int8 kernel runs on (``int8.gpu_supported``)."""
    from engine.fused.int8 import gpu_supported

    return device.type != "cuda" or gpu_supported(device)


def auto_int8_gemms(calibration: Calibration, fp8: bool, static: Sequence[str],
                    device: torch.device) -> tuple[str, ...]:
    """``int8_gemms="auto"``'s choice for a calibration: the out-projection and FFN1 in int8
    (``calibration.INT8_GEMMS``) where they can run as asked (:func:`check_int8_gemms`
    would pass) and the calibration recorded their per-channel input magnitudes; else
    none (the e4m3 default, e.g. from a calibration file written before 2026-12-07)."""
    recorded = calibration.colmax is not None and set(calibration.colmax) == set(INT8_GEMMS)
    return INT8_GEMMS if recorded and int8_refusal(INT8_GEMMS, fp8, static, device) is None else ()


def int8_refusal(gemms: Sequence[str], fp8: bool, static: Sequence[str],
                 device: torch.device) -> str | None:
    """Why ``int8_gemms`` would not run as asked (None where they would): an engine without
    FP8 weights (calibrated passes are FP8 ones), FFN1 without its input and FFN2's both
    static (its int8 form is the one-GEMM calibrated FFN1), or a GPU the int8 kernel does
    not run on (float math there would be slower than the e4m3 path it replaces)."""
    if not fp8:
        return "int8_gemms needs an FP8 engine (dtype='fp8'): they run in its calibrated passes"
    if "ffn_in" in gemms and not {"ffn_in", "ffn_out"} <= set(static):
        return "int8_gemms: FFN1 in int8 needs fp8_static_inputs to hold ffn_in and ffn_out"
    if not int8_runs_on(device):
        return ("int8_gemms needs a Hopper GPU (sm_90) and a Triton with Gluon "
                "(kernels.gluon_gemm) on CUDA")
    return None


def check_int8_gemms(gemms: Sequence[str], fp8: bool, static: Sequence[str],
                     device: torch.device) -> None:
    """Refuse ``int8_gemms`` where they would not run as asked (:func:`int8_refusal`)."""
    if (why := int8_refusal(gemms, fp8, static, device)) is not None:
        raise ValueError(why)


def select_ops(backend: str, device: torch.device) -> ModuleType:
    """``kernels`` (Triton) or ``torch_ops``; ``auto`` uses Triton on CUDA, and on the CPU
    only under ``TRITON_INTERPRET=1``."""
    if backend == "auto":
        interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
        backend = "triton" if device.type == "cuda" or interpret else "torch"
    if backend == "triton":
        from engine.fused import kernels

        return kernels
    if backend == "torch":
        from engine.fused import torch_ops

        return torch_ops
    raise ValueError(f"backend {backend!r}: choose auto, triton or torch")


def _int32_on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` as a contiguous int32 tensor on ``device``: itself where it is one already."""
    if t.dtype is torch.int32 and t.device == device and t.is_contiguous():
        return t
    return t.to(device=device, dtype=torch.int32).contiguous()


class FusedEngine:
    """Fused-kernel BERT-QA encoder over packed (padding-free) token batches."""

    name = "fused"

    def __init__(
        self,
        weights: BertQAWeights,
        device: torch.device | str = "cuda",
        *,
        backend: str = "auto",
        cuda_graphs: bool = True,
        graph_staging: bool = True,
        max_graph_tokens: int = MAX_GRAPH_TOKENS,
        graph_buckets_per_octave: int = TOKEN_BUCKETS_PER_OCTAVE,
        max_tokens_per_pass: int = 65536,
        fp8_min_tokens: int = FP8_MIN_TOKENS,
        fp8_calibrated_min_tokens: int = FP8_CALIBRATED_MIN_TOKENS,
        fp8_fast_accum: bool = True,
        fp8_calibration: Calibration | str | Path | None = None,
        fp8_static_inputs: Sequence[str] | str | None = FP8_STATIC_INPUTS,
        ffn1_fused_max_tokens: int | None = FFN1_FUSED_MAX_TOKENS,
        small_batch_max_tokens: int | None = SMALL_BATCH_MAX_TOKENS,
        pdl: bool = True,
        prefetch: bool = True,
        persistent: bool = False,
        deferred_ln_max_hidden: int | None = DEFERRED_LN_MAX_HIDDEN,
        attention_tiles: tuple[int, int, int, int] | None = None,
        attention_tile_list: bool = True,
        gemm_plans: dict[str, GemmPlan] | None = None,
        cutlass_small_gemms: Sequence[str] | str | None = "auto",
        qkv_late_release_min_seqs: int | None = QKV_LATE_RELEASE_MIN_SEQS,
        late_release: Sequence[str] | str | None = None,
        fp8_deferred: bool = FP8_DEFERRED,
        early_weights: Sequence[str] | str | None = EARLY_WEIGHTS,
        attention_grid: int | str = "table",
        int8_gemms: Sequence[str] | str | None = "auto",
        int8_min_tokens: int | None = None,
    ) -> None:
        """FP8 weights (if packed) are used for batches of at least ``fp8_min_tokens``
        tokens, and once calibrated (:meth:`calibrating`) from ``fp8_calibrated_min_tokens``
        (static FP8 then takes precedence over the small-batch path; ``fp8_static_inputs``
        names the GEMMs whose input takes its calibrated scale (or as text,
        ``"qkv,ffn_in"``; None or ``""``: none), the others keeping scales per token: see
        ``encoder.EncodeOptions``);
        ``fp8_fast_accum`` lets their GEMMs accumulate in the tensor cores' own precision
        (``engine.fused.fp8``); ``fp8_calibration`` (a :class:`Calibration` or its JSON
        file, e.g. from ``python -m training.calibrate``) calibrates at construction.
        fp16/bf16 batches of at most ``small_batch_max_tokens`` tokens (None: none)
        take the small-batch path (all-Triton GEMMs, split-K, programmatic dependent launch
        if ``pdl`` and the GPU has it; with ``prefetch`` each GEMM pulls its weight slice
        into L2, and GEMMs and attention their biases into L1, before waiting; see
        ``encoder``); above it, batches of at most ``ffn1_fused_max_tokens`` still run FFN1
        with bias + GELU fused. ``deferred_ln_max_hidden``: models up to that hidden size run
        the small-batch path without LayerNorm kernels (``kernels.deferred``; None: never).
        ``persistent`` runs small batches as one persistent kernel (``kernels.persistent``).
        ``attention_tile_list``: batches of many sequences on the large path launch
        attention over a tile list of their query blocks (``kernels.attention_tiles``)
        instead of a grid sized for the longest possible sequence.
        ``attention_tiles`` (BLOCK_M, BLOCK_N, warps, stages) and ``gemm_plans``
        (small-batch GEMM name -> (tiles, splits)) override the built-in rules (benchmarks,
        tests). ``cutlass_small_gemms`` (of ``qkv``, ``ffn1``; or as text) runs those
        GEMMs of the seven-kernel small-batch layer (models wider than
        ``deferred_ln_max_hidden``) as CUTLASS kernels (``engine.fused.small_gemm``: fp16,
        exact GELU, CUDA, the library built; anything missing is an error). ``"auto"``
        (the default) picks those that can run here on models of hidden size
        ``encoder.AUTO_SMALL_GEMMS_MIN_HIDDEN`` and up, none elsewhere (no error): on
        BERT-large both measured 2.8-17% faster at every shape from 1x16 to 8x16.
        ``qkv_late_release_min_seqs``: batches of at least that many sequences (None: none)
        on the seven-kernel small-batch layer let attention launch only after the QKV
        GEMM's K loop (programmatic dependent launch), not before it.
        ``late_release`` (of ``encoder.LATE_RELEASE_KERNELS``, or as text) names the
        small-batch layers' Triton kernels that let the next kernel launch only after
        their main loop, in every batch (an A/B knob; none by default).
        ``fp8_deferred`` (on by default): once calibrated (with the un-normalised inputs
        recorded), the deferred layer (``deferred_ln_max_hidden``) runs QKV, FFN1 and FFN2
        on e4m3 operands (``folding.DeferredFP8Layer``).
        ``early_weights`` (of ``encoder.EARLY_WEIGHT_GEMMS``, or as text; None or ``""``:
        none; default ``encoder.EARLY_WEIGHTS``, QKV and FFN1) names the deferred layer's
        GEMMs whose programs load their whole weight slice before their PDL wait (where
        it fits, ``kernels.deferred.early_weights_fit``: e4m3 slices and small models'
        16-bit ones).
        ``attention_grid`` sizes the deferred layer's attention grid: ``"table"`` (the
        default) gives each sequence more query blocks than it needs (blocks that do
        nothing) where ``dispatch.QUERY_BLOCKS`` measured the pass faster with them,
        ``"fewest"`` never, and a positive number at least that many blocks (A/B).
        ``int8_gemms`` (of ``calibration.INT8_GEMMS``: ``attn_out``, ``ffn_in``; or as
        text; None or ``""``: none) runs those GEMMs of calibrated passes in int8 with
        SmoothQuant smoothing (``engine.fused.int8``), from a calibration that recorded
        their inputs' per-channel magnitudes; FFN1 only where its input and FFN2's are
        static. ``"auto"`` (the default): both, from each calibration loaded, where they
        can run and it recorded those magnitudes, else none, with no error
        (:func:`auto_int8_gemms`), on passes of at least ``INT8_AUTO_MIN_TOKENS`` tokens
        for the model's hidden size (none for sizes it does not list); measured in
        ``NOTES.md`` v51-v52 (BERT-large mix +3.6% settled on an H100, F1 loss 0.02 under
        the e4m3 form's), or from the int8 copies the weights carry (another engine's
        calibration). On the CPU (float math) the choice is the same, so the numbers are.
        ``int8_min_tokens`` sets that threshold instead (named GEMMs: 0 by default, every
        calibrated large-path pass; no effect without int8 GEMMs).
        ``graph_buckets_per_octave``: token buckets per power of two of the
        graphs, itself a power of two (``packing.round_tokens``: padding under 1/that of
        the tokens from 64 x that many tokens up; more buckets pad less but capture more
        graphs). ``graph_staging``: graphs stage their own
        inputs and write the caller's output (``graph_args``), so a call on device
        tensors is one launch."""
        self.weights = with_folded(weights, deferred_ln_max_hidden)
        self.config = weights.config
        self.device = torch.device(device)
        # Where its tensors live, as a tensor's ``.device`` names it ("cuda" alone means
        # the current device now): what ``infer_packed`` compares its inputs' devices with.
        self._tensor_device = (torch.device("cuda", torch.cuda.current_device())
                               if self.device.type == "cuda" and self.device.index is None
                               else self.device)
        self.ops = select_ops(backend, self.device)
        # 0, 1, 2, ...: one sequence's positions (``_positions``), made here, before any
        # call on any stream can read it, and never written again
        self._counting = torch.arange(self.config.max_position_embeddings, dtype=torch.int32,
                                      device=self._tensor_device)
        if self._tensor_device.type == "cuda":
            torch.cuda.synchronize(self._tensor_device)
        self.backend = "triton" if self.ops.__name__.endswith("kernels") else "torch"
        self.fp8 = weights.fp8
        if weights.fp8_blocks and self.device.type == "cuda":
            from engine.fused.cutlass_fp8 import LIBRARY

            LIBRARY.load()  # a missing or stale library: RuntimeError naming the build
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.max_graph_tokens = max_graph_tokens
        try:
            self.graph_buckets_per_octave = buckets_per_octave(graph_buckets_per_octave)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"graph_buckets_per_octave: {exc}") from exc
        self.max_tokens_per_pass = max_tokens_per_pass
        fp8_static_inputs = _option_names("fp8_static_inputs", fp8_static_inputs, GEMMS)
        cutlass_small_gemms = self._small_gemms(cutlass_small_gemms, weights,
                                                deferred_ln_max_hidden, gemm_plans or {})
        late_release = _option_names("late_release", late_release, LATE_RELEASE_KERNELS,
                                     "kernels")
        early_weights = _option_names("early_weights", early_weights, EARLY_WEIGHT_GEMMS)
        auto = isinstance(int8_gemms, str) and int8_gemms.strip().lower() == "auto"
        try:
            int8_gemms = [] if auto else _option_names("int8_gemms", int8_gemms, INT8_GEMMS)
        except ValueError as exc:
            raise ValueError(f"{exc}, or 'auto'") from None
        if int8_gemms:
            check_int8_gemms(int8_gemms, self.fp8, fp8_static_inputs, self.device)
        if int8_min_tokens is not None and (type(int8_min_tokens) is not int
                                            or int8_min_tokens < 0):
            raise ValueError(f"int8_min_tokens: {int8_min_tokens!r} is not a token count")
        threshold = (int8_min_tokens if int8_min_tokens is not None
                     else INT8_AUTO_MIN_TOKENS.get(weights.config.hidden_size) if auto else 0)
        # auto decides at each calibration loaded; with no threshold for this width: never
        self._int8_auto = auto and threshold is not None
        if (self._int8_auto and weights.int8 is not None
                and int8_refusal(INT8_GEMMS, self.fp8, fp8_static_inputs, self.device) is None):
            # weights that carry int8 copies (from an engine's calibration): auto's own
            # choice for them, both GEMMs from this engine's threshold, as loading that
            # calibration here would make it (an engine that named one GEMM chose otherwise)
            int8_gemms = list(INT8_GEMMS)
        if not (attention_grid in ("table", "fewest") if isinstance(attention_grid, str)
                else type(attention_grid) is int and attention_grid >= 1):
            raise ValueError(f"attention_grid: {attention_grid!r} is neither 'table', "
                             "'fewest' nor a positive number of query blocks")
        self.options = EncodeOptions(
            fp8_out_dtype=(weights.dtype if weights.fp8_blocks  # the CUTLASS kernel: fp16/bf16
                           else rowwise_out_dtype(self.device, weights.dtype) if self.fp8
                           else None),
            fp8_min_tokens=fp8_min_tokens,
            fp8_calibrated_min_tokens=fp8_calibrated_min_tokens,
            fp8_fast_accum=fp8_fast_accum,
            fp8_static_inputs=tuple(g for g in GEMMS if g in fp8_static_inputs),
            ffn1_fused_max_tokens=ffn1_fused_max_tokens,
            small_batch_max_tokens=small_batch_max_tokens,
            pdl=pdl,
            prefetch=prefetch,
            persistent=persistent,
            deferred_ln_max_hidden=deferred_ln_max_hidden,
            attn_config=attention_tiles,
            attn_tile_list=attention_tile_list,
            gemm_plans=tuple(sorted((gemm_plans or {}).items())),
            cutlass_small_gemms=tuple(g for g in small_gemm.GEMMS if g in cutlass_small_gemms),
            qkv_late_release_min_seqs=qkv_late_release_min_seqs,
            late_release=tuple(k for k in LATE_RELEASE_KERNELS if k in late_release),
            fp8_deferred=fp8_deferred,
            early_weights=tuple(g for g in EARLY_WEIGHT_GEMMS if g in early_weights),
            attn_grid=attention_grid,
            int8_gemms=tuple(g for g in INT8_GEMMS if g in int8_gemms),
            int8_min_tokens=threshold or 0,
        )
        self.graph_staging = graph_staging
        self._graphs = self._new_graphs()
        self._recorder: AmaxRecorder | None = None
        self._lock = threading.Lock()
        self.calibration: Calibration | None = None
        if fp8_calibration is not None:
            self.load_calibration(fp8_calibration if isinstance(fp8_calibration, Calibration)
                                  else Calibration.load(Path(fp8_calibration)))

    def _small_gemms(self, value: Sequence[str] | str | None, weights: BertQAWeights,
                     deferred_ln_max_hidden: int | None,
                     gemm_plans: dict[str, GemmPlan]) -> list[str]:
        """The GEMMs ``cutlass_small_gemms`` names, checked; for ``"auto"`` those of
        ``small_gemm.GEMMS`` that can run here (FFN1 only with the exact GELU, neither with a
        Triton plan of its own) on models of hidden size ``AUTO_SMALL_GEMMS_MIN_HIDDEN`` and
        up, or none."""
        if value != "auto":
            gemms = _option_names("cutlass_small_gemms", value, small_gemm.GEMMS)
            if gemms:
                self._check_small_gemms(gemms, weights, deferred_ln_max_hidden, gemm_plans)
            return gemms
        gemms = [g for g in small_gemm.GEMMS if g not in gemm_plans
                 and (g != "ffn1" or self.config.gelu == "erf")]
        if not gemms or self.config.hidden_size < AUTO_SMALL_GEMMS_MIN_HIDDEN:
            return []
        try:
            self._check_small_gemms(gemms, weights, deferred_ln_max_hidden, gemm_plans)
        except (ValueError, RuntimeError):
            return []
        return gemms

    def _check_small_gemms(self, gemms: Sequence[str], weights: BertQAWeights,
                           deferred_ln_max_hidden: int | None,
                           gemm_plans: dict[str, GemmPlan]) -> None:
        """What ``cutlass_small_gemms`` needs: fp16 weights, the exact GELU for FFN1, a
        model that takes the seven-kernel layer, no Triton plan for the same GEMMs, CUDA
        with the Triton kernels on an sm_90 GPU (what the library is built for), and the
        library itself. Model checks first, so each is testable without a GPU."""
        if weights.dtype != torch.float16:
            raise ValueError(f"cutlass_small_gemms takes float16 weights, not {weights.dtype}")
        if "ffn1" in gemms and self.config.gelu != "erf":
            raise ValueError("cutlass_small_gemms: FFN1's kernel has the exact GELU only, "
                             f"this model uses {self.config.gelu}")
        hidden, inner = self.config.hidden_size, self.config.intermediate_size
        if hidden % 8 or inner % 8:
            raise ValueError(f"cutlass_small_gemms: hidden {hidden} and intermediate {inner} "
                             "must be multiples of 8")
        if deferred_ln_max_hidden is not None and hidden <= deferred_ln_max_hidden:
            raise ValueError(
                f"cutlass_small_gemms applies to the seven-kernel small-batch layer: this "
                f"model (hidden {hidden} <= deferred_ln_max_hidden {deferred_ln_max_hidden}) "
                "takes the deferred one (deferred_ln_max_hidden=None to change that)")
        if both := sorted(set(gemms) & set(gemm_plans)):
            raise ValueError(f"gemm_plans {both}: those GEMMs run as CUTLASS kernels here")
        if self.device.type != "cuda" or self.backend != "triton":
            raise ValueError("cutlass_small_gemms runs on CUDA with the Triton kernels")
        if torch.cuda.get_device_capability(self.device)[0] != 9:
            raise ValueError("cutlass_small_gemms: the library is built for sm_90 (Hopper), "
                             f"not {torch.cuda.get_device_name(self.device)}")
        small_gemm.LIBRARY.load()  # a missing or stale library: RuntimeError naming the build

    def _new_graphs(self) -> GraphCache | None:
        if not self.cuda_graphs:
            return None
        # Graphs stage their own inputs where the first kernel can (the Triton kernels, not
        # the persistent one) and the driver lets a call set kernel arguments.
        staging = (self.graph_staging and hasattr(self.ops, "STAGE_ARGS")
                   and not self.options.persistent and graph_args.supported())
        return GraphCache(self._forward, self.device,
                          stage_args=self.ops.STAGE_ARGS if staging else None)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_pretrained(
        cls,
        model_dir: Path,
        device: str = "cuda",
        dtype: str = "float16",
        *,
        fp8: bool = False,
        fp8_scaling: str = "rows",
        **options: object,
    ) -> FusedEngine:
        """Load a HF BERT-family QA checkpoint directory (config.json + model.safetensors).

        ``dtype``: float16 | bfloat16 | float32, or ``fp8`` (float16 activations, e4m3 QKV
        and FFN GEMMs). ``fp8_scaling``: ``rows`` (per token x per output channel,
        cuBLAS) or ``blocks`` (1x128 x 128x128, the CUTLASS kernel: opt-in, Hopper, needs
        ``engine/fused/cuda/build.sh``; see ``engine.fused.fp8``). ``options``: keyword
        arguments of ``__init__`` (``backend``, ``cuda_graphs``, ``max_graph_tokens``,
        ``small_batch_max_tokens``, ...).
        """
        config = BertQAConfig.from_dir(Path(model_dir))
        return cls.from_state_dict(read_state_dict(Path(model_dir)), config, device, dtype,
                                   fp8=fp8, fp8_scaling=fp8_scaling, **options)

    @classmethod
    def from_state_dict(
        cls,
        state: dict[str, torch.Tensor],
        config: BertQAConfig,
        device: str = "cuda",
        dtype: str = "float16",
        *,
        fp8: bool = False,
        fp8_scaling: str = "rows",
        **options: object,
    ) -> FusedEngine:
        """Build from in-memory tensors (e.g. a live HF model's ``state_dict()``)."""
        torch_dtype, fp8 = parse_dtype(dtype, fp8)
        if fp8_scaling not in ("rows", "blocks"):
            raise ValueError(f"fp8_scaling must be 'rows' or 'blocks', got {fp8_scaling!r}")
        weights = pack_weights(state, config, device, torch_dtype, fp8,
                               fp8_blocks=fp8_scaling == "blocks")
        return cls(weights, device, **options)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ forward

    def _forward(self, ids: torch.Tensor, tt: torch.Tensor, pos: torch.Tensor, cu: torch.Tensor,
                 n_seqs: int, max_seqlen: int, stage: bool = False) -> torch.Tensor:
        recorder = self._recorder  # the caller holds the lock
        if recorder is not None:  # un-quantized, FFN1 unfused: every activation seen
            opts = replace(self.options, fp8_min_tokens=1 << 62,
                           fp8_calibrated_min_tokens=1 << 62, small_batch_max_tokens=None,
                           ffn1_fused_max_tokens=None)
            real = int(cu[-1])  # rows past the last sequence hold no token: not recorded
            logits = torch.zeros((2, ids.shape[0]), device=ids.device, dtype=torch.float32)
            logits[:, :real] = encode_packed(
                self.weights, recorder, ids[:real], tt[:real], pos[:real], cu,  # type: ignore[arg-type]
                n_seqs, max_seqlen, opts)
            return logits
        return encode_packed(self.weights, self.ops, ids, tt, pos, cu, n_seqs, max_seqlen,
                             self.options, stage)

    def _check_calibratable(self) -> None:
        if not self.fp8 or self.weights.fp8_blocks:
            raise ValueError("calibration needs an FP8 engine with row-wise scales "
                             "(dtype='fp8', fp8_scaling='rows')")
        if self.device.type == "cuda":
            from engine.fused import cublaslt

            if not cublaslt.available():
                raise RuntimeError("calibrated FP8 needs cuBLASLt and an sm_89+ GPU")

    def load_calibration(self, calibration: Calibration) -> None:
        """Use these static FP8 scales from now on (graphs are re-captured)."""
        self._check_calibratable()
        layers = calibration.layers_for(self.weights)
        deferred = calibration.deferred_for(self.weights)
        options = self.options
        if self._int8_auto:
            options = replace(options, int8_gemms=auto_int8_gemms(
                calibration, self.fp8, options.fp8_static_inputs, self.device))
        int8 = calibration.int8_for(self.weights) if options.int8_gemms else None
        with self._lock:
            self.weights = replace(self.weights, calibrated=layers, folded8=deferred,
                                   int8=int8)
            self.options = options
            self.calibration = calibration
            if self._graphs is not None:
                # A call may have left a graph running (no sync): it must not outlive
                # the graphs and their memory.
                torch.cuda.synchronize(self.device)
                self._graphs = self._new_graphs()

    def save_calibration(self, path: Path) -> None:
        """Write the calibration in use as JSON (:meth:`load_calibration`'s input)."""
        if self.calibration is None:
            raise ValueError("this engine has no calibration to save: calibrate it "
                             "(calibrating()) or build it with fp8_calibration=")
        self.calibration.save(Path(path))

    @contextmanager
    def calibrating(self, margin: float = CALIBRATION_MARGIN,
                    gptq: bool = False) -> Iterator[None]:
        """Calibrate static FP8 scales on the batches inferred inside the block (any entry
        point; e.g. a few hundred windows of real text), then use them.

        Inside, passes run un-quantized and without graphs, and record the magnitudes of
        every FP8 GEMM's input per layer; on leaving, the large path quantizes the inputs
        named in ``fp8_static_inputs`` with per-tensor scales from
        ``fp8_calibrated_min_tokens`` tokens up (with FFN1's and FFN2's both static, FFN1 +
        bias + GELU + e4m3 is one cuBLASLt GEMM; ``engine.fused.fp8``, "Calibrated"), and
        the graphs are re-captured. Needs FP8 weights with row-wise scales. With ``gptq``
        the passes also record each GEMM's input Gram matrix and the calibrated weights
        are rounded by GPTQ rather than to nearest (``engine.fused.gptq``; same format and
        scales, so the same speed)."""
        self._check_calibratable()  # before the passes, not after them
        with self._lock:  # every pass holds the lock: none sees half a switch
            if self._recorder is not None:
                raise RuntimeError("this engine is already calibrating")
            recorder = self._recorder = AmaxRecorder(
                self.ops, replace(self.weights, calibrated=None, folded8=None, int8=None),
                grams=gptq)
        try:
            yield
        finally:
            with self._lock:
                self._recorder = None
        self.load_calibration(recorder.calibration(margin))

    def calibrate(self, input_ids: Int32Array, attention_mask: Int32Array,
                  token_type_ids: Int32Array, margin: float = CALIBRATION_MARGIN) -> None:
        """:meth:`calibrating` over these ``[windows, seq]`` batches."""
        with self.calibrating(margin):
            self.infer(input_ids, attention_mask, token_type_ids)

    def _graph_bucket(self, tokens: int, seqs: int, max_seqlen: int) -> Bucket | None:
        if self._graphs is None or tokens > self.max_graph_tokens or self._recorder is not None:
            return None
        bucket = bucket_for(tokens, seqs, max_seqlen, self.graph_buckets_per_octave)
        return bucket if self._graphs.can_serve(bucket) else None

    def capture(self, tokens: int, seqs: int, max_seqlen: int) -> None:
        """Capture the graph of this batch size ahead of traffic (no-op without graphs)."""
        with self._lock, torch.inference_mode():
            bucket = self._graph_bucket(tokens, seqs, max_seqlen)
            if bucket is not None and self._graphs is not None:
                self._graphs.inputs(bucket)

    def _run_host(self, p: PackedHost) -> Float32Array:
        """Logits [2, T] on the host of a host-packed batch, valid until the next call (a
        graph's pinned output: copy what you keep); caller holds the lock."""
        t, b = p.tokens, p.seqs
        bucket = self._graph_bucket(t, b, p.max_seqlen)
        if bucket is not None and self._graphs is not None:
            return self._graphs.run_host(bucket, p.input_ids, p.token_type_ids,
                                         p.position_ids, p.cu_seqlens)
        flat = np.concatenate([p.input_ids, p.token_type_ids, p.position_ids, p.cu_seqlens])
        dev = torch.from_numpy(flat).to(self.device)
        ids, tt, pos, cu = dev[:t], dev[t : 2 * t], dev[2 * t : 3 * t], dev[3 * t :]
        logits: Float32Array = self._forward(ids, tt, pos, cu, b, p.max_seqlen).cpu().numpy()
        return logits

    def _run_device(self, ids: torch.Tensor, tt: torch.Tensor, pos: torch.Tensor,
                    cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """Logits [2, T] (fresh; it may be a view of a wider tensor) of packed int32 device
        tensors."""
        t, b = ids.shape[0], cu.shape[0] - 1
        with self._lock:
            graphs = self._graphs
            if graphs is not None and self._recorder is None:
                # A batch size already replayed into a bucket that stages itself: the
                # same bucket, without the lookup (~0.7 µs of the call's path), and on
                # the compiled path no Python before the launch (2.5-3 µs, v35) unless the
                # call needs the checked path (another stream, a misfit: None).
                route = graphs.routes.get((t, b, max_seqlen))
                if route is not None:
                    known, fast = route
                    if fast is not None:
                        logits: torch.Tensor | None = fast.call(ids, tt, pos, cu,
                                                                graphs.last_stream)
                        if logits is not None:
                            return logits
                    return graphs.replay_into(known, ids, tt, pos, cu)
            with torch.inference_mode():  # captures and eager passes
                bucket = self._graph_bucket(t, b, max_seqlen)
                if bucket is None or graphs is None:
                    return self._forward(ids, tt, pos, cu, b, max_seqlen)
                if graphs.stages_itself(bucket):  # one launch, nothing around it
                    logits = graphs.replay_into(bucket, ids, tt, pos, cu)
                    graphs.remember_route((t, b, max_seqlen), bucket)
                    return logits
                # Rows past t keep earlier batches' (valid) tokens: they belong to no
                # sequence.
                self.ops.stage_inputs(graphs.inputs(bucket), bucket.tokens, ids, tt, pos, cu)
                return graphs.replay(bucket)[:, :t].clone()

    def _check_host(self, p: PackedHost) -> None:
        cfg = self.config
        if p.tokens == 0:
            return
        # One pass per array: seen as unsigned, a negative id lies past any upper bound.
        if int(p.input_ids.view(np.uint32).max()) >= cfg.vocab_size:
            raise ValueError(f"input_ids must lie in [0, {cfg.vocab_size})")
        if int(p.token_type_ids.view(np.uint32).max()) >= cfg.type_vocab_size:
            raise ValueError(f"token_type_ids must lie in [0, {cfg.type_vocab_size})")
        if (p.keep.shape[1] > cfg.max_position_embeddings  # else no position can be too large
                and p.position_ids.max() >= cfg.max_position_embeddings):
            raise ValueError(f"sequences longer than {cfg.max_position_embeddings} tokens")

    # ------------------------------------------------------------------ public API

    def infer(
        self, input_ids: Int32Array, attention_mask: Int32Array, token_type_ids: Int32Array
    ) -> tuple[Float32Array, Float32Array]:
        """Start and end logits, float32 ``[windows, seq]``; ``PAD_LOGIT`` where mask is 0."""
        ids = np.asarray(input_ids)
        mask = np.asarray(attention_mask)
        tt = np.asarray(token_type_ids)
        start = np.full(ids.shape, PAD_LOGIT, dtype=np.float32)
        end = np.full(ids.shape, PAD_LOGIT, dtype=np.float32)
        if ids.size == 0:
            return start, end
        # Counted on the mask itself: pack_padded makes the boolean mask, once per chunk.
        chunks = ([slice(None)] if np.count_nonzero(mask) <= self.max_tokens_per_pass
                  else chunks_by_tokens(np.count_nonzero(mask, axis=1),
                                        self.max_tokens_per_pass))
        for rows in chunks:
            p = pack_padded(ids[rows], mask[rows], tt[rows])
            if p.tokens == 0:
                continue
            self._check_host(p)
            with self._lock, torch.inference_mode():
                logits = self._run_host(p)
                start[rows][p.keep] = logits[0]  # under the lock: the next call reuses it
                end[rows][p.keep] = logits[1]
        return start, end

    def infer_packed(
        self,
        input_ids_flat: torch.Tensor,
        token_type_ids_flat: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits float32 ``[T]`` of packed sequences, on the engine's device.

        ``input_ids_flat``/``token_type_ids_flat`` [T] hold every sequence's tokens back to
        back; sequence ``b`` is ``cu_seqlens[b]:cu_seqlens[b+1]`` (int, [B + 1], starting at
        0); ``max_seqlen`` >= the longest sequence (over-stating it is safe). Position ids
        restart at 0 in each sequence: computed from ``cu_seqlens`` (for one sequence a
        view of a kept ``arange``; for several one kernel, ~30 µs of host time), or
        ``position_ids`` [T] as given (not checked against ``cu_seqlens``). Contiguous
        int32 tensors on the engine's device are used as they are; others are converted
        (a copy each). Values are not range-checked (that would need a device sync): ids
        must be < vocab size, and given positions < max positions (computed ones are kept
        there). The logits may be inference tensors (made under ``torch.inference_mode``
        by an earlier call): clone them before changing them in place.
        """
        dev = self._tensor_device
        # Contiguous: the graph's first kernel (or the staging kernel) reads them as flat
        # arrays.
        ids = _int32_on(input_ids_flat, dev)
        tt = _int32_on(token_type_ids_flat, dev)
        cu = _int32_on(cu_seqlens, dev)
        if position_ids is None:
            pos = self._positions(cu, ids.shape[0])
        else:
            pos = _int32_on(position_ids, dev)
            if pos.shape != ids.shape:
                raise ValueError(f"position_ids has shape {tuple(pos.shape)}, the tokens "
                                 f"{tuple(ids.shape)}")
        # No inference mode around a call that has its graph already (``_run_device``
        # enters it for the others): it costs the call's path ~1.5 µs.
        start, end = self._run_device(ids, tt, pos, cu, max_seqlen).unbind(0)
        return start, end

    def _positions(self, cu: torch.Tensor, tokens: int) -> torch.Tensor:
        """Position ids [``tokens``] of the packed sequences that ``cu`` bounds, each in
        the position table: one sequence's are a view of a kept ``arange`` (no launch:
        the kernel's launch costs ~27-38 µs of host time, v35), several sequences' come
        from one kernel."""
        longest = self.config.max_position_embeddings
        if cu.shape[0] != 2 or tokens > longest:
            positions: torch.Tensor = self.ops.packed_positions(cu, tokens, longest)
            return positions
        return self._counting[:tokens]

    def infer_torch(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`infer` on torch ``[windows, seq]`` tensors; results on the inputs' device.

        CUDA inputs are packed on the GPU (one sync, for the token count); CPU inputs go
        through the numpy path.
        """
        if not input_ids.is_cuda:
            s, e = self.infer(input_ids.numpy(), attention_mask.numpy(), token_type_ids.numpy())
            return torch.from_numpy(s), torch.from_numpy(e)
        w, seq = input_ids.shape
        with torch.inference_mode():
            keep = attention_mask != 0
            rows, cols = keep.nonzero(as_tuple=True)
            cu = torch.zeros(w + 1, dtype=torch.int32, device=input_ids.device)
            cu[1:] = torch.cumsum(keep.sum(dim=1), 0)
            logits = self._run_device(
                input_ids[rows, cols].to(self.device, torch.int32),
                token_type_ids[rows, cols].to(self.device, torch.int32),
                cols.to(self.device, torch.int32),
                cu.to(self.device),
                seq,
            ).to(input_ids.device)
            start = torch.full((w, seq), PAD_LOGIT, dtype=torch.float32, device=input_ids.device)
            end = torch.full_like(start, PAD_LOGIT)
            start[rows, cols] = logits[0]
            end[rows, cols] = logits[1]
        return start, end
