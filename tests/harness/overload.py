"""Overload scenarios: more requests than the deployment has room for, once as a burst, once as a soak.

Each returns plain figures (JSON-able), like those of :mod:`.faults`.
"""

from __future__ import annotations

import asyncio

from harness.cluster import Cluster
from harness.deployment import Deployment, tree_rss_bytes
from harness.fleet import fleet_totals, settle, telemetry_balance
from harness.load import run_load


def scenario_back_pressure(
    dep: Deployment, *, requests: int = 120, concurrency: int = 48, max_tokens: int = 32
) -> dict:
    """More concurrent requests than slots + queue, no client retries: what comes back."""
    result = asyncio.run(
        run_load(dep, requests=requests, concurrency=concurrency, max_tokens=max_tokens, ignore_eos=True, max_retries=0)
    )
    other = [o.error for o in result.failed if " 503" not in o.error and " 429" not in o.error]
    return {
        "load": result.summary(),
        "streams_ok": sum(o.ok for o in result.outcomes if o.kind.endswith("stream")),
        "errors_other_than_back_pressure": other,
    }


def scenario_soak(
    dep: Deployment,
    cluster: Cluster,
    *,
    requests: int = 2000,
    concurrency: int = 64,
    max_tokens: int = 8,
    warmup: int = 100,
) -> dict:
    """A bounded soak: ``requests`` requests at ``concurrency``, the client retrying back-pressure answers.

    RSS of the whole deployment (Ray, Serve, engines) after a warm-up and at the end.
    """
    replicas = dep.config.replicas.num_replicas
    asyncio.run(run_load(dep, requests=warmup, concurrency=min(concurrency, 16), max_tokens=max_tokens, max_retries=8))
    totals0 = fleet_totals(settle(cluster, replicas, dep))  # the warm-up's telemetry has landed
    rss0 = tree_rss_bytes(dep.pid)
    result = asyncio.run(
        run_load(dep, requests=requests, concurrency=concurrency, max_tokens=max_tokens, max_retries=8, timeout_s=300)
    )
    rss1 = tree_rss_bytes(dep.pid)
    totals1 = fleet_totals(settle(cluster, replicas, dep))
    return {
        "load": result.summary(),
        "failures": [o.error for o in result.failed][:20],
        "rss_start_mib": round(rss0 / 2**20),
        "rss_end_mib": round(rss1 / 2**20),
        "preemptions": totals1["preemptions"] - totals0["preemptions"],
        "telemetry": telemetry_balance(totals0, totals1, result.ok),
    }
