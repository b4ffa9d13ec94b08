"""The vLLM / Ray Serve names of ``dashboards.external`` are the ones the installed packages export.

* Static: each ``ray_vllm_*`` entry is a ``vllm:<x>`` metric declared in the installed
  ``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger, which RayPrometheusStatLogger
  subclasses) with the same kind and extra labels; each ``ray_serve_*`` entry is declared in
  Ray Serve's ``request_ingress_metrics.py``; ``ray.serve.llm`` turns engine metrics on by
  default and uses RayPrometheusStatLogger.
  Each plugin-mode entry (``vllm:*``, ``http_*``) is the same vLLM metric as its Ray-mode
  twin, or one of the API server's instrumentator metrics.
* Live, in both deployments: a real Ray metrics agent exports the Ray-mode names (vLLM's
  Ray wrappers and Ray Serve's RequestIngressMetrics record them) beside the app's
  exporter; in plugin mode two synthetic ``vllm serve`` endpoints each expose one EB+
  replica's ``ebplus_*`` with the plugin-mode names. In each, a real Prometheus answers
  *every* panel and variable query of both dashboards with data, with the variables at
  "All" and pinned to one model and replica.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from observability.panels import expand, panel_queries, variable_queries
from observability.prom import Target, has_finite
from observability.synthetic import MODEL, REPLICAS, SyntheticApp

from docgen.dashboards.external import EXTERNAL, EXTERNAL_METRICS, VLLM_LABELS, VLLM_PLUGIN_LABELS
from docgen.dashboards.grafana import engine

RAY_MODE = [m for m in EXTERNAL_METRICS if m.mode == "ray"]
PLUGIN_MODE = [m for m in EXTERNAL_METRICS if m.mode == "plugin"]


def _source(module: str) -> Path:
    """The installed source file of a module, found without importing it (vLLM takes seconds to import)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.submodule_search_locations, top
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest).with_suffix(".py")
    assert path.is_file(), path
    return path


def _vllm_declarations() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``vllm:<x>`` -> (kind, extra label names) as declared in vLLM's Prometheus logger."""
    tree = ast.parse(_source("vllm.v1.metrics.loggers").read_text())
    out = {}
    kinds = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in kinds):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        name = kw.get("name")
        if not (isinstance(name, ast.Constant) and str(name.value).startswith("vllm:")):
            continue
        extra: tuple[str, ...] = ()
        labels = kw.get("labelnames")
        if isinstance(labels, ast.BinOp) and isinstance(labels.right, ast.List):
            extra = tuple(e.value for e in labels.right.elts if isinstance(e, ast.Constant))
        out[name.value] = (kinds[node.func.attr], extra)
    return out


def test_vllm_names_kinds_and_labels() -> None:
    declared = _vllm_declarations()
    assert len(declared) > 20, "the parser found too few vLLM metrics: has loggers.py changed shape?"
    for m in EXTERNAL_METRICS:
        if not m.source.startswith("vllm:"):
            continue
        assert m.source in declared, f"{m.source} is not declared by the installed vLLM"
        kind, extra = declared[m.source]
        assert kind == m.kind, f"{m.source}: vLLM declares a {kind}"
        total = "_total" if kind == "counter" else ""
        if m.mode == "ray":
            assert m.labels == (*VLLM_LABELS, *extra), m.name
            # Ray's rule: non [a-zA-Z0-9_] -> "_", prefix "ray_", counters "_total" (checked live below)
            assert m.name == "ray_" + re.sub(r"[^a-zA-Z0-9_]", "_", m.source) + total
        else:  # prometheus-client's rule: the declared name, counters "_total"
            assert m.labels == (*VLLM_PLUGIN_LABELS, *extra), m.name
            assert m.name == m.source + total
        twin = EXTERNAL[m.twin]
        assert (twin.source, twin.kind, twin.twin) == (m.source, m.kind, m.name) and twin.mode != m.mode


def test_plugin_mode_http_names() -> None:
    """vLLM's API server instruments itself with the instrumentator's defaults, whose names these are."""
    attach = _source("vllm.entrypoints.serve.instrumentator.metrics").read_text()
    assert ".add()" in attach, "vLLM no longer adds the instrumentator's default metrics"
    tree = ast.parse(_source("prometheus_fastapi_instrumentator.metrics").read_text())
    (default,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "default"]
    declared = {}
    for node in ast.walk(default):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Counter", "Histogram"):
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(kw.get("name"), ast.Constant):
                declared[kw["name"].value] = node.func.id.lower()
    http = [m for m in PLUGIN_MODE if m.source.startswith("prometheus_fastapi_instrumentator:")]
    assert len(http) == 2
    for m in http:
        name = m.source.split(":", 1)[1]
        assert declared.get(name) == m.kind and m.name == name, (m.name, declared)


def test_vllm_ray_wrapper_and_serve_llm_wiring() -> None:
    wrappers = _source("vllm.v1.metrics.ray_wrappers").read_text()
    assert "class RayPrometheusStatLogger(PrometheusStatLogger)" in wrappers
    assert 'labels.append("ReplicaId")' in wrappers
    engine = _source("ray.llm._internal.serve.engines.vllm.vllm_engine").read_text()
    assert "custom_stat_loggers = [RayPrometheusStatLogger]" in engine
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    assert LLMConfig.model_fields["log_engine_metrics"].default is True


def test_ray_serve_names() -> None:
    tree = ast.parse(_source("ray.serve._private.request_ingress_metrics").read_text())
    declared = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "Counter", "Histogram", "Gauge"
        ):  # fmt: skip
            arg = node.args[0] if node.args else {k.arg: k.value for k in node.keywords}.get("name")
            if isinstance(arg, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{protocol}" for v in arg.values)
                declared[text] = node.func.attr.lower()
    for m in EXTERNAL_METRICS:
        if m.source.startswith("serve_"):
            assert declared.get(m.source) == m.kind, f"{m.source} ({m.kind}) not in Ray Serve: {declared}"
            assert m.name == "ray_" + m.source.replace("{protocol}", "http") + ("_total" if m.kind == "counter" else "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_agent():
    """A Ray metrics agent exporting vLLM's and Ray Serve's metrics (subprocess: isolated from other Ray users)."""
    port = _free_port()
    specs = [(m.source, m.kind, list(m.labels[len(VLLM_LABELS) :])) for m in RAY_MODE if m.source.startswith("vllm:")]
    script = str(Path(__file__).with_name("ray_metrics_source.py"))
    proc = subprocess.Popen(
        [sys.executable, script, str(port), json.dumps(specs), REPLICAS[0]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("READY"):
            break
    else:
        proc.wait(timeout=30)
        pytest.fail("Ray did not start:\n" + "".join(lines[-40:]))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


PINNED = {"model": MODEL, "replica": REPLICAS[0]}


def _queries_without_data(prom, rate_interval: str) -> list[str]:
    """Each panel and variable query of both dashboards, at "All" and pinned to one model and replica."""
    failures = []
    for variables in ({}, PINNED):
        for query in [*panel_queries(), *variable_queries()]:
            if query.ref == "var":  # label_values(selector, label): the selector must have series
                expr = expand(query.expr.removeprefix("label_values(").rsplit(",", 1)[0], variables=variables)
                ok = bool(prom.query(expr))
            else:
                expr = expand(query.expr, rate_interval=rate_interval, variables=variables)
                ok = has_finite(prom.query(expr))
            if not ok:
                failures.append(f"{query.id} {variables or 'All'}: {expr}")
    return failures


def _wait_for_names(prom, metrics: list, timeout: float) -> None:
    """Until every one of ``metrics`` is stored, under exactly its name and with its declared type."""
    names = [m.name + ("_count" if m.kind == "histogram" else "") for m in metrics]
    prom.wait_for(
        'count by (__name__) ({__name__=~"' + "|".join(names) + '"})',
        timeout=timeout,
        predicate=lambda r: len(r) == len(names),
    )
    prom.wait_for_scrapes(6, timeout=60)
    metadata = prom.metadata()
    for m in metrics:  # (a counter's family may be stored without _total)
        entries = metadata.get(m.name) or metadata.get(m.name.removesuffix("_total"), [])
        assert [e["type"] for e in entries][:1] == [m.kind], (m.name, entries)


def test_every_panel_returns_data_from_ray_agent(prometheus, ray_agent) -> None:
    """Ray mode: the app's /metrics (every replica) and Ray's metrics agent (ray_vllm_*, ray_serve_*)."""
    with SyntheticApp() as app:
        prom = prometheus([Target(app.address, job="ebplus"), Target(ray_agent, job="ray")])
        _wait_for_names(prom, RAY_MODE, timeout=120)
        failures = _queries_without_data(prom, rate_interval="5s")
        assert not failures, "queries with no data:\n" + "\n".join(failures)


def test_every_panel_returns_data_in_plugin_mode(prometheus) -> None:
    """Plugin mode: two `vllm serve` endpoints, each with one EB+ replica's ebplus_* beside vllm:* and http_*."""
    apps = [SyntheticApp(replicas=(rid,), plugin=True, seed=i) for i, rid in enumerate(REPLICAS)]
    with apps[0], apps[1]:
        prom = prometheus([Target(app.address, job="vllm") for app in apps])
        _wait_for_names(prom, PLUGIN_MODE, timeout=60)
        failures = _queries_without_data(prom, rate_interval="5s")
        assert not failures, "queries with no data:\n" + "\n".join(failures)
        # the join gives each vllm:* series its own server's replica, not the other's
        (one,) = prom.query(expand(engine("ray_vllm_num_requests_running"), variables=PINNED))
        assert one["metric"]["ReplicaId"] == REPLICAS[0] and one["metric"]["instance"] == apps[0].address
