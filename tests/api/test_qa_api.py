"""POST /v1/qa in-process: real tokenizer, real ONNX engine, real decoding."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from engine.onnx_cpu import OnnxEngine
from tests.api.conftest import make_client

CONTEXT = (
    "The Amazon rainforest covers much of the Amazon basin of South America. "
    "The basin covers 7,000,000 square kilometres, of which 5,500,000 square kilometres "
    "are covered by the rainforest. The majority of the forest is contained within Brazil, "
    "with 60% of the rainforest, followed by Peru with 13% and Colombia with 10%."
)


def ask(client: TestClient, **body: object) -> dict:
    r = client.post("/v1/qa", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_single_question_answer_is_exact_slice(client: TestClient) -> None:
    out = ask(client, context=CONTEXT, question="Which country contains most of the forest?")
    best = out["answers"][0][0]
    assert best["text"] == "Brazil"
    assert CONTEXT[best["start"] : best["end"]] == best["text"]
    assert 0.5 < best["score"] <= 1.0


def test_several_questions_one_call(client: TestClient) -> None:
    qs = ["How large is the Amazon basin?", "Which country follows Brazil?",
          "On which continent is the Amazon basin?"]
    out = ask(client, context=CONTEXT, questions=qs)
    assert len(out["answers"]) == 3 and out["windows"] == 3
    assert "7,000,000 square kilometres" in out["answers"][0][0]["text"]
    assert out["answers"][1][0]["text"] == "Peru"
    assert out["answers"][2][0]["text"] == "South America"


def test_top_k_ranked_distinct(client: TestClient) -> None:
    out = ask(client, context=CONTEXT, question="Which country contains most of the forest?", top_k=3)
    answers = out["answers"][0]
    assert len(answers) == 3
    scores = [a["score"] for a in answers]
    assert scores == sorted(scores, reverse=True)
    assert len({(a["start"], a["end"]) for a in answers}) == 3


def test_long_context_windows_and_answer_in_late_window(client: TestClient) -> None:
    filler = " ".join(f"Sentence number {i} talks about nothing in particular." for i in range(120))
    context = filler + " The secret password of the archive is marmalade-42. " + filler
    out = ask(client, context=context, question="What is the secret password of the archive?")
    assert out["windows"] >= 4
    best = out["answers"][0][0]
    assert "marmalade" in best["text"]
    assert context[best["start"] : best["end"]] == best["text"]


@pytest.mark.parametrize(
    "context",
    [
        "Café Noël in Zürich was founded by Ørjan Åsheim in 1987.",
        "東京タワーは1958年に完成した。 The Tokyo Tower was completed in 1958.",
        "The party 🎉🎉 starts at 9pm on Friday at Ana's house.",
        "Combining marks: e\u0301 and a\u0308 appear in the name Rene\u0301e Mu\u0308ller, born 1990.",
    ],
)
def test_unicode_answers_are_exact_slices(client: TestClient, context: str) -> None:
    out = ask(client, context=context, question="When?", top_k=5)
    for a in out["answers"][0]:
        assert context[a["start"] : a["end"]] == a["text"]


def test_no_answer_threshold(client: TestClient) -> None:
    q = "What is the boiling point of mercury?"
    forced = ask(client, context=CONTEXT, question=q, no_answer_threshold=-1000.0)
    assert forced["answers"] == [[]]
    normal = ask(client, context=CONTEXT, question=q)
    assert len(normal["answers"][0]) == 1


def test_server_timing_header_and_body_agree(client: TestClient) -> None:
    r = client.post("/v1/qa", json={"context": CONTEXT, "question": "Where is the basin?"})
    header = r.headers["server-timing"]
    phases = dict(p.strip().split(";dur=") for p in header.split(","))
    assert set(phases) == {"tokenize", "infer", "decode", "total"}
    assert float(phases["total"]) == pytest.approx(r.json()["timing"]["total_ms"], abs=1e-3)
    assert r.headers["x-request-id"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"context": "   ", "question": "Who?"}, "context"),
        ({"context": "Text.", "question": "\n\t "}, "question"),
        ({"context": "Text.", "questions": []}, "questions"),
        ({"context": "Text.", "questions": ["ok", " "]}, "questions[1]"),
        ({"context": "Text."}, "exactly one"),
        ({"context": "Text.", "question": "a", "questions": ["b"]}, "exactly one"),
        ({"context": 42, "question": "Who?"}, "context"),
        ({"context": "Text.", "question": "Who?", "top_k": 0}, "top_k"),
        ({"context": "Text.", "question": "Who?", "top_k": "3"}, "top_k"),
        ({"context": "Text.", "question": "Who?", "max_answer_len": 129}, "max_answer_len"),
        ({"context": "Text.", "question": "Who?", "colour": "red"}, "colour"),
    ],
)
def test_invalid_input_is_422_with_error_body(client: TestClient, body: dict, fragment: str) -> None:
    r = client.post("/v1/qa", json=body)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_input" and fragment in err["message"]
    assert err["request_id"] == r.headers["x-request-id"]
    assert "Traceback" not in r.text and "Error(" not in r.text


def test_malformed_json_is_422(client: TestClient) -> None:
    r = client.post("/v1/qa", content=b'{"context": ', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_input"


def test_limits_are_413(engine: OnnxEngine) -> None:
    with make_client(engine, max_context_chars=100, max_questions=2, max_question_chars=20,
                     max_windows=3) as c:
        cases = [
            {"context": "x " * 60, "question": "Why?"},
            {"context": "Short.", "questions": ["a?", "b?", "c?"]},
            {"context": "Short.", "question": "q" * 21},
        ]
        for body in cases:
            r = c.post("/v1/qa", json=body)
            assert r.status_code == 413, body
            assert r.json()["error"]["code"] == "payload_too_large"
    with make_client(engine, max_windows=3, max_seq_len=64, window_overlap=16,
                     max_question_tokens=16) as c:
        r = c.post("/v1/qa", json={"context": "word " * 400, "question": "Which word?"})
        assert r.status_code == 413 and "windows" in r.json()["error"]["message"]


def test_body_larger_than_limit_is_413_before_parsing(engine: OnnxEngine) -> None:
    with make_client(engine, max_context_chars=10, max_questions=1, max_question_chars=10) as c:
        r = c.post("/v1/qa", content=b"x" * 200_000, headers={"content-type": "application/json"})
        assert r.status_code == 413


def test_chunked_body_over_limit_is_413(engine: OnnxEngine) -> None:
    def chunks():  # no Content-Length: the body arrives in pieces
        yield b'{"question": "Who?", "context": "'
        for _ in range(50):
            yield b"x" * 10_000
        yield b'"}'

    with make_client(engine, max_context_chars=10, max_questions=1, max_question_chars=10) as c:
        r = c.post("/v1/qa", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        error = r.json()["error"]
        # stopped while streaming, not after parsing the whole body
        assert error["code"] == "payload_too_large" and "request body is larger" in error["message"]


def test_top_k_above_limit(engine: OnnxEngine) -> None:
    with make_client(engine, max_top_k=3) as c:
        r = c.post("/v1/qa", json={"context": CONTEXT, "question": "Where?", "top_k": 4})
        assert r.status_code == 422


def test_unknown_route_and_method(client: TestClient) -> None:
    assert client.get("/v1/nothing").json()["error"]["code"] == "not_found"
    r = client.get("/v1/qa")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_health_and_metrics(client: TestClient) -> None:
    assert client.get("/health/live").json() == {"status": "live"}
    assert client.get("/health/ready").json() == {"status": "ready"}
    ask(client, context=CONTEXT, question="Where is the basin?")
    client.post("/v1/qa", json={"context": " ", "question": "x"})
    text = client.get("/metrics").text
    assert 'qa_request_duration_seconds_count{outcome="ok",route="/v1/qa"} 1.0' in text
    assert 'qa_errors_total{code="invalid_input"} 1.0' in text
    for phase in ("tokenize", "infer", "decode"):
        assert f'qa_phase_duration_seconds_count{{phase="{phase}"}} 1.0' in text
    assert "qa_latency_budget_seconds 0.01" in text


def test_openapi_documents_the_api(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    post = spec["paths"]["/v1/qa"]["post"]
    assert {"200", "413", "422", "429", "503", "504"} <= set(post["responses"])
