"""The shipped checkpoint (models/minilm-l6-squad) through the fp32 CPU reference engine.

Hand-written paragraphs about made-up things (so the answers cannot come from memorised
SQuAD text) and a measured XQuAD floor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.reference import ReferenceEngine
from service.decoding import DecodeSpec, decode
from service.windowing import QATokenizer, WindowSpec
from training import evaluate
from training.features import predict
from training.squad import Example

COMPANY = (
    "Nordhaven Robotics is a Norwegian company that builds underwater drones. It was founded "
    "in 2011 by the engineer Ada Okafor in the city of Tromsø. The company employs 340 people, "
    "and its largest customer is the Norwegian coast guard. In 2019 it opened a second factory "
    "in Bergen."
)
CITY = (
    "Velmora is a fictional port city on the southern coast of the island of Castavel. With a "
    "population of about 480,000, it is the island's second-largest city after the capital, "
    "Orlenne. Velmora's old town is known for its blue-tiled lighthouse, built in 1784, and the "
    "city hosts an annual kite festival every September."
)
PERSON = (
    "The composer Miriam Halvorsen was born on 12 March 1921 in Stavanger. She studied violin "
    "in Vienna before writing her first symphony at the age of twenty-six. Her best-known work, "
    "the opera The Glass Harbour, premiered in Oslo in 1958. She died in 1990."
)
BRIDGE = (
    "The Quillon Bridge spans the river Aster and is 1,204 metres long. Construction began in "
    "1927 and took five years; the bridge was opened to traffic in 1932. It was designed by the "
    "architect Tomas Brenner and cost 4.5 million crowns."
)

QUESTIONS = [
    (COMPANY, "Who founded Nordhaven Robotics?", "Ada Okafor"),
    (COMPANY, "What does Nordhaven Robotics build?", "underwater drones"),
    (COMPANY, "How many people does the company employ?", "340"),
    (COMPANY, "Where did the company open a second factory?", "Bergen"),
    (COMPANY, "In which year was Nordhaven Robotics founded?", "2011"),
    (CITY, "What is the capital of Castavel?", "Orlenne"),
    (CITY, "When was the lighthouse in Velmora built?", "1784"),
    (CITY, "What festival does Velmora host every September?", "kite festival"),
    (PERSON, "Where was Miriam Halvorsen born?", "Stavanger"),
    (PERSON, "What instrument did Halvorsen study in Vienna?", "violin"),
    (PERSON, "When did The Glass Harbour premiere?", "1958"),
    (BRIDGE, "How long is the Quillon Bridge?", "1,204 metres"),
    (BRIDGE, "Who designed the Quillon Bridge?", "Tomas Brenner"),
    (BRIDGE, "When was the bridge opened to traffic?", "1932"),
    (BRIDGE, "How much did the bridge cost?", "4.5 million crowns"),
]


@pytest.fixture(scope="module")
def engine(shipped_model_dir: Path) -> ReferenceEngine:
    return ReferenceEngine(shipped_model_dir, device="cpu", dtype="float32")


def examples_of(items: list[tuple[str, str, str]]) -> list[Example]:
    return [
        Example(f"q{i}", "handwritten", ctx, q, (a,), (ctx.index(a),))
        for i, (ctx, q, a) in enumerate(items)
    ]


def test_engine_is_fp32_and_returns_logits_per_token(
    engine: ReferenceEngine, qa_tokenizer: QATokenizer
) -> None:
    tok = qa_tokenizer
    win = tok.windows(tok.encode_batch(["Who?", "When?"]), tok.encode(COMPANY), WindowSpec())
    start, end = engine.infer(win.input_ids, win.attention_mask, win.token_type_ids)
    assert start.dtype == end.dtype == np.float32
    assert start.shape == end.shape == win.input_ids.shape
    assert np.isfinite(start).all() and np.isfinite(end).all()
    assert next(engine.model.parameters()).dtype.is_floating_point
    assert str(next(engine.model.parameters()).dtype) == "torch.float32"


def test_answers_handwritten_questions(
    engine: ReferenceEngine, qa_tokenizer: QATokenizer
) -> None:
    examples = examples_of(QUESTIONS)
    preds = predict(examples, qa_tokenizer, engine.infer, WindowSpec(), DecodeSpec())
    wrong = []
    for ex in examples:
        got, want = preds[ex.id], ex.answers[0]
        # the expected phrase, with at most two extra words around it ("engineer Ada Okafor")
        if want not in got or len(got.split()) > len(want.split()) + 2:
            wrong.append((ex.question, want, got))
    # measured: 15 of 15 right
    assert len(wrong) <= 1, wrong


def test_answer_from_a_later_window_of_a_long_context(
    engine: ReferenceEngine, qa_tokenizer: QATokenizer
) -> None:
    """The answer sits in the second window of a context longer than one window."""
    tok = qa_tokenizer
    context = " ".join([CITY, PERSON, BRIDGE, CITY.replace("Velmora", "Castel Nuovo"), COMPANY])
    ctx = tok.encode(context)
    question = tok.encode("Who founded Nordhaven Robotics?")
    spec = WindowSpec(max_seq_len=192, overlap=32)
    win = tok.windows([question], ctx, spec)
    assert win.count >= 2
    answer_at = context.index("Ada Okafor")
    in_first = win.offsets[0, :, 1].max() >= answer_at + len("Ada Okafor")
    assert not in_first
    start, end = engine.infer(win.input_ids, win.attention_mask, win.token_type_ids)
    [res] = decode(win, start, end, 1, DecodeSpec(top_k=3))
    best = res.spans[0]
    assert "Ada Okafor" in context[best.start : best.end]
    assert best.start >= context.index(COMPANY)
    assert len(res.spans) == 3
    # measured: "the engineer Ada Okafor" 0.52, "Ada Okafor" 0.22, a long span with both 0.14
    # (probabilities over the 20 best spans and the no-answer candidate)
    assert best.score > 0.4
    with_name = [s.score for s in res.spans if "Ada Okafor" in context[s.start : s.end]]
    assert len(with_name) == 3
    assert sum(with_name) > 0.75
    assert res.no_answer_score < 0.01
    assert sum(s.score for s in res.spans) + res.no_answer_score <= 1.0 + 1e-6


def test_xquad_en_f1(shipped_model_dir: Path, data_dir: Path) -> None:
    """Measured on the first 200 XQuAD (en) questions: EM 61.5, F1 70.96."""
    result = evaluate.main(
        [
            "--model-dir", str(shipped_model_dir),
            "--data", str(data_dir / "xquad.en.json.xz"),
            "--limit", "200",
            "--engine", "reference",
            "--device", "cpu",
            "--dtype", "float32",
        ]
    )
    assert result.total == 200
    assert result.f1 >= 68.0, result
    assert result.exact >= 58.0, result
    assert result.no_ans_f1 is None
