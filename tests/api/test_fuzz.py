"""Property-based fuzzing of the public JSON POST endpoints, in-process, real CPU engine.

Whatever a client sends, the gateway answers either 200 with a body that keeps the response
schema's promises (answers are exact slices of the context, finite probabilities) or a 4xx
whose body is the error table's ``{"error": {"code", "message", "request_id"}}`` with the
status the table gives that code. Never a 5xx (the TestClient re-raises a server exception,
so one fails the test with its traceback).

Schema-shaped requests run against an app with small limits (and small windows), so that
strings near and over the limits and many-window requests stay cheap on a 2-core CPU.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from engine.onnx_cpu import OnnxEngine
from service.errors import RETRY_AFTER_S, STATUS, ErrorCode
from service.qa import INLINE_DECODE_WINDOWS, INLINE_TOKENIZE_CHARS
from service.schemas import QARequest, QAResponse
from service.settings import Settings
from tests.api.conftest import make_client

if TYPE_CHECKING:
    from httpx2 import Response  # what starlette's TestClient returns

POST_PATHS = ("/v1/qa",)  # every public POST route with a JSON body (checked below)
FIELDS = tuple(QARequest.model_fields)

FUZZ = settings(max_examples=120, deadline=None)

# small limits and windows: strings near and over the limits cost little, many windows are
# common (decoded in a worker thread above INLINE_DECODE_WINDOWS), and the longest contexts
# are tokenized in a worker thread (above INLINE_TOKENIZE_CHARS)
SMALL_LIMITS: dict[str, object] = {
    "max_context_chars": INLINE_TOKENIZE_CHARS + 500, "max_question_chars": 60, "max_questions": 3,
    "max_top_k": 5, "max_windows": 4 * INLINE_DECODE_WINDOWS, "max_seq_len": 64,
    "window_overlap": 16, "max_question_tokens": 16,
}


@pytest.fixture(scope="module")
def default_client(engine: OnnxEngine) -> Iterator[TestClient]:
    """The shipped configuration (one client for every example: no per-example startup)."""
    with make_client(engine) as c:
        yield c


@pytest.fixture(scope="module")
def small_client(engine: OnnxEngine) -> Iterator[TestClient]:
    with make_client(engine, **SMALL_LIMITS) as c:
        yield c


# --- checks ----------------------------------------------------------------------------------


def check_error(r: Response) -> ErrorCode:
    """A 4xx in the error table's shape, with the table's status for its code."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"code", "message", "request_id"}, err
    assert all(isinstance(v, str) for v in err.values()), err
    code = ErrorCode(err["code"])
    assert STATUS[code] == r.status_code, (code, r.status_code)
    assert err["message"] and err["request_id"] == r.headers["x-request-id"]
    assert "Traceback" not in r.text
    if code in RETRY_AFTER_S:
        assert r.headers["retry-after"] == str(RETRY_AFTER_S[code])
    return code


def check_answer(r: Response, sent: dict[str, Any], limits: Settings) -> None:
    """200: the response schema, and answers that slice the context exactly."""
    assert r.status_code == 200, r.text[:500]
    out = QAResponse.model_validate(r.json())
    context: str = sent["context"]
    questions = [sent["question"]] if sent.get("question") is not None else sent["questions"]
    top_k = sent.get("top_k") or limits.default_top_k
    assert len(out.answers) == len(out.no_answer_scores) == len(questions)
    assert len(questions) <= out.windows <= limits.max_windows
    for answers, no_answer in zip(out.answers, out.no_answer_scores, strict=True):
        assert math.isfinite(no_answer) and 0.0 <= no_answer <= 1.0
        assert len(answers) <= top_k
        scores = [a.score for a in answers]
        assert scores == sorted(scores, reverse=True)
        for a in answers:
            assert 0 <= a.start <= a.end <= len(context), a
            assert context[a.start : a.end] == a.text
            assert math.isfinite(a.score) and 0.0 <= a.score <= 1.0
        assert sum(scores) + no_answer <= 1.0 + 1e-6
    timing = out.timing.model_dump().values()
    assert all(math.isfinite(t) and t >= 0 for t in timing)
    assert r.headers["server-timing"]


def expected_statuses(sent: Any, limits: Settings) -> set[int]:
    """What the gateway should answer to a JSON body that decoded to ``sent``."""
    try:
        req = QARequest.model_validate(sent)
    except ValidationError:
        return {422}
    questions = req.all_questions
    if (len(req.context) > limits.max_context_chars or len(questions) > limits.max_questions
            or max(len(q) for q in questions) > limits.max_question_chars):
        return {413}
    if (req.top_k or limits.default_top_k) > limits.max_top_k:
        return {422}
    return {200, 413}  # 413: the context and questions need more than max_windows windows


def post(client: TestClient, path: str, raw: bytes, content_type: str | None) -> Response:
    headers = {} if content_type is None else {"content-type": content_type}
    return client.post(path, content=raw, headers=headers)


def check(r: Response, raw: bytes, limits: Settings, json_body: bool = True) -> None:
    """The response to a raw body: a JSON content type gets the full oracle."""
    if not json_body:  # the body is never parsed as JSON: 422 (or 413 when too large)
        assert check_error(r) in (ErrorCode.INVALID_INPUT, ErrorCode.PAYLOAD_TOO_LARGE)
        return
    try:
        sent = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8/16/32, ints over 4300 digits
        assert check_error(r) in (ErrorCode.INVALID_INPUT, ErrorCode.PAYLOAD_TOO_LARGE)
        return
    allowed = expected_statuses(sent, limits)
    assert r.status_code in allowed, (r.status_code, allowed, r.text[:500])
    if r.status_code == 200:
        check_answer(r, sent, limits)
        return
    code = check_error(r)
    if allowed == {200, 413}:
        assert code == ErrorCode.PAYLOAD_TOO_LARGE and "windows" in r.json()["error"]["message"]


def encode(value: object, ascii_only: bool) -> bytes:
    # NaN and +-Infinity are written as Python's json writes (and reads) them; a lone surrogate
    # as a \udXXX escape (ascii) or as its (invalid) UTF-8 bytes, which json.loads also takes
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", "surrogatepass")


def limits_of(client: TestClient) -> Settings:
    s: Settings = client.app.state.settings  # type: ignore[attr-defined]
    return s


# --- strategies ------------------------------------------------------------------------------

HUGE_INTS = st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**100,
                             -(10**300), 10**4000])
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), HUGE_INTS, st.floats(),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
# objects with the request's field names (and others) reach the validators, not just the parser
request_like = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=6)


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in n draws (an integer strategy would favour its bounds), shrinks to False."""
    return st.sampled_from(range(n)).map(lambda i: i == n - 1)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], n: int = 8
           ) -> st.SearchStrategy[Any]:
    return one_in(n).flatmap(lambda rare: bad if rare else good)


PIECES = (
    "The", "Amazon", "rainforest", "covers", "7,000,000", "km²", "in", "1958", "Brazil.", "60%",
    "Zürich", "Ørjan", "東京タワー", "서울은", "한국의", "القاهرة", "Москва", "עברית", "ॐ", "ไทย",
    "🎉", "👩‍👩‍👧‍👦", "🇳🇴", "e\u0301", "\u0301", "ﬁ", "ß", "İ", "Ⅻ", "①", "\U0001d54f", "\U0010ffff",
    "\u200b", "\u200d", "\u2060", "\ufeff", "\u00a0", "\u3000", "\u2028", "\u0085", "\u202e",
    "\x00", "\x07", "\x1b[0m", "\x7f", "\t", "\n", "\r\n", "\ufffd", "\uffff", "\ud800", "\udfff",
    "<b>", "%s", "{}", "\\", '"', "'", "[SEP]", "[CLS]", "[PAD]", "[UNK]", "##ing",
)
UNITS = ("word ", "The rainforest covers Brazil. ", "東", "🎉", "e\u0301", "a\u200b", " x", "\x00",
         "Ünïcödé ")
WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2003\u2028\u2029\u202f\u205f\u3000"


def texts(limit: int) -> st.SearchStrategy[str]:
    joined = st.tuples(st.lists(st.sampled_from(PIECES), min_size=1, max_size=24),
                       st.sampled_from([" ", "", "\u200b"])).map(lambda t: t[1].join(t[0]))
    near_limit = st.builds(lambda unit, n: (unit * n)[:n], st.sampled_from(UNITS),
                           st.sampled_from([limit - 1, limit, limit + 1, 2 * limit]))
    some_text = st.one_of(
        st.sampled_from(PIECES),
        joined,
        st.text(st.characters(exclude_categories=()), min_size=1, max_size=40),  # surrogates too
        near_limit,
    )
    return mostly(some_text, st.text(st.sampled_from(WHITESPACE), max_size=8), n=6)  # empty, blank


def bounded_int(low: int, high: int) -> st.SearchStrategy[int]:
    """Mostly in or just outside [low, high]; at times far outside (huge, negative)."""
    return mostly(st.integers(low - 1, high + 1),
                  st.sampled_from([low - 1, high + 1, 0, -1, -(10**30)]) | HUGE_INTS, n=4)


WRONG_TYPES: st.SearchStrategy[Any] = json_values | st.sampled_from(
    [True, False, 0, 3, 3.0, -0.0, 1e999, "3", "", [], ["x"], {}, None])
MISTAKES = ("wrong type", "missing field", "both question and questions", "unknown field")


@st.composite
def qa_requests(draw: st.DrawFn, limits: Settings) -> dict[str, Any]:
    """Valid field names and types with adversarial values; one request in three has a mistake."""
    body: dict[str, Any] = {"context": draw(texts(limits.max_context_chars))}
    question = texts(limits.max_question_chars)
    if draw(st.booleans()):
        body["question"] = draw(question)
    else:
        body["questions"] = draw(mostly(st.lists(question, min_size=1, max_size=limits.max_questions + 1),
                                        st.just([])))
    if draw(st.booleans()):
        body["top_k"] = draw(bounded_int(1, limits.max_top_k))
    if draw(st.booleans()):
        body["max_answer_len"] = draw(bounded_int(1, 128))
    if draw(st.booleans()):
        body["no_answer_threshold"] = draw(st.floats() | st.integers(-100, 100) | HUGE_INTS)
    if draw(one_in(3)):
        mistake = draw(st.sampled_from(MISTAKES))
        if mistake == "wrong type":
            body[draw(st.sampled_from(FIELDS))] = draw(WRONG_TYPES)
        elif mistake == "missing field":
            del body[draw(st.sampled_from(sorted(body)))]
        elif mistake == "both question and questions":
            body["question"], body["questions"] = "Who?", ["Who?"]
        else:
            key = draw(st.text(max_size=10).filter(lambda k: k not in FIELDS))
            body[key] = draw(json_values)
    return body


CONTENT_TYPES = (None, "application/json", "application/json; charset=utf-8", "application/problem+json",
                 "application/json; charset=latin-1", "text/plain", "text/json", "json", "",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz",
                 "application/octet-stream", "application/json, text/plain")
VALID = json.dumps({"context": "Ada Okafor founded Nordhaven in 2011.", "question": "Who?"}).encode()
NASTY_BODIES = (
    b"", b"null", b"[]", b"{}", b"0", b'"x"', b"NaN", b"-Infinity", b"\xff\xfe", b"\x00" * 8,
    b"[" * 100_000, b'{"a":' * 50_000,  # nesting deeper than the JSON parser's recursion
    b'{"context": "Text.", "question": "Who?", "top_k": ' + b"9" * 5000 + b"}",  # > 4300 digits
    b'{"context": "Text.", "question": "Who?", "top_k": 1e999}',
    b'{"context": "Text \\ud800 here.", "question": "Who?"}',
    b'{"context": "Text \xed\xa0\x80 here.", "question": "Who?"}',  # a surrogate as UTF-8 bytes
    b'{"context": "Text.", "questions": ["ok?", "\\udfff"]}',
    b'{"context": "Text.", "question": "Who?", "context": "dup"}',
    b"\xef\xbb\xbf" + VALID,  # UTF-8 BOM
    json.dumps({"context": "Text.", "question": "Who?"}).encode("utf-16"),
    VALID[:-1], VALID + b"x", VALID + b",",
)


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    """A valid request with a few bytes cut, inserted or changed."""
    body = bytearray(VALID)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(body)))
        op = draw(st.sampled_from(["cut", "insert", "set"]))
        if op == "cut":
            del body[i : i + draw(st.integers(1, 8))]
        elif op == "insert":
            body[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif i < len(body):
            body[i] = draw(st.integers(0, 255))
    return bytes(body)


raw_bodies = st.one_of(st.binary(max_size=200), st.sampled_from(NASTY_BODIES), mangled())


def is_json_type(content_type: str | None) -> bool:
    if not content_type:
        return False  # FastAPI's strict_content_type: no content type, no JSON
    main, _, rest = content_type.partition(";")[0].strip().partition("/")
    return main == "application" and (rest == "json" or rest.endswith("+json"))


# --- properties ------------------------------------------------------------------------------


def test_every_public_json_post_route_is_fuzzed(default_client: TestClient) -> None:
    spec = default_client.get("/openapi.json").json()
    posts = {path for path, ops in spec["paths"].items()
             if "application/json" in ops.get("post", {}).get("requestBody", {}).get("content", {})}
    assert posts == set(POST_PATHS)


@pytest.mark.parametrize("path", POST_PATHS)
@FUZZ
@given(value=st.one_of(json_values, request_like), ascii_only=st.booleans())
def test_any_json_value_is_an_answer_or_a_clean_4xx(
    default_client: TestClient, path: str, value: object, ascii_only: bool
) -> None:
    raw = encode(value, ascii_only)
    r = post(default_client, path, raw, "application/json")
    check(r, raw, limits_of(default_client))


@pytest.mark.parametrize("path", POST_PATHS)
@FUZZ
@given(raw=raw_bodies, content_type=st.sampled_from(CONTENT_TYPES))
def test_any_bytes_are_an_answer_or_a_clean_4xx(
    default_client: TestClient, path: str, raw: bytes, content_type: str | None
) -> None:
    r = post(default_client, path, raw, content_type)
    check(r, raw, limits_of(default_client), json_body=is_json_type(content_type))


@pytest.mark.parametrize("path", POST_PATHS)
@settings(FUZZ, max_examples=150)
@given(data=st.data(), ascii_only=st.booleans())
def test_adversarial_requests_are_an_answer_or_a_clean_4xx(
    small_client: TestClient, path: str, data: st.DataObject, ascii_only: bool
) -> None:
    limits = limits_of(small_client)
    body = data.draw(qa_requests(limits), label="body")
    raw = encode(body, ascii_only)
    r = post(small_client, path, raw, "application/json")
    check(r, raw, limits)


# --- regressions found by the properties above -----------------------------------------------


@pytest.mark.parametrize("ascii_only", [True, False], ids=["escaped", "utf8-bytes"])
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"context": "Text \ud800 here.", "question": "Who?"}, "context"),
        ({"context": "The", "question": "\ud800"}, "question"),  # as hypothesis shrank it
        ({"context": "Text.", "questions": ["Who?", "\ud83d"]}, "questions[1]"),
    ],
)
def test_lone_surrogate_is_422_not_500(
    client: TestClient, body: dict[str, Any], field: str, ascii_only: bool
) -> None:
    """A lone surrogate, escaped (\\ud800) or as its UTF-8 bytes (which Python's json.loads
    takes), was a 500: the tokenizer raised TypeError on a str that is no valid Unicode."""
    r = post(client, "/v1/qa", encode(body, ascii_only), "application/json")
    assert r.status_code == 422
    assert check_error(r) == ErrorCode.INVALID_INPUT
    assert f"{field} must be valid Unicode" in r.json()["error"]["message"]


def test_escaped_astral_context_at_its_limit_passes_the_body_guard(engine: OnnxEngine) -> None:
    """A context of max_context_chars emoji, ASCII-escaped (12 bytes each), was refused by the
    body-size guard (6 bytes a character) although every limit allowed it."""
    with make_client(engine, max_context_chars=20_000, max_questions=1, max_question_chars=10,
                     max_windows=1) as c:
        body = {"context": "\U0001F600" * 20_000, "question": "Who?"}
        raw = encode(body, ascii_only=True)
        assert len(raw) > 6 * 20_010 + 65_536  # over the old guard
        r = post(c, "/v1/qa", raw, "application/json")
        assert r.status_code == 200, r.text[:300]  # one word: one [UNK] token, one window
