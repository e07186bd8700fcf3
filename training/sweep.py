"""Fine-tune several configurations in one run and score each on SQuAD v1.1 dev.

Made for one call on the lent GPU: configurations run in order until the time budget
is spent; the table at the end and ``sweep.json`` compare them.

    python -m training.sweep --base-model B --data-dir data --out-root /tmp/sweep
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from training import evaluate, finetune

# name -> (phases, extra finetune flags); files are relative to --data-dir
EXTRA, SQUAD = "extra_train_answerable.json.xz", "train-subset-v1.1.json.xz"
CONFIGS: dict[str, tuple[list[str], list[str]]] = {
    "mix-sq2-e3-lr1e-4": ([f"{EXTRA},{SQUAD}*2@3"], ["--lr", "1e-4"]),
    "twostage-e2+2-lr1e-4": ([f"{EXTRA}@2", f"{SQUAD}@2"], ["--lr", "1e-4"]),
    "mix-sq2-e3-lr2e-4": ([f"{EXTRA},{SQUAD}*2@3"], ["--lr", "2e-4"]),
    "mix-sq3-e4-lr1.5e-4": ([f"{EXTRA},{SQUAD}*3@4"], ["--lr", "1.5e-4"]),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base-model", required=True)
    p.add_argument("--data-dir", type=Path, default=Path("data"))
    p.add_argument("--out-root", type=Path, required=True)
    p.add_argument("--only", default="", help="comma-separated config names")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no config after this")
    p.add_argument("--drop-sources", default="covidqa")
    args = p.parse_args()
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    started = time.perf_counter()
    rows = []
    for name in names:
        if time.perf_counter() - started > args.budget_s:
            print(f"skipping {name}: time budget spent")
            continue
        phases, flags = CONFIGS[name]
        out = args.out_root / name
        argv = ["--base-model", args.base_model, "--out", str(out),
                "--drop-sources", args.drop_sources, *flags]
        for ph in phases:
            files, _, epochs = ph.partition("@")
            resolved = ",".join(str(args.data_dir / f) for f in files.split(","))
            argv += ["--phase", f"{resolved}@{epochs}"]
        t0 = time.perf_counter()
        reports = finetune.main(argv)
        train_s = time.perf_counter() - t0
        s = evaluate.main(["--model-dir", str(out), "--data", str(args.data_dir / "dev-v1.1.json.xz"),
                           "--device", "cuda", "--batch-windows", "512"])
        rows.append({"name": name, "train_s": train_s, "em": s.exact, "f1": s.f1,
                     "steps": sum(r.steps for r in reports)})
        (args.out_root / "sweep.json").write_text(json.dumps(rows, indent=1))
    table = Table(title="fine-tuning sweep (SQuAD v1.1 dev, 10,570 questions)")
    for col in ("config", "steps", "train s", "EM", "F1"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], str(r["steps"]), f"{r['train_s']:.0f}",
                      f"{r['em']:.2f}", f"{r['f1']:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
