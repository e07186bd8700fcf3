"""SQuAD-format data: loading (plain or .xz JSON) and the official EM/F1 scoring."""

from __future__ import annotations

import collections
import json
import lzma
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Example:
    id: str
    title: str
    context: str
    question: str
    answers: tuple[str, ...]  # gold texts; empty for an unanswerable question
    answer_starts: tuple[int, ...]  # char offsets of the gold texts

    @property
    def is_impossible(self) -> bool:
        return not self.answers


def read_json(path: Path) -> dict[str, object]:
    """A SQuAD JSON file, plain or xz-compressed (``.json.xz``)."""
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data: dict[str, object] = json.load(f)
    return data


def load_examples(path: Path) -> list[Example]:
    """Every question of a SQuAD v1.1 / v2.0 file, in file order."""
    examples = []
    for article in read_json(path)["data"]:  # type: ignore[attr-defined]
        title = article.get("title", "")
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                answers = [] if qa.get("is_impossible") else qa["answers"]
                examples.append(
                    Example(
                        id=qa["id"],
                        title=title,
                        context=para["context"],
                        question=qa["question"],
                        answers=tuple(a["text"] for a in answers),
                        answer_starts=tuple(int(a["answer_start"]) for a in answers),
                    )
                )
    return examples


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, articles and extra whitespace (official script)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # SQuAD v2: an empty answer is right only when the gold answer is empty too
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class Score:
    exact: float  # percent
    f1: float  # percent
    total: int
    has_ans_f1: float | None = None
    no_ans_f1: float | None = None


def score(examples: Sequence[Example], predictions: Mapping[str, str]) -> Score:
    """EM/F1 in percent; max over gold answers, mean over questions.

    A missing prediction counts as an empty answer.
    """
    ems: list[float] = []
    f1s: list[float] = []
    has_ans: list[float] = []
    no_ans: list[float] = []
    for ex in examples:
        pred = predictions.get(ex.id, "")
        golds: Iterable[str] = ex.answers or ("",)
        em = max(exact_match(pred, g) for g in golds)
        f = max(f1(pred, g) for g in golds)
        ems.append(em)
        f1s.append(f)
        (no_ans if ex.is_impossible else has_ans).append(f)
    n = len(examples)
    return Score(
        exact=100.0 * sum(ems) / max(n, 1),
        f1=100.0 * sum(f1s) / max(n, 1),
        total=n,
        has_ans_f1=100.0 * sum(has_ans) / len(has_ans) if has_ans else None,
        no_ans_f1=100.0 * sum(no_ans) / len(no_ans) if no_ans else None,
    )


def best_threshold(
    examples: Sequence[Example], predictions: Mapping[str, tuple[str, float]]
) -> tuple[float, Score]:
    """The no-answer threshold that maximises F1 (the official v2 script's ``best_f1``).

    A question is answered empty when its margin ``null - best`` exceeds the threshold.
    Sweeps thresholds from "always answer" down, switching one question at a time.
    Tuned on the data it scores: an optimistic figure, reported as such.
    """
    def gain(ex: Example) -> float:
        golds = ex.answers or ("",)
        text = predictions[ex.id][0]
        return max(f1("", g) for g in golds) - max(f1(text, g) for g in golds)

    ordered = sorted(examples, key=lambda ex: predictions[ex.id][1], reverse=True)
    total, best_total, best_t = 0.0, 0.0, float("inf")
    for ex in ordered:
        total += gain(ex)
        if total > best_total:
            best_total, best_t = total, predictions[ex.id][1] - 1e-6
    preds = {ex.id: ("" if predictions[ex.id][1] > best_t else predictions[ex.id][0])
             for ex in examples}
    return best_t, score(examples, preds)
