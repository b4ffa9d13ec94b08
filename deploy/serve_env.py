"""Ray Serve's own settings for the Ray cluster ``ebplus serve`` starts: its throughput mode and HAProxy.

Ray Serve reads these from the environment of its processes (the Serve controller,
the proxies, every replica), so they are set in the driver before it starts the local
Ray cluster, which every Ray process inherits. A variable already set in the
environment wins, so each one can be turned back (``RAY_SERVE_ENABLE_HA_PROXY=0
ebplus serve ...``). A cluster ``ebplus serve`` joins (``ray.address``, KubeRay) keeps
the environment its pods were started with.

Why (measured with ``ebplus bench overhead``, docs/benchmarks/overhead.md): on the
2-core CPU deployment every CPU second the serving plane spends is taken from the
engine. With Ray Serve's defaults each streamed chunk crosses the Python HTTP proxy
and two replica event loops in threads of their own; these settings halve the serving
plane's CPU per output token (2.0 -> 0.93 CPU-s per 1,000 output tokens, with Ray Serve LLM's
own app as the baseline), and no behaviour of the API changes.

HAProxy adds two listening ports on every interface, its stats page and its metrics, which
Ray Serve fixes at 8404 and 9101: a second ``ebplus serve`` on the host, or an HAProxy a killed
deployment left behind, made the next start fail (``cannot bind socket ... 0.0.0.0:9101``, the
e2e tier's second deployment). Unless ``RAY_SERVE_HAPROXY_STATS_PORT`` /
``RAY_SERVE_HAPROXY_METRICS_PORT`` are set, each start takes free ports for them.
"""

from __future__ import annotations

import os
import socket
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


#: HAProxy's own listeners, fixed by Ray Serve unless set (see the module docstring).
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")


def free_port() -> int:
    """A TCP port free on every interface now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`SERVE_ENV` in ``environ`` (default ``os.environ``) where not set; returns what is in effect.

    With HAProxy on, its stats and metrics ports are set to free ones where not set.
    """
    environ = os.environ if environ is None else environ
    for key, value in SERVE_ENV.items():
        environ.setdefault(key, value)
    applied = {key: environ[key] for key in SERVE_ENV}
    if environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1":
        for key in HAPROXY_PORTS:
            environ.setdefault(key, str(free_port()))
            applied[key] = environ[key]
    return applied
