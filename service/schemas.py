"""HTTP request and response bodies (pydantic at the edge only)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def _text(value: str, field: str) -> str:
    if not value.strip():
        raise ValueError(f"{field} must not be empty or whitespace")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # JSON can escape a lone surrogate (\ud800); no tokenizer takes one
            raise ValueError(f"{field} must be valid Unicode (it has a lone surrogate)") from None
    return value


class QARequest(BaseModel):
    """One context and one question, or one context and several questions."""

    model_config = ConfigDict(extra="forbid", strict=True)

    context: str = Field(description="The paragraph(s) to answer from")
    question: str | None = Field(None, description="A single question")
    questions: list[str] | None = Field(None, description="Several questions, one context")
    top_k: int | None = Field(None, ge=1, description="Answers per question (default 1)")
    max_answer_len: int | None = Field(None, ge=1, le=128, description="Longest answer in tokens")
    no_answer_threshold: float | None = Field(
        None,
        description="Answer nothing when null_logit - best_logit > threshold (SQuAD v2 style)",
    )

    @field_validator("context")
    @classmethod
    def _context(cls, v: str) -> str:
        return _text(v, "context")

    @field_validator("question")
    @classmethod
    def _question(cls, v: str | None) -> str | None:
        return None if v is None else _text(v, "question")

    @field_validator("questions")
    @classmethod
    def _questions(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("questions must not be empty")
        return [_text(q, f"questions[{i}]") for i, q in enumerate(v)]

    @model_validator(mode="after")
    def _one_of(self) -> QARequest:
        if (self.question is None) == (self.questions is None):
            raise ValueError("give exactly one of 'question' or 'questions'")
        return self

    @property
    def all_questions(self) -> list[str]:
        return [self.question] if self.question is not None else list(self.questions or [])


class Answer(BaseModel):
    text: str = Field(description="Exactly context[start:end]")
    start: int = Field(description="Character offset in the context (inclusive)")
    end: int = Field(description="Character offset in the context (exclusive)")
    score: float = Field(description="Probability among the candidate spans and no-answer")


class Timing(BaseModel):
    tokenize_ms: float
    infer_ms: float
    decode_ms: float
    total_ms: float


class QAResponse(BaseModel):
    answers: list[list[Answer]] = Field(
        description="One list per question, best first; empty when judged unanswerable"
    )
    no_answer_scores: list[float] = Field(description="Probability of 'no answer', per question")
    windows: int = Field(description="Token windows the request was cut into")
    timing: Timing


class ErrorDetail(BaseModel):
    code: str
    message: str
    request_id: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: str
