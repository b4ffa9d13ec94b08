"""Node loss: a worker node of a multi-node cluster killed under open-loop load.

The fault is :meth:`.nodes.LocalCluster.kill` (SIGKILL of the node's raylet and
everything under it); KubeRay's part, a new pod for the lost one, is
:meth:`.nodes.LocalCluster.add` a few seconds later. The scenario reports what the
clients saw (per request: in flight at the kill or not, how it ended, when) and
how the deployment recovered: Ray declaring the node dead, the controller back
from its persisted state (when it lived there), Serve running a replacement
replica, and the fleet converged on one version.
"""

from __future__ import annotations

import time

from harness.cluster import Cluster
from harness.deployment import Deployment
from harness.fleet import healthy_fleet
from harness.load import BackgroundLoad, LoadResult, Outcome
from harness.nodes import LocalCluster, NodeSpec
from harness.waiting import HarnessError, wait_until

#: Requests in flight on a lost node must end (answer or clear error) within this long of the kill.
END_WITHIN_S = 30.0

#: Errors that say a request's replica, proxy or connection was lost (each one retryable and explicit).
LOST_NODE_ERRORS = ("the model replica serving this request failed", "APIConnectionError", "RemoteProtocolError")


def pick_victim(cluster: Cluster, local: LocalCluster, target: str) -> str:
    """The worker node to kill: the controller's (``"controller"``), one that hosts the HTTP ingress and a
    model replica (``"ingress"``), or one that hosts a model replica but not the controller (``"replica"``)."""
    controller = local.name_of(cluster.controller_node())
    replica_nodes = sorted({local.name_of(node) for node in cluster.replica_nodes().values()} - {None})
    if target == "ingress":
        both = sorted({local.name_of(node) for node in cluster.ingress_nodes()} & set(replica_nodes) - {local.head_spec.name})
        if not both:
            raise HarnessError(f"no worker node hosts the ingress and a replica (replicas on {replica_nodes})")
        return both[0]
    if target == "controller":
        if controller is None or controller == local.head_spec.name:
            raise HarnessError(f"the controller runs on {controller!r}, not on a worker node this harness can kill")
        return controller
    others = [n for n in replica_nodes if n not in (controller, local.head_spec.name)]
    if not others:
        raise HarnessError(f"no worker node hosts a replica without the controller (replicas on {replica_nodes})")
    return others[0]


def _node_dead(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes())


def _request(o: Outcome, t_kill: float) -> dict:
    return {
        "kind": o.kind,
        "started_s": round(o.started - t_kill, 2),  # relative to the kill
        "took_s": round(o.ended - o.started, 2),
        "statuses": o.statuses,
        "error": o.error[:300],
    }


def classify(result: LoadResult, t_kill: float) -> dict:
    """Split what the clients saw around the kill: requests in flight at it, failures, and how late each ended."""
    at_kill = result.in_flight_at(t_kill)
    failed = result.failed
    lost = [o for o in failed if o.started <= t_kill and any(e in o.error for e in LOST_NODE_ERRORS)]
    other = [o for o in failed if o not in lost]
    return {
        "in_flight_at_kill": len(at_kill),
        "in_flight_ended_within_s": round(max((o.ended - t_kill for o in at_kill), default=0.0), 2),
        "failed_in_flight_on_lost_node": [_request(o, t_kill) for o in lost],
        "failed_other": [_request(o, t_kill) for o in other],
        "silently_truncated": sum(o.error.startswith("truncated") for o in failed),
        "longest_request_s": result.longest_s(),
        "slowest": [_request(o, t_kill) for o in sorted(result.outcomes, key=lambda o: o.ended - o.started)[-5:]],
    }


def scenario_node_loss(
    dep: Deployment,
    cluster: Cluster,
    local: LocalCluster,
    *,
    target: str = "controller",
    rate_per_s: float = 3.0,
    load_s: float = 90.0,
    kill_after_s: float = 10.0,
    replace_after_s: float = 5.0,
    max_tokens: int = 128,
    seed: int = 0,
) -> dict:
    """Kill a worker node under open-loop Poisson load; the replacement node joins ``replace_after_s`` later.

    The OpenAI client retries as it does by default (2 retries, honouring
    ``Retry-After``). Times are seconds after the kill.
    """
    replicas = cluster.running_replicas()
    snap0 = healthy_fleet(dep, cluster, replicas)
    placement = {rid: local.name_of(node) for rid, node in cluster.replica_nodes().items()}
    victim = pick_victim(cluster, local, target)
    controller_there = local.name_of(cluster.controller_node()) == victim
    ping0 = cluster.ping()
    spec = local.nodes[victim].spec
    times: dict[str, float | None] = {"node_declared_dead_s": None, "controller_back_s": None}
    restored = None
    with BackgroundLoad(
        dep,
        rate_per_s=rate_per_s,
        duration_s=load_s,
        concurrency=32,
        max_tokens=max_tokens,
        ignore_eos=True,  # requests long enough to be in flight at the kill
        max_retries=2,
        seed=seed,
    ) as load:
        time.sleep(kill_after_s)
        wait_until(
            "requests in flight to kill the node under",
            lambda: len(load.live.in_flight_at(time.monotonic())) >= 2,
            timeout_s=30,
            every_s=0.05,
        )
        killed = local.kill(victim)
        t_kill = killed.at
        time.sleep(replace_after_s)
        replacement = local.add(NodeSpec(f"{victim}+", spec.num_cpus, dict(spec.resources)))
        wait_until("Ray to declare the lost node dead", lambda: _node_dead(killed.node_id), timeout_s=120, every_s=0.2)
        times["node_declared_dead_s"] = time.monotonic() - t_kill
        if controller_there:
            ping = cluster.wait_controller(timeout_s=180, pid_not=ping0["pid"])
            times["controller_back_s"] = time.monotonic() - t_kill
            restored = bool(ping["restored"])
        lost = {rid for rid, node in placement.items() if node == victim}

        def replaced() -> bool:
            now = set(cluster.replica_actors())
            return cluster.running_replicas() == replicas and not (lost & now) and len(now) == replicas

        wait_until("Serve to run a replacement replica", replaced, timeout_s=600, every_s=0.5)
        t_serving = time.monotonic()
        snap1 = healthy_fleet(dep, cluster, replicas, timeout_s=300)
        t_converged = time.monotonic()
    result = load.join(timeout_s=600)
    return {
        "victim": victim,
        "replacement": replacement.spec.name,
        "lost": {"replicas": sorted(lost), "controller": controller_there, "pids": len(killed.pids)},
        "placement_before": placement,
        "placement_after": {rid: local.name_of(node) for rid, node in cluster.replica_nodes().items()},
        "load": result.summary(),
        **classify(result, t_kill),
        **{k: None if v is None else round(v, 1) for k, v in times.items()},
        "controller_restored": restored,
        "replacement_serving_s": round(t_serving - t_kill, 1),
        "thresholds_applied_s": round(t_converged - t_kill, 1),
        "converged_after_serving_s": round(t_converged - t_serving, 1),
        "version_before": snap0["version"],
        "version_after": snap1["version"],
        "replicas_before": sorted(snap0["replicas"]),
        "replicas_after": sorted(snap1["replicas"]),
    }
