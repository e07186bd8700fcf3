"""Fine-tune a BERT-family encoder for extractive QA (start/end logits) on SQuAD-format data.

Training runs in phases; each phase names its data and epochs, e.g.::

    python -m training.finetune --base-model BASE --out models/x \
        --phase "extra.json.xz@2" --phase "train-subset-v1.1.json.xz*2@2"

``FILE*N`` repeats a file N times in the phase's mix. ``--drop-sources covidqa,bioasq``
drops articles whose title starts with ``source:`` for those sources (qa-extra naming).
Windows are ``--max-seq-len`` tokens with ``--overlap`` context tokens shared between
consecutive windows. Batches are length-grouped (dynamic padding), bf16 autocast on GPUs.
``--fp8-aware qkv,attn_out,ffn_in,ffn_out`` trains those GEMMs on the fused engine's
calibrated e4m3 rounding and saves their weights on its grids (``training.fp8_aware``);
``--distill-from DIR`` trains on a teacher's start/end distributions (the labelled loss's
share: ``1 - --distill-weight``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from service.windowing import QATokenizer, WindowSpec
from training import fp8_aware
from training.features import TrainWindow, train_windows
from training.squad import Example, load_examples

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class Phase:
    files: tuple[tuple[Path, int], ...]  # (file, repeat)
    epochs: float

    @classmethod
    def parse(cls, text: str) -> Phase:
        files_part, _, epochs = text.partition("@")
        files = []
        for item in files_part.split(","):
            path, _, repeat = item.partition("*")
            files.append((Path(path), int(repeat or 1)))
        return cls(tuple(files), float(epochs or 1))


@dataclass
class PhaseReport:
    name: str
    windows: int
    steps: int
    first_loss: float
    last_loss: float
    seconds: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_mix(phase: Phase, drop_sources: set[str]) -> list[Example]:
    examples: list[Example] = []
    for path, repeat in phase.files:
        loaded = [
            ex for ex in load_examples(path) if ex.title.partition(":")[0] not in drop_sources
        ]
        examples.extend(loaded * repeat)
    return examples


def length_grouped_batches(
    windows: list[TrainWindow], batch_size: int, rng: random.Random
) -> list[list[int]]:
    """Shuffled batches of similar lengths, so padding stays small."""
    order = list(range(len(windows)))
    rng.shuffle(order)
    chunk = batch_size * 64
    batches = []
    for i in range(0, len(order), chunk):
        part = sorted(order[i : i + chunk], key=lambda j: len(windows[j].input_ids))
        batches.extend(part[k : k + batch_size] for k in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


def collate(windows: list[TrainWindow], idx: list[int], device: torch.device) -> dict[str, torch.Tensor]:
    seq = max(len(windows[j].input_ids) for j in idx)
    ids = np.zeros((len(idx), seq), dtype=np.int64)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for r, j in enumerate(idx):
        w = windows[j]
        ids[r, : len(w.input_ids)] = w.input_ids
        types[r, : len(w.input_ids)] = w.token_type_ids
        mask[r, : len(w.input_ids)] = 1
    batch = {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": mask,
        "start_positions": np.array([windows[j].start for j in idx]),
        "end_positions": np.array([windows[j].end for j in idx]),
    }
    return {k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in batch.items()}


def distill_loss(student: Any, teacher: Any, attention_mask: torch.Tensor,
                 weight: float = 1.0) -> torch.Tensor:
    """``weight`` x KL(teacher || student) of each window's start and end distributions
    over its real tokens (their mean), plus ``1 - weight`` x the student's labelled loss.
    ``student`` and ``teacher`` are HF QA outputs (``start_logits``, ``end_logits``; the
    student's ``loss`` where ``weight`` < 1)."""
    pad = attention_mask == 0
    kl = torch.zeros((), device=attention_mask.device)
    for s, t in ((student.start_logits, teacher.start_logits),
                 (student.end_logits, teacher.end_logits)):
        s_log = F.log_softmax(s.float().masked_fill(pad, -1e4), dim=-1)
        t_log = F.log_softmax(t.float().masked_fill(pad, -1e4), dim=-1)
        kl = kl + F.kl_div(s_log, t_log, log_target=True, reduction="batchmean") / 2
    return kl if weight >= 1.0 else weight * kl + (1.0 - weight) * student.loss


def train_phase(
    model: torch.nn.Module,
    windows: list[TrainWindow],
    phase: Phase,
    args: argparse.Namespace,
    device: torch.device,
    name: str,
    teacher: torch.nn.Module | None = None,
) -> PhaseReport:
    rng = random.Random(args.seed)
    epochs_whole = math.ceil(phase.epochs)
    per_epoch = math.ceil(len(windows) / args.batch_size)
    total = max(1, int(per_epoch * phase.epochs))
    if args.max_steps:
        total = min(total, args.max_steps)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=fused)
    warmup = max(1, int(total * args.warmup))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup)))
    )
    model.train()
    losses: list[float] = []
    started = time.perf_counter()
    bar = tqdm(total=total, desc=name)
    step = 0
    for _ in range(epochs_whole):
        for idx in length_grouped_batches(windows, args.batch_size, rng):
            if step >= total:
                break
            batch = collate(windows, idx, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=fused):
                out = model(**batch)
                if teacher is None:
                    loss = out.loss
                else:
                    with torch.no_grad():
                        taught = teacher(**{k: v for k, v in batch.items() if "_positions" not in k})
                    loss = distill_loss(out, taught, batch["attention_mask"], args.distill_weight)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == 1 or step % 20 == 0 or step == total:
                losses.append(loss.item())
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update(1)
    bar.close()
    if not losses:
        losses.append(loss.item())
    return PhaseReport(
        name, len(windows), step, losses[0], float(np.mean(losses[-5:])), time.perf_counter() - started
    )


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def save(model: torch.nn.Module, args: argparse.Namespace, reports: list[PhaseReport]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.save_dtype)
    model.to(dtype=dtype).save_pretrained(str(out), safe_serialization=True)
    model.to(dtype=torch.float32)
    for name in TOKENIZER_FILES:
        src = Path(args.base_model) / name
        if src.exists():
            shutil.copy(src, out / name)
    info = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "phases": [asdict(r) for r in reports],
        "commit": git_commit(),
    }
    (out / "training_run.json").write_text(json.dumps(info, indent=2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base-model", required=True, help="HF checkpoint directory (BERT family)")
    p.add_argument("--out", required=True)
    p.add_argument("--phase", action="append", required=True, help="FILE[*N][,FILE...]@EPOCHS")
    p.add_argument("--drop-sources", default="", help="comma-separated qa-extra source prefixes")
    p.add_argument("--max-seq-len", type=int, default=384)
    p.add_argument("--overlap", type=int, default=128, help="context tokens shared by windows")
    p.add_argument("--max-question-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of steps")
    p.add_argument("--max-steps", type=int, default=0, help="cap per phase (smoke runs)")
    p.add_argument("--max-examples", type=int, default=0, help="cap per phase (smoke runs)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--save-dtype", default="float16", choices=["float16", "float32", "bfloat16"])
    p.add_argument("--distill-from", default="",
                   help="a QA checkpoint whose start/end distributions the model learns "
                   "(knowledge distillation, e.g. the base model itself for --fp8-aware)")
    p.add_argument("--distill-weight", type=float, default=1.0,
                   help="the distillation loss's share; the rest is the labelled loss")
    p.add_argument("--fp8-aware", default="",
                   help="comma-separated GEMMs (qkv, attn_out, ffn_in, ffn_out) trained on the "
                   "fused engine's calibrated e4m3 rounding, saved on their grids "
                   "(training.fp8_aware)")
    args = p.parse_args(argv)
    if not 0.0 <= args.distill_weight <= 1.0:
        p.error("--distill-weight must be between 0 and 1")
    return args


def main(argv: list[str] | None = None) -> list[PhaseReport]:
    from transformers import AutoModelForQuestionAnswering

    args = parse_args(argv)
    seed_everything(args.seed)
    device = torch.device(args.device)
    tok = QATokenizer.from_dir(Path(args.base_model))
    spec = WindowSpec(args.max_seq_len, args.overlap, args.max_question_len)
    model = AutoModelForQuestionAnswering.from_pretrained(args.base_model, dtype=torch.float32)
    model.to(device)
    fp8_gemms = tuple(g for g in args.fp8_aware.split(",") if g)
    if fp8_gemms:
        fp8_aware.wrap(model, fp8_gemms)
    teacher = None
    if args.distill_from:
        teacher = AutoModelForQuestionAnswering.from_pretrained(args.distill_from,
                                                                dtype=torch.float32)
        teacher.to(device).eval().requires_grad_(False)
    drop = {s for s in args.drop_sources.split(",") if s}
    reports = []
    for i, text in enumerate(args.phase):
        phase = Phase.parse(text)
        examples = load_mix(phase, drop)
        if args.max_examples:
            examples = random.Random(args.seed).sample(examples, min(len(examples), args.max_examples))
        windows = train_windows(examples, tok, spec)
        reports.append(train_phase(model, windows, phase, args, device, f"phase {i + 1}",
                                   teacher))
    if fp8_gemms:
        fp8_aware.project(model)
    save(model, args, reports)
    table = Table(title=f"fine-tuning -> {args.out}")
    for col in ("phase", "windows", "steps", "first loss", "last loss", "seconds"):
        table.add_column(col)
    for r in reports:
        table.add_row(r.name, str(r.windows), str(r.steps), f"{r.first_loss:.3f}",
                      f"{r.last_loss:.3f}", f"{r.seconds:.1f}")
    Console().print(table)
    return reports


if __name__ == "__main__":
    main()
