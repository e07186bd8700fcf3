"""The mix pass against the cuBLAS(Lt) workspace: with one, Hopper's GEMM kernels schedule
their tiles dynamically and zero a counter before each launch (a memset node before every
GEMM, ~5 µs of step each in the pass's trace); with none, cuBLAS(Lt) picks statically
scheduled kernels and no memset runs.

    python3 benchmarks/gemm_workspace.py --rounds 2 --out ws.json

Configurations, each in a process of its own (torch reads ``CUBLAS_WORKSPACE_CONFIG`` when
it creates its cuBLAS handle), taken in turn for ``--rounds`` rounds:

* ``default``: the engine's 32 MiB cuBLASLt workspace, torch's default for its fp16 GEMM;
* ``lt0``: no workspace for the engine's cuBLASLt FP8 GEMMs (``cublaslt._WORKSPACE_BYTES``
  = 0, plans remade after calibration);
* ``lt0_torch0``: that, and none for torch's cuBLAS (``CUBLAS_WORKSPACE_CONFIG=:0:0``, the
  out-projection).

Each process builds the calibrated FP8 BERT-large mix engine (``bench_gpu.mix_engine``),
counts the memsets of one profiled eager pass over 256 SQuAD-dev-length windows, names its
GEMM kernels, and times 3 x 12 passes (windows/s from the best). Random weights.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "lt0": {"LT_WORKSPACE_BYTES": "0"},
    "lt0_torch0": {"LT_WORKSPACE_BYTES": "0", "CUBLAS_WORKSPACE_CONFIG": ":0:0"},
}


def child(windows: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows
    from benchmarks.rounds import wall_ms
    from engine.fused import cublaslt

    if "LT_WORKSPACE_BYTES" in os.environ:
        cublaslt._WORKSPACE_BYTES = int(os.environ["LT_WORKSPACE_BYTES"])
    engine = mix_engine("bert-large")
    cublaslt.clear_plans()  # plans (and their algorithms) for this workspace size
    rng = np.random.default_rng(3)
    batches = [device_packed(*mix_windows(rng, windows)) for _ in range(4)]
    with torch.inference_mode():
        for i in range(3):
            engine._run_device(*batches[i])
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine._run_device(*batches[1])
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]

        def twelve() -> None:
            for i in range(12):
                engine._run_device(*batches[i % 4])

        rounds = [wall_ms(twelve, 1) / 12 for _ in range(3)]
    return {"memsets": sum("memset" in n.lower() for n in names),
            "gemm_kernels": sorted({n for n in names if "nvjet" in n or "gemm" in n.lower()}),
            "ms_rounds": rounds, "windows_per_s": windows / min(rounds) * 1e3}


def child_env(name: str) -> dict[str, str]:
    """This process's environment with configuration ``name``'s settings, and none of the
    others' (a variable set in the caller's shell would otherwise leak into the default)."""
    env = {k: v for k, v in os.environ.items()
           if k not in {key for c in CONFIGS.values() for key in c}}
    return {**env, **CONFIGS[name]}


def run_child(name: str, windows: int) -> dict[str, Any]:
    """One configuration's measurement in a process of its own (errors reported, not raised)."""
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", "--windows", str(windows)],
            env=child_env(name), capture_output=True, text=True, timeout=300, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 300 s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": proc.stderr[-600:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.windows)))
        return
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        p.error(f"--configs: unknown {sorted(unknown)}, choose from {list(CONFIGS)}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.configs.split(",")}
    for r in range(args.rounds):
        for name in runs:
            result = run_child(name, args.windows)
            runs[name].append(result)
            print(f"round {r + 1} {name}: {result.get('windows_per_s', result)} windows/s, "
                  f"{result.get('memsets')} memsets", flush=True)
            if args.out:
                args.out.write_text(json.dumps({"windows": args.windows, "runs": runs},
                                               indent=1))
    print("| configuration | memsets per pass | windows/s per round |")
    print("|---|---|---|")
    for name, results in runs.items():
        rates = ", ".join(f"{r['windows_per_s']:.0f}" for r in results if "windows_per_s" in r)
        memsets = {r.get("memsets") for r in results}
        print(f"| {name} | {', '.join(map(str, memsets))} | {rates} |")


if __name__ == "__main__":
    main()
