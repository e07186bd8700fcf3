"""Attention alone on the BERT-large SQuAD mix, in each output form the encoder launches:
16-bit (the default's context, read by the 16-bit out-projection), e4m3 (a static
out-projection input) and int8 (``int8_gemms`` with the out-projection: per-column
multipliers).

    python3 benchmarks/attn_out_forms.py --out attn.json [--rounds 7 --calls 24 --vectors 0,8]

In the settled mix pass the int8 form took ~43 µs a layer more than the 16-bit one
(``engine/fused/NOTES.md`` v51) although it writes half the bytes. This times the forms
alone on the same packed batch (the mix's 256 windows, ``mix_settings.py``'s seed) as the
large pass launches them (tile list, no PDL): ``--calls`` back-to-back calls replayed from
one CUDA graph, the forms taking turns for ``--rounds`` rounds so that clock drift hits
them alike. The 8-bit forms run under each of ``--vectors``, the bytes a thread stores at
once (``attention.ATTN_OUT8_VECTOR``; 0: the compiler's choice), named e.g. ``int8 v8``.
Prints µs a call per form (median over rounds, and each round's) against the 16-bit form,
the compiled forms' registers, spills and shared memory, and the SM clock and power over
the run (``gpu_clocks``). Random QKV activations (the values do not change the work).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def compiled_stats(kernel: Any) -> list[dict[str, Any]]:
    """Registers, spills and shared bytes of each compiled specialization of a Triton JIT
    function (triton 3.x ``device_caches``); empty where that API is absent."""
    out = []
    for caches in getattr(kernel, "device_caches", {}).values():
        for compiled in caches[0].values():
            meta = getattr(compiled, "metadata", None)
            out.append({"registers": getattr(compiled, "n_regs", None),
                        "spills": getattr(compiled, "n_spills", None),
                        "shared_bytes": getattr(meta, "shared", None)})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=24, help="calls a graph replay (a layer each)")
    p.add_argument("--vectors", default="0,8",
                   help="ATTN_OUT8_VECTOR values for the 8-bit forms (0: the compiler's)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))

    import numpy as np
    import torch

    from benchmarks.bench_gpu import MODELS, device_packed, mix_windows
    from benchmarks.gpu_clocks import ClockSampler, clock_fields, torch_gpu_id
    from benchmarks.rounds import capture_graph, interleaved
    from engine.fused import kernels as k
    from engine.fused.kernels import attention as attn

    cfg = MODELS["bert-large"]
    d, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    _ids, _tt, _pos, cu, max_len = device_packed(
        *mix_windows(np.random.default_rng(3), args.windows))
    t, seqs = _ids.shape[0], cu.shape[0] - 1
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(t, 3 * d, device="cuda", dtype=torch.float16, generator=g)
    bias = torch.randn(3 * d, device="cuda", dtype=torch.float16, generator=g) * 0.1
    tiles = k.attention_tiles(cu, t, seqs, max_len, heads, d // heads)
    ref = k.attention_varlen(qkv, bias, cu, max_len, seqs, heads, tiles=tiles)
    amax = ref.float().abs().amax(dim=0).clamp_min(1e-6)
    extra: dict[str, dict[str, Any]] = {
        "16-bit": {},
        "e4m3": {"fp8_scale": (ref.float().abs().max() / 448).reshape(1)},
        "int8": {"int8_mult": (127 / amax).float().contiguous()},
    }

    def call(form: str) -> None:
        k.attention_varlen(qkv, bias, cu, max_len, seqs, heads, tiles=tiles, **extra[form])

    vectors = [int(v) for v in args.vectors.split(",")]
    graphs = {}
    for form, vec in [("16-bit", 0), *((f, v) for v in vectors for f in ("e4m3", "int8"))]:
        attn.ATTN_OUT8_VECTOR = vec or None  # read at capture
        name = form if form == "16-bit" else f"{form} v{vec}"
        graphs[name] = capture_graph(
            lambda form=form: [call(form) for _ in range(args.calls)], 1, warm=1)
    with ClockSampler(gpu=torch_gpu_id()) as sampler:
        start = sampler.now()
        replay_ms = interleaved({f: g.replay for f, g in graphs.items()}, args.rounds, reps=5)
        window = (start, sampler.now())
    rounds = {f: [ms * 1e3 / args.calls for ms in r] for f, r in replay_ms.items()}
    clocks = clock_fields(sampler.between(*window))
    base = statistics.median(rounds["16-bit"])
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(), "tokens": t, "windows": seqs,
        "calls_a_replay": args.calls, "clocks": clocks, "vectors": vectors,
        "forms": {f: {"us_median": statistics.median(r), "us_rounds": r,
                      "vs_16bit": statistics.median(r) / base - 1} for f, r in rounds.items()},
        "compiled": compiled_stats(attn._attn_varlen_kernel),
    }
    print(f"attention alone, BERT-large mix ({t} tokens, {seqs} windows), "
          f"{result['gpu']}, {clocks or 'unsampled: ' + str(sampler.missing)}")
    print(f"{'form':10} {'µs a call':>10} {'vs 16-bit':>10}  rounds")
    for f, v in result["forms"].items():
        print(f"{f:10} {v['us_median']:10.1f} {v['vs_16bit']:+10.1%}  "
              + " ".join(f"{x:.1f}" for x in v["us_rounds"]))
    for c in result["compiled"]:
        print(f"compiled: {c}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
