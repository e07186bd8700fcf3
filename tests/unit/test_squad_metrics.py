"""SQuAD scoring (official EM/F1 semantics) and data loading, on hand-computed cases."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from training.squad import (
    Example,
    exact_match,
    f1,
    load_examples,
    normalize_answer,
    read_json,
    score,
)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Cat sat.", "cat sat"),
        ("  An   apple\tpie\n", "apple pie"),
        ("A", ""),
        ("the the a an", ""),
        ("theatre", "theatre"),  # articles only as whole words
        ("Then they ate an anchovy", "then they ate anchovy"),
        ("U.S.A.", "usa"),  # punctuation is removed, not replaced by a space
        ("well-known", "wellknown"),
        ("$4.5 million!", "45 million"),
        ("(1999)", "1999"),
        ("Zürich", "zürich"),  # accents stay
        ("Tokyo—Kyoto", "tokyo—kyoto"),  # non-ASCII punctuation stays (as in the official script)
        ("a.b", "ab"),
    ],
)
def test_normalize_answer(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize(
    ("pred", "gold", "em"),
    [
        ("The Cat.", "cat", 1.0),
        ("cat", "the cat sat", 0.0),
        ("Zurich", "Zürich", 0.0),
        ("", "", 1.0),
        ("the", "", 1.0),  # an article alone normalizes to the empty answer
        ("1,000", "1000", 1.0),
    ],
)
def test_exact_match(pred: str, gold: str, em: float) -> None:
    assert exact_match(pred, gold) == em


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        # pred tokens {cat, sat}, gold {cat, sat, on}: P = 2/2, R = 2/3 -> F1 = 0.8
        ("the cat sat", "a cat sat on", 0.8),
        ("cat sat on the mat", "cat sat on the mat", 1.0),
        # pred {black, cat}, gold {cat, sat, on, mat}: P = 1/2, R = 1/4 -> 2*(1/8)/(3/4) = 1/3
        ("the black cat", "cat sat on mat", 1 / 3),
        # repeated tokens count once each: pred {cat, cat}, gold {cat}: P = 1/2, R = 1 -> 2/3
        ("cat cat", "cat", 2 / 3),
        # pred {cat, cat}, gold {cat, cat, dog}: common 2, P = 1, R = 2/3 -> 0.8
        ("cat cat", "cat cat dog", 0.8),
        ("dog", "cat", 0.0),
        ("", "cat", 0.0),
        ("cat", "", 0.0),
        ("", "", 1.0),  # v2: empty is right only against empty
        ("An", "the", 1.0),  # both normalize to empty
        # order does not matter, punctuation and case do not either
        ("Sat, the CAT!", "cat sat", 1.0),
        # 1 of 3 vs 1 of 1: P = 1/3, R = 1 -> 0.5
        ("in the year 1932", "1932", 0.5),
    ],
)
def test_f1(pred: str, gold: str, expected: float) -> None:
    assert f1(pred, gold) == pytest.approx(expected)


def ex(qid: str, answers: tuple[str, ...], context: str = "ctx") -> Example:
    starts = tuple(0 for _ in answers)
    return Example(qid, "t", context, f"q {qid}?", answers, starts)


def test_score_takes_the_best_gold_and_averages() -> None:
    examples = [
        ex("a", ("Ada Okafor", "Okafor")),  # pred "Okafor": EM 1 (2nd gold), F1 1
        ex("b", ("in 2011", "2011")),  # pred "2011 or 2012": F1 max(2/5... , 1/2)
        ex("c", ("Tromsø",)),  # pred missing -> "" -> 0
        ex("d", ("the coast guard",)),  # pred "Norwegian coast guard": P 2/3 R 1 -> 0.8
    ]
    preds = {"a": "Okafor", "b": "2011 or 2012", "d": "Norwegian coast guard"}
    # b: vs "in 2011": pred {2011, or, 2012}, gold {in, 2011}: P 1/3, R 1/2 -> 0.4
    #    vs "2011":    P 1/3, R 1 -> 0.5 ; best 0.5
    result = score(examples, preds)
    assert result.total == 4
    assert result.exact == pytest.approx(100 * 1 / 4)
    assert result.f1 == pytest.approx(100 * (1 + 0.5 + 0 + 0.8) / 4)
    assert result.has_ans_f1 == pytest.approx(result.f1)
    assert result.no_ans_f1 is None


def test_score_v2_has_ans_and_no_ans() -> None:
    examples = [
        ex("a", ("Oslo",)),
        ex("b", ("Bergen", "Bergen city")),
        ex("u1", ()),  # unanswerable
        ex("u2", ()),
        ex("u3", ()),
    ]
    assert [e.is_impossible for e in examples] == [False, False, True, True, True]
    preds = {"a": "Oslo", "b": "", "u1": "", "u2": "Stavanger", "u3": "the"}
    result = score(examples, preds)
    # a: 1, b: 0 (empty vs non-empty), u1: 1, u2: 0, u3: "the" -> "" -> 1
    assert result.exact == pytest.approx(100 * 3 / 5)
    assert result.f1 == pytest.approx(100 * 3 / 5)
    assert result.has_ans_f1 == pytest.approx(50.0)
    assert result.no_ans_f1 == pytest.approx(100 * 2 / 3)
    # only unanswerable questions
    only_no = score(examples[2:], {})
    assert (only_no.exact, only_no.f1, only_no.has_ans_f1, only_no.no_ans_f1) == (
        100.0, 100.0, None, 100.0,
    )


def test_score_of_nothing() -> None:
    result = score([], {})
    assert (result.exact, result.f1, result.total) == (0.0, 0.0, 0)
    assert result.has_ans_f1 is None and result.no_ans_f1 is None


V2_SAMPLE = {
    "version": "v2.0",
    "data": [
        {
            "title": "Nordhaven",
            "paragraphs": [
                {
                    "context": "Nordhaven Robotics was founded in 2011 by Ada Okafor.",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "Who founded Nordhaven?",
                            "answers": [
                                {"text": "Ada Okafor", "answer_start": 42},
                                {"text": "Okafor", "answer_start": 46},
                            ],
                            "is_impossible": False,
                        },
                        {
                            "id": "q2",
                            "question": "Who sold Nordhaven?",
                            "answers": [],
                            "plausible_answers": [{"text": "Ada Okafor", "answer_start": 42}],
                            "is_impossible": True,
                        },
                    ],
                }
            ],
        },
        {
            "title": "source:covidqa",
            "paragraphs": [
                {
                    "context": "Zürich liegt am Zürichsee.",
                    "qas": [
                        {
                            "id": "q3",
                            "question": "Woran liegt Zürich?",
                            # v1.1 style: no is_impossible key
                            "answers": [{"text": "Zürichsee", "answer_start": 16}],
                        }
                    ],
                }
            ],
        },
    ],
}


def test_load_examples_plain_and_xz(tmp_path: Path) -> None:
    plain = tmp_path / "sample.json"
    plain.write_text(json.dumps(V2_SAMPLE, ensure_ascii=False), encoding="utf-8")
    packed = tmp_path / "sample.json.xz"
    with lzma.open(packed, "wt", encoding="utf-8") as f:
        json.dump(V2_SAMPLE, f, ensure_ascii=False)
    assert packed.read_bytes()[:6] == b"\xfd7zXZ\x00"  # really xz on disk
    assert read_json(packed) == read_json(plain) == V2_SAMPLE

    for path in (plain, packed):
        examples = load_examples(path)
        assert [e.id for e in examples] == ["q1", "q2", "q3"]
        q1, q2, q3 = examples
        assert q1.answers == ("Ada Okafor", "Okafor")
        assert q1.answer_starts == (42, 46)
        assert q1.context[42:52] == "Ada Okafor"
        assert q1.title == "Nordhaven" and not q1.is_impossible
        # plausible answers of an impossible question are not gold answers
        assert q2.is_impossible and q2.answers == () and q2.answer_starts == ()
        assert q3.title == "source:covidqa"
        assert q3.context[16:25] == q3.answers[0] == "Zürichsee"


@pytest.mark.parametrize(
    ("name", "n_questions", "n_impossible", "n_dot_gold"),
    [
        ("dev-v1.1.json.xz", 10570, 0, 3),
        ("dev-v2.0.json.xz", 11873, 5945, 3),
        ("xquad.en.json.xz", 1190, 0, 0),
        ("train-subset-v1.1.json.xz", 11877, 0, 0),
    ],
)
def test_real_files_load_and_score(
    data_dir: Path, name: str, n_questions: int, n_impossible: int, n_dot_gold: int
) -> None:
    examples = load_examples(data_dir / name)
    assert len(examples) == n_questions
    assert sum(e.is_impossible for e in examples) == n_impossible
    assert len({e.id for e in examples}) == n_questions
    for e in examples:
        for text, start in zip(e.answers, e.answer_starts, strict=True):
            assert e.context[start : start + len(text)] == text
    # gold answers score 100
    gold = score(examples, {e.id: (e.answers[0] if e.answers else "") for e in examples})
    assert (gold.exact, gold.f1) == (pytest.approx(100.0), pytest.approx(100.0))
    # SQuAD dev has 3 answerable questions with a gold answer of "." (normalizes to ""):
    # an empty prediction is right for them, as in the official script
    dot = [e for e in examples if e.answers and "." in e.answers]
    assert len(dot) == n_dot_gold
    empty = score(examples, {})
    right = n_impossible + n_dot_gold
    assert empty.exact == pytest.approx(100.0 * right / n_questions)
    assert empty.f1 == pytest.approx(100.0 * right / n_questions)
    assert empty.has_ans_f1 == pytest.approx(100.0 * n_dot_gold / (n_questions - n_impossible))
    assert empty.no_ans_f1 == (100.0 if n_impossible else None)
