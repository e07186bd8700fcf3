"""Fused-kernel GPU BERT encoder for extractive QA (padding-free, CUDA graphs, optional FP8).

Modules, one job each:

- ``config``     the checkpoint's ``config.json`` -> :class:`~engine.fused.config.BertQAConfig`
- ``weights``    safetensors -> re-packed weights (fused QKV, optional FP8 copies)
- ``fp8``        e4m3 quantization and row-scaled FP8 GEMMs (``torch._scaled_mm``)
- ``packing``    padded ``[windows, seq]`` batches -> packed tokens + ``cu_seqlens``; buckets
- ``kernels``    the OpenAI-Triton kernels and their launchers
- ``torch_ops``  the same operations in plain PyTorch: the readable spec and the CPU path
- ``encoder``    the forward pass over packed tokens, written once against either op set
- ``graphs``     CUDA-graph capture and replay per token/sequence bucket
- ``engine``     :class:`~engine.fused.engine.FusedEngine`, the ``QAEngine`` implementation

Importing this package does no work and imports neither torch nor triton. Design notes,
the roofline floors and each version's measurements: ``NOTES.md`` beside this file.
"""
