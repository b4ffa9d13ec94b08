"""The fleet as the controller sees it: wait for a healthy, converged fleet; counters to diff across a scenario."""

from __future__ import annotations

import time

from harness.cluster import Cluster
from harness.deployment import Deployment
from harness.waiting import wait_until


def healthy_fleet(
    dep: Deployment, cluster: Cluster, replicas: int, fresh_s: float = 3.0, timeout_s: float = 300
) -> dict:
    """Wait until Serve runs ``replicas`` model replicas, the controller knows exactly those and
    hears from each, and every replica applies the controller's version. Returns the controller's snapshot."""

    def ok() -> dict | None:
        if cluster.running_replicas() != replicas:
            return None
        snap = cluster.snapshot()
        reps = snap["replicas"]
        if len(reps) != replicas or not set(reps) <= set(cluster.replica_actors()):
            return None
        now = time.time()
        if any(now - r["last_seen"] > fresh_s for r in reps.values()):
            return None
        if not all(r["applied_version"] == r["version"] == snap["version"] for r in reps.values()):
            return None
        return snap

    return wait_until(f"{replicas} healthy, registered and converged replicas", ok, timeout_s=timeout_s, every_s=0.5)


def fleet_totals(snapshot: dict) -> dict:
    """Counters to diff across a scenario: telemetry accepted/rejected, drops and preemptions of live replicas."""
    reps = snapshot["replicas"].values()
    return {
        "received_completions": snapshot["received"].get("completions", 0),
        "rejected": dict(snapshot["rejected"]),
        "dropped_completions": sum(r["dropped"]["completions"] for r in reps),
        "dropped_steps": sum(r["dropped"]["steps"] for r in reps),
        "preemptions": sum(int(r["engine_stats"].get("preemptions", 0)) for r in reps),
    }


def settle(cluster: Cluster, replicas: int, dep: Deployment) -> dict:
    """Let in-flight telemetry land (a few pushes), then the controller's snapshot."""
    time.sleep(3 * dep.config.replicas.telemetry_interval_s + 0.5)
    return healthy_fleet(dep, cluster, replicas)


def telemetry_balance(before: dict, after: dict, served: int) -> dict:
    """Completions the clients got vs what the controller counted.

    ``lost``: served but neither received nor counted as dropped. ``double_counted``:
    received more often than served. A record dropped from a full outbox may
    still arrive (it was in a push that timed out and was delivered late), so
    ``received + dropped`` can exceed ``served`` without anything being counted twice.
    """
    received = after["received_completions"] - before["received_completions"]
    dropped = after["dropped_completions"] - before["dropped_completions"]
    dup = after["rejected"].get("duplicate", 0) - before["rejected"].get("duplicate", 0)
    return {
        "served": served,
        "received": received,
        "dropped_counted": dropped,
        "duplicates_skipped": dup,
        "lost": max(0, served - received - dropped),
        "double_counted": max(0, received - served),
    }
