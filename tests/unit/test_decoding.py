"""Span decoding on hand-built logits whose right answers are known.

Windows come from the real tokenizer (so offsets are real), logits are set by hand: a
word gets a start/end logit and every other position LOW (so low that spans using it have
probability exactly 0 in float64, which makes the probabilities computable by hand). A
brute-force decoder (all spans of all windows, merged by characters) is the reference for
random logits.

Probability contract: a span's ``score`` is the softmax of its logit over the N_BEST best
distinct spans plus the no-answer logit, whatever top_k is.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.decoding import N_BEST, DecodeSpec, QuestionResult, decode
from service.windowing import NOT_CONTEXT, QATokenizer, Windows, WindowSpec

LOW = -1000.0

CONTEXT = (
    "Nordhaven Robotics was founded in 2011 by Ada Okafor in Tromsø. "
    "The company builds underwater drones and employs 340 people. "
    "Its largest customer is the Norwegian coast guard."
)


def words_logits(
    win: Windows,
    context: str,
    start: dict[str, float],
    end: dict[str, float],
    unit: str = r"\w+",
) -> tuple[np.ndarray, np.ndarray]:
    """Logits [windows, seq], LOW everywhere except: a context token that begins a word
    (``unit`` match) listed in ``start`` gets its start logit, a token that ends a word
    listed in ``end`` gets its end logit."""
    word_at_start = {m.start(): m.group() for m in re.finditer(unit, context)}
    word_at_end = {m.end(): m.group() for m in re.finditer(unit, context)}
    s = np.full(win.input_ids.shape, LOW, dtype=np.float32)
    e = s.copy()
    for w in range(win.count):
        for p in range(win.seq_len):
            a, b = (int(x) for x in win.offsets[w, p])
            if a == NOT_CONTEXT:
                continue
            if a in word_at_start:
                s[w, p] = start.get(word_at_start[a], LOW)
            if b in word_at_end:
                e[w, p] = end.get(word_at_end[b], LOW)
    return s, e


def texts(context: str, result: QuestionResult) -> list[str]:
    return [context[s.start : s.end] for s in result.spans]


@pytest.fixture(scope="module")
def one_window(qa_tokenizer: QATokenizer) -> Windows:
    tok = qa_tokenizer
    return tok.windows([tok.encode("Who founded Nordhaven?")], tok.encode(CONTEXT), WindowSpec())


def test_best_span_is_the_known_answer(one_window: Windows) -> None:
    s, e = words_logits(one_window, CONTEXT, {"Ada": 6.0}, {"Okafor": 5.0})
    [res] = decode(one_window, s, e, 1, DecodeSpec())
    assert texts(CONTEXT, res) == ["Ada Okafor"]
    span = res.spans[0]
    assert span.logit == pytest.approx(11.0)
    # the no-answer logit is start[CLS] + end[CLS] = 2 * LOW
    assert res.null_logit == pytest.approx(2 * LOW)
    assert span.score == pytest.approx(1.0)
    assert res.no_answer_score == pytest.approx(0.0, abs=1e-300)
    # a plausible no-answer: null = 4 + 4 = 8, best = 11 -> score = 1 / (1 + e^-3) = 0.9526
    s[0, 0] = e[0, 0] = 4.0
    [res] = decode(one_window, s, e, 1, DecodeSpec())
    assert res.spans[0].score == pytest.approx(1 / (1 + math.exp(-3.0)))
    assert res.spans[0].score == pytest.approx(0.952574, abs=1e-6)
    assert res.spans[0].score + res.no_answer_score == pytest.approx(1.0)


def test_span_texts_are_exact_slices_through_normalisation(one_window: Windows) -> None:
    """Tokens are lower-cased and accent-stripped; the answer keeps the context's spelling."""
    # "Tromsø" tokenizes into several word pieces: start on the first, end on the last
    offs = [(a, b) for a, b in one_window.offsets[0].tolist() if a != NOT_CONTEXT]
    where = CONTEXT.index("Tromsø")
    pos = [k for k, (a, b) in enumerate(offs) if where <= a < where + len("Tromsø")]
    assert len(pos) >= 2
    head = int(np.flatnonzero(one_window.offsets[0, :, 0] != NOT_CONTEXT)[0])
    s = np.full(one_window.input_ids.shape, LOW, np.float32)
    e = s.copy()
    s[0, head + pos[0]] = 4.0
    e[0, head + pos[-1]] = 4.0
    [res] = decode(one_window, s, e, 1, DecodeSpec())
    assert texts(CONTEXT, res) == ["Tromsø"]


def test_top_k_order_and_scores(one_window: Windows) -> None:
    """start(2011)=5, start(Ada)=3, end(2011)=4, end(Okafor)=2, [CLS]=3+3, all else LOW.

    Spans: 2011..2011 = 9, 2011..Okafor = 7 (6 tokens: within 30), Ada..Okafor = 5; every
    other span uses a LOW logit. So top-3 is [2011, "2011 by Ada Okafor", "Ada Okafor"] and
    the probabilities are softmax([9, 7, 5, null=6]).
    """
    s, e = words_logits(
        one_window, CONTEXT, {"2011": 5.0, "Ada": 3.0}, {"2011": 4.0, "Okafor": 2.0}
    )
    s[0, 0] = e[0, 0] = 3.0
    [res] = decode(one_window, s, e, 1, DecodeSpec(top_k=3))
    assert texts(CONTEXT, res) == ["2011", "2011 by Ada Okafor", "Ada Okafor"]
    assert [sp.logit for sp in res.spans] == pytest.approx([9.0, 7.0, 5.0])
    # probabilities: softmax over the three spans and the no-answer logit 6
    z = np.exp(np.array([9.0, 7.0, 5.0, 6.0]) - 9.0)
    expected = z / z.sum()
    assert [sp.score for sp in res.spans] == pytest.approx(expected[:3].tolist())
    assert res.no_answer_score == pytest.approx(expected[3])
    scores = [sp.score for sp in res.spans]
    assert scores == sorted(scores, reverse=True)
    assert sum(scores) + res.no_answer_score == pytest.approx(1.0)
    assert scores == pytest.approx([0.8309527, 0.1124572, 0.0152194], abs=1e-6)
    # top_k=1 gives the same best span with the same probability: the score does not
    # depend on how many answers were asked for
    [one] = decode(one_window, s, e, 1, DecodeSpec(top_k=1))
    assert texts(CONTEXT, one) == ["2011"]
    assert one.spans[0].score == pytest.approx(res.spans[0].score)
    assert one.no_answer_score == pytest.approx(res.no_answer_score)
    assert one.spans[0].score + one.no_answer_score < 1.0


def test_max_answer_len_is_respected(one_window: Windows) -> None:
    # start on "nordhaven" pieces' first token, end on "tromsø"'s last piece: a long span
    offs = one_window.offsets[0]
    ctx_pos = np.flatnonzero(offs[:, 0] != NOT_CONTEXT)
    first, end_word = int(ctx_pos[0]), CONTEXT.index("Tromsø.") + len("Tromsø")
    last = int(next(p for p in ctx_pos if offs[p, 1] == end_word))
    length = last - first + 1
    s = np.full(one_window.input_ids.shape, LOW, np.float32)
    e = s.copy()
    s[0, first] = 8.0
    e[0, last] = 8.0
    e[0, first + 2] = 1.0  # the best short span: first .. first+2
    [long] = decode(one_window, s, e, 1, DecodeSpec(max_answer_len=length))
    assert CONTEXT[long.spans[0].start : long.spans[0].end] == CONTEXT[:end_word]
    [short] = decode(one_window, s, e, 1, DecodeSpec(max_answer_len=length - 1))
    sp = short.spans[0]
    assert sp.logit == pytest.approx(9.0)
    assert (sp.start, sp.end) == (int(offs[first, 0]), int(offs[first + 2, 1]))
    # every span of a top-20 list is at most max_answer_len tokens
    for max_len in (1, 2, 5):
        [res] = decode(one_window, s, e, 1, DecodeSpec(top_k=20, max_answer_len=max_len))
        assert len(res.spans) == 20
        for span in res.spans:
            toks = [p for p in ctx_pos if offs[p, 0] >= span.start and offs[p, 1] <= span.end]
            assert 1 <= len(toks) <= max_len


def test_spans_never_leave_the_context(qa_tokenizer: QATokenizer) -> None:
    """Huge logits on [CLS], question, [SEP] and padding columns are never picked."""
    tok = qa_tokenizer
    context = "The bridge opened in 1932."
    win = tok.windows(
        tok.encode_batch(["When did the bridge open?", "What opened?"]),
        tok.encode(context),
        WindowSpec(),
    ).padded_to(40, tok.pad_id)
    s = np.full(win.input_ids.shape, 50.0, np.float32)  # everything huge ...
    e = s.copy()
    is_ctx = win.offsets[:, :, 0] != NOT_CONTEXT
    s[is_ctx] = LOW  # ... except the context, which is low and flat
    e[is_ctx] = LOW
    s[0, 0] = e[0, 0] = LOW  # [CLS] of question 0 low: the no-answer candidate is 2 * LOW
    results = decode(win, s, e, 2, DecodeSpec(top_k=50, max_answer_len=30))
    n_ctx = int(is_ctx[0].sum())
    for res in results:
        # all n(n+1)/2 context spans, nothing else
        assert len(res.spans) == n_ctx * (n_ctx + 1) // 2
        for span in res.spans:
            assert 0 <= span.start < span.end <= len(context)
            assert span.logit == pytest.approx(2 * LOW)
    assert results[0].null_logit == pytest.approx(2 * LOW)
    assert results[1].null_logit == pytest.approx(100.0)
    assert results[1].no_answer_score == pytest.approx(1.0)
    # the engine may return logits wider than the windows: extra columns are ignored
    wide_s = np.concatenate([s, np.full((win.count, 8), 99.0, np.float32)], axis=1)
    wide_e = np.concatenate([e, np.full((win.count, 8), 99.0, np.float32)], axis=1)
    assert decode(win, wide_s, wide_e, 2, DecodeSpec(top_k=3)) == decode(
        win, s, e, 2, DecodeSpec(top_k=3)
    )


def test_no_answer_threshold(one_window: Windows) -> None:
    s, e = words_logits(one_window, CONTEXT, {"340": 2.0}, {"people": 2.0})
    s[0, 0], e[0, 0] = 3.0, 3.0  # null logit 6, best span logit 4: null - best = 2
    expect = ["340 people"]
    [res] = decode(one_window, s, e, 1, DecodeSpec())
    assert texts(CONTEXT, res) == expect
    assert res.null_logit == pytest.approx(6.0)
    assert res.no_answer_score == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert res.spans[0].score + res.no_answer_score == pytest.approx(1.0)
    for threshold, answered in [(1.5, False), (2.0, True), (2.5, True), (-100.0, False)]:
        [res] = decode(one_window, s, e, 1, DecodeSpec(no_answer_threshold=threshold))
        assert (texts(CONTEXT, res) == expect) is answered, threshold
        assert res.null_logit == pytest.approx(6.0)  # reported either way
    # a negative threshold asks for more confidence than the null: best 4 vs null 6 - 3
    s[0, 0], e[0, 0] = 1.0, 0.0  # null 1, best 4: null - best = -3
    [res] = decode(one_window, s, e, 1, DecodeSpec(no_answer_threshold=-2.5))
    assert texts(CONTEXT, res) == expect
    [res] = decode(one_window, s, e, 1, DecodeSpec(no_answer_threshold=-3.5))
    assert texts(CONTEXT, res) == []


def test_null_logit_is_lowest_over_windows(qa_tokenizer: QATokenizer) -> None:
    tok = qa_tokenizer
    context = " ".join(f"word{i}" for i in range(30)) + " Lisbon is the answer."
    q = tok.encode("Which city?")
    spec = WindowSpec(max_seq_len=len(q.ids) + 3 + 24, overlap=6, max_question_len=len(q.ids))
    win = tok.windows([q], tok.encode(context), spec)
    assert win.count >= 3
    s, e = words_logits(win, context, {"Lisbon": 2.0}, {"Lisbon": 2.0})
    s[:, 0] = [5.0] * win.count
    e[:, 0] = [5.0] * win.count
    s[1, 0] = 0.5  # one window is sure there is an answer in the context
    [res] = decode(win, s, e, 1, DecodeSpec(no_answer_threshold=0.0))
    assert res.null_logit == pytest.approx(5.5)
    assert texts(context, res) == []  # 5.5 - 4 > 0
    [res] = decode(win, s, e, 1, DecodeSpec(no_answer_threshold=1.5))
    assert texts(context, res) == ["Lisbon"]


def test_duplicate_spans_from_overlapping_windows_are_merged(qa_tokenizer: QATokenizer) -> None:
    """The same characters seen by two windows count once, with the better logit."""
    tok = qa_tokenizer
    context = " ".join(f"w{i}" for i in range(12)) + " Oslo and Bergen are cities."
    q = tok.encode("Which cities?")
    spec = WindowSpec(max_seq_len=len(q.ids) + 3 + 20, overlap=14, max_question_len=len(q.ids))
    win = tok.windows([q], tok.encode(context), spec)
    with_oslo = [
        w for w in range(win.count) if any(
            context[a:b] == "Oslo" for a, b in win.offsets[w].tolist() if a != NOT_CONTEXT
        )
    ]
    assert len(with_oslo) >= 2
    s, e = words_logits(win, context, {"Oslo": 4.0, "Bergen": 3.0}, {"Oslo": 4.0, "Bergen": 3.0})
    bump = with_oslo[-1]
    s[bump] = np.where(s[bump] > LOW, s[bump] + 0.5, s[bump])  # one window is a bit surer
    [res] = decode(win, s, e, 1, DecodeSpec(top_k=4))
    got = texts(context, res)
    assert len(got) == len(set(got)) == 4
    assert got[0] == "Oslo"
    assert res.spans[0].logit == pytest.approx(8.5)  # the better of the duplicates
    assert got[1:3] == ["Oslo and Bergen", "Bergen"]
    assert [sp.logit for sp in res.spans[:3]] == pytest.approx([8.5, 7.5, 6.5])


@pytest.mark.parametrize("top_k", [1, 2, 3, 5, 10])
def test_top_k_is_filled_when_windows_repeat_spans(qa_tokenizer: QATokenizer, top_k: int) -> None:
    """Heavily overlapping windows that agree on the logits repeat every span many times;
    decoding must still return top_k distinct answers when that many exist."""
    tok = qa_tokenizer
    context = " ".join(str(i) for i in range(40))  # 40 one-token words
    q = tok.encode("Which?")
    spec = WindowSpec(max_seq_len=len(q.ids) + 3 + 12, overlap=10, max_question_len=len(q.ids))
    win = tok.windows([q], tok.encode(context), spec)
    # step 2: each of the tokens 10..29 is in 6 windows
    table = {str(i): (40 - i) / 10 for i in range(20, 40)}
    s, e = words_logits(win, context, table, table)
    [res] = decode(win, s, e, 1, DecodeSpec(top_k=top_k, max_answer_len=1))
    assert texts(context, res) == [str(i) for i in range(20, 20 + top_k)]
    assert [sp.logit for sp in res.spans] == pytest.approx(
        [2 * (40 - i) / 10 for i in range(20, 20 + top_k)]
    )


def test_top_k_is_filled_for_hangul(qa_tokenizer: QATokenizer) -> None:
    """A Hangul syllable becomes several jamo tokens with one char span: many token spans,
    one answer. Asking for 3 answers must give 3 distinct ones."""
    tok = qa_tokenizer
    context = "서울은 한국의 수도이고 부산은 항구 도시이다."
    q = tok.encode("수도는?")
    spec = WindowSpec(max_seq_len=len(q.ids) + 3 + 30, overlap=20, max_question_len=len(q.ids))
    win = tok.windows([q], tok.encode(context), spec)
    s, e = words_logits(win, context, {"한": 5.0, "부": 3.0}, {"한": 5.0, "부": 3.0}, unit=r"\w")
    [res] = decode(win, s, e, 1, DecodeSpec(top_k=3))
    assert texts(context, res) == ["한", "한국의 수도이고 부", "부"]
    assert [sp.logit for sp in res.spans] == pytest.approx([10.0, 8.0, 6.0])


def test_questions_are_routed_by_question_index(qa_tokenizer: QATokenizer) -> None:
    tok = qa_tokenizer
    context = " ".join(f"filler{i}" for i in range(20)) + " Ada Okafor founded it in 2011."
    qs = tok.encode_batch(["Who founded it?", "When?", "Where?"])
    spec = WindowSpec(max_seq_len=32, overlap=8, max_question_len=8)
    win = tok.windows(qs, tok.encode(context), spec)
    assert win.count > 3 and set(win.question_index.tolist()) == {0, 1, 2}
    per_question = [
        words_logits(win, context, {"Ada": 4.0}, {"Okafor": 4.0}),
        words_logits(win, context, {"2011": 4.0}, {"2011": 4.0}),
        words_logits(win, context, {}, {}),
    ]
    rows_q = win.question_index
    s = np.stack([per_question[q][0][w] for w, q in enumerate(rows_q)])
    e = np.stack([per_question[q][1][w] for w, q in enumerate(rows_q)])
    s[rows_q == 2, 0] = e[rows_q == 2, 0] = 9.0  # question 2 has no answer here
    results = decode(win, s, e, 3, DecodeSpec(no_answer_threshold=0.0))
    assert [texts(context, r) for r in results] == [["Ada Okafor"], ["2011"], []]
    # shuffling the rows (and the logits with them) changes nothing
    perm = np.random.default_rng(0).permutation(win.count)
    shuffled = Windows(
        input_ids=win.input_ids[perm],
        attention_mask=win.attention_mask[perm],
        token_type_ids=win.token_type_ids[perm],
        offsets=win.offsets[perm],
        question_index=win.question_index[perm],
        lengths=win.lengths[perm],
    )
    again = decode(shuffled, s[perm], e[perm], 3, DecodeSpec(no_answer_threshold=0.0))
    assert [texts(context, r) for r in again] == [["Ada Okafor"], ["2011"], []]


def test_empty_context_gives_no_answer(qa_tokenizer: QATokenizer) -> None:
    tok = qa_tokenizer
    win = tok.windows([tok.encode("Anything?")], tok.encode("   \u200b "), WindowSpec())
    s = np.zeros(win.input_ids.shape, np.float32)
    for top_k in (1, 3, N_BEST + 5):
        [res] = decode(win, s, s, 1, DecodeSpec(top_k=top_k))
        assert res.spans == ()
        assert res.no_answer_score == pytest.approx(1.0)


@pytest.mark.parametrize("top_k", [3, 4, 10, N_BEST, N_BEST + 1])
def test_top_k_larger_than_the_candidates(qa_tokenizer: QATokenizer, top_k: int) -> None:
    """A two-token context has exactly 3 spans; asking for more returns those 3."""
    tok = qa_tokenizer
    context = "Paris."
    win = tok.windows([tok.encode("Where?")], tok.encode(context), WindowSpec())
    s, e = words_logits(win, context, {"Paris": 2.0, ".": 1.0}, {"Paris": 2.0, ".": 0.5},
                        unit=r"\w+|\.")
    [res] = decode(win, s, e, 1, DecodeSpec(top_k=top_k))
    # Paris..Paris = 4, Paris..'.' = 2.5, '.'..'.' = 1.5; null = 2 * LOW
    assert texts(context, res) == ["Paris", "Paris.", "."]
    z = np.exp(np.array([4.0, 2.5, 1.5]) - 4.0)
    assert [sp.score for sp in res.spans] == pytest.approx((z / z.sum()).tolist())


# --- against a brute-force decoder ----------------------------------------------------------


def brute_force(
    win: Windows, start: np.ndarray, end: np.ndarray, q: int, spec: DecodeSpec
) -> tuple[list[tuple[int, int, float]], float]:
    best: dict[tuple[int, int], float] = {}
    rows = np.flatnonzero(win.question_index == q)
    for w in rows:
        ctx = [p for p in range(win.seq_len) if win.offsets[w, p, 0] != NOT_CONTEXT]
        for i in ctx:
            for j in ctx:
                if i <= j < i + spec.max_answer_len:
                    key = (int(win.offsets[w, i, 0]), int(win.offsets[w, j, 1]))
                    logit = float(np.float32(start[w, i]) + np.float32(end[w, j]))
                    best[key] = max(best.get(key, -math.inf), logit)
    ranked = sorted(best.items(), key=lambda kv: -kv[1])[: spec.top_k]
    null = min(float(np.float32(start[w, 0]) + np.float32(end[w, 0])) for w in rows)
    return [(a, b, lg) for (a, b), lg in ranked], null


BRUTE_CONTEXT = (
    "Die Brücke über den Fluss wurde 1932 eröffnet; 東京 liegt in Japan, 서울은 한국의 수도. "
    "It is 1,204 metres long and cost $4.5 million."
)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_questions=st.integers(1, 3),
    budget=st.integers(4, 30),
    overlap_frac=st.floats(0, 0.95),
    top_k=st.integers(1, 8),
    max_answer_len=st.integers(1, 12),
    agree=st.booleans(),
    pad=st.integers(0, 5),
)
def test_decode_matches_brute_force(
    qa_tokenizer: QATokenizer,
    seed: int,
    n_questions: int,
    budget: int,
    overlap_frac: float,
    top_k: int,
    max_answer_len: int,
    agree: bool,
    pad: int,
) -> None:
    tok = qa_tokenizer
    rng = np.random.default_rng(seed)
    qs = tok.encode_batch(["Wann wurde sie eröffnet?", "How long?", "수도는?"][:n_questions])
    q_max = max(len(q.ids) for q in qs)
    spec = WindowSpec(
        max_seq_len=q_max + 3 + budget,
        overlap=min(budget - 1, int(budget * overlap_frac)),
        max_question_len=q_max,
    )
    win = tok.windows(qs, tok.encode(BRUTE_CONTEXT), spec)
    win = win.padded_to(win.seq_len + pad, tok.pad_id)
    if agree:
        # windows agree: a token's logits depend on its context char span only (+ tiny noise),
        # so overlapping windows repeat the same candidates
        per_char = rng.normal(size=(len(BRUTE_CONTEXT) + 1, 2)).astype(np.float32)
        a = np.clip(win.offsets[:, :, 0], 0, None)
        s = per_char[a, 0] + rng.normal(scale=1e-3, size=a.shape).astype(np.float32)
        e = per_char[a, 1] + rng.normal(scale=1e-3, size=a.shape).astype(np.float32)
        s, e = s.astype(np.float32), e.astype(np.float32)
    else:
        s = rng.normal(size=win.input_ids.shape).astype(np.float32)
        e = rng.normal(size=win.input_ids.shape).astype(np.float32)
    dspec = DecodeSpec(top_k=top_k, max_answer_len=max_answer_len)
    results = decode(win, s, e, n_questions, dspec)
    assert len(results) == n_questions
    for q, res in enumerate(results):
        expected, null = brute_force(win, s, e, q, dspec)
        assert [(sp.start, sp.end) for sp in res.spans] == [(a, b) for a, b, _ in expected]
        assert [sp.logit for sp in res.spans] == pytest.approx([lg for _, _, lg in expected])
        assert res.null_logit == pytest.approx(null)
        probs = [sp.score for sp in res.spans]
        assert all(0.0 <= p <= 1.0 for p in probs)
        assert probs == sorted(probs, reverse=True)
        # softmax over the N_BEST best distinct spans (whatever top_k is) and the null
        pool, _ = brute_force(win, s, e, q, DecodeSpec(top_k=max(top_k, N_BEST),
                                                       max_answer_len=max_answer_len))
        logits = np.array([lg for *_, lg in pool] + [null])
        z = np.exp(logits - logits.max())
        want = z / z.sum()
        assert probs == pytest.approx(want[: len(probs)].tolist())
        assert res.no_answer_score == pytest.approx(want[-1])
        assert sum(probs) + res.no_answer_score <= 1.0 + 1e-9
        if len(pool) <= top_k:  # every candidate reported: the probabilities add up to 1
            assert sum(probs) + res.no_answer_score == pytest.approx(1.0)
