"""SQuAD EM/F1 through the HTTP API equals the offline evaluation of the same model."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from engine.onnx_cpu import OnnxEngine
from service.decoding import DecodeSpec
from service.settings import Settings
from service.windowing import QATokenizer, WindowSpec
from tests.integration.conftest import ONNX, REPO, LiveService
from training.features import predict
from training.squad import Example, Score, load_examples, score

pytestmark = pytest.mark.integration


def offline(examples: list[Example]) -> Score:
    s = Settings()
    tok = QATokenizer.from_dir(s.model_dir)
    spec = WindowSpec(s.max_seq_len, s.window_overlap, s.max_question_tokens)
    engine = OnnxEngine(ONNX, threads=2)
    preds = predict(examples, tok, engine.infer, spec, DecodeSpec(max_answer_len=s.max_answer_tokens))
    return score(examples, preds)


def through_service(url: str, examples: list[Example], concurrency: int = 4) -> Score:
    groups: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        groups[ex.context].append(ex)
    preds: dict[str, str] = {}
    limit = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, context: str, group: list[Example]) -> None:
        for i in range(0, len(group), 8):
            part = group[i : i + 8]
            async with limit:
                r = await client.post("/v1/qa", json={"context": context,
                                                      "questions": [e.question for e in part]})
            r.raise_for_status()
            for ex, answers in zip(part, r.json()["answers"], strict=True):
                preds[ex.id] = answers[0]["text"] if answers else ""

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            await asyncio.gather(*(one(client, c, g) for c, g in groups.items()))

    asyncio.run(run())
    return score(examples, preds)


def compare(live_service: LiveService, data: Path) -> None:
    examples = load_examples(data)
    served = through_service(live_service.gateway_url, examples)
    reference = offline(examples)
    print(f"\n{data.name}: service EM {served.exact:.2f} F1 {served.f1:.2f}; "
          f"offline EM {reference.exact:.2f} F1 {reference.f1:.2f} ({len(examples)} questions)")
    assert served.total == len(examples)
    assert abs(served.f1 - reference.f1) <= 0.1
    assert served.f1 > 65.0  # the shipped model scores ~73 F1 on XQuAD-en


def test_xquad_through_http_matches_offline(live_service: LiveService) -> None:
    compare(live_service, REPO / "data" / "xquad.en.json.xz")


@pytest.mark.slow
def test_full_dev_through_http_matches_offline(live_service: LiveService) -> None:
    compare(live_service, REPO / "data" / "dev-v1.1.json.xz")
