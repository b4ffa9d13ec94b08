"""Every ``ebplus_*`` panel query returns data from a real Prometheus scraping the real exporter.

A loopback HTTP server renders ``controller.exporter.render(FleetController.snapshot(), model)``
(what the app's ``/metrics`` serves) over a FleetController that keeps receiving synthetic
telemetry from two replicas. Debian's Prometheus 2.42 scrapes it every second; then each
panel query of the dashboards whose metrics are all ``ebplus_*`` is sent as Grafana sends
it (variables at "All", and again pinned to one model and replica) and must return at
least one finite value: the check that "No data" panels cannot ship.

Panels on vLLM / Ray Serve metrics need Ray's metrics agent:
``test_external_metrics.py::test_every_panel_returns_data_from_ray_agent`` covers them,
and the live local deployment (tests/e2e) can point the same fixture at its ports.
"""

from __future__ import annotations

import pytest
from observability.panels import expand, panel_queries
from observability.prom import Target, has_finite
from observability.synthetic import MODEL, REPLICAS, SyntheticApp

from docgen.dashboards.promql import base_name, metric_names
from ebplus.controller.exporter import SPECS

HISTOGRAMS = {n for n, s in SPECS.items() if s.kind == "histogram"}
EBPLUS_ONLY = [q for q in panel_queries() if all(base_name(n, HISTOGRAMS) in SPECS for n in metric_names(q.expr))]


@pytest.fixture(scope="module")
def app():
    with SyntheticApp() as running:
        yield running


def test_prometheus_helper_scrapes_the_exporter(prometheus, app) -> None:
    prom = prometheus([Target(app.address, job="ebplus", labels={"env": "test"})])
    prom.wait_for_scrapes(3, timeout=60)
    (up,) = prom.query('up{job="ebplus"}')
    assert up["value"][1] == "1" and up["metric"]["env"] == "test"
    (k,) = prom.query(f'ebplus_threshold_k{{ReplicaId="{REPLICAS[1]}"}}')
    assert float(k["value"][1]) == 9  # the override the synthetic app set
    with pytest.raises(Exception, match="parse error"):
        prom.query("sum(")


def test_every_ebplus_panel_query_returns_data(prometheus, app) -> None:
    assert len(EBPLUS_ONLY) >= 30
    prom = prometheus([Target(app.address, job="ebplus")])
    prom.wait_for_scrapes(6, timeout=60)
    # rate() needs the series to have moved inside the window; on a loaded machine
    # the synthetic feeder can stall for seconds, so each query gets 30 s to show data
    pinned = {"model": MODEL, "replica": REPLICAS[0]}
    failures = []
    for query in EBPLUS_ONLY:
        for variables in ({}, pinned):
            expr = expand(query.expr, rate_interval="30s", variables=variables)
            try:
                prom.wait_for(expr, timeout=30, predicate=has_finite)
            except TimeoutError as exc:
                failures.append(f"{query.id}: {exc}")
    assert not failures, "panels with no data:\n" + "\n".join(failures)
