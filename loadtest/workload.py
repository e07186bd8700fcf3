"""Request bodies for a load test: real SQuAD dev questions against their own paragraphs."""

from __future__ import annotations

import random
from itertools import groupby
from pathlib import Path
from typing import Any

from training.squad import load_examples

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT / "data" / "dev-v1.1.json.xz"

Payload = dict[str, Any]


def squad_payloads(
    path: Path = DEFAULT_DATA,
    questions_per_request: int = 1,
    limit: int | None = None,
    seed: int = 0,
) -> list[Payload]:
    """POST /v1/qa bodies, shuffled with ``seed``.

    With ``questions_per_request`` 1 each body is ``{"context", "question"}``; above 1, questions
    of one paragraph are grouped (in file order, up to that many) as ``{"context", "questions"}``.
    """
    if questions_per_request < 1:
        raise ValueError("questions_per_request must be >= 1")
    examples = load_examples(path)
    bodies: list[Payload] = []
    for context, group in groupby(examples, key=lambda e: e.context):
        questions = [e.question for e in group]
        for i in range(0, len(questions), questions_per_request):
            chunk = questions[i : i + questions_per_request]
            if questions_per_request == 1:
                bodies.append({"context": context, "question": chunk[0]})
            else:
                bodies.append({"context": context, "questions": chunk})
    random.Random(seed).shuffle(bodies)
    return bodies[:limit] if limit else bodies


def with_options(bodies: list[Payload], options: Payload) -> list[Payload]:
    """Each body with the optional request fields (top_k, max_answer_len, ...) added."""
    if not options:
        return bodies
    return [{**body, **options} for body in bodies]
