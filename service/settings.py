"""The gateway's one settings object. Every field is an env var ``QA_<NAME>``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QA_", env_file=None, frozen=True)

    # HTTP
    host: str = Field("0.0.0.0", description="Gateway bind address")
    port: int = Field(8080, description="Gateway HTTP port")
    workers: int = Field(1, ge=1, description="uvicorn worker processes (launcher)")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level")
    shutdown_timeout_s: int = Field(
        20, ge=1, description="On SIGTERM, wait this long for requests in progress, then close"
    )

    # Triton
    triton_url: str = Field(
        "localhost:8001", description="Triton gRPC host:port (dns:///name:port balances over pods)"
    )
    model_name: str = Field("bert_qa", description="Triton model to call")
    model_version: str = Field("", description="Triton model version ('' = latest)")
    request_timeout_ms: float = Field(2000.0, gt=0, description="Deadline of one Triton call")
    max_in_flight: int = Field(64, ge=1, description="Requests in progress before 429")

    # Launcher (python -m service.launcher starts Triton, then the gateway)
    triton_http_port: int = Field(8000, description="Triton HTTP port (health checks)")
    triton_metrics_port: int = Field(8002, description="Triton Prometheus metrics port")
    triton_startup_timeout_s: float = Field(180.0, gt=0, description="Wait this long for Triton")
    model_repository: Path = Field(
        REPO_ROOT / "model_repository", description="Triton model repository"
    )

    # Model and windows
    model_dir: Path = Field(
        REPO_ROOT / "models" / "minilm-l6-squad", description="Checkpoint dir (tokenizer files)"
    )
    max_seq_len: int = Field(384, ge=32, le=512, description="Tokens per window")
    window_overlap: int = Field(128, ge=0, description="Context tokens shared by adjacent windows")
    max_question_tokens: int = Field(64, ge=1, description="Question tokens kept per window")
    seq_buckets: tuple[int, ...] = Field(
        (64, 128, 192, 256, 320, 384), description="Window lengths padded up to (Triton batching)"
    )

    # Answers
    max_answer_tokens: int = Field(30, ge=1, le=128, description="Default longest answer (tokens)")
    default_top_k: int = Field(1, ge=1, description="Answers per question when not asked")
    max_top_k: int = Field(20, ge=1, description="Largest top_k a client may ask")
    no_answer_threshold: float | None = Field(
        None, description="Default null-minus-best logit margin for 'no answer' (unset: off)"
    )

    # Limits (413)
    max_context_chars: int = Field(50_000, ge=1, description="Longest context accepted")
    max_question_chars: int = Field(1_000, ge=1, description="Longest question accepted")
    max_questions: int = Field(32, ge=1, description="Questions per request")
    max_windows: int = Field(256, ge=1, description="Windows (questions x context chunks) per request")

    # SLO
    latency_budget_ms: float = Field(10.0, gt=0, description="Latency budget for metrics and alerts")

    @model_validator(mode="after")
    def _windows_fit(self) -> Settings:
        from service.windowing import WindowSpec

        WindowSpec(self.max_seq_len, self.window_overlap, self.max_question_tokens)
        if not self.seq_buckets or not all(1 <= b <= 512 for b in self.seq_buckets):
            # windows are padded up to a bucket; the model has 512 positions (its own 400 else)
            raise ValueError(f"seq_buckets must be window lengths in [1, 512], got {self.seq_buckets}")
        if max(self.seq_buckets) < self.max_seq_len:
            raise ValueError("the largest of seq_buckets must be >= max_seq_len")
        return self


def settings_or_exit() -> Settings:
    """The settings from the environment; on a bad value, one line per problem on stderr
    (naming its ``QA_`` variable) and exit status 2, not a traceback."""
    try:
        return Settings()
    except ValidationError as exc:
        lines = [
            f"  {'QA_' + str(e['loc'][0]).upper() if e['loc'] else 'settings'}: {e['msg']}"
            for e in exc.errors()
        ]
        print("invalid configuration:", *lines, sep="\n", file=sys.stderr)
        raise SystemExit(2) from None
