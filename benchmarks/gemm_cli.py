"""What the GEMM micro-benchmarks (``cublaslt_fp8``, ``fp8_gemm_tuning``, ``fp8_scaling``,
``cublaslt_search``) share: BERT-large's GEMM shapes, their command line
(``--tokens``/``--replays``/``--out``) and the head of their result JSON (GPU, torch,
tokens, date)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

# (N, K) of BERT-large's GEMMs, by the names calibration.GEMMS uses for their inputs' order.
BERT_LARGE_GEMMS = {"qkv": (3072, 1024), "out": (1024, 1024), "ffn1": (4096, 1024),
                    "ffn2": (1024, 4096)}


def parse_args(doc: str | None, tokens: int, argv: list[str] | None = None) -> argparse.Namespace:
    """``--tokens`` (default ``tokens``: the SQuAD mix of 256), ``--replays`` (CUDA-graph
    replays per timing) and ``--out`` (JSON, rewritten after every GEMM)."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=tokens)
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def header(tokens: int) -> dict[str, Any]:
    """The result JSON's first fields: where and when it was measured."""
    import torch

    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "tokens": tokens, "date": time.strftime("%Y-%m-%d")}
