"""Fault scenarios: the controller killed or hung, a model replica killed, each under client load.

Each returns plain figures (JSON-able): ``tests/e2e/test_reliability.py`` asserts on
them, ``benchmarks/reliability_bench.py`` tabulates them. The faults themselves are
:class:`.cluster.Cluster` methods.
"""

from __future__ import annotations

import time

from harness.cluster import Cluster
from harness.deployment import Deployment
from harness.fleet import fleet_totals, healthy_fleet, settle, telemetry_balance
from harness.load import BackgroundLoad, percentile
from harness.waiting import HarnessError, wait_until


def _versions(snap: dict | None) -> str:
    """Fleet and per-replica versions of a snapshot, for error messages."""
    if snap is None:
        return "no snapshot"
    reps = {
        rid: (r["version"], r["applied_version"], r["active"], r["concurrency"]) for rid, r in snap["replicas"].items()
    }
    return (
        f"version {snap['version']}, updates {snap['updates']}, replicas (version, applied, active, concurrency) {reps}"
    )


def _plan_of(replica: dict) -> list:
    return [replica["k"], replica["n"], replica["active"], replica["theta"], replica["n_star"]]


def scenario_controller_kills(
    dep: Deployment, cluster: Cluster, *, kills: int = 3, gap_s: float = 6.0, concurrency: int = 4, max_tokens: int = 12
) -> dict:
    """``ray.kill`` the controller ``kills`` times during one load run (Ray restarts it).

    Per kill: restart time, whether it resumed from persisted state, each replica's
    (k, N, policy) before vs after, and how long until every replica applied the
    restarted controller's version.
    """
    replicas = dep.config.replicas.num_replicas
    snap0 = healthy_fleet(dep, cluster, replicas)
    totals0 = fleet_totals(snap0)
    events = []
    with BackgroundLoad(dep, duration_s=kills * gap_s + 3, concurrency=concurrency, max_tokens=max_tokens) as load:
        for _ in range(kills):
            time.sleep(gap_s / 2)
            before = cluster.snapshot()
            ping0 = cluster.kill_controller()
            t_kill = time.monotonic()
            ping1 = cluster.wait_controller(timeout_s=120, pid_not=ping0["pid"])
            t_up = time.monotonic()

            seen: dict = {}

            def converged(version_floor: int = before["version"], seen: dict = seen) -> dict | None:
                snap = seen["snap"] = cluster.snapshot()
                reps = snap["replicas"]
                if len(reps) != replicas or snap["version"] < version_floor:
                    return None
                ok = all(r["applied_version"] == r["version"] == snap["version"] for r in reps.values())
                return snap if ok else None

            try:
                after = wait_until(
                    "replicas to converge on the restarted controller", converged, timeout_s=60, every_s=0.05
                )
            except HarnessError as exc:
                raise HarnessError(
                    f"{exc}; before the kill: {_versions(before)}; last seen: {_versions(seen.get('snap'))}"
                ) from exc
            t_conv = time.monotonic()
            same_version = after["version"] == before["version"]
            events.append(
                {
                    "restart_s": round(t_up - t_kill, 2),
                    "converge_s": round(t_conv - t_up, 2),
                    "restored": bool(ping1["restored"]),
                    "version_before": before["version"],
                    "version_after": after["version"],
                    "updates_before": before["updates"],
                    "updates_after": after["updates"],
                    "estimate_kept": after["estimate"] is not None or before["estimate"] is None,
                    # (k, N, policy, smoothed theta, N*): theta is theta_cold and N* null after a cold start
                    "thresholds_before": {rid: _plan_of(r) for rid, r in before["replicas"].items()},
                    "thresholds_after": {rid: _plan_of(r) for rid, r in after["replicas"].items()},
                    # a periodic re-plan between kill and convergence may change k legitimately
                    "same_version": same_version,
                }
            )
            time.sleep(gap_s / 2)
    result = load.join()
    totals1 = fleet_totals(settle(cluster, replicas, dep))
    return {
        "kills": kills,
        "load": result.summary(),
        "failures": [o.error for o in result.failed],
        "events": events,
        "telemetry": telemetry_balance(totals0, totals1, result.ok),
    }


def scenario_hung_controller(
    dep: Deployment,
    cluster: Cluster,
    *,
    hang_s: float = 8.0,
    base_s: float = 6.0,
    concurrency: int = 4,
    max_tokens: int = 12,
) -> dict:
    """SIGSTOP the controller for ``hang_s`` under load: latency, the replicas' bounded outboxes, drops."""
    replicas = dep.config.replicas.num_replicas
    snap0 = healthy_fleet(dep, cluster, replicas)
    totals0 = fleet_totals(snap0)
    applied0 = {rid: [r["k"], r["n"], r["version"]] for rid, r in snap0["replicas"].items()}
    with BackgroundLoad(
        dep, duration_s=base_s + hang_s + base_s, concurrency=concurrency, max_tokens=max_tokens
    ) as load:
        time.sleep(base_s)
        t_stop = time.monotonic()
        with cluster.controller_stopped():
            time.sleep(max(0.0, hang_s - 4.0))
            during = cluster.replica_status(replicas, timeout_s=4.0)  # while the controller is still stopped
            time.sleep(max(0.0, t_stop + hang_s - time.monotonic()))
        t_cont = time.monotonic()
    result = load.join()
    snap1 = settle(cluster, replicas, dep)
    totals1 = fleet_totals(snap1)
    base = result.latencies(load.t0, t_stop)
    hung = result.latencies(t_stop, t_cont)
    return {
        "hang_s": round(t_cont - t_stop, 1),
        "load": result.summary(),
        "failures": [o.error for o in result.failed],
        "latency_p50_base_s": percentile(base, 50),
        "latency_p95_base_s": percentile(base, 95),
        "latency_p50_hung_s": percentile(hung, 50),
        "latency_p95_hung_s": percentile(hung, 95),
        "requests_during_hang": len(hung),
        "outbox_capacity": dep.config.replicas.telemetry_buffer,
        "during": {
            rid: {
                "applied": [s["applied"]["k"], s["applied"]["n"], s["applied"]["version"]],
                "outbox": s["outbox"],
                "push_failures": s["push_failures"],
            }
            for rid, s in during.items()
        },
        "applied_before": applied0,
        "dropped_completions": totals1["dropped_completions"] - totals0["dropped_completions"],
        "dropped_steps": totals1["dropped_steps"] - totals0["dropped_steps"],
        "telemetry": telemetry_balance(totals0, totals1, result.ok),
        "replicas_after": sorted(snap1["replicas"]),
        "replicas_before": sorted(snap0["replicas"]),
    }


def scenario_replica_kill(
    dep: Deployment,
    cluster: Cluster,
    *,
    concurrency: int = 10,
    max_tokens: int = 160,
    load_s: float = 16.0,
    kill_after_s: float = 5.0,
) -> dict:
    """SIGKILL the busiest model replica's process under load (streamed and not), the OpenAI client retrying as it does by default.

    Reports what the clients saw, whether any connection hung, how long the
    controller took to forget the dead replica, and how long Serve took to start a
    replacement that registered with the controller.
    """
    replicas = dep.config.replicas.num_replicas
    snap0 = healthy_fleet(dep, cluster, replicas)
    with BackgroundLoad(
        dep, duration_s=load_s, concurrency=concurrency, max_tokens=max_tokens, ignore_eos=True, max_retries=2
    ) as load:
        time.sleep(kill_after_s)
        status = cluster.replica_status(replicas, timeout_s=5.0)
        victim = max(sorted(status), key=lambda rid: status[rid]["running"])  # the one with requests in flight
        running_on_victim = status[victim]["running"]
        t_kill = time.monotonic()
        pid = cluster.kill_replica(victim)
        wait_until(
            "the controller to forget the dead replica",
            lambda: victim not in cluster.snapshot()["replicas"],
            timeout_s=dep.config.controller.stale_replica_s + 60,
            every_s=0.2,
        )
        t_forgot = time.monotonic()
    result = load.join(timeout_s=600)
    snap1 = healthy_fleet(dep, cluster, replicas, timeout_s=600)
    t_replaced = time.monotonic()
    return {
        "victim": victim,
        "victim_pid": pid,
        "running_on_victim_at_kill": running_on_victim,
        "in_flight_at_kill": len(result.in_flight_at(t_kill)),
        "load": result.summary(),
        "failed": [{"kind": o.kind, "error": o.error} for o in result.failed],
        "failed_streams": sum(o.kind.endswith("stream") for o in result.failed),
        "failed_non_streamed": sum(not o.kind.endswith("stream") for o in result.failed),
        "silently_truncated": sum(o.error.startswith("truncated") for o in result.failed),
        "longest_request_s": round(max(o.ended - o.started for o in result.outcomes), 1),
        "forgot_dead_s": round(t_forgot - t_kill, 1),
        "replaced_and_registered_s": round(t_replaced - t_kill, 1),
        "replicas_before": sorted(snap0["replicas"]),
        "replicas_after": sorted(snap1["replicas"]),
    }
