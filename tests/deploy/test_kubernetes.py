"""deploy/k8s: every kustomization builds, every object is schema-valid, and the objects agree
with each other and with the code (ports, probe paths, settings names, metric names)."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator  # a dependency of kubernetes-validate
from referencing import Registry, Resource

from service import contract
from service.settings import Settings
from tests.deploy.conftest import KUSTOMIZATIONS, OVERLAYS, Manifest, find
from tests.deploy.crd_schemas import SCHEMAS
from tests.deploy.support import ENGINE_VARS, REPO, REQUIREMENTS, parse_env_file

# Oldest Kubernetes minor still in wide use (HPA v2, PDB v1, seccompProfile all GA) and the
# newest whose schemas kubernetes-validate bundles.
K8S_VERSIONS = ("1.29.0", "1.37.0")
GATEWAY_PATHS = {"/health/live", "/health/ready", "/metrics"}
TRITON_PATHS = {"/v2/health/live", "/v2/health/ready", "/metrics"}


def kv() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.skip(f"kubernetes-validate not installed: pip install -r {REQUIREMENTS}")
    return kubernetes_validate


def containers(objects: list[Manifest], name: str) -> dict[str, Any]:
    pod = find(objects, "Deployment", name)["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == name]
    return container  # type: ignore[no-any-return]


def pod_labels(objects: list[Manifest], name: str) -> dict[str, str]:
    template = find(objects, "Deployment", name)["spec"]["template"]
    return template["metadata"]["labels"]  # type: ignore[no-any-return]


def pod_spec(objects: list[Manifest], name: str) -> dict[str, Any]:
    return find(objects, "Deployment", name)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


# ---- builds and schemas ---------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomization_builds(rendered: dict[str, list[Manifest]], name: str) -> None:
    assert rendered[name], f"{KUSTOMIZATIONS[name]} rendered no objects"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_builtin_objects_match_kubernetes_schemas(
    rendered: dict[str, list[Manifest]], name: str, version: str
) -> None:
    """Strict: unknown fields are errors, as `kubectl apply --validate=strict` makes them."""
    validator = kv()
    checked = 0
    for obj in rendered[name]:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        validator.validate(obj, version, strict=True)
        checked += 1
    assert checked


def test_strict_validation_rejects_a_misspelt_field(rendered: dict[str, list[Manifest]]) -> None:
    """The validator above is no rubber stamp: one typo in a probe fails it."""
    validator = kv()
    deployment = json.loads(json.dumps(find(rendered["gpu"], "Deployment", "triton")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(validator.ValidationError):
        validator.validate(deployment, K8S_VERSIONS[0], strict=True)


def crd_validator(kind: str) -> Draft202012Validator:
    kv()
    base = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    defs = json.loads((base / f"v{K8S_VERSIONS[0]}-local-strict" / "_definitions.json").read_text())
    registry: Registry = Resource.from_contents(defs) @ Registry()
    return Draft202012Validator(SCHEMAS[kind], registry=registry)


@pytest.mark.parametrize("name", OVERLAYS)
def test_monitoring_objects_match_their_crd_structure(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    kinds = set()
    for obj in rendered[name]:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            crd_validator(obj["kind"]).validate(obj)
            kinds.add(obj["kind"])
    assert kinds == {"ServiceMonitor", "PodMonitor"}


def test_crd_schema_rejects_a_misspelt_field(rendered: dict[str, list[Manifest]]) -> None:
    monitor = json.loads(json.dumps(find(rendered["gpu"], "ServiceMonitor", "gateway")))
    monitor["spec"]["endpoints"][0]["intervall"] = "10s"
    assert not crd_validator("ServiceMonitor").is_valid(monitor)


# ---- ports and probes against service/contract.py -------------------------------------------


@pytest.mark.parametrize("name", OVERLAYS)
def test_container_ports_match_the_contract(rendered: dict[str, list[Manifest]], name: str) -> None:
    ports = {p["name"]: p["containerPort"] for p in containers(rendered[name], "gateway")["ports"]}
    assert ports == {"http": contract.GATEWAY_PORT}
    ports = {p["name"]: p["containerPort"] for p in containers(rendered[name], "triton")["ports"]}
    assert ports == {
        "http": contract.TRITON_HTTP_PORT,
        "grpc": contract.TRITON_GRPC_PORT,
        "metrics": contract.TRITON_METRICS_PORT,
    }


@pytest.mark.parametrize("name", OVERLAYS)
def test_probes_hit_the_real_health_endpoints(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    gateway = containers(rendered[name], "gateway")
    assert gateway["startupProbe"]["httpGet"]["path"] == "/health/live"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    triton = containers(rendered[name], "triton")
    assert triton["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    for container in (gateway, triton):
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["port"] == "http"


@pytest.mark.parametrize("name", OVERLAYS)
def test_services_select_their_pods_on_named_ports(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    objects = rendered[name]
    for service in [o for o in objects if o["kind"] == "Service"]:
        target = service["metadata"]["labels"]["app.kubernetes.io/name"]
        labels = pod_labels(objects, target)
        assert service["spec"]["selector"].items() <= labels.items()
        named = {p["name"] for p in containers(objects, target)["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named
    assert find(objects, "Service", "gateway")["spec"]["ports"][0]["port"] == contract.GATEWAY_PORT
    triton = {p["name"]: p["port"] for p in find(objects, "Service", "triton")["spec"]["ports"]}
    assert triton == {"http": contract.TRITON_HTTP_PORT, "grpc": contract.TRITON_GRPC_PORT}


@pytest.mark.parametrize("name", OVERLAYS)
def test_scrape_objects_point_at_metrics_ports(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    objects = rendered[name]
    monitor = find(objects, "ServiceMonitor", "gateway")
    service = find(objects, "Service", "gateway")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]
    podmon = find(objects, "PodMonitor", "triton")
    labels = pod_labels(objects, "triton")
    assert podmon["spec"]["selector"]["matchLabels"].items() <= labels.items()
    endpoints = [(e["port"], e["path"]) for e in podmon["spec"]["podMetricsEndpoints"]]
    assert endpoints == [("metrics", "/metrics")]


@pytest.mark.parametrize("name", OVERLAYS)
def test_scrape_jobs_and_interval_match_prometheus_yml(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    """The recording rules and alerts select job="gateway" / job="triton" (compose's jobs)."""
    path = REPO / "deploy/monitoring/prometheus.yml"
    if not path.is_file():
        pytest.skip("deploy/monitoring/prometheus.yml not written yet")
    config = yaml.safe_load(path.read_text())
    objects = rendered[name]
    jobs = {}
    # jobLabel names a label of the Service (ServiceMonitor) or of the pod (PodMonitor).
    service_labels = find(objects, "Service", "gateway")["metadata"]["labels"]
    triton_labels = pod_labels(objects, "triton")
    for kind, target, key, labels in (
        ("ServiceMonitor", "gateway", "endpoints", service_labels),
        ("PodMonitor", "triton", "podMetricsEndpoints", triton_labels),
    ):
        monitor = find(objects, kind, target)["spec"]
        jobs[labels[monitor["jobLabel"]]] = {e["interval"] for e in monitor[key]}
    assert set(jobs) == {job["job_name"] for job in config["scrape_configs"]}
    assert set().union(*jobs.values()) == {config["global"]["scrape_interval"]}


def test_gateway_paths_are_routes_of_the_app() -> None:
    """The probe and scrape paths used here are GET routes the gateway really serves."""
    from service.routes import router

    served = {r.path for r in router.routes if "GET" in getattr(r, "methods", set())}
    assert served >= GATEWAY_PATHS


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_http_path_is_a_known_route(rendered: dict[str, list[Manifest]], name: str) -> None:
    text = yaml.safe_dump_all(rendered[name])
    paths = set(re.findall(r"path: (/\S*)", text))
    assert paths <= GATEWAY_PATHS | TRITON_PATHS


# ---- security and resources -----------------------------------------------------------------


@pytest.mark.parametrize("workload", ["gateway", "triton"])
@pytest.mark.parametrize("name", OVERLAYS)
def test_pods_are_locked_down(
    rendered: dict[str, list[Manifest]], name: str, workload: str
) -> None:
    pod = pod_spec(rendered[name], workload)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    container = containers(rendered[name], workload)
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][kind].keys()


@pytest.mark.parametrize("name", OVERLAYS)
def test_triton_shm_is_a_memory_backed_emptydir(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    container = containers(rendered[name], "triton")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(rendered[name], "triton")["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def test_only_the_gpu_overlay_asks_for_a_gpu(rendered: dict[str, list[Manifest]]) -> None:
    gpu = containers(rendered["gpu"], "triton")["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == "1"
    tolerations = pod_spec(rendered["gpu"], "triton")["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" for t in tolerations)
    cpu_text = yaml.safe_dump_all(rendered["cpu"])
    assert "nvidia.com/gpu" not in cpu_text


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_namespace_enforces_restricted_pod_security(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    (namespace,) = [o for o in rendered[name] if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    namespaced = [o for o in rendered[name] if o["kind"] != "Namespace"]
    assert {o["metadata"]["namespace"] for o in namespaced} == {namespace["metadata"]["name"]}


# ---- settings and engine variables ----------------------------------------------------------


def config_data(objects: list[Manifest], name: str) -> dict[str, str]:
    return find(objects, "ConfigMap", name)["data"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", OVERLAYS)
def test_gateway_configmap_names_are_exactly_the_settings_fields(
    rendered: dict[str, list[Manifest]], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = config_data(rendered[name], "gateway-config")
    fields = {f"QA_{f.upper()}" for f in Settings.model_fields}
    unset = {f"QA_{f.upper()}" for f, info in Settings.model_fields.items() if info.default is None}
    assert set(data) == fields - unset, "a None default cannot be written as an env value"
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    settings = Settings()  # the values parse as the gateway would parse them
    assert settings.triton_url == f"triton:{contract.TRITON_GRPC_PORT}"
    assert settings.port == contract.GATEWAY_PORT
    assert settings.model_name == contract.MODEL_NAME


def test_kustomize_env_files_and_env_example_agree(rendered: dict[str, list[Manifest]]) -> None:
    """Same values as .env.example except where the cluster differs (address, image path)."""
    example = parse_env_file(REPO / ".env.example").values
    cluster = parse_env_file(REPO / "deploy/k8s/base/gateway.env").values
    differ = {k for k in cluster if cluster[k] != example[k]}
    assert differ == {"QA_TRITON_URL", "QA_MODEL_DIR"}


@pytest.mark.parametrize(
    ("name", "engine", "device"), [("cpu", "onnx", "cpu"), ("gpu", "fused", "cuda")]
)
def test_triton_engine_settings(
    rendered: dict[str, list[Manifest]], name: str, engine: str, device: str
) -> None:
    data = config_data(rendered[name], "triton-config")
    assert set(data) <= ENGINE_VARS
    assert (data["BERT_QA_ENGINE"], data["BERT_QA_DEVICE"]) == (engine, device)
    refs = containers(rendered[name], "triton")["envFrom"]
    assert refs[0]["configMapRef"]["name"] == find(rendered[name], "ConfigMap", "triton-config")[
        "metadata"]["name"]


def test_cpu_overlay_threads_fit_the_cpu_limit(rendered: dict[str, list[Manifest]]) -> None:
    threads = int(config_data(rendered["cpu"], "triton-config")["BERT_QA_THREADS"])
    limit = int(containers(rendered["cpu"], "triton")["resources"]["limits"]["cpu"])
    assert 0 < threads <= limit


# ---- autoscaling, disruption budgets, network policy ----------------------------------------


def adapter_rules(rendered: dict[str, list[Manifest]]) -> list[dict[str, Any]]:
    config = find(rendered["prometheus-adapter"], "ConfigMap", "prometheus-adapter-squad-serve")
    return yaml.safe_load(config["data"]["config.yaml"])["rules"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", OVERLAYS)
def test_hpas_target_the_deployments(rendered: dict[str, list[Manifest]], name: str) -> None:
    objects = rendered[name]
    gateway = find(objects, "HorizontalPodAutoscaler", "gateway")["spec"]
    assert gateway["scaleTargetRef"]["name"] == "gateway"
    assert gateway["metrics"][0]["resource"]["name"] == "cpu"
    triton = find(objects, "HorizontalPodAutoscaler", "triton")["spec"]
    assert triton["scaleTargetRef"]["name"] == "triton"
    assert triton["metrics"][0]["type"] == "Pods"
    for deployment in ("gateway", "triton"):
        assert "replicas" not in find(objects, "Deployment", deployment)["spec"], "the HPA owns it"


def test_triton_hpa_metric_is_served_by_the_adapter_rule(
    rendered: dict[str, list[Manifest]],
) -> None:
    metric = find(rendered["gpu"], "HorizontalPodAutoscaler", "triton")["spec"]["metrics"][0]
    name = metric["pods"]["metric"]["name"]
    (rule,) = [r for r in adapter_rules(rendered) if r["name"]["as"] == name]
    assert re.match(rule["name"]["matches"], "nv_inference_queue_duration_us")
    assert f'model="{contract.MODEL_NAME}"' in rule["seriesQuery"]
    query = rule["metricsQuery"]
    assert "rate(nv_inference_queue_duration_us{<<.LabelMatchers>>}" in query
    assert "rate(nv_inference_request_success{<<.LabelMatchers>>}" in query
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


@pytest.mark.parametrize("name", OVERLAYS)
def test_pdbs_cover_both_deployments_without_blocking_drains(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    for workload in ("gateway", "triton"):
        pdb = find(rendered[name], "PodDisruptionBudget", workload)["spec"]
        labels = pod_labels(rendered[name], workload)
        assert pdb["selector"]["matchLabels"].items() <= labels.items()
        hpa = find(rendered[name], "HorizontalPodAutoscaler", workload)["spec"]
        assert pdb["maxUnavailable"] < hpa["minReplicas"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_only_gateway_and_prometheus_reach_triton(
    rendered: dict[str, list[Manifest]], name: str
) -> None:
    objects = rendered[name]
    policy = find(objects, "NetworkPolicy", "triton")["spec"]
    triton_labels = pod_labels(objects, "triton")
    gateway_labels = pod_labels(objects, "gateway")
    assert policy["podSelector"]["matchLabels"].items() <= triton_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    allowed: dict[str, set[int]] = {}
    for rule in policy["ingress"]:
        (peer,) = rule["from"]
        who = "gateway" if peer.get("podSelector", {}).get("matchLabels", {}).items() <= (
            gateway_labels.items()) and "namespaceSelector" not in peer else "prometheus"
        if who == "prometheus":
            assert peer["namespaceSelector"]["matchLabels"]
            assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "prometheus"
        allowed[who] = {p["port"] for p in rule["ports"]}
    assert allowed == {
        "gateway": {contract.TRITON_HTTP_PORT, contract.TRITON_GRPC_PORT},
        "prometheus": {contract.TRITON_METRICS_PORT},
    }


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_gateway_drains_within_its_grace_period(rendered: dict[str, list[Manifest]], name: str) -> None:
    """preStop's sleep plus the gateway's QA_SHUTDOWN_TIMEOUT_S end before the kubelet's
    SIGKILL, so requests in progress finish and a stalled upload cannot stop the drain."""
    pod = pod_spec(rendered[name], "gateway")
    (sleep,) = [float(s) for s in re.findall(
        r"time\.sleep\(([\d.]+)\)", " ".join(containers(rendered[name], "gateway")["lifecycle"][
            "preStop"]["exec"]["command"]))]
    shutdown = float(parse_env_file(REPO / "deploy/k8s/base/gateway.env").values["QA_SHUTDOWN_TIMEOUT_S"])
    assert sleep + shutdown + 2 <= pod["terminationGracePeriodSeconds"]
