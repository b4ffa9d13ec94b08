"""The Grafana model of the EB+ dashboards: panel types, PromQL selectors of declared metrics, JSON rendering.

Every metric a query names goes through :func:`metric`, which accepts only names in
:data:`ebplus.controller.exporter.METRICS` (the app's ``ebplus_*`` metrics) or
:data:`docgen.dashboards.external.EXTERNAL_METRICS` (vLLM's ``ray_vllm_*`` / ``vllm:*`` and
Ray Serve's ``ray_serve_*``), so a renamed metric breaks the generator instead of
leaving a panel on "No data"; deprecated ``ebplus_*`` names are refused. The data source
is the variable ``$datasource`` (no hard-coded UIDs); per-replica panels filter on the
``$model`` (label ``model_name``) and ``$replica`` (label ``ReplicaId``) variables, the
labels EB+'s and vLLM's metrics share.

An engine panel works in both deployments through :func:`engine`: the Ray-mode series
``or`` the plugin-mode series, each ``vllm:*`` series given the ``ReplicaId`` of the EB+
replica on the same scrape target (plain vLLM has no replica label of its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from docgen.dashboards.external import EXTERNAL
from ebplus.controller.exporter import SPECS

DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
HISTOGRAMS = {n for n, s in (*SPECS.items(), *EXTERNAL.items()) if s.kind == "histogram"}


# -- queries ---------------------------------------------------------------------


def metric(name: str, suffix: str = "", **matchers: str) -> str:
    """A selector of a declared metric, filtered on the dashboard variables it has labels for.

    ``suffix`` is ``_bucket``/``_sum``/``_count`` for histograms. Matchers given as
    keyword arguments are added verbatim (``status_code='=~"5.."'``).
    """
    spec = SPECS.get(name) or EXTERNAL.get(name)
    if spec is None:
        raise KeyError(f"{name} is neither in ebplus.controller.exporter.METRICS nor in dashboards.external")
    if getattr(spec, "deprecated", False):
        raise ValueError(f"{name} is deprecated: {spec.help}")
    if suffix and spec.kind != "histogram":
        raise ValueError(f"{name} is a {spec.kind}, not a histogram")
    if spec.kind == "histogram" and not suffix:
        raise ValueError(f"{name} is a histogram: select _bucket, _sum or _count")
    labels = set(spec.labels)
    parts = []
    if "model_name" in labels:
        parts.append('model_name=~"$model"')
    if "ReplicaId" in labels:
        parts.append('ReplicaId=~"$replica"')
    parts.extend(f"{k}{v}" for k, v in matchers.items())
    return name + suffix + ("{" + ", ".join(parts) + "}" if parts else "")


def on_ebplus_targets(expr: str) -> str:
    """``expr`` kept to the scrape targets that also export EB+'s metrics: in plugin mode, for generic
    names (``http_requests_total``) that other applications in the same Prometheus export too."""
    return f"{expr} and on (job, instance) {metric('ebplus_controller_up')}"


def _rate(selector: str) -> str:
    return f"rate({selector}[{RATE}])"


def engine(name: str, suffix: str = "", rate: bool = False) -> str:
    """A vLLM engine metric in both deployments: Ray mode's ``name`` or its plugin-mode twin.

    Ray mode's ``ray_vllm_*`` series carry ``ReplicaId`` themselves. A plugin-mode ``vllm:*``
    series is multiplied by 1 joined on its scrape target, ``group_left (ReplicaId)``, from
    the ``ebplus_mode_info`` of the one EB+ replica that server runs (kept to targets that
    export ``vllm:*``, so a Ray-mode ingress, which renders many replicas, never matches).
    With ``rate``, each side is ``rate()``'d first (``suffix`` ``_bucket`` for a quantile).
    """
    spec = EXTERNAL[name]
    if spec.mode != "ray" or not spec.twin:
        raise ValueError(f"{name}: engine() takes a Ray-mode vLLM metric with a plugin-mode twin")
    ray, plugin = metric(name, suffix), metric(spec.twin, suffix)
    if rate:
        ray, plugin = _rate(ray), _rate(plugin)
    replica = (
        f"max by (job, instance, ReplicaId) ({metric('ebplus_mode_info')} "
        f"and on (job, instance) {metric('vllm:num_requests_running')})"
    )
    return f"({ray} or {plugin} * on (job, instance) group_left (ReplicaId) {replica})"


def quantile(q: float, name: str, by: str = "", **matchers: str) -> str:
    """``histogram_quantile`` over a histogram, summed over everything but ``le`` and ``by``
    (a vLLM histogram in both deployments, see :func:`engine`)."""
    keep = ", ".join(["le", *[b.strip() for b in by.split(",") if b.strip()]])
    if name in EXTERNAL and EXTERNAL[name].twin:
        rates = engine(name, "_bucket", rate=True)  # parenthesised
    else:
        rates = f"({_rate(metric(name, '_bucket', **matchers))})"
    return f"histogram_quantile({q}, sum by ({keep}) {rates})"


# -- panels ----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One query of a panel: a PromQL expression and its legend (``{{label}}`` templates)."""

    expr: str
    legend: str = ""


@dataclass
class Panel:
    """A panel; ``description`` is shown in Grafana and in the generated docs page, so it says what to read off it."""

    title: str
    description: str
    targets: list[Target]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | state-timeline
    width: int = 12
    mappings: list[dict] = field(default_factory=list)
    decimals: int | None = None


@dataclass
class Row:
    """A titled row of panels, laid out left to right on Grafana's 24-column grid."""

    title: str
    panels: list[Panel]


@dataclass
class Dashboard:
    """A whole dashboard: its stable ``uid``, template variables, rows, and the JSON file it is written to."""

    uid: str
    title: str
    description: str
    variables: list[dict]
    rows: list[Row]
    file: str


def datasource_var() -> dict:
    """The ``$datasource`` variable: every panel and query variable reads through it, never a fixed UID."""
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }


def query_var(name: str, label: str, query: str) -> dict:
    """A multi-value variable (``All`` by default) filled by a ``label_values`` query."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-var"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
        "regex": "",
    }


def replica_vars() -> list[dict]:
    """``$model`` and ``$replica``, from EB+'s own metrics: they exist in both deployments, with the labels
    (``model_name``, ``ReplicaId``) the engine metrics share, so one replica variable filters every panel."""
    return [
        query_var("model", "Model", "label_values(ebplus_mode_info, model_name)"),
        query_var("replica", "Replica", 'label_values(ebplus_mode_info{model_name=~"$model"}, ReplicaId)'),
    ]


# -- JSON ------------------------------------------------------------------------


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict:
    defaults: dict = {"unit": p.unit, "mappings": p.mappings}
    if p.decimals is not None:
        defaults["decimals"] = p.decimals
    options: dict = {"tooltip": {"mode": "multi", "sort": "none"}}
    if p.kind in ("timeseries", "state-timeline"):
        options["legend"] = {"displayMode": "list", "placement": "bottom", "showLegend": True}
    if p.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "value_and_name",
            "colorMode": "none",
            "graphMode": "none",
        }
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": t.expr, "legendFormat": t.legend or "__auto"}
            for i, t in enumerate(p.targets)
        ],
    }


def build(d: Dashboard) -> dict:
    """Grafana's JSON model of ``d``: rows and panels numbered and placed in order, 8 units high."""
    panels: list[dict] = []
    pid, y = 1, 0
    for row in d.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x = pid + 1, y + 1, 0
        for p in row.panels:
            if x + p.width > 24:
                x, y = 0, y + 8
            panels.append(_panel_json(p, pid, x, y))
            pid, x = pid + 1, x + p.width
        y += 8
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": ["ebplus", "vllm", "ray"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": d.variables},
        "panels": panels,
    }


def render_json(d: Dashboard) -> str:
    """The committed file's text (stable key order and indent, so ``--check`` compares bytes)."""
    return json.dumps(build(d), indent=2, ensure_ascii=False) + "\n"
