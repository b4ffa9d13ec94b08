"""The Helm chart's values, as a schema: ``helm/ebplus/values.schema.json`` is generated from here.

The chart's ``config:`` block *is* a :class:`ebplus.deploy.config.ServeConfig` (the one
config schema of a deployment): the chart renders it verbatim as the ``args`` of
the Ray Serve application in the RayService's ``serveConfigV2``. Everything else
(images, the Ray head and GPU worker groups, secrets, monitoring, dashboards) is
described by :class:`ChartValues` below, so ``helm install`` rejects a bad value
with the field named before anything reaches the cluster.

    python -m docgen.helm_values            # rewrite helm/ebplus/values.schema.json
    python -m docgen.helm_values --check    # exit 1 if the committed file is stale

A test (``tests/helm/test_chart.py``) fails when the committed schema differs from
the generated one, and validates the chart's values files against these models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ebplus.deploy.config import ServeConfig

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "helm" / "ebplus" / "values.schema.json"

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Quantity = str | int | float


class _Values(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(_Values):
    """Kubernetes container resources (quantities such as ``"8"``, ``"64Gi"``)."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="Resource requests.")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Resource limits.")


class Image(_Values):
    """The container image: ``deploy/Dockerfile`` (ray[llm]==2.60.0 + ebplus-serve[gpu])."""

    repository: str = Field("ebplus-serve", min_length=1, description="Image repository (push the image you built).")
    tag: str = Field("", description="Image tag; empty means the chart's appVersion.")
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Pull policy.")


class _PodGroup(_Values):
    """What the head and every worker group share."""

    resources: Resources = Field(default_factory=Resources, description="Container resources.")
    rayStartParams: dict[str, str] = Field(
        default_factory=dict, description="Extra `ray start` parameters (string values)."
    )
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods must match.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Pod tolerations.")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Pod affinity rules.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    env: list[dict[str, Any]] = Field(default_factory=list, description="Extra container env entries.")
    volumes: list[dict[str, Any]] = Field(default_factory=list, description="Extra pod volumes.")
    volumeMounts: list[dict[str, Any]] = Field(default_factory=list, description="Extra container volume mounts.")
    shmSize: str = Field(
        "8Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)?$", description="Size of the /dev/shm memory volume."
    )


class Head(_PodGroup):
    """The Ray head pod: GCS, dashboard, Serve controller and HTTP proxy, EB+ controller actor. No GPU."""


class WorkerGroup(_PodGroup):
    """One Ray worker group of identical GPU nodes (one per GPU type in a mixed fleet)."""

    name: str = Field(..., min_length=1, max_length=40, pattern=DNS_LABEL, description="Group name (DNS label).")
    replicas: int = Field(1, ge=0, description="Worker pods (nodes) in the group.")
    minReplicas: int | None = Field(None, ge=0, description="Autoscaling lower bound; default: replicas.")
    maxReplicas: int | None = Field(None, ge=0, description="Autoscaling upper bound; default: replicas.")
    gpus: int = Field(
        1,
        ge=0,
        description="GPUs per worker pod: one EB+ replica per tensor_parallel_size GPUs (config.engine.extra), "
        "so a multiple of it.",
    )
    gpuResource: str = Field("nvidia.com/gpu", min_length=1, description="Extended resource name of the GPU.")
    gpuType: str = Field(
        "",
        description="GPU type for documentation and the pod label ebplus.io/gpu-type, e.g. 'H200' "
        "(Ray detects the accelerator type itself).",
    )


class ApiKey(_Values):
    """The optional API key required on /v1 (env named by config.auth.api_key_env)."""

    enabled: bool = Field(False, description="Require an API key on /v1.")
    key: str = Field("api-key", min_length=1, description="Key of the API key inside the Secret.")


class Auth(_Values):
    """The admin bearer token (and optional /v1 API key) come from a Secret, never from values."""

    existingSecret: str = Field(
        "", description="Name of an existing Secret holding the token(s); empty: the chart generates one."
    )
    adminTokenKey: str = Field("admin-token", min_length=1, description="Key of the admin token inside the Secret.")
    apiKey: ApiKey = Field(default_factory=ApiKey, description="Optional /v1 API key.")


class ModelStorage(_Values):
    """A volume holding the model directories named by config.model.source."""

    enabled: bool = Field(False, description="Mount a PersistentVolumeClaim with the models.")
    existingClaim: str = Field("", description="Name of the PersistentVolumeClaim.")
    mountPath: str = Field("/models", pattern=r"^/", description="Where the claim is mounted (head and workers).")
    readOnly: bool = Field(True, description="Mount read-only.")


class ServeService(_Values):
    """The Service in front of the Serve HTTP proxies (OpenAI API, /admin, /metrics, /health)."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Service annotations.")


class MonitorToggle(_Values):
    enabled: bool = Field(True, description="Render this object.")


class Monitoring(_Values):
    """Prometheus Operator objects, rendered only where the cluster serves monitoring.coreos.com/v1."""

    enabled: bool = Field(
        True,
        description="Render ServiceMonitor/PodMonitor/PrometheusRule objects when the cluster has the "
        "Prometheus Operator's API (monitoring.coreos.com/v1).",
    )
    interval: str = Field("15s", pattern=r"^[0-9]+(ms|s|m|h)$", description="Scrape interval.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on the monitors, e.g. {release: kube-prometheus-stack} for its selector.",
    )
    serviceMonitor: MonitorToggle = Field(
        default_factory=MonitorToggle, description="ServiceMonitor for the app's /metrics (ebplus_*), head pod."
    )
    podMonitor: MonitorToggle = Field(
        default_factory=MonitorToggle,
        description="PodMonitor for Ray's metrics export port on every Ray pod (ray_vllm_*, ray_serve_*).",
    )
    prometheusRule: MonitorToggle = Field(
        default_factory=MonitorToggle,
        description="PrometheusRule with the EB+ alerts (helm/ebplus/rules/ebplus-alerts.yaml).",
    )


class Dashboards(_Values):
    """Grafana dashboards as ConfigMaps, picked up by the Grafana sidecar."""

    enabled: bool = Field(
        True, description="Render the dashboards ConfigMap (where the cluster has monitoring.coreos.com/v1)."
    )
    label: str = Field("grafana_dashboard", min_length=1, description="Label the Grafana sidecar watches.")
    labelValue: str = Field("1", description="Value of that label.")
    namespace: str = Field("", description="Namespace of the ConfigMap; empty: the release namespace.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="ConfigMap annotations, e.g. {grafana_folder: EB+}."
    )


class HelmTest(_Values):
    """The `helm test` hook: a pod that runs `ebplus status` against the release's Serve Service."""

    enabled: bool = Field(True, description="Render the test pod (it runs only on `helm test`).")
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests={"cpu": "100m", "memory": "256Mi"}, limits={"cpu": "1", "memory": "1Gi"}
        ),
        description="Resources of the test pod.",
    )


class RayServiceSettings(_Values):
    """KubeRay RayService settings."""

    rayVersion: str = Field("2.60.0", min_length=1, description="Ray version in the image.")
    serviceUnhealthySecondThreshold: int = Field(
        900, ge=1, description="Seconds the Serve app may be unhealthy before KubeRay replaces the cluster."
    )
    deploymentUnhealthySecondThreshold: int = Field(
        600, ge=1, description="Seconds a deployment may be unhealthy (model loading takes minutes)."
    )
    upgradeType: Literal["NewCluster", "None"] = Field(
        "NewCluster", description="How KubeRay applies a changed cluster spec: NewCluster (zero downtime) or None."
    )
    enableInTreeAutoscaling: bool = Field(
        False,
        description="Run Ray's autoscaler in the head pod: worker pods are added (up to a group's maxReplicas) when "
        "Serve's replicas (config.replicas.autoscaling) need room, and removed when idle.",
    )


class ChartValues(_Values):
    """Values of the ``ebplus`` chart."""

    nameOverride: str = Field("", description="Replaces the chart name in resource names.")
    fullnameOverride: str = Field("", description="Replaces the release-chart name in resource names.")
    image: Image = Field(default_factory=Image, description="The container image.")
    imagePullSecrets: list[dict[str, str]] = Field(default_factory=list, description="Image pull secrets.")
    serviceAccountName: str = Field("", description="Service account of the Ray pods; empty: the namespace default.")
    rayService: RayServiceSettings = Field(default_factory=RayServiceSettings, description="KubeRay settings.")
    config: ServeConfig = Field(
        default_factory=ServeConfig,
        description="The EB+ deployment config (deploy/config.py ServeConfig, same keys as deploy/gpu.yaml); "
        "rendered as the Serve application's args.",
    )
    auth: Auth = Field(default_factory=Auth, description="Admin token and API key.")
    modelStorage: ModelStorage = Field(default_factory=ModelStorage, description="Model volume.")
    head: Head = Field(default_factory=Head, description="The Ray head group (no GPU).")
    workerGroups: list[WorkerGroup] = Field(..., min_length=1, description="GPU worker groups.")
    service: ServeService = Field(default_factory=ServeService, description="The Serve HTTP Service.")
    monitoring: Monitoring = Field(default_factory=Monitoring, description="Prometheus scraping.")
    dashboards: Dashboards = Field(default_factory=Dashboards, description="Grafana dashboards.")
    helmTest: HelmTest = Field(default_factory=HelmTest, description="The `helm test` pod.")
    global_: dict[str, Any] = Field(
        default_factory=dict,
        alias="global",
        description="Helm's global values, shared by a parent chart with its subcharts; this chart reads none "
        "of them, but accepts them so that it can be a dependency.",
    )


def _strip_titles(node: Any, in_properties: bool = False) -> Any:
    """Drop pydantic's generated ``title`` keys (noise in error messages and diffs)."""
    if isinstance(node, dict):
        return {
            k: _strip_titles(v, k in ("properties", "$defs") and not in_properties)
            for k, v in node.items()
            if in_properties or not (k == "title" and isinstance(v, str))
        }
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def values_schema() -> dict:
    """JSON schema of the chart's values (draft 2020-12, ``$defs`` at the root)."""
    schema = _strip_titles(ChartValues.model_json_schema())
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def render_schema() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed schema is stale")
    parser.add_argument("--output", type=Path, default=SCHEMA_PATH)
    args = parser.parse_args(argv)
    text = render_schema()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run `python -m docgen.helm_values`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
