"""How far the fused engine's Triton kernels drift from its torch op set on the same GPU, for
the calibrated e4m3 default and for ``int8_gemms`` (Hopper only; shipped MiniLM, random
tokens).

    python3 benchmarks/int8_drift.py [--windows 40] [--seq 300]

Both forms round the same operands with the same scales, yet one rounding that lands the
other way early in the pass (a tie, an accumulation order) moves every later one, so the two
forms of one scheme differ by far more than a rounding step: this measures by how much, so
that a test can bound the int8 engine's drift by the e4m3 default's own (``tests/gpu``
``test_int8_gemms_parity``; ``engine/fused/NOTES.md`` v51). Also the Gluon int8 GEMM against
float math on the same int8 operands inside one engine. Prints max and mean |logit
difference| over the real tokens.
"""

from __future__ import annotations

import argparse
from typing import Any


def _gap(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[float, float]:
    import numpy as np

    return (max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True)),
            float(np.mean([np.abs(x - y).mean() for x, y in zip(a, b, strict=True)])))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=40)
    p.add_argument("--seq", type=int, default=300)
    args = p.parse_args(argv)
    import numpy as np
    import torch
    from rich.console import Console
    from rich.table import Table

    from engine.config import REPO_ROOT
    from engine.fused import int8
    from engine.fused.engine import FusedEngine

    rng = np.random.default_rng(3)

    def batch(windows: int, seq: int) -> tuple[Any, Any, Any]:
        ids = rng.integers(1000, 20000, (windows, seq)).astype(np.int32)
        ids[:, 0] = 101
        tt = (np.arange(seq)[None] >= seq // 3).astype(np.int32).repeat(windows, 0)
        return ids, np.ones_like(ids), tt

    base = FusedEngine.from_pretrained(REPO_ROOT / "models" / "minilm-l6-squad", device="cuda",
                                       dtype="fp8", cuda_graphs=False)
    base.calibrate(*batch(16, 256))
    x = batch(args.windows, args.seq)
    table = Table(title=f"kernels against the torch op set, {torch.cuda.get_device_name()}, "
                        f"{args.windows} windows of {args.seq}")
    for col in ("scheme", "compared with", "max |d|", "mean |d|"):
        table.add_column(col)
    for name, gemms in (("e4m3 (MiniLM's default)", None), ("int8 out-proj + FFN1", "attn_out,ffn_in")):
        fused = FusedEngine(base.weights, "cuda", cuda_graphs=False, int8_gemms=gemms,
                            fp8_calibration=base.calibration)
        spec = FusedEngine(fused.weights, "cuda", backend="torch", cuda_graphs=False,
                           int8_gemms=gemms)
        out = fused.infer(*x)
        table.add_row(name, "torch op set", *(f"{v:.4f}" for v in _gap(out, spec.infer(*x))))
        if gemms:
            real = int8._gluon_takes
            int8._gluon_takes = lambda *a: False  # type: ignore[assignment]  # float math
            try:
                floats = fused.infer(*x)
            finally:
                int8._gluon_takes = real  # type: ignore[assignment]
            table.add_row(name, "its GEMMs as float math", *(f"{v:.4f}" for v in _gap(out, floats)))
    Console().print(table)


if __name__ == "__main__":
    main()
