"""docker-compose.yml (GPU) and docker-compose.cpu.yml (CPU override): valid against the Compose
specification, and wired the way the code expects (ports, health endpoints, settings names)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from service import contract
from service.settings import Settings
from tests.deploy.conftest import COMPOSE_VARIANTS
from tests.deploy.support import ENGINE_VARS, REPO, parse_env_file
from tests.deploy.test_dockerfiles import stages_of

Config = dict[str, Any]
MONITORING = REPO / "deploy" / "monitoring"


def service(configs: dict[str, Config], variant: str, name: str) -> dict[str, Any]:
    return configs[variant]["services"][name]  # type: ignore[no-any-return]


def healthcheck_url(svc: dict[str, Any]) -> str:
    (url,) = re.findall(r"https?://[^'\" ]+", " ".join(svc["healthcheck"]["test"]))
    return url


@pytest.mark.parametrize("variant", COMPOSE_VARIANTS)
def test_compose_files_validate_against_the_compose_spec(
    compose_configs: dict[str, Config], variant: str
) -> None:
    """`docker compose config` rejects anything outside the spec's JSON schema (rendered OK)."""
    services = set(compose_configs[variant]["services"])
    assert services == {"triton", "gateway", "prometheus", "grafana"}


def test_compose_rejects_an_unknown_key(compose: Any, tmp_path: Any) -> None:
    """The validation above is real: a misspelt key in a service fails `config`."""
    from tests.deploy.support import run

    bad = tmp_path / "compose.yml"
    bad.write_text("services:\n  triton:\n    image: x\n    shm_sise: 1gb\n")
    result = run([str(compose), "-f", str(bad), "config", "-q"],
                 env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode != 0
    assert "shm_sise" in result.stderr


def test_gpu_variant_reserves_a_gpu_and_runs_the_fused_engine(
    compose_configs: dict[str, Config],
) -> None:
    triton = service(compose_configs, "gpu", "triton")
    (device,) = triton["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert triton["build"]["target"] == "runtime-gpu"
    assert (triton["environment"]["BERT_QA_ENGINE"], triton["environment"]["BERT_QA_DEVICE"]) == (
        "fused", "cuda")


def test_cpu_variant_drops_the_gpu_and_runs_onnx(compose_configs: dict[str, Config]) -> None:
    triton = service(compose_configs, "cpu", "triton")
    assert "deploy" not in triton
    assert triton["build"]["target"] == "runtime-cpu"
    assert (triton["environment"]["BERT_QA_ENGINE"], triton["environment"]["BERT_QA_DEVICE"]) == (
        "onnx", "cpu")


@pytest.mark.parametrize("variant", COMPOSE_VARIANTS)
def test_build_targets_are_stages_of_the_dockerfiles(
    compose_configs: dict[str, Config], variant: str
) -> None:
    for name in ("triton", "gateway"):
        build = service(compose_configs, variant, name)["build"]
        names = [s.name for s in stages_of(build["dockerfile"])]
        assert build.get("target", names[-1]) in names


@pytest.mark.parametrize("variant", COMPOSE_VARIANTS)
def test_triton_service(compose_configs: dict[str, Config], variant: str) -> None:
    triton = service(compose_configs, variant, "triton")
    assert healthcheck_url(triton) == (
        f"http://127.0.0.1:{contract.TRITON_HTTP_PORT}/v2/health/ready")
    assert int(triton["shm_size"]) >= 256 * 2**20, "python backend tensors pass through /dev/shm"
    assert set(triton["environment"]) <= ENGINE_VARS
    published = {p["target"] for p in triton.get("ports", [])}
    assert published <= {contract.TRITON_HTTP_PORT, contract.TRITON_GRPC_PORT,
                          contract.TRITON_METRICS_PORT}
    assert all(p["host_ip"] == "127.0.0.1" for p in triton.get("ports", []))


@pytest.mark.parametrize("variant", COMPOSE_VARIANTS)
def test_gateway_service(
    compose_configs: dict[str, Config], variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = service(compose_configs, variant, "gateway")
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert healthcheck_url(gateway) == f"http://127.0.0.1:{contract.GATEWAY_PORT}/health/live"
    assert [p["target"] for p in gateway["ports"]] == [contract.GATEWAY_PORT]
    env = {k: v for k, v in gateway["environment"].items() if k.startswith("QA_")}
    fields = {f"QA_{f.upper()}" for f in Settings.model_fields}
    assert set(env) <= fields
    # What the gateway sees: .env (a copy of .env.example) overridden by `environment`.
    for key, value in {**parse_env_file(REPO / ".env.example").values, **env}.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.triton_url == f"triton:{contract.TRITON_GRPC_PORT}"
    assert settings.port == contract.GATEWAY_PORT
    # the drain ends before compose's SIGKILL (its default grace is 10 s)
    assert settings.shutdown_timeout_s + 2 <= _seconds(gateway["stop_grace_period"])


def _seconds(duration: str) -> float:
    """A compose duration such as '25s' or '1m30s', in seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and duration, duration
    return sum(int(n) * units[u] for n, u in zip(parts.groups(), "hms", strict=True) if n)


def test_gateway_reads_env_file_dot_env() -> None:
    raw = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert raw["services"]["gateway"]["env_file"] == [{"path": ".env", "required": False}]


@pytest.mark.parametrize("variant", COMPOSE_VARIANTS)
def test_monitoring_is_mounted_from_deploy_monitoring(
    compose_configs: dict[str, Config], variant: str
) -> None:
    mounts = {
        name: {v["target"]: v["source"] for v in service(compose_configs, variant, name)["volumes"]
               if v["type"] == "bind"}
        for name in ("prometheus", "grafana")
    }
    assert mounts["prometheus"] == {
        "/etc/prometheus/prometheus.yml": str(MONITORING / "prometheus.yml"),
        "/etc/prometheus/rules": str(MONITORING / "rules"),
    }
    grafana = MONITORING / "grafana"
    assert mounts["grafana"] == {
        "/etc/grafana/provisioning/datasources": str(grafana / "provisioning/datasources"),
        "/etc/grafana/provisioning/dashboards": str(grafana / "provisioning/dashboards"),
        "/var/lib/grafana/dashboards": str(grafana / "dashboards"),
    }
    home = service(compose_configs, variant, "grafana")["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/var/lib/grafana/dashboards/qa-latency.json"


def test_every_interpolated_variable_is_in_env_example() -> None:
    env = parse_env_file(REPO / ".env.example")
    documented = set(env.values) | set(env.unset)
    used = set()
    for name in ("docker-compose.yml", "docker-compose.cpu.yml"):
        used |= set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", (REPO / name).read_text()))
    assert used <= documented
    compose_only = {k for k in documented if not k.startswith(("QA_", "BERT_QA_"))}
    assert compose_only <= used, "a compose variable in .env.example that no compose file uses"


# ---- against the monitoring files (owned elsewhere; checked once they exist) -----------------


def monitoring_file(relative: str) -> Any:
    path = MONITORING / relative
    if not path.is_file():
        pytest.skip(f"deploy/monitoring/{relative} not written yet")
    return yaml.safe_load(path.read_text())


def test_prometheus_scrapes_the_compose_services_and_loads_mounted_rules() -> None:
    config = monitoring_file("prometheus.yml")
    targets = {
        t for job in config.get("scrape_configs", []) for sc in job.get("static_configs", [])
        for t in sc.get("targets", [])
    }
    assert f"gateway:{contract.GATEWAY_PORT}" in targets
    assert f"triton:{contract.TRITON_METRICS_PORT}" in targets
    for pattern in config.get("rule_files", []):
        resolved = PurePosixPath("/etc/prometheus") / pattern
        assert str(resolved).startswith("/etc/prometheus/rules/"), f"{pattern} is not mounted"
        assert list((MONITORING / "rules").glob(resolved.name)), f"{pattern} matches no file"


def test_grafana_provisioning_matches_the_mounts() -> None:
    directory = MONITORING / "grafana/provisioning/dashboards"
    files = sorted(directory.glob("*.y*ml")) if directory.is_dir() else []
    if not files:
        pytest.skip("deploy/monitoring/grafana/provisioning/dashboards not written yet")
    providers = [p for f in files for p in yaml.safe_load(f.read_text())["providers"]]
    paths = {p["options"]["path"] for p in providers}
    assert paths == {"/var/lib/grafana/dashboards"}
    sources = MONITORING / "grafana/provisioning/datasources"
    urls = {d.get("url") for f in sources.glob("*.y*ml")
            for d in yaml.safe_load(f.read_text()).get("datasources", [])}
    assert "http://prometheus:9090" in urls
