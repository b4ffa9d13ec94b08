"""Metrics the dashboards use that EB+ does not export itself: vLLM's and Ray Serve's, in both deployments.

The app's own ``ebplus_*`` metrics are declared in :data:`ebplus.controller.exporter.METRICS`.
Everything else a panel may query is listed here, with where it comes from, so a
panel cannot reference a name nobody exports. ``tests/observability`` checks every
entry against the installed packages (vLLM 0.29.0, Ray 2.60.0).

How the names arise (verified by reading the installed code and by a live Ray
metrics agent, see ``tests/observability/test_external_metrics.py``):

* ``ray.serve.llm`` (``LLMConfig.log_engine_metrics``, default True) gives vLLM's
  ``AsyncLLM`` the stat logger ``vllm.v1.metrics.ray_wrappers.RayPrometheusStatLogger``.
  It declares the same metrics as vLLM's Prometheus logger
  (``vllm/v1/metrics/loggers.py``, names ``vllm:<x>``) through ``ray.util.metrics``,
  after replacing every character outside ``[a-zA-Z0-9_]`` by ``_``
  (``vllm:num_requests_running`` -> ``vllm_num_requests_running``) and adding the tag
  ``ReplicaId`` (the Serve replica's unique id) to vLLM's ``model_name`` and ``engine``.
* Ray's metrics agent (port ``ray.metrics_export_port``, 8080 by default, on every
  Ray node) prefixes ``ray_``; counters get ``_total``, histograms
  ``_bucket``/``_sum``/``_count``: ``ray_vllm_num_preemptions_total``.
* Ray Serve's HTTP proxy metrics (``ray/serve/_private/request_ingress_metrics.py``,
  ``serve_num_{protocol}_requests`` ...) follow the same rule: ``ray_serve_num_http_requests_total``.

Plugin mode (plain ``vllm serve`` with ``VLLM_PLUGINS=ebplus``) has no Ray: vLLM's own
``PrometheusStatLogger`` exports ``vllm:<x>`` (counters ``vllm:<x>_total``) with
``model_name`` and ``engine`` only, on the API server's ``/metrics`` beside the
``ebplus_*`` metrics, and its HTTP metrics come from ``prometheus_fastapi_instrumentator``
(``http_requests_total``, ``http_request_duration_highr_seconds``). Every engine metric
is declared in both namings (``mode`` says which, ``twin`` names the other).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExternalMetric:
    name: str  # as Prometheus stores it, without _bucket/_sum/_count
    kind: str  # gauge | counter | histogram
    source: str  # the declaring name in the package that exports it
    labels: tuple[str, ...]
    help: str
    mode: str = "ray"  # ray (Ray Serve LLM, Ray's metrics agent) | plugin (plain vLLM with the ebplus plugin)
    twin: str = ""  # the same engine metric's name in the other mode


VLLM_LABELS = ("model_name", "engine", "ReplicaId")  # Ray mode: vLLM's labels and the tag of its Ray wrappers
VLLM_PLUGIN_LABELS = ("model_name", "engine")  # plugin mode: vLLM's own Prometheus logger


def _vllm(base: str, kind: str, help: str, extra: tuple[str, ...] = ()) -> tuple[ExternalMetric, ExternalMetric]:
    """The Ray-mode (``ray_vllm_<x>``) and plugin-mode (``vllm:<x>``) names of one vLLM metric."""
    total = "_total" if kind == "counter" else ""
    ray, plugin = f"ray_vllm_{base}{total}", f"vllm:{base}{total}"
    return (
        ExternalMetric(ray, kind, "vllm:" + base, (*VLLM_LABELS, *extra), help, "ray", plugin),
        ExternalMetric(plugin, kind, "vllm:" + base, (*VLLM_PLUGIN_LABELS, *extra), help, "plugin", ray),
    )


EXTERNAL_METRICS: tuple[ExternalMetric, ...] = (
    *_vllm("num_requests_running", "gauge", "Requests in model execution batches."),
    *_vllm("num_requests_waiting", "gauge", "Requests waiting to be processed."),
    *_vllm("kv_cache_usage_perc", "gauge", "KV-cache usage, 1 = 100%."),
    *_vllm("num_preemptions", "counter", "Preemptions by the engine."),
    *_vllm("prompt_tokens", "counter", "Prefill tokens processed."),
    *_vllm("generation_tokens", "counter", "Generation tokens processed."),
    *_vllm("request_success", "counter", "Finished requests, by finish reason.", ("finished_reason",)),
    *_vllm("time_to_first_token_seconds", "histogram", "Time to first token."),
    *_vllm("inter_token_latency_seconds", "histogram", "Inter-token latency (ITL)."),
    *_vllm("request_time_per_output_token_seconds", "histogram", "Time per output token of a request (TPOT)."),
    *_vllm("e2e_request_latency_seconds", "histogram", "End-to-end request latency."),
    ExternalMetric(
        "ray_serve_num_http_requests_total",
        "counter",
        "serve_num_{protocol}_requests",
        ("route", "method", "application", "status_code"),
        "HTTP requests processed by the Serve proxies.",
    ),
    ExternalMetric(
        "ray_serve_http_request_latency_ms",
        "histogram",
        "serve_{protocol}_request_latency_ms",
        ("method", "route", "application", "status_code"),
        "End-to-end HTTP latency at the Serve proxy (ms).",
    ),
    ExternalMetric(
        "http_requests_total",
        "counter",
        "prometheus_fastapi_instrumentator:http_requests_total",
        ("handler", "method", "status"),
        "HTTP requests processed by vLLM's API server, status grouped as 2xx, 4xx...",
        "plugin",
    ),
    ExternalMetric(
        "http_request_duration_highr_seconds",
        "histogram",
        "prometheus_fastapi_instrumentator:http_request_duration_highr_seconds",
        (),
        "Latency of HTTP requests at vLLM's API server (s).",
        "plugin",
    ),
)

EXTERNAL = {m.name: m for m in EXTERNAL_METRICS}
