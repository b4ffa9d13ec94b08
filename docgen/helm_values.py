"""The Helm chart's values, as a schema: ``helm/ebplus/values.schema.json`` is generated from here.

The chart's ``config:`` block *is* a :class:`ebplus.deploy.config.ServeConfig` (the one
config schema of a deployment): the chart renders it verbatim as the ``args`` of
the Ray Serve application in the RayService's ``serveConfigV2``. Everything else
(images, the Ray head and GPU worker groups, secrets, monitoring, dashboards) is
described by :class:`ChartValues` below, so ``helm install`` rejects a bad value
with the field named before anything reaches the cluster.

    python -m docgen.helm_values            # rewrite helm/ebplus/values.schema.json
    python -m docgen.helm_values --check    # exit 1 if the committed file is stale

It also writes ``helm/ebplus/files/serve-env.yaml``: Ray Serve's throughput settings,
copied from :data:`ebplus.deploy.serve_env.SERVE_ENV` (what ``ebplus serve`` sets and
``docs/benchmarks/overhead.md`` measured), because a chart can only read files inside
itself (``.Files.Get``), not the Python module. Generated rather than hand-copied, so the
chart cannot drift from the benchmarked list; ``--check`` fails when either file is stale.

A test (``tests/helm/test_chart.py``) fails when the committed schema differs from
the generated one, and validates the chart's values files against these models.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from docgen import generated
from ebplus.deploy.config import ServeConfig
from ebplus.deploy.serve_env import SERVE_ENV

CHART_DIR = Path(__file__).resolve().parent.parent / "helm" / "ebplus"
SCHEMA_PATH = CHART_DIR / "values.schema.json"
SERVE_ENV_PATH = CHART_DIR / "files" / "serve-env.yaml"

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)?$"
ABSOLUTE = r"^/"
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
    shmSize: str = Field("8Gi", pattern=QUANTITY, description="Size of the /dev/shm memory volume.")


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
    """The admin bearer token (and optional /v1 API key) come from a Secret, never from values.

    The documented path is a Secret the operator creates once (``kubectl create secret generic
    ebplus-auth --from-literal=admin-token=$(openssl rand -hex 24)``): a generated one would
    change on every ``helm template`` / Argo CD render, since those cannot ``lookup`` the old one.
    """

    existingSecret: str = Field(
        "ebplus-auth",
        description="Name of the Secret holding the token(s): create it before installing (`kubectl create secret "
        "generic ebplus-auth --from-literal=admin-token=$(openssl rand -hex 24)`), or let `generate` create it. "
        "Empty: `<fullname>-auth`.",
    )
    generate: bool = Field(
        False,
        description="The chart creates that Secret itself with random tokens, kept across upgrades (read back "
        "through `lookup`) and left in place by `helm uninstall` (`helm.sh/resource-policy: keep`). Only for "
        "`helm install`/`upgrade` from a shell: `helm template` and Argo CD cannot look the old Secret up, so "
        "they would render new random tokens on every sync.",
    )
    adminTokenKey: str = Field("admin-token", min_length=1, description="Key of the admin token inside the Secret.")
    apiKey: ApiKey = Field(default_factory=ApiKey, description="Optional /v1 API key.")


class ModelStorage(_Values):
    """A volume holding the model directories named by config.model.source."""

    enabled: bool = Field(False, description="Mount a PersistentVolumeClaim with the models.")
    existingClaim: str = Field("", description="Name of the PersistentVolumeClaim.")
    mountPath: str = Field("/models", pattern=r"^/", description="Where the claim is mounted (head and workers).")
    readOnly: bool = Field(True, description="Mount read-only.")


class HfCache(_Values):
    """The Hugging Face cache (``HF_HOME``) on every Ray pod: where vLLM downloads Hub models.

    Without it each container downloads into its own filesystem (read-only here) and again
    after every restart; an emptyDir keeps a download for the pod's life, a claim across pods.
    """

    mountPath: str = Field(
        "/home/ray/.cache/huggingface",
        pattern=ABSOLUTE,
        description="Where the cache is mounted; HF_HOME is set to it on every Ray container.",
    )
    existingClaim: str = Field(
        "",
        description="A PersistentVolumeClaim holding the cache (ReadWriteMany when several pods share it); empty: "
        "an emptyDir per pod.",
    )
    sizeLimit: str = Field("200Gi", pattern=QUANTITY, description="Size limit of the emptyDir (no existingClaim).")


class HuggingFace(_Values):
    """Access to the Hugging Face Hub: the token gated models need, and the download cache."""

    token: str = Field(
        "",
        description="Hub token in clear; the chart stores it in the Secret `<fullname>-hf` (key `token`). Prefer "
        "`existingSecret`: a token in a values file ends up in Git and in Helm's release history.",
    )
    existingSecret: str = Field(
        "", description="Existing Secret with the Hub token (wins over `token`); HF_TOKEN comes from it."
    )
    existingSecretKey: str = Field("token", min_length=1, description="Key of the token in `existingSecret`.")
    cache: HfCache = Field(default_factory=HfCache, description="The model cache volume (HF_HOME).")


def _serve_env_text() -> str:
    return ", ".join(f"{k}={v}" for k, v in SERVE_ENV.items())


class ServingPlane(_Values):
    """Ray Serve's settings on the Ray pods: the serving plane that was benchmarked."""

    tuned: bool = Field(
        True,
        description="Set on every Ray container what `ebplus serve` sets (`ebplus.deploy.serve_env.SERVE_ENV`, "
        f"copied to files/serve-env.yaml by the generator): {_serve_env_text()}. Ray Serve's throughput mode and "
        "slower control and metrics loops halve the serving plane's CPU per output token "
        "(docs/benchmarks/overhead.md); Serve's proxy calls the ingress over gRPC, whose stream reset carries a "
        "client's disconnect on; HAProxy stays off (a client's abort would not reach the engine); Ray's node "
        "health checks (the chart's only: the cluster `ebplus serve` starts has one node) declare a lost worker dead in about 5 s (20 s if it went silent) instead of 15 s (65 s), so "
        "requests held by an ingress or replica there end sooner (docs/scaling.md#when-a-node-is-lost). A "
        "variable in head.env or a group's env wins; false: Ray's and Ray Serve's defaults.",
    )


class RayAuth(_Values):
    """Ray's own token authentication (KubeRay >= 1.5.1 ``authOptions``): GCS, dashboard and client refuse a
    caller without the token, so a pod that reaches the head cannot submit jobs (run code on the GPU nodes)."""

    enabled: bool = Field(True, description="`rayClusterConfig.authOptions: {mode: token}` (Ray >= 2.52).")
    existingSecret: str = Field(
        "",
        description="Secret with the Ray token under key `auth_token`; empty: KubeRay generates one per RayCluster "
        "(named after it).",
    )


class PeerSelectors(_Values):
    """Which pods a NetworkPolicy rule admits: ``namespaceSelector`` AND ``podSelector`` (one peer)."""

    namespaceSelector: dict[str, Any] | None = Field(
        default_factory=dict,
        description="Namespaces of the peer pods (a LabelSelector); `{}`: every namespace; null: the release's own.",
    )
    podSelector: dict[str, Any] = Field(default_factory=dict, description="The peer pods (a LabelSelector).")


class ServePeers(_Values):
    """Who may reach the Serve HTTP port (OpenAI API, /admin, /metrics, /health)."""

    from_: list[dict[str, Any]] = Field(
        default_factory=list,
        alias="from",
        description="NetworkPolicyPeers admitted to config.http.port; empty: from anywhere. With `ingress.enabled` "
        "and a list here, include the ingress controller's pods (e.g. `{namespaceSelector: {matchLabels: "
        "{kubernetes.io/metadata.name: ingress-nginx}}}`).",
    )


class NetworkPolicy(_Values):
    """Ingress to the Ray pods: the release's own pods on every port, the KubeRay operator on the dashboard and
    its agent, Prometheus on the metrics and Serve ports, and the Serve port as configured. GCS (6379), the Ray
    client (10001) and the dashboard (8265) are closed to everyone else. Egress stays open (Hub downloads)."""

    enabled: bool = Field(True, description="Render the NetworkPolicy (needs a CNI that enforces it).")
    operator: PeerSelectors = Field(
        default_factory=lambda: PeerSelectors(podSelector={"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}),
        description="The KubeRay operator's pods: admitted to the dashboard (8265) and the dashboard agent (52365).",
    )
    prometheus: PeerSelectors = Field(
        default_factory=lambda: PeerSelectors(podSelector={"matchLabels": {"app.kubernetes.io/name": "prometheus"}}),
        description="Prometheus' pods: admitted to Ray's metrics port and the Serve port (/metrics).",
    )
    serve: ServePeers = Field(default_factory=ServePeers, description="The Serve HTTP port.")


#: Pod Security "restricted" for the ray-llm image (user ray, uid 1000, gid 100).
POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 100,
    "fsGroup": 100,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
    "readOnlyRootFilesystem": True,
}
WRITABLE_PATHS = ["/tmp", "/home/ray/.cache", "/home/ray/.config", "/home/ray/.triton", "/home/ray/.nv"]


class ControllerState(_Values):
    """A volume for the EB+ controller's state (``controller.state_dir``), so its estimates and overrides
    survive the head: by default they live in Ray's KV store, in the head's GCS memory."""

    enabled: bool = Field(False, description="Mount a state volume on the head and point controller.state_dir at it.")
    existingClaim: str = Field("", description="A PersistentVolumeClaim to use; empty: the chart creates one.")
    size: str = Field("1Gi", pattern=QUANTITY, description="Size of the claim the chart creates.")
    storageClassName: str = Field("", description="Storage class of that claim; empty: the cluster's default.")
    accessModes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        default_factory=lambda: ["ReadWriteOnce"],
        min_length=1,
        description="Access modes of that claim. A NewCluster upgrade starts the new head while the old one runs: "
        "ReadWriteOnce works only if both land on one node; use ReadWriteMany for zero-downtime upgrades.",
    )
    mountPath: str = Field(
        "/var/lib/ebplus",
        pattern=ABSOLUTE,
        description="Where the head mounts it; config.controller.state_dir, unless set, becomes this path.",
    )


class RedisPassword(_Values):
    """The Redis password, from a Secret."""

    existingSecret: str = Field("", description="Secret holding the Redis password; empty: no password.")
    key: str = Field("password", min_length=1, description="Key of the password in that Secret.")


class GcsFaultTolerance(_Values):
    """GCS fault tolerance on an external Redis (``rayClusterConfig.gcsFaultToleranceOptions``): the cluster's
    metadata, Ray's KV store (the controller's default state store) included, outlives a head restart. Not a
    NewCluster upgrade: KubeRay keys the Redis namespace by the RayCluster's UID, so the new cluster starts
    empty; ``controllerState`` carries the controller's state across both."""

    enabled: bool = Field(
        False,
        description="Render gcsFaultToleranceOptions (needs a Redis you run): the GCS survives a head restart, "
        "not a NewCluster upgrade (a new RayCluster, a new Redis namespace); controllerState survives both.",
    )
    redisAddress: str = Field("", description="Redis `host:port` (required when enabled).")
    redisPassword: RedisPassword = Field(default_factory=RedisPassword, description="The Redis password.")


class IngressPath(_Values):
    path: str = Field("/", pattern=ABSOLUTE, description="URL path routed to the Serve Service.")
    pathType: Literal["Prefix", "Exact", "ImplementationSpecific"] = Field("Prefix", description="Path match.")


class IngressHost(_Values):
    host: str = Field(..., min_length=1, description="Host name.")
    paths: list[IngressPath] = Field(
        default_factory=lambda: [IngressPath()], min_length=1, description="Paths of that host."
    )


class IngressTLS(_Values):
    secretName: str = Field(
        "", description="Secret with the certificate (cert-manager creates it when annotated); empty: the default."
    )
    hosts: list[str] = Field(default_factory=list, description="Host names the certificate covers.")


class Ingress(_Values):
    """A networking.k8s.io/v1 Ingress to the Serve Service (the OpenAI API from outside the cluster)."""

    enabled: bool = Field(False, description="Render the Ingress.")
    className: str = Field("", description="IngressClass (e.g. nginx); empty: the cluster's default.")
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Ingress annotations, e.g. `{cert-manager.io/cluster-issuer: letsencrypt}` for a certificate "
        "from cert-manager, or the controller's timeouts for long streams.",
    )
    hosts: list[IngressHost] = Field(
        default_factory=lambda: [IngressHost(host="ebplus.example.com")], description="Hosts and their paths."
    )
    tls: list[IngressTLS] = Field(default_factory=list, description="TLS: certificate Secrets and their hosts.")


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
        True,
        description="Render the dashboards ConfigMap (Grafana's sidecar reads it; the Prometheus Operator is not needed).",
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
        "Serve's replicas (config.replicas.autoscaling) need room, and removed when idle. The autoscaler sidecar "
        "calls the Kubernetes API, so the head pod then mounts its service-account token (KubeRay's own account).",
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
    hf: HuggingFace = Field(default_factory=HuggingFace, description="Hugging Face Hub token and model cache.")
    modelStorage: ModelStorage = Field(default_factory=ModelStorage, description="Model volume.")
    servingPlane: ServingPlane = Field(default_factory=ServingPlane, description="Ray Serve's settings.")
    rayAuth: RayAuth = Field(default_factory=RayAuth, description="Ray token authentication.")
    networkPolicy: NetworkPolicy = Field(default_factory=NetworkPolicy, description="Ingress to the Ray pods.")
    podSecurityContext: dict[str, Any] = Field(
        default_factory=lambda: dict(POD_SECURITY_CONTEXT),
        description="Pod securityContext of every pod (Pod Security 'restricted'; the image's user ray, uid 1000, "
        "gid 100).",
    )
    securityContext: dict[str, Any] = Field(
        default_factory=lambda: dict(CONTAINER_SECURITY_CONTEXT),
        description="Container securityContext of every container, the autoscaler sidecar (autoscalerOptions) "
        "and the helm-test pod included; KubeRay copies it to the workers' wait-gcs-ready init container.",
    )
    writablePaths: list[Annotated[str, Field(pattern=ABSOLUTE)]] = Field(
        default_factory=lambda: list(WRITABLE_PATHS),
        description="emptyDirs mounted on every Ray container (the root filesystem is read-only): /tmp holds "
        "Ray's session dir and logs, ~/.cache vLLM's and torch's compile caches, ~/.config vLLM's usage file, "
        "~/.triton Triton's kernels, ~/.nv CUDA's JIT cache. Each hides what the image has at that path; never /home/ray itself "
        "(Python lives under it).",
    )
    controllerState: ControllerState = Field(default_factory=ControllerState, description="Controller state volume.")
    gcsFaultTolerance: GcsFaultTolerance = Field(
        default_factory=GcsFaultTolerance, description="GCS fault tolerance (external Redis)."
    )
    head: Head = Field(default_factory=Head, description="The Ray head group (no GPU).")
    workerGroups: list[WorkerGroup] = Field(..., min_length=1, description="GPU worker groups.")
    service: ServeService = Field(default_factory=ServeService, description="The Serve HTTP Service.")
    ingress: Ingress = Field(default_factory=Ingress, description="Ingress to the Serve Service.")
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


def render_serve_env() -> str:
    """``files/serve-env.yaml``: :data:`SERVE_ENV` as a YAML mapping the templates read (``servingPlane.tuned``)."""
    lines = [
        "# Generated by `python -m docgen.helm_values` from ebplus.deploy.serve_env.SERVE_ENV; do not edit by hand.",
        "# Ray Serve's settings `ebplus serve` uses (measured in docs/benchmarks/overhead.md); the chart sets them",
        "# on every Ray container when servingPlane.tuned is true.",
    ]
    lines += [f"{key}: {json.dumps(value)}" for key, value in SERVE_ENV.items()]
    return "\n".join(lines) + "\n"


def outputs(schema_path: Path = SCHEMA_PATH, serve_env_path: Path = SERVE_ENV_PATH) -> dict[Path, str]:
    """Every file this module generates and its content."""
    return {schema_path: render_schema(), serve_env_path: render_serve_env()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed file is stale")
    parser.add_argument("--output", type=Path, default=SCHEMA_PATH, help="where the values schema goes")
    parser.add_argument("--serve-env", type=Path, default=SERVE_ENV_PATH, help="where files/serve-env.yaml goes")
    args = parser.parse_args(argv)
    return generated.check_or_write(outputs(args.output, args.serve_env), args.check, "python -m docgen.helm_values")


if __name__ == "__main__":
    raise SystemExit(main())
