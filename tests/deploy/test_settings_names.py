""".env.example and every deployment file use exactly the names the code reads: the gateway's
Settings fields as QA_<FIELD>, and the engine's BERT_QA_* variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service import contract
from service.settings import Settings
from tests.deploy.support import DOCUMENTED_ENGINE_VARS, ENGINE_VARS, REPO, parse_env_file

ENV_EXAMPLE = REPO / ".env.example"
FIELDS = {f"QA_{name.upper()}": name for name in Settings.model_fields}
DEPLOY_FILES = [
    REPO / "docker/gateway.Dockerfile", REPO / "docker/triton.Dockerfile",
    REPO / "docker-compose.yml", REPO / "docker-compose.cpu.yml", ENV_EXAMPLE,
    REPO / "docs/DEPLOY.md", *sorted((REPO / "deploy/k8s").rglob("*.y*ml")),
    *sorted((REPO / "deploy/k8s").rglob("*.env")),
]


def test_env_example_lists_exactly_the_settings_fields() -> None:
    env = parse_env_file(ENV_EXAMPLE)
    named = {k for k in {*env.values, *env.unset} if k.startswith("QA_")}
    assert named == set(FIELDS)
    unset = {k for k in env.unset if k.startswith("QA_")}
    assert unset == {k for k, f in FIELDS.items() if Settings.model_fields[f].default is None}


def test_env_example_describes_each_setting_with_its_field_description() -> None:
    env = parse_env_file(ENV_EXAMPLE)
    for key, field in FIELDS.items():
        assert env.notes.get(key) == Settings.model_fields[field].description, key


def test_env_example_values_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    env = parse_env_file(ENV_EXAMPLE)
    for key, value in env.values.items():
        if key.startswith("QA_"):
            monkeypatch.setenv(key, value)
    loaded, default = Settings().model_dump(), Settings.model_construct().model_dump()
    # Paths are written repo-relative: the same text works from the repo and in the images.
    loaded = {k: REPO / v if isinstance(v, Path) else v for k, v in loaded.items()}
    assert loaded == default


def test_env_example_documents_every_engine_variable() -> None:
    env = parse_env_file(ENV_EXAMPLE)
    assert {k for k in {*env.values, *env.unset} if k.startswith("BERT_QA_")} == ENGINE_VARS


def test_the_engine_reads_the_variables_the_deployment_sets() -> None:
    assert DOCUMENTED_ENGINE_VARS <= ENGINE_VARS


def test_launcher_ports_default_to_the_contract() -> None:
    fields = Settings.model_fields
    assert fields["port"].default == contract.GATEWAY_PORT
    assert fields["triton_url"].default.endswith(f":{contract.TRITON_GRPC_PORT}")
    assert fields["model_name"].default == contract.MODEL_NAME
    for name, port in (("triton_http_port", contract.TRITON_HTTP_PORT),
                       ("triton_metrics_port", contract.TRITON_METRICS_PORT)):
        if name in fields:
            assert fields[name].default == port


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_deployment_files_use_only_real_names(path: Path) -> None:
    text = path.read_text()
    assert set(re.findall(r"\bBERT_QA_[A-Z0-9_]+", text)) <= ENGINE_VARS
    assert set(re.findall(r"\bQA_[A-Z0-9_]+", text)) <= set(FIELDS)


def test_the_engine_reads_no_variable_the_deployment_does_not_know() -> None:
    """If the engine or model.py starts reading a new BERT_QA_ variable, deploy must learn it."""
    used: set[str] = set()
    for folder in ("engine", "model_repository", "service"):
        for path in (REPO / folder).rglob("*.py"):
            used |= set(re.findall(r"\bBERT_QA_[A-Z0-9_]+", path.read_text()))
    assert used <= ENGINE_VARS
