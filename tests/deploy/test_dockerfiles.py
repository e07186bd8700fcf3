"""docker/*.Dockerfile: hadolint-clean, pinned, non-root, health-checked, and installing what
the code they ship actually imports."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from service import contract
from tests.deploy.support import (
    ENGINE_VARS,
    REPO,
    REQUIREMENTS,
    ImportGraph,
    Stage,
    distribution_closure,
    find_tool,
    import_graph,
    parse_dockerfile,
    pip_requirements,
    providing_distributions,
    run,
)

GATEWAY = "docker/gateway.Dockerfile"
TRITON = "docker/triton.Dockerfile"
DOCKERFILES = (GATEWAY, TRITON)
# Provided by the Triton server's python backend at run time, not by pip.
BACKEND_MODULES = {"triton_python_backend_utils"}


@cache
def stages_of(dockerfile: str) -> list[Stage]:
    return parse_dockerfile(REPO / dockerfile)


def stage(dockerfile: str, name: str) -> Stage:
    (hit,) = [s for s in stages_of(dockerfile) if s.name == name]
    return hit


# ---- lint and pins --------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_finds_nothing(dockerfile: str) -> None:
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip(f"hadolint not installed: pip install -r {REQUIREMENTS}")
    result = run([str(hadolint), "--failure-threshold", "style", "--no-color",
                  "--trusted-registry", "docker.io", "--trusted-registry", "nvcr.io", dockerfile])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_base_images_are_pinned(dockerfile: str) -> None:
    names = set()
    for s in stages_of(dockerfile):
        if s.image not in names:
            repo, _, tag = s.image.rpartition(":")
            assert repo and "/" not in tag and tag not in ("", "latest"), s.image
        if s.name:
            names.add(s.name)


def test_pinned_images_are_the_documented_ones() -> None:
    assert {s.image for s in stages_of(GATEWAY)} == {"python:3.11-slim-bookworm"}
    assert stage(TRITON, "export").image == "python:3.11-slim-bookworm"
    assert stage(TRITON, "runtime-cpu").image == "nvcr.io/nvidia/tritonserver:24.10-py3"
    assert stage(TRITON, "runtime-gpu").image == "runtime-cpu"
    assert stage(TRITON, "cutlass-headers").image == "python:3.11-slim-bookworm"
    assert stage(TRITON, "cuda-libs").image == "nvidia/cuda:13.0.1-devel-ubuntu24.04"
    assert stages_of(TRITON)[-1].name == "runtime-gpu", "the default target is the GPU image"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_pip_install_is_pinned_and_numpy_stays_below_2(dockerfile: str) -> None:
    for s in stages_of(dockerfile):
        for req in pip_requirements(s):
            (spec,) = req.specifier
            assert spec.operator == "==", f"{s.name}: {req} is not pinned"
            if canonicalize_name(req.name) == "numpy":
                assert not req.specifier.contains("2.0.0") and spec.version.startswith("1.")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_copied_sources_exist(dockerfile: str) -> None:
    for s in stages_of(dockerfile):
        for ins in s.all("COPY"):
            if "--from=" in ins.args:
                continue
            *sources, _ = [a for a in ins.args.split() if not a.startswith("--")]
            for source in sources:
                assert (REPO / source).exists(), f"{dockerfile}:{ins.line} copies missing {source}"


# ---- runtime shape --------------------------------------------------------------------------


def final_user(s: Stage) -> str:
    return s.all("USER")[-1].args


@pytest.mark.parametrize(
    ("dockerfile", "name"), [(GATEWAY, "runtime"), (TRITON, "runtime-cpu"), (TRITON, "runtime-gpu")]
)
def test_runtime_stages_run_as_a_numeric_non_root_user(dockerfile: str, name: str) -> None:
    uid, _, gid = final_user(stage(dockerfile, name)).partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    deploy = (REPO / "deploy/k8s/base/gateway-deployment.yaml").read_text()
    assert f"runAsUser: {uid}" in deploy, "the pods' runAsUser is the image's user"


def test_gateway_image() -> None:
    build, runtime = stages_of(GATEWAY)
    assert build.name == "build" and runtime.name == "runtime"
    (health,) = runtime.all("HEALTHCHECK")
    assert "/health/live" in health.args and f"'{contract.GATEWAY_PORT}'" in health.args
    assert runtime.all("EXPOSE")[0].args == str(contract.GATEWAY_PORT)
    assert runtime.env()["QA_PORT"] == str(contract.GATEWAY_PORT)
    assert runtime.all("CMD")[-1].args == '["python", "-m", "service"]'
    copies = " ".join(i.args for i in build.all("COPY"))
    assert "model.safetensors" not in copies and "models/minilm-l6-squad/ " not in copies


def test_triton_image_serves_the_contract_ports_and_health() -> None:
    runtime = stage(TRITON, "runtime-cpu")
    cmd = runtime.all("CMD")[-1].args
    assert f'"--http-port={contract.TRITON_HTTP_PORT}"' in cmd
    assert f'"--grpc-port={contract.TRITON_GRPC_PORT}"' in cmd
    assert f'"--metrics-port={contract.TRITON_METRICS_PORT}"' in cmd
    assert '"--model-repository=/opt/qa/model_repository"' in cmd
    assert runtime.all("EXPOSE")[0].args.split() == [
        str(p) for p in (contract.TRITON_HTTP_PORT, contract.TRITON_GRPC_PORT,
                         contract.TRITON_METRICS_PORT)]
    (health,) = runtime.all("HEALTHCHECK")
    assert f"http://127.0.0.1:{contract.TRITON_HTTP_PORT}/v2/health/ready" in health.args


def test_triton_image_bakes_the_export_it_serves() -> None:
    export = stage(TRITON, "export")
    (run_export,) = [i for i in export.all("RUN") if "training.export_onnx" in i.args]
    out = re.search(r"--out (\S+)", run_export.args)
    assert out
    runtime = stage(TRITON, "runtime-cpu")
    (copied_files,) = [i for i in runtime.all("COPY") if "--from=export" in i.args]
    *sources, _ = copied_files.args.split()[1:]
    for source in sources:
        assert source.startswith(f"/src/{out.group(1)}/")
        if source.endswith(".onnx"):
            assert f"test -s {source.removeprefix('/src/')}" in run_export.args
    assert "model-int8.onnx" in copied_files.args


def test_triton_engine_defaults_per_target() -> None:
    cpu, gpu = stage(TRITON, "runtime-cpu").env(), stage(TRITON, "runtime-gpu").env()
    assert (cpu["BERT_QA_ENGINE"], cpu["BERT_QA_DEVICE"]) == ("onnx", "cpu")
    assert (gpu["BERT_QA_ENGINE"], gpu["BERT_QA_DEVICE"]) == ("fused", "cuda")
    for env in (cpu, gpu):
        assert {k for k in env if k.startswith("BERT_QA_")} <= ENGINE_VARS


# ---- the images ship and install what their code imports -----------------------------------
# Each check follows first-party imports from the image's entry point (python -m service; the
# python backend's model.py; python -m training.export_onnx) and asks that every first-party file
# reached is COPY'd into the image and every other import is installed by its pip lines (or by
# what those pull in). engine.reference (transformers) is for parity tests, never in an image.

REFERENCE_ONLY = frozenset({"engine.reference"})


def copied(stages: list[Stage]) -> list[str]:
    sources: list[str] = []
    for s in stages:
        for ins in s.all("COPY"):
            if "--from=" not in ins.args:
                sources += [a for a in ins.args.split() if not a.startswith("--")][:-1]
    return sources


def assert_image_runs(graph: ImportGraph, stages: list[Stage]) -> None:
    sources = copied(stages)
    unshipped = sorted(
        f.relative_to(REPO).as_posix() for f in graph.files
        if not any(f.relative_to(REPO).as_posix().startswith(src.rstrip("/")) for src in sources)
    )
    assert not unshipped, f"imported but not copied into the image: {unshipped}"
    closure = distribution_closure([r for s in stages for r in pip_requirements(s)])
    missing = {m: sorted(users) for m, users in graph.third_party.items()
               if not providing_distributions(m) & closure}
    assert not missing, f"imported but not installed in the image: {missing}"


def model_py_files() -> list[Path]:
    files = sorted((REPO / "model_repository").glob("*/[0-9]*/model.py"))
    if not files:
        pytest.fail("model_repository/*/<version>/model.py is missing: the Triton image serves it")
    return files


def test_gateway_image_ships_and_installs_what_service_imports() -> None:
    # The image runs `python -m service`, which serves the app factory service.app:create_app
    # (uvicorn imports it by name); the launcher, which also starts Triton, is not run there.
    entries = [REPO / "service/__main__.py", REPO / "service/app.py"]
    assert all(e.is_file() for e in entries), "the gateway image runs python -m service"
    graph = import_graph(entries, lazy=True)
    assert_image_runs(graph, [stage(GATEWAY, "build")])
    reqs = pip_requirements(stage(GATEWAY, "build"))
    http = sorted(m for m in graph.third_party if m.startswith("tritonclient.http"))
    extras = {e for r in reqs if r.name == "tritonclient" for e in r.extras}
    assert not http or "http" in extras, f"service imports {http}: install tritonclient[http]"


def test_triton_gpu_image_ships_and_installs_what_the_engines_import() -> None:
    graph = import_graph(model_py_files(), lazy=True, exclude=REFERENCE_ONLY,
                         provided=BACKEND_MODULES)
    assert_image_runs(graph, [stage(TRITON, "runtime-cpu"), stage(TRITON, "runtime-gpu")])


def test_triton_cpu_image_loads_the_onnx_engine_without_torch() -> None:
    """model.py at import time, then the ONNX engine when it is built (runtime-cpu: no torch)."""
    graph = import_graph(model_py_files(), lazy=False, provided=BACKEND_MODULES)
    onnx = import_graph([REPO / "engine/onnx_cpu.py"], lazy=True)
    graph.files |= onnx.files
    for module, users in onnx.third_party.items():
        graph.third_party.setdefault(module, set()).update(users)
    assert_image_runs(graph, [stage(TRITON, "runtime-cpu")])


def test_triton_image_holds_the_engines_default_files() -> None:
    """The engine's defaults (relative to the repo root, /opt/qa in the image) exist there."""
    from engine.config import REPO_ROOT, EngineConfig

    defaults = EngineConfig()
    runtime = stage(TRITON, "runtime-cpu")
    (exported,) = [i for i in runtime.all("COPY") if "--from=export" in i.args]
    onnx = defaults.onnx.relative_to(REPO_ROOT).as_posix()
    assert f"/src/{onnx}" in exported.args.split()
    assert exported.args.split()[-1] == f"{Path(onnx).parent.as_posix()}/"
    model_dir = defaults.model_dir.relative_to(REPO_ROOT).as_posix()
    assert f"{model_dir}/" in copied([runtime])
    assert runtime.all("WORKDIR")[-1].args == "/opt/qa"
    assert runtime.env()["PYTHONPATH"] == "/opt/qa"


def test_export_stage_installs_what_the_export_imports() -> None:
    entry = REPO / "training/export_onnx.py"
    if not entry.is_file():
        pytest.fail("training/export_onnx.py is missing: the export stage runs it")
    graph = import_graph([entry], lazy=True)  # its parity check runs engine.reference
    assert_image_runs(graph, [stage(TRITON, "export")])


def _build_outputs() -> dict[str, str]:
    """``engine/fused/cuda/build.sh``'s targets -> the library each writes into build/cuda."""
    text = (REPO / "engine/fused/cuda/build.sh").read_text()
    arms = re.split(r"\n\s+(?=[a-z0-9-]+\) )", text.split('case "$t" in', 1)[1])
    outputs = {}
    for arm in arms:
        target = re.match(r"([a-z0-9-]+)\) ", arm)
        built = re.search(r'-o "\$out/(\S+)"', arm)
        if target and built:
            outputs[target.group(1)] = built.group(1)
    return outputs


def test_triton_gpu_image_ships_the_engines_cuda_libraries() -> None:
    """The GPU image holds the libraries the fused engine loads (block-wise FP8, the
    small-batch CUTLASS GEMMs) where it looks for them, built by the stage that runs
    ``build.sh`` for exactly those targets on CUTLASS headers fetched by ``headers``."""
    from engine.fused import cutlass_fp8, native, small_gemm

    outputs = _build_outputs()
    assert outputs["lib"] == cutlass_fp8.LIB_NAME and outputs["small"] == small_gemm.LIB_NAME
    headers = stage(TRITON, "cutlass-headers")
    assert any("build.sh headers" in i.args for i in headers.all("RUN"))
    libs = stage(TRITON, "cuda-libs")
    (build,) = [i for i in libs.all("RUN") if "build.sh" in i.args]
    targets = re.search(r"build\.sh ([a-z0-9 -]+?)(?:\s*&&|$)", build.args)
    assert targets and targets.group(1).split() == ["lib", "small"]
    (from_headers,) = [i for i in libs.all("COPY") if "--from=cutlass-headers" in i.args]
    assert from_headers.args.split()[-1] == "build/cuda/cutlass/"
    gpu = stage(TRITON, "runtime-gpu")
    (shipped,) = [i for i in gpu.all("COPY") if "--from=cuda-libs" in i.args]
    *sources, dest = shipped.args.split()[1:]
    assert sorted(Path(s).name for s in sources) == sorted([cutlass_fp8.LIB_NAME,
                                                            small_gemm.LIB_NAME])
    for source in sources:
        assert f"test -s {source.removeprefix('/src/')}" in build.args
    # /opt/qa is the repository root in the image: the engine's build/cuda resolves there.
    assert stage(TRITON, "runtime-cpu").all("WORKDIR")[-1].args == "/opt/qa"
    assert native.BUILD_DIR.relative_to(native.BUILD_DIR.parents[1]).as_posix() + "/" == dest


def test_triton_gpu_image_builds_the_compiled_call_path() -> None:
    """The GPU image builds ``staged_launch``'s extension after installing torch and as
    root (the runtime user cannot write there: read-only root), into the engine's
    ``build/native`` under /opt/qa, with the C compiler and Python headers that OpenAI
    Triton's launcher build also needs at run time."""
    from engine.fused import staged_launch

    gpu = stage(TRITON, "runtime-gpu")
    runs = gpu.all("RUN")
    (torch_install,) = [i for i in runs if '"torch==' in i.args]
    (built,) = [i for i in runs if "staged_launch.build()" in i.args]
    assert runs.index(torch_install) < runs.index(built)
    assert "g++" in built.args and "python3-dev" in built.args
    users = gpu.all("USER")
    before = [u.args for u in users if gpu.instructions.index(u) < gpu.instructions.index(built)]
    assert before and before[-1] == "0:0", "built as root: the runtime user cannot write"
    assert staged_launch.BUILD_DIR == REPO / "build" / "native"  # /opt/qa/build/native there
    assert stage(TRITON, "runtime-cpu").all("WORKDIR")[-1].args == "/opt/qa"
