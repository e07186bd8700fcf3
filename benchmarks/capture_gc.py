"""Does freeing a CUDA graph inside another graph's capture invalidate that capture?

    python benchmarks/capture_gc.py [--guard]

The hypothesis behind two unexplained GPU-suite failures (engine/fused/NOTES.md v23,
v24: "operation failed due to a previous error during capture" in a full run, passing
alone): a dropped engine's graphs live in a reference cycle until the cyclic garbage
collector frees them, and torch no longer collects before a capture, so a collection can
destroy a graph (and release its memory) in the middle of another one's capture. Here
an engine with a captured graph is dropped into its cycle, then a second engine
captures while one forced collection runs inside its capture (the first forward of the
capture calls ``gc.collect()``). Without ``--guard`` the collection runs as written;
with it, ``gc.collect`` is replaced by the automatic collector's own check, which the
graph cache now keeps off while it captures, i.e. what an automatic collection would
do. Prints whether the capture succeeded and the logits' difference from eager.
Checkpoint: the shipped MiniLM (fp16).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--guard", action="store_true",
                   help="collect only if automatic collection is on (as a threshold would)")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch

    import engine.fused.engine as fe
    from engine.fused.engine import FusedEngine

    eager = FusedEngine.from_pretrained(REPO / "models" / "minilm-l6-squad", device="cuda",
                                        dtype="float16", cuda_graphs=False)
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 30000, (2, 160)).astype(np.int32)
    mask, tt = np.ones_like(ids), np.zeros_like(ids)
    old = FusedEngine(eager.weights, "cuda")
    old.infer(ids, mask, tt)  # captures a graph
    del old  # garbage in a cycle: freed by the next full collection
    gc.disable()  # so that nothing collects it before the capture does

    real_encode = fe.encode_packed
    fired = []

    def encode(*a: object, **kw: object) -> object:
        if torch.cuda.is_current_stream_capturing() and not fired:
            fired.append(gc.isenabled())
            if not args.guard or gc.isenabled():
                gc.collect()
        return real_encode(*a, **kw)  # type: ignore[arg-type]

    fe.encode_packed = encode  # type: ignore[assignment]
    if args.guard:
        gc.enable()  # the graph cache turns it off around its capture
    new = FusedEngine(eager.weights, "cuda")
    try:
        start, end = new.infer(ids, mask, tt)
    except Exception as exc:  # the outcome being measured
        print(f"capture FAILED (collection inside it: {fired}): {exc!r}"[:400])
        return
    finally:
        fe.encode_packed = real_encode
    want = eager.infer(ids, mask, tt)
    print(f"capture succeeded (collection enabled inside it: {fired}); max |diff| vs eager "
          f"{max(np.abs(start - want[0]).max(), np.abs(end - want[1]).max()):.2e}")


if __name__ == "__main__":
    main()
