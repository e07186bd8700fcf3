"""The SQuAD v2 no-answer threshold search on hand-built predictions."""

from __future__ import annotations

from training.squad import Example, best_threshold


def ex(id_: str, answers: tuple[str, ...]) -> Example:
    return Example(id_, "t", "ctx", "q?", answers, tuple(0 for _ in answers))


def test_threshold_splits_answerable_from_unanswerable() -> None:
    examples = [ex("a", ("Paris",)), ex("b", ("1889",)), ex("c", ()), ex("d", ())]
    # margins (null - best): answerable questions low, unanswerable high
    preds = {"a": ("Paris", -3.0), "b": ("1889", -1.0), "c": ("Lyon", 2.0), "d": ("x", 5.0)}
    threshold, s = best_threshold(examples, preds)
    assert -1.0 <= threshold < 2.0
    assert s.f1 == 100.0 and s.exact == 100.0


def test_threshold_keeps_answers_when_nulls_never_help() -> None:
    examples = [ex("a", ("Paris",)), ex("b", ("1889",))]
    preds = {"a": ("Paris", 4.0), "b": ("1889", 1.0)}
    threshold, s = best_threshold(examples, preds)
    assert threshold == float("inf") and s.f1 == 100.0


def test_threshold_trades_one_wrong_answer_for_a_right_null() -> None:
    examples = [ex("a", ("Paris",)), ex("b", ())]
    preds = {"a": ("Paris", 0.5), "b": ("Rome", 0.2)}  # the unanswerable one has the lower margin
    _, s = best_threshold(examples, preds)
    assert s.f1 == 50.0  # either answer both (50) or null both (50): never both right
