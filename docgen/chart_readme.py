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

- Kubernetes {kube}, with the KubeRay operator ({requires}):
  `helm install kuberay-operator kuberay/kuberay-operator`.
- The image of `deploy/Dockerfile` (on `rayproject/ray-llm`) in a registry the nodes pull from:
  `docker build -f deploy/Dockerfile -t REGISTRY/ebplus-serve:{app} .` from the repository root.
- GPU nodes with the NVIDIA device plugin (`nvidia.com/gpu`), and the models on a
  PersistentVolumeClaim (`modelStorage`) or wherever `config.model.source` points.
- Optional: the Prometheus Operator. The ServiceMonitor, PodMonitor, PrometheusRule and the
  Grafana dashboards ConfigMap are created only where the cluster serves `monitoring.coreos.com/v1`
  (with `helm template`, pass `--api-versions monitoring.coreos.com/v1`).

## Install and test

```console
helm install ebplus helm/ebplus --namespace llm --create-namespace \\
  --set image.repository=REGISTRY/ebplus-serve
kubectl -n llm get rayservice ebplus -w          # loading the model takes minutes
helm test ebplus --namespace llm                 # /health, /v1/models, /admin/thresholds
```

`helm test` runs `ebplus status` in a pod of the same image, with the admin token (and API key)
from the release's Secret: it fails unless `/health` answers, `/v1/models` lists
`config.model.id`, and `/admin/thresholds` and `/admin/estimates` accept the token.
`values.schema.json` refuses unknown keys and values outside their bounds, naming them; the
templates refuse what the schema cannot express (GPUs per replica, replicas per worker group).
The chart also works as a dependency of another chart: it accepts Helm's `global` values.

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
