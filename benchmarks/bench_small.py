"""Small-batch path sweep for ``bench_gpu.py`` (section ``small``): tiles and K splits of
each Triton GEMM, then whole passes with the best plans.

Per model and batch-1 shape, each of the four GEMMs (QKV, attention output, FFN1, FFN2)
runs as a chain over many weight copies (more bytes than L2 holds, so weights stream from
HBM as in a real pass), captured in one CUDA graph, with PDL and the L2 weight prefetch
as the engine launches it. GEMMs whose output is split-K partials are timed together with
the residual-LayerNorm kernel that sums them, since more splits cost that kernel more
reads. cuBLAS (``torch.mm`` + the same consumer) is timed alongside. Then whole forward
passes compare the engine's default plan, the sweep's best plan, and the large-batch path
(cuBLAS GEMMs, the v3 default), all on the same inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

L2_DEFEAT_BYTES = 160e6  # > 2x the H200's 60 MB L2
SHAPES = [("bert-base", 1, 128), ("bert-base", 1, 192), ("bert-base", 1, 256),
          ("bert-base", 1, 384), ("bert-large", 1, 128), ("bert-large", 1, 192),
          ("bert-large", 1, 256), ("bert-large", 1, 384)]
STORE_CONFIGS = [(64, 64, 64, 4, 4), (128, 64, 64, 4, 4), (64, 32, 64, 4, 4),
                 (128, 32, 64, 4, 4), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3),
                 (64, 64, 128, 4, 3),
                 # TMA loads (sixth entry 1)
                 (64, 64, 128, 4, 3, 1), (64, 64, 64, 4, 4, 1), (128, 64, 64, 4, 4, 1),
                 (64, 128, 64, 4, 4, 1), (128, 128, 64, 4, 4, 1), (128, 128, 64, 8, 4, 1),
                 (128, 256, 64, 8, 3, 1)]
PARTIAL_CONFIGS = [(64, 64, 64, 4, 4), (128, 64, 64, 4, 4), (128, 32, 64, 4, 4),
                   (64, 32, 64, 4, 4), (64, 64, 64, 4, 4, 1), (128, 64, 64, 4, 4, 1),
                   (128, 128, 64, 4, 4, 1), (128, 128, 64, 8, 4, 1)]
SPLITS = [1, 2, 3, 4, 6, 8, 12]
# ``--small-set tma``: the few tiles that test TMA loads against the pointer-load plan
TMA_STORE_CONFIGS = [(128, 64, 64, 4, 4), (64, 64, 128, 4, 3), (128, 64, 64, 4, 4, 1),
                     (64, 64, 128, 4, 3, 1), (128, 128, 64, 4, 4, 1), (128, 128, 64, 8, 4, 1),
                     (64, 128, 64, 4, 4, 1)]
TMA_PARTIAL_CONFIGS = [(128, 64, 64, 4, 4), (128, 64, 64, 4, 4, 1), (128, 128, 64, 4, 4, 1),
                       (64, 64, 64, 4, 4, 1)]
TMA_SPLITS = [1, 2, 4, 8]


def _key(config: tuple[int, ...], splits: int) -> str:
    from benchmarks.bench_gpu import gemm_key

    return f"{gemm_key(config)} k/{splits}"


def _shapes(spec: str | None) -> list[tuple[str, int, int]]:
    from benchmarks.bench_gpu import parse_shapes

    return parse_shapes(spec) if spec else SHAPES


def section_small_sweep(res: dict[str, Any], deadline: float, sweep: bool = True,
                        shapes: str | None = None, focus: str | None = None,
                        save: Callable[[], None] = lambda: None) -> None:
    """``focus="tma"``: the TMA tile set, and whole passes of the default path, the large
    path and the best plans only. ``save`` runs after every GEMM and every shape (so a run
    cut short by its time limit keeps what it measured)."""
    import time

    import numpy as np
    import torch

    from benchmarks.bench_gpu import (
        MODELS,
        device_packed,
        graph_time_ms,
        make_hf,
        make_ours,
        random_padded,
        time_calls,
    )
    from engine.fused import kernels as k

    rows = res.setdefault("small_sweep", [])
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, batch, seq in _shapes(shapes):
        if time.time() > deadline:
            rows.append({"model": name, "shape": f"{batch}x{seq}", "skipped": "deadline"})
            continue
        cfg = MODELS[name]
        d, f = cfg["hidden_size"], cfg["intermediate_size"]
        t = batch * seq
        row: dict[str, Any] = {"model": name, "shape": f"{batch}x{seq}", "tokens": t,
                               "gemm": {}, "best": {}}
        gemms = {"qkv": (3 * d, d, False), "out": (d, d, True), "ffn1": (f, d, False),
                 "ffn2": (d, f, True)}
        gamma = torch.ones(d, device="cuda", dtype=torch.float16)
        beta = torch.zeros(d, device="cuda", dtype=torch.float16)
        res_x = torch.randn(t, d, device="cuda", dtype=torch.float16, generator=g)
        with torch.inference_mode():
            for gname, (n, kk, partial) in gemms.items() if sweep else ():
                copies = max(cfg["num_hidden_layers"], math.ceil(L2_DEFEAT_BYTES / (n * kk * 2)))
                ws = [torch.randn(n, kk, device="cuda", dtype=torch.float16, generator=g) * 0.03
                      for _ in range(copies)]
                bias = torch.randn(n, device="cuda", dtype=torch.float16, generator=g) * 0.1
                x = torch.randn(t, kk, device="cuda", dtype=torch.float16, generator=g)
                act = "gelu" if gname == "ffn1" else None
                b = bias if gname == "ffn1" else None

                def chain(config: Any, splits: int, pdl: bool = True, cublas: bool = False,
                          ws: Any = ws, x: Any = x, b: Any = b, act: Any = act,
                          partial: bool = partial, bias: Any = bias, res_x: Any = res_x,
                          gamma: Any = gamma, beta: Any = beta) -> list[Any]:
                    out = []
                    for w in ws:
                        if cublas:
                            y = torch.mm(x, w.t())
                        else:
                            y = k.linear(x, w, b, act=act, splits=splits, config=config,
                                         pdl=pdl, prefetch=pdl)
                        if partial:  # its consumer, which sums the partials
                            y = k.bias_residual_layernorm(y, bias, res_x, gamma, beta, 1e-12,
                                                          pdl=pdl and not cublas)[0]
                        out.append(y)
                    return out

                timings: dict[str, float] = {}
                ref = chain(None, 1, cublas=True)[0].float()
                timings["cuBLAS"] = graph_time_ms(lambda: chain(None, 1, cublas=True),
                                                  reps=1) / copies * 1e3
                plan = k.small_batch_plan(t, n, kk, partial)
                timings["default " + _key(*plan) + " no PDL"] = graph_time_ms(
                    lambda plan=plan: chain(*plan, pdl=False), reps=1) / copies * 1e3
                pconf, sconf, splits_ = ((TMA_PARTIAL_CONFIGS, TMA_STORE_CONFIGS, TMA_SPLITS)
                                         if focus == "tma" else
                                         (PARTIAL_CONFIGS, STORE_CONFIGS, SPLITS))
                cands = ([(c, s) for c in pconf for s in splits_
                          if kk % (s * c[2]) == 0 and math.ceil(t / c[0]) * math.ceil(n / c[1])
                          * s <= 4 * 132] if partial else [(c, 1) for c in sconf])
                for config, splits in cands:
                    key = _key(config, splits)
                    try:
                        y = chain(config, splits)[0].float()
                        # FFN1 carries bias + GELU: compare with cuBLAS + the same epilogue
                        want = torch.nn.functional.gelu(ref + bias.float()) if act else ref
                        err = float((y - want).abs().max() / max(float(want.abs().max()), 1e-6))
                        if err > 2e-2:
                            timings[key + " WRONG"] = err
                            continue
                        timings[key] = graph_time_ms(
                            lambda config=config, splits=splits: chain(config, splits),
                            reps=1) / copies * 1e3
                    except Exception as exc:  # record and go on
                        row.setdefault("errors", []).append(f"{gname} {key}: {exc!r}"[:300])
                row["gemm"][gname] = timings
                good = [(us, kk_) for kk_, us in timings.items()
                        if kk_ not in ("cuBLAS",) and "no PDL" not in kk_ and "WRONG" not in kk_]
                if good:
                    us, best_key = min(good)
                    best = next((c, s) for c, s in cands if _key(c, s) == best_key)
                    row["best"][gname] = {"config": list(best[0]), "splits": best[1], "us": us}
                print(f"small sweep {name} {batch}x{seq} {gname}: cuBLAS "
                      f"{timings['cuBLAS']:.1f}us, best {row['best'].get(gname)}, default "
                      f"{timings.get(_key(*plan), float('nan')):.1f}us", flush=True)
                res["small_sweep_partial"] = row
                save()
            # Whole passes on the same inputs: default plan, best plans, large path.
            model, hcfg = make_hf(name)
            rng = np.random.default_rng(8)
            sets = [device_packed(*random_padded(rng, batch, seq)) for _ in range(4)]
            best_plans = {gn: (tuple(v["config"]), v["splits"]) for gn, v in row["best"].items()}
            small = {"small_batch_max_tokens": 512}  # whatever the default threshold
            bm64 = {  # 64-row tiles for every GEMM, about one wave of programs each
                "qkv": ((64, 64, 128, 4, 3), 1), "ffn1": ((64, 64, 128, 4, 3), 1),
                "out": ((64, 64, 64, 4, 4), max(1, min(4, 132 // (math.ceil(t / 64) * d // 64)))),
                "ffn2": ((64, 64, 64, 4, 4), max(1, min(8, 132 // (math.ceil(t / 64) * d // 64)))),
            }
            bm64 = {k_: (c, s if (kk_ % (s * 64) == 0) else 1) for (k_, (c, s)), kk_ in
                    zip(bm64.items(), (d, d, d, f), strict=True)}
            variants: dict[str, dict[str, Any]] = {
                "small_path": small,
                "small_bm64": {**small, "gemm_plans": bm64},
                "large_path": {"small_batch_max_tokens": None},
                "persistent": {**small, "persistent": True},
                "no_pdl": {**small, "pdl": False},
            }
            if focus == "tma":
                variants = {k_: variants[k_] for k_ in ("small_path", "large_path")}
            engines = {label: make_ours(model, hcfg, dtype="float16", **kw)
                       for label, kw in variants.items()}
            if best_plans:  # (the deferred layer's GEMMs take pointer-load tiles only)
                engines["best_plans"] = make_ours(model, hcfg, dtype="float16",
                                                  gemm_plans=best_plans,
                                                  deferred_ln_max_hidden=None, **small)
            whole: dict[str, Any] = {}
            ref = engines["large_path"]._run_device(*sets[0])
            for label, eng in engines.items():
                try:
                    out = eng._run_device(*sets[0])
                    err = float((out - ref).abs().max())
                    tm = time_calls(lambda xs, eng=eng: eng._run_device(*xs), sets)
                    whole[label] = {**tm.as_dict(), "max_abs_vs_large_path": err}
                except Exception as exc:  # record and go on
                    whole[label] = {"error": repr(exc)[:300]}
            row["whole"] = whole
            print(f"small whole {name} {batch}x{seq}: " + " ".join(
                f"{kk_}={v.get('median_ms', float('nan')):.3f}" for kk_, v in whole.items()),
                flush=True)
            del model, engines
        rows.append(row)
        res.pop("small_sweep_partial", None)
        save()


def markdown(res: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for r in res.get("small_sweep", []):
        if "skipped" in r:
            lines += [f"## small sweep {r['model']} {r['shape']}: skipped ({r['skipped']})", ""]
            continue
        lines += [f"## Small-batch sweep: {r['model']} {r['shape']} ({r['tokens']} tokens)", "",
                  "us per GEMM in a PDL chain (partials: + the LayerNorm that sums them)", "",
                  "| GEMM | cuBLAS | default no PDL | best | best plan | top 5 |",
                  "|---|---|---|---|---|---|"]
        for gname, tms in r.get("gemm", {}).items():
            nopdl = next((v for kk, v in tms.items() if "no PDL" in kk), float("nan"))
            best = r["best"].get(gname, {})
            ranked = sorted((v, kk) for kk, v in tms.items()
                            if kk != "cuBLAS" and "no PDL" not in kk and "WRONG" not in kk)
            top = ", ".join(f"{kk} {v:.1f}" for v, kk in ranked[:5])
            lines.append(f"| {gname} | {tms.get('cuBLAS', float('nan')):.1f} | {nopdl:.1f} | "
                         f"{best.get('us', float('nan')):.1f} | {best.get('config')} "
                         f"k/{best.get('splits')} | {top} |")
        if "whole" in r:
            lines += ["", "Whole pass, ms (median / p99, max |logit - large path|): " + ", ".join(
                f"{kk} {v['median_ms']:.3f} / {v['p99_ms']:.3f} ({v['max_abs_vs_large_path']:.1e})"
                if "median_ms" in v else f"{kk} {v.get('error')}" for kk, v in r["whole"].items())]
        for e in r.get("errors", []):
            lines.append(f"- error: {e}")
        lines.append("")
    return lines
