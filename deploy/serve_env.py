"""Ray Serve's own settings for the Ray cluster ``ebplus serve`` starts: its throughput mode and HAProxy.

Ray Serve reads these from the environment of its processes (the Serve controller,
the proxies, every replica), so they are set in the driver before it starts the local
Ray cluster, which every Ray process inherits. A variable already set in the
environment wins, so each one can be turned back (``RAY_SERVE_ENABLE_HA_PROXY=0
ebplus serve ...``). A cluster ``ebplus serve`` joins (``ray.address``, KubeRay) keeps
the environment its pods were started with.

Why (measured with ``ebplus bench-overhead``, docs/benchmarks/overhead.md): on the
2-core CPU deployment every CPU second the serving plane spends is taken from the
engine. With Ray Serve's defaults each streamed chunk crosses the Python HTTP proxy
and two replica event loops in threads of their own; these settings halve the serving
plane's CPU per output token (2.0 -> 0.93 CPU-s per 1,000 output tokens, with Ray Serve LLM's
own app as the baseline), and no behaviour of the API changes.

HAProxy adds two listening ports on every interface: its stats page (8404) and its metrics
(9101). A second ``ebplus serve`` on the same host needs other ones
(``RAY_SERVE_HAPROXY_STATS_PORT``, ``RAY_SERVE_HAPROXY_METRICS_PORT``) or
``RAY_SERVE_ENABLE_HA_PROXY=0``.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: Variable -> value; see the module docstring for how they are applied.
SERVE_ENV: dict[str, str] = {
    # Ray Serve's throughput mode: replicas run user code and request routing on their main
    # event loop (no thread hop per chunk), replicas call each other over gRPC, ingress replicas
    # serve HTTP themselves, access logs are buffered.
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # HAProxy (the binary ships with ray[serve]) forwards HTTP to the ingress replicas instead
    # of the Python proxy actor handling every chunk.
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # The Serve controller reconciles once a second instead of ten times; replica health checks
    # keep their own period.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    # Serve's metrics are exported from their cache once a second (default 100 ms).
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`SERVE_ENV` in ``environ`` (default ``os.environ``) where not set; returns what is in effect."""
    environ = os.environ if environ is None else environ
    for key, value in SERVE_ENV.items():
        environ.setdefault(key, value)
    return {key: environ[key] for key in SERVE_ENV}
