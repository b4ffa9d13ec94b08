"""``helm/ebplus/README.md``, generated: what helm-docs does for KubeRay's charts, in-house.

helm-docs is not on the package registries these machines reach. The chart's README
is one more page of :mod:`docgen.reference` (``python -m docgen.reference`` writes it,
and the test of the reference pages fails when it is stale): the chart's metadata from
``Chart.yaml``, how to install and test it, the alerts of ``rules/ebplus-alerts.yaml``,
and the values table of the docs site's Helm values page (the values schema's models,
:class:`docgen.helm_values.ChartValues`, with the defaults of ``values.yaml``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from docgen import reference

CHART_DIR = reference.ROOT / "helm" / "ebplus"
README_PATH = CHART_DIR / "README.md"
#: The configuration reference, relative to the chart's README.
CONFIG_PAGE = "../../docs/reference/config.md"

USAGE = """\
## Prerequisites

- Kubernetes {kube}, with the KubeRay operator, {requires}:
  `helm install kuberay-operator kuberay/kuberay-operator`.
- The image of `deploy/Dockerfile` (on `rayproject/ray-llm`) in a registry the nodes pull from:
  `docker build -f deploy/Dockerfile -t REGISTRY/ebplus-serve:{app} .` from the repository root
  (no image is published).
- GPU nodes with the NVIDIA device plugin (`nvidia.com/gpu`). The model comes from the Hugging Face
  Hub by default (`config.model.source: Qwen/Qwen3-8B`), into the cache `hf.cache` (an emptyDir, or a
  claim); a local directory needs `modelStorage` (the chart refuses a local path nothing mounts).
- Optional: the Prometheus Operator. The ServiceMonitor, PodMonitor and PrometheusRule are created
  only where the cluster serves `monitoring.coreos.com/v1` (with `helm template`, pass
  `--api-versions monitoring.coreos.com/v1`); the Grafana dashboards ConfigMap needs only Grafana's sidecar.

## Install and test

```console
kubectl create namespace llm
kubectl -n llm create secret generic ebplus-auth --from-literal=admin-token=$(openssl rand -hex 24)
kubectl -n llm create secret generic hf-token --from-literal=token=hf_...      # gated models
helm install ebplus helm/ebplus --namespace llm -f helm/ebplus/ci/one-gpu-values.yaml \\
  --set image.repository=REGISTRY/ebplus-serve
kubectl -n llm get rayservice ebplus -w          # loading the model takes minutes
helm test ebplus --namespace llm                 # /health, /v1/models, /admin/thresholds
```

`ci/one-gpu-values.yaml` (one GPU of any type, a gated Hub model), `ci/eight-gpu-values.yaml` (one node
x 8 H200, the defaults spelled out) and `ci/cpu-values.yaml` (no GPU, the tiny test model) are complete
examples. The admin Secret is created by you (`auth.existingSecret`, default `ebplus-auth`), so a GitOps
render never changes it; `auth.generate=true` lets `helm install` make one instead.

`helm test` runs `ebplus status` in a pod of the same image, with the admin token (and API key)
from the release's Secret: it fails unless `/health` answers, `/v1/models` lists
`config.model.id`, and `/admin/thresholds` and `/admin/estimates` accept the token.
`values.schema.json` refuses unknown keys and values outside their bounds, naming them; the
templates refuse what the schema cannot express (GPUs per replica, replicas per worker group,
a local model path without storage).
The chart also works as a dependency of another chart: it accepts Helm's `global` values.

## Locked down by default

- Ray token authentication (`rayAuth`, KubeRay's `authOptions`): the GCS, the dashboard and the
  Ray client refuse callers without the token.
- A NetworkPolicy (`networkPolicy`): GCS 6379, the Ray client 10001 and the dashboard 8265 answer
  only the release's own pods; the KubeRay operator reaches the dashboard and its agent, Prometheus
  the metrics ports, and the Serve port is open to `networkPolicy.serve.from` (anyone when empty).
  The chart's Services publish only the Serve port.
- Pod Security "restricted" on every container (`podSecurityContext`, `securityContext`; the autoscaler
  sidecar through `autoscalerOptions`), a read-only root filesystem with emptyDirs for `writablePaths`,
  and no service-account token in any pod but an autoscaling head (its sidecar calls the Kubernetes API).
- The serving plane `ebplus serve` runs (`servingPlane.tuned`): Ray Serve's throughput settings from
  `files/serve-env.yaml`, generated from `ebplus.deploy.serve_env.SERVE_ENV`.

`controllerState` keeps the controller's state on a claim mounted on the head (it survives head
restarts and `NewCluster` upgrades); `gcsFaultTolerance` puts the GCS on an external Redis.

## Tensor parallelism

`config.engine.extra.tensor_parallel_size: T` gives every replica T GPUs: Ray Serve LLM reserves a
placement group of T x `pipeline_parallel_size` GPU bundles per replica, from the engine arguments.
Each worker group's `gpus` must then be a multiple of T (a replica's tensor-parallel GPUs stay in
one pod), and the groups must hold `config.replicas.num_replicas` x T x `pipeline_parallel_size`
GPUs; the chart refuses other values with one line naming them.
"""


def alert_rows(rules_text: str) -> list[tuple[str, ...]]:
    """``(alert, severity, for, summary)`` of every alert of a Prometheus rules file."""
    return [
        (reference.code(rule["alert"]), rule["labels"]["severity"], rule.get("for", "0m"),
         reference.cell(rule["annotations"]["summary"]))
        for group in yaml.safe_load(rules_text)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]  # fmt: skip


def render_readme(chart_dir: Path = CHART_DIR) -> str:
    """The chart's README.md."""
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    lines = [
        f"# {chart['name']}",
        "",
        reference.banner("`helm/ebplus/Chart.yaml`, `values.yaml`, the values schema and `rules/ebplus-alerts.yaml`"),
        "",
        chart["description"],
        "",
        f"Chart version {chart['version']}, app version {chart['appVersion']}.",
        "",
        USAGE.format(
            kube=chart.get("kubeVersion", ""),
            requires=chart.get("annotations", {}).get("ebplus.io/requires", "ray.io/v1"),
            app=chart["appVersion"],
        ),
        "## Alerts",
        "",
        "The PrometheusRule (`monitoring.prometheusRule.enabled`) holds these alerts on the `ebplus_*` metrics;",
        "`promtool test rules` checks each against synthetic series (`tests/helm/alerts_test.yaml`).",
        "",
        *reference.table(
            ("Alert", "Severity", "For", "Summary"),
            alert_rows((chart_dir / "rules" / "ebplus-alerts.yaml").read_text()),
        ),
        "",
        "## Values",
        "",
        "*Chart default* is what `values.yaml` sets (for `workerGroups[]`, its first group), else the schema's",
        "default. `config` is the EB+ deployment config (`ServeConfig`, the keys of `deploy/gpu.yaml`).",
        "",
        *reference.table(reference.HELM_VALUES_HEADER, reference.helm_values_rows(config_page=CONFIG_PAGE)),
    ]
    return "\n".join(lines) + "\n"
