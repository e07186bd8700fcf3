"""Shared fixtures: repository paths and the shipped checkpoint's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def data_dir(repo_root: Path) -> Path:
    return repo_root / "data"


@pytest.fixture(scope="session")
def shipped_model_dir(repo_root: Path) -> Path:
    return repo_root / "models" / "minilm-l6-squad"


@pytest.fixture(scope="session")
def qa_tokenizer(shipped_model_dir: Path):  # type: ignore[no-untyped-def]
    from service.windowing import QATokenizer

    return QATokenizer.from_dir(shipped_model_dir)
