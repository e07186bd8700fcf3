"""The fused encoder's OpenAI-Triton kernels, and launchers over torch tensors.

Every kernel computes in float32 and reads/writes whatever float dtype its tensors have
(fp16, bf16, fp32; e4m3 for the optional FP8 copies):

==========================  ==================================================================
``embed_layernorm``          word + position + token-type gather, sum, LayerNorm (+ FP8 copy)
``attention_varlen``         QKV bias, scaled QK^T, online softmax, PV over packed sequences
``attention_tiles``          the query blocks of a batch as a list (no idle programs)
``bias_gelu``                FFN bias + exact (erf) GELU (+ FP8 copy instead of the fp16 one)
``bias_residual_layernorm``  projection bias + residual add + LayerNorm (+ FP8 copy), summing
                             split-K partials when the GEMM left them
``..._qa``                   the same for the last layer, dotted with the 2-row QA head
``linear``                   a GEMM with a bias / GELU epilogue or split-K partials: FFN1 for
                             few tokens, and every GEMM of the small-batch path (``matmul``)
``embed_sum``                the embeddings' sum without LayerNorm, with row sums (``deferred``)
``folded_linear``            a GEMM reading un-normalised rows, the LayerNorm before it folded in
``residual_linear``          a GEMM + bias + LayerNorm'd residual, stored or added atomically
``layernorm_qa``             LayerNorm + QA head (the deferred path's last step; ``deferred``)
``stage_inputs``             a batch into a CUDA graph's input buffer, in one launch
``packed_positions``         packed sequences' position ids from their offsets, in one launch
``encode_persistent``        the whole encoder of a small batch as one persistent kernel
                             whose phases are the tasks above (``persistent``)
==========================  ==================================================================

Modules: ``common`` (shared jit helpers, PDL), ``rows`` (row-wise kernels), ``attention``,
``matmul``, ``deferred``, ``persistent``, ``staging``; and ``gluon_gemm``, not imported
here: 8-bit GEMMs (the calibrated FFN1, the INT8 study's) as a warp-specialized Gluon
kernel (Hopper only, no interpreter path; FFN1 opt-in through
``fp8.FFN1_GLUON_MIN_ROWS``). Launchers never
synchronise with the device and take every size from the host, so a whole forward pass
can be captured in a CUDA graph.
Each takes ``pdl``: launch with programmatic dependent launch (see ``common``). With
``TRITON_INTERPRET=1`` set before this package is imported, the same kernels run on CPU
tensors (for CI). ``engine.fused.torch_ops`` holds the plain-PyTorch spec of each
launcher, same signature.
"""

from engine.fused.kernels.attention import (
    ATTN_LARGE,
    ATTN_LARGE_MEAN,
    ATTN_SMALL,
    AttnTiles,
    attention_config,
    attention_tiles,
    attention_varlen,
)
from engine.fused.kernels.common import pdl_available
from engine.fused.kernels.deferred import (
    deferred_plan,
    embed_sum,
    folded_linear,
    layernorm_qa,
    residual_linear,
)
from engine.fused.kernels.matmul import (
    GEMM_LARGE,
    GEMM_SMALL,
    GemmConfig,
    gemm_config,
    gemm_supported,
    linear,
    small_batch_plan,
)
from engine.fused.kernels.persistent import encode_persistent, persistent_supported
from engine.fused.kernels.rows import (
    STAGE_ARGS,
    bias_gelu,
    bias_residual_layernorm,
    bias_residual_layernorm_qa,
    embed_layernorm,
    layernorm_quant,
)
from engine.fused.kernels.staging import packed_positions, stage_inputs

__all__ = [
    "ATTN_LARGE",
    "ATTN_LARGE_MEAN",
    "ATTN_SMALL",
    "GEMM_LARGE",
    "GEMM_SMALL",
    "STAGE_ARGS",
    "AttnTiles",
    "GemmConfig",
    "attention_config",
    "attention_tiles",
    "attention_varlen",
    "bias_gelu",
    "bias_residual_layernorm",
    "bias_residual_layernorm_qa",
    "deferred_plan",
    "embed_layernorm",
    "embed_sum",
    "encode_persistent",
    "folded_linear",
    "gemm_config",
    "gemm_supported",
    "layernorm_qa",
    "layernorm_quant",
    "linear",
    "packed_positions",
    "pdl_available",
    "persistent_supported",
    "residual_linear",
    "small_batch_plan",
    "stage_inputs",
]
