"""``helm/ebplus/README.md``, generated: what helm-docs does for KubeRay's charts, in-house.

helm-docs is not on the package registries these machines reach, so this module plays
its part. The values table takes each key of ``values.yaml`` in file order with the
``# --`` comment above it (helm-docs' convention; ``#`` lines below it continue it), or,
where a key has none, the description of its field in :class:`ChartValues`, the model
``values.schema.json`` is generated from. Keys the schema accepts but ``values.yaml``
leaves out (``global``, ``workerGroups[].minReplicas``, ...) follow with the schema's
defaults. Under ``config`` (a ``ServeConfig``) every key set in ``values.yaml`` gets a
row with its ``deploy/config.py`` description. The alerts table comes from
``rules/ebplus-alerts.yaml``.

``python -m ebplus.deploy.helm_values`` writes it with the schema; a test fails when
the committed file differs (the chart is documented as it is).
"""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

CHART_DIR = Path(__file__).resolve().parent.parent / "helm" / "ebplus"
README_PATH = CHART_DIR / "README.md"

_KEY = re.compile(r"(?P<key>[A-Za-z_][\w-]*):(?:\s|$)")
_DOC = re.compile(r"# -- ?(?P<text>.*)$")


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    description: str


def comments(values_text: str) -> dict[str, str]:
    """``dotted.key -> text`` of every ``# --`` comment of a values file (list items as ``key[]``)."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, path) of the enclosing keys and list items
    pending: list[str] | None = None
    for line in values_text.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith("- "):  # a list item: its keys sit two columns further in
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, (stack[-1][1] if stack else "") + "[]"))
            stripped, indent = stripped[2:], indent + 2
        doc = _DOC.match(stripped)
        if doc:
            pending = [doc.group("text").strip()]
            continue
        if pending is not None and stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        key = _KEY.match(stripped)
        if not key:
            if not stripped:
                pending = None
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join(filter(None, [stack[-1][1] if stack else "", key.group("key")]))
        stack.append((indent, path))
        if pending is not None:
            docs.setdefault(path, " ".join(t for t in pending if t))
            pending = None
    return docs


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``Model``, ``Model | None`` or ``list[Model]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {info.alias or name: info for name, info in model.model_fields.items()}


def field_at(root: type[BaseModel], path: str) -> FieldInfo | None:
    """The pydantic field a dotted values path (``workerGroups[].gpus``) names."""
    model: type[BaseModel] | None = root
    info = None
    for part in path.split("."):
        if model is None:
            return None
        info = _fields(model).get(part.removesuffix("[]"))
        if info is None:
            return None
        model = _model_of(info.annotation)
    return info


def _type(value: Any, info: FieldInfo | None = None) -> str:
    if value is None and info is not None:  # "int | None" -> "int or null"
        names = [a.__name__ for a in typing.get_args(info.annotation) if a is not type(None) and isinstance(a, type)]
        return " or ".join([*names, "null"])
    for kind, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"), (list, "list"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def _default(value: Any) -> str:
    return "`" + json.dumps(value, separators=(", ", ": ")) + "`"


def _cell(text: str) -> str:
    """One table cell: one line, ``|`` escaped, ``<``/``>`` as entities (not HTML tags)."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def value_rows(values_text: str, root: type[BaseModel]) -> list[Row]:
    """Rows of the values table; raises ``ValueError`` naming a key with no description at all."""
    docs = comments(values_text)
    values = yaml.safe_load(values_text)
    rows: list[Row] = []
    missing: list[str] = []

    def describe(path: str) -> str:
        info = field_at(root, path)
        text = docs.get(path) or (info.description if info is not None else None)
        if not text:
            missing.append(path)
        return text or ""

    def walk(node: Any, path: str, model: type[BaseModel] | None) -> None:
        # descend into a mapping the schema models, unless a `# --` comment documents it whole
        # (helm-docs' rule); `config` always (its keys are ServeConfig's, documented there)
        whole = path in docs and path != "config"
        if isinstance(node, dict) and node and model is not None and not whole:
            for key, child in node.items():
                info = _fields(model).get(key)
                walk(child, f"{path}.{key}".lstrip("."), _model_of(info.annotation) if info is not None else None)
            if path != "config" and not path.startswith("config."):
                schema_only(model, path, set(node))
            return
        if isinstance(node, list) and node and isinstance(node[0], dict) and model is not None:
            rows.append(Row(path, "list", f"{len(node)} item(s), see below", describe(path)))
            walk(node[0], f"{path}[]", model)
            return
        rows.append(Row(path, _type(node), _default(node), describe(path)))

    def schema_only(model: type[BaseModel], path: str, present: set[str]) -> None:
        for key, info in _fields(model).items():
            if key in present:
                continue
            default = info.get_default(call_default_factory=True)
            if isinstance(default, BaseModel):
                default = default.model_dump(mode="json", by_alias=True)
            sub = f"{path}.{key}".lstrip(".")
            rows.append(Row(sub, _type(default, info), _default(default), describe(sub)))

    walk(values, "", root)
    if missing:
        raise ValueError(f"values without a description (add a `# --` comment or a Field description): {missing}")
    return rows


def alert_rows(rules_text: str) -> list[list[str]]:
    rows = []
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rows.append([f"`{rule['alert']}`", rule["labels"]["severity"], rule.get("for", "0m"),
                             _cell(rule["annotations"]["summary"])])  # fmt: skip
    return rows


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


INTRO = """\
<!-- Generated by `python -m ebplus.deploy.helm_values` from Chart.yaml, values.yaml (`# --` comments),
the values schema (deploy/helm_values.py) and rules/ebplus-alerts.yaml. Edit those, not this file:
tests/helm/test_chart.py fails when it is stale. -->

## Prerequisites

- Kubernetes {kube}, with the KubeRay operator ({requires}):
  `helm install kuberay-operator kuberay/kuberay-operator`.
- The image of `deploy/Dockerfile` (on `rayproject/ray-llm`) in a registry the nodes pull from:
  `docker build -f deploy/Dockerfile -t REGISTRY/ebplus-serve:{app} .` from the repository root.
- GPU nodes with the NVIDIA device plugin (`nvidia.com/gpu`); models on a PersistentVolumeClaim
  (`modelStorage`) or wherever `config.model.source` points.
- Optional: the Prometheus Operator. ServiceMonitor, PodMonitor, PrometheusRule and the Grafana
  dashboards ConfigMap are created only where the cluster serves `monitoring.coreos.com/v1`
  (with `helm template`, pass `--api-versions monitoring.coreos.com/v1`).

## Install and test

```console
helm install ebplus helm/ebplus --namespace llm --create-namespace \\
  --set image.repository=REGISTRY/ebplus-serve
kubectl -n llm get rayservice ebplus -w          # loading the model takes minutes
helm test ebplus --namespace llm                 # /health, /v1/models, /admin/thresholds
```

`helm test` runs `ebplus status` in a pod from the same image, with the admin token from the
release's Secret. The values are validated by `values.schema.json` (unknown keys are refused) and
by cross-field checks in the templates (GPUs per replica, replicas per worker group).
The chart also works as a dependency of another chart (it accepts Helm's `global` values).

## Tensor parallelism

`config.engine.extra.tensor_parallel_size: T` gives every replica T GPUs: Ray Serve LLM reserves a
placement group of T GPU bundles per replica from the engine arguments. Each worker group's `gpus`
must then be a multiple of T (a replica's GPUs stay in one pod), and the groups must hold
`config.replicas.num_replicas` x T x `pipeline_parallel_size` GPUs; the chart refuses other values.
"""


def render_readme(chart_dir: Path = CHART_DIR) -> str:
    """The chart's README.md."""
    from ebplus.deploy.helm_values import ChartValues

    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    rows = value_rows((chart_dir / "values.yaml").read_text(), ChartValues)
    alerts = alert_rows((chart_dir / "rules" / "ebplus-alerts.yaml").read_text())
    parts = [
        f"# {chart['name']}\n",
        f"{chart['description']}\n",
        f"Chart version {chart['version']}, app version {chart['appVersion']}.\n",
        INTRO.format(
            kube=chart.get("kubeVersion", ""),
            requires=chart.get("annotations", {}).get("ebplus.io/requires", "ray.io/v1"),
            app=chart["appVersion"],
        ),
        "## Alerts\n",
        "The PrometheusRule (`monitoring.prometheusRule.enabled`) holds these alerts on the `ebplus_*` metrics;\n"
        "`promtool test rules` checks each in tests/helm/alerts_test.yaml.\n",
        _table(["Alert", "Severity", "For", "Summary"], alerts) + "\n",
        "## Values\n",
        "`config` is the EB+ deployment config (`deploy/config.py` `ServeConfig`, the keys of `deploy/gpu.yaml`);\n"
        "the rows below list the keys the default sets, every other `ServeConfig` key is accepted too.\n",
        _table(
            ["Key", "Type", "Default", "Description"],
            [[f"`{r.key}`", r.type, _cell(r.default), _cell(r.description)] for r in rows],
        )
        + "\n",
    ]
    return "\n".join(parts)
