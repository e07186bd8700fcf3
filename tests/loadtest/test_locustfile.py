"""loadtest/locustfile.py stays valid without Locust installed, and loads when it is."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtest" / "locustfile.py"


def test_locustfile_compiles_and_defines_a_qa_user() -> None:
    tree = ast.parse(LOCUSTFILE.read_text(), filename=str(LOCUSTFILE))
    compile(tree, str(LOCUSTFILE), "exec")
    users = [n for n in tree.body if isinstance(n, ast.ClassDef)
             and any(getattr(b, "id", "") == "FastHttpUser" for b in n.bases)]
    assert [u.name for u in users] == ["QAUser"]
    tasks = [f for f in users[0].body if isinstance(f, ast.FunctionDef)
             and any(getattr(d, "id", "") == "task" for d in f.decorator_list)]
    assert tasks, "QAUser has no @task"
    assert "require_loopback" in LOCUSTFILE.read_text()


@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust not installed")
def test_locustfile_imports_with_locust() -> None:
    spec = importlib.util.spec_from_file_location("qa_locustfile", LOCUSTFILE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.QAUser.host is None or module.QAUser.host.startswith("http")
