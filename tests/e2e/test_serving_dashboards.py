"""The dashboards against the live deployment: no panel may show "No data".

A real Prometheus (Debian's package, on loopback) scrapes the deployment's
``/metrics`` (``ebplus_*``) and Ray's metrics agent (``ray_vllm_*``,
``ray_serve_*``) while real chat traffic flows; then every panel and variable
query of both dashboards, expanded as Grafana sends it, must return a finite
value, and every metric a panel names must appear in a live exposition.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from observability.panels import expand, panel_queries, variable_queries
from observability.prom import Target, has_finite
from openai import OpenAI

from docgen.dashboards.external import EXTERNAL_METRICS
from docgen.dashboards.promql import base_name, metric_names
from ebplus.controller.exporter import SPECS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MODEL = "smollm2-135m-instruct"
RAY_METRICS = "127.0.0.1:18080"
HISTOGRAMS = {n for n, s in SPECS.items() if s.kind == "histogram"}


def traffic(base_url: str, stop: threading.Event) -> int:
    """Chat requests (half streamed) at concurrency 8 until ``stop``; returns how many ran."""
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def one(i: int) -> None:
        messages = [{"role": "user", "content": f"Name {i % 7 + 2} colours."}]
        if i % 2:
            for _ in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, stream=True):
                pass
        else:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)

    sent = 0
    with ThreadPoolExecutor(8) as pool:
        while not stop.is_set():
            list(pool.map(one, range(sent, sent + 8)))
            sent += 8
    return sent


#: Ray mode's request-latency histograms the serving dashboard's quantile panels read.
LATENCY_HISTOGRAMS = (
    "ray_vllm_request_time_per_output_token_seconds",
    "ray_vllm_inter_token_latency_seconds",
    "ray_vllm_e2e_request_latency_seconds",
)


def test_every_panel_has_data_on_the_live_deployment(deployment, prometheus) -> None:
    host = deployment.base_url.removeprefix("http://")
    prom = prometheus([Target(host, job="ebplus"), Target(RAY_METRICS, job="ray")], scrape_interval="1s")
    stop = threading.Event()
    with ThreadPoolExecutor(1) as runner:
        sent = runner.submit(traffic, deployment.base_url, stop)
        try:
            prom.wait_for('up{job="ray"} == 1', timeout=120)
            prom.wait_for("ray_vllm_num_requests_running", timeout=180)
            # the latency panels are quantiles of histogram rates: they have data once completions
            # reached two of Prometheus's scrapes of Ray's agent (its export lags the engine by seconds)
            for histogram in LATENCY_HISTOGRAMS:
                prom.wait_for(f"sum(rate({histogram}_count[1m])) > 0", timeout=180)
            # so is the controller's update latency: once a re-plan (every update_every completions of
            # this traffic) reached two scrapes of the ingress
            prom.wait_for("sum(rate(ebplus_controller_update_seconds_count[1m])) > 0", timeout=180)
            time.sleep(20)  # rates over the window the queries use
            failures = []
            for query in panel_queries():
                expr = expand(query.expr, rate_interval="1m")
                if not has_finite(prom.query(expr)):
                    failures.append(f"{query.id}: {expr}")
            for query in variable_queries():
                metric, label = label_values(query.expr)
                if not any(label in series["metric"] for series in prom.query(metric)):
                    failures.append(f"{query.id}: no {metric} series with label {label}")
        finally:
            stop.set()
        assert sent.result() >= 16
    assert not failures, "panels with no data on the live deployment:\n" + "\n".join(failures)


def label_values(expr: str) -> tuple[str, str]:
    """``label_values(metric{...}, label)`` -> ``(metric{...}, label)``."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", expr.strip())
    assert match, expr
    return expand(match.group(1)), match.group(2)


def test_every_panel_metric_is_exported_live(deployment) -> None:
    exposed = (
        httpx.get(f"{deployment.base_url}/metrics", timeout=30).text
        + httpx.get(f"http://{RAY_METRICS}/metrics", timeout=30).text
    )
    names = {line.split("{")[0].split(" ")[0] for line in exposed.splitlines() if line and not line.startswith("#")}
    # vLLM's Ray wrapper skips inc(0): its preemption counter exists only after a preemption
    names.add("ray_vllm_num_preemptions_total")
    missing = set()
    queries = [
        *panel_queries(),
        *(q.__class__(q.dashboard, q.panel, q.ref, label_values(q.expr)[0]) for q in variable_queries()),
    ]
    plugin_mode = {m.name for m in EXTERNAL_METRICS if m.mode == "plugin"}  # plain vLLM's names, not Ray's
    for query in queries:
        for name in metric_names(query.expr):
            if re.sub(r"_(bucket|sum|count)$", "", name) in plugin_mode:  # a plain-vLLM series or its histogram's
                continue
            if (
                name not in names
                and base_name(name, HISTOGRAMS) not in names
                and not any(n.startswith(name + "_") for n in names)
            ):
                missing.add(f"{query.id}: {name}")
    assert not missing, "metrics named by panels but not exported:\n" + "\n".join(sorted(missing))
