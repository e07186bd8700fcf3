"""Structural JSON schemas for the Prometheus-operator objects (monitoring.coreos.com/v1).

kubernetes-validate bundles schemas of the built-in kinds only, and no CRD can be fetched here,
so ServiceMonitor and PodMonitor are checked against this hand-written subset of their CRD's
openAPIV3Schema: the field names of spec, endpoints and selectors (unknown names are rejected,
so a typo fails), their types, the Prometheus duration pattern and the scheme enum. metadata and
label selectors reuse the Kubernetes definitions that kubernetes-validate ships.
"""

from __future__ import annotations

from typing import Any

DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1."
# A Prometheus duration: 0, or units from years to milliseconds in order (1h30m, 5s, 250ms).
DURATION = "^(0|" + "".join(rf"(([0-9]+){u})?" for u in ("y", "w", "d", "h", "m", "s", "ms")) + ")$"

_OBJ: dict[str, Any] = {"type": "object"}
_STR: dict[str, Any] = {"type": "string"}
_BOOL: dict[str, Any] = {"type": "boolean"}
_INT: dict[str, Any] = {"type": "integer"}
_STRS: dict[str, Any] = {"type": "array", "items": _STR}
_OBJS: dict[str, Any] = {"type": "array", "items": _OBJ}
_INT_OR_STR: dict[str, Any] = {"type": ["integer", "string"]}

# Scrape options shared by ServiceMonitor endpoints and PodMonitor podMetricsEndpoints.
_SCRAPE: dict[str, Any] = {
    "authorization": _OBJ, "basicAuth": _OBJ, "bearerTokenSecret": _OBJ, "oauth2": _OBJ,
    "tlsConfig": _OBJ, "enableHttp2": _BOOL, "filterRunning": _BOOL, "followRedirects": _BOOL,
    "honorLabels": _BOOL, "honorTimestamps": _BOOL, "trackTimestampsStaleness": _BOOL,
    "interval": {"type": "string", "pattern": DURATION},
    "scrapeTimeout": {"type": "string", "pattern": DURATION},
    "metricRelabelings": _OBJS, "relabelings": _OBJS,
    "params": {"type": "object", "additionalProperties": _STRS},
    "path": _STR, "port": _STR, "targetPort": _INT_OR_STR,
    "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
    "proxyUrl": _STR, "noProxy": _STR, "proxyFromEnvironment": _BOOL, "proxyConnectHeader": _OBJ,
}
_ENDPOINT: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {**_SCRAPE, "bearerTokenFile": _STR},
}
_POD_ENDPOINT: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {**_SCRAPE, "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535}},
}
_NAMESPACE_SELECTOR: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {"any": _BOOL, "matchNames": _STRS},
}
# Target-discovery and limit options shared by both kinds.
_COMMON_SPEC: dict[str, Any] = {
    "attachMetadata": _OBJ, "bodySizeLimit": _STR, "jobLabel": _STR, "keepDroppedTargets": _INT,
    "labelLimit": _INT, "labelNameLengthLimit": _INT, "labelValueLengthLimit": _INT,
    "namespaceSelector": _NAMESPACE_SELECTOR, "podTargetLabels": _STRS, "sampleLimit": _INT,
    "scrapeClass": _STR, "scrapeProtocols": _STRS, "fallbackScrapeProtocol": _STR,
    "selector": {"$ref": DEFS + "LabelSelector"}, "selectorMechanism": _STR, "targetLimit": _INT,
    "nativeHistogramBucketLimit": _INT, "nativeHistogramMinBucketFactor": _INT_OR_STR,
    "scrapeClassicHistograms": _BOOL, "convertClassicHistogramsToNHCB": _BOOL,
}


def _kind(kind: str, spec_properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": {"$ref": DEFS + "ObjectMeta"},
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector"],
                "properties": {**_COMMON_SPEC, **spec_properties},
            },
        },
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _kind("ServiceMonitor", {
        "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
        "targetLabels": _STRS, "serviceDiscoveryRole": _STR,
    }),
    "PodMonitor": _kind("PodMonitor", {
        "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _POD_ENDPOINT},
    }),
}
