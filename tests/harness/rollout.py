"""Scaling and upgrades under load: an autoscaling cycle, rolling config updates, a controller upgrade.

Each scenario runs an open-loop load across the change and returns plain figures
(JSON-able) for ``tests/e2e/test_scaleout.py`` and ``benchmarks/scaleout_bench.py``:

- :func:`scenario_autoscale`: a load ramp makes Serve add replicas, and its end
  remove them; the controller seeds each new replica with the fleet's plan at its
  first push and forgets each removed one; no request fails during the drain.
- :func:`scenario_rolling_update`: ``ebplus deploy`` with a changed config, as a user
  runs it: Serve replaces every replica, one at a time, each old one draining.
- :func:`scenario_controller_upgrade`: the previous release's controller is gone and
  its persisted state (schema 1, :data:`PREVIOUS_STATE`) is what a new controller
  finds: it must resume from it, migrated, without a cold start.
- :func:`scenario_newer_state`: a rollback: the state is from a newer schema; the
  controller must log it, keep it aside and serve cold, never crash-loop.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from ebplus.deploy.config import load_config
from harness.cluster import Cluster
from harness.deployment import ROOT, Deployment
from harness.fleet import healthy_fleet
from harness.load import BackgroundLoad, LoadResult
from harness.nodes import LocalCluster, NodeSpec
from harness.waiting import HarnessError, wait_until

#: What the previous release's controller persisted (``tests/data/make_controller_state.py`` wrote it with that code).
PREVIOUS_STATE = ROOT / "tests" / "data" / "controller-state-b0f895d.json"


def _failures(result: LoadResult) -> list[dict]:
    return [{"kind": o.kind, "statuses": o.statuses, "error": o.error[:300]} for o in result.failed]


def _plan(view: dict) -> list:
    """(k, N, policy) of a threshold view."""
    return [view["k"], view["n"], view["active"]]


def thresholds_at(history: list[dict], version: int) -> dict[str, list]:
    """Each replica's (k, N, policy) as of ``version``: its newest decision at or below it."""
    out: dict[str, tuple[int, list]] = {}
    for d in history:
        if d["version"] <= version and d["version"] >= out.get(d["replica_id"], (-1, []))[0]:
            out[d["replica_id"]] = (d["version"], _plan(d["update"]))
    return {rid: plan for rid, (_, plan) in out.items()}


def ensure_nodes(local: LocalCluster, resource: str, count: int) -> list[str]:
    """Worker nodes with ``resource`` up to ``count``, adding copies of one that has it (KubeRay's autoscaler's part)."""
    have = [n for n, live in local.nodes.items() if resource in live.spec.resources]
    if not have:
        raise HarnessError(f"no node has {resource!r} to copy")
    template = local.nodes[have[0]].spec
    added = []
    for i in range(count - len(have)):
        name = f"{template.name}-{len(local.nodes) + i}"
        local.add(NodeSpec(name, template.num_cpus, dict(template.resources)))
        added.append(name)
    return added


def scenario_autoscale(
    dep: Deployment,
    cluster: Cluster,
    *,
    low_rate: float = 0.5,
    max_tokens: int = 48,
    timeout_s: float = 600.0,
) -> dict:
    """A load ramp until Serve runs ``max_replicas``, then back until it runs ``min_replicas`` again.

    The low load is open loop (``low_rate`` requests/s) for the whole cycle; the ramp adds a
    closed loop of just enough concurrent requests to ask for ``max_replicas``
    (``target_ongoing_requests`` x ``max_replicas``), stopped once they run. A closed loop,
    not a higher arrival rate: an open-loop ramp above what the fleet serves (8 requests/s
    on this 2-core machine's CPU engines) queues requests faster than they end, so the
    queue outlives the ramp and holds the fleet at ``max_replicas`` long after it, and the
    saturated engines starve the new replica's start.
    The cluster must have room for ``max_replicas``.
    """
    auto = dep.config.replicas.autoscaling
    if auto is None:
        raise HarnessError("the deployment has no replicas.autoscaling")
    lo, hi = auto.min_replicas, auto.max_replicas
    ramp_concurrency = math.ceil(auto.target_ongoing_requests * hi)
    snap0 = healthy_fleet(dep, cluster, lo)
    marks: dict[str, float] = {}
    with BackgroundLoad(
        dep, rate_per_s=low_rate, duration_s=3 * timeout_s, concurrency=8, max_tokens=max_tokens, max_retries=2
    ) as load:
        time.sleep(3)
        t_high = time.monotonic()
        with BackgroundLoad(
            dep, duration_s=timeout_s, concurrency=ramp_concurrency, max_tokens=max_tokens, max_retries=2, seed=1
        ) as ramp:
            wait_until(
                f"Serve to scale up to {hi} replicas", lambda: cluster.running_replicas() == hi, timeout_s, every_s=0.5
            )
            marks["scaled_up_s"] = time.monotonic() - t_high
            snap_up = healthy_fleet(dep, cluster, hi, timeout_s=120)
            marks["up_converged_s"] = time.monotonic() - t_high
            ramp.stop.set()
        new = sorted(set(snap_up["replicas"]) - set(snap0["replicas"]))
        status = cluster.replica_status(hi, want=set(new))
        history = json.loads(cluster.call("history"))
        t_low = time.monotonic()
        wait_until(
            f"Serve to scale down to {lo} replicas", lambda: cluster.running_replicas() == lo, timeout_s, every_s=0.5
        )
        marks["scaled_down_s"] = time.monotonic() - t_low
        removed = wait_until(  # Serve counts a replica out when it starts draining; its actor goes after
            "the scaled-down replica's actor to stop",
            lambda: sorted(set(snap_up["replicas"]) - set(cluster.replica_actors())),
            timeout_s=dep.config.replicas.graceful_shutdown_timeout_s + 60,
        )
        wait_until(
            "the controller to forget the removed replicas",
            lambda: not set(removed) & set(cluster.snapshot()["replicas"]),
            timeout_s=dep.config.controller.stale_replica_s + 60,
        )
        marks["forgot_removed_s"] = time.monotonic() - t_low
        snap_down = healthy_fleet(dep, cluster, lo, timeout_s=120)
        time.sleep(3)
        load.stop.set()
    result = load.join().merged(ramp.join())
    seeded = {}
    for rid in new:
        if rid not in status:
            raise HarnessError(f"new replica {rid} did not answer ebplus_status (answered: {sorted(status)})")
        first = status[rid]["first_update"]
        fleet_then = {} if first is None else thresholds_at(history, first["version"])
        old_plans = [plan for other, plan in fleet_then.items() if other in snap0["replicas"]]
        seeded[rid] = {
            "first_update": first,
            "fleet_then": old_plans,
            "on_fleet_plan": first is not None and first["version"] > 0 and _plan(first) in old_plans,
        }
    return {
        "replicas": [lo, hi, lo],
        "load_shape": {"low_rate_per_s": low_rate, "ramp_concurrency": ramp_concurrency},
        "load": result.summary(),
        "failures": _failures(result),
        "new": new,
        "removed": removed,
        "seeded": seeded,
        "replicas_after": sorted(snap_down["replicas"]),
        **{k: round(v, 1) for k, v in marks.items()},
    }


def variant(config_path: Path, dest: Path, **sections: dict) -> Path:
    """A copy of a config file with some keys of some sections changed (a config update; None removes a key)."""
    data = yaml.safe_load(config_path.read_text())
    for name, changes in sections.items():
        section = {**data.get(name, {}), **changes}
        data[name] = {key: value for key, value in section.items() if value is not None}
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def ebplus_deploy(dep: Deployment, config_path: Path, timeout_s: float = 900) -> float:
    """``ebplus deploy --config`` against the deployment's cluster, as a user runs it; returns its wall time."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ebplus.cli", "deploy", "--config", str(config_path), "--address", dep.ray_address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise HarnessError(f"ebplus deploy exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - started


def scenario_rolling_update(
    dep: Deployment,
    cluster: Cluster,
    config_path: Path,
    local: LocalCluster,
    *,
    rate_per_s: float = 2.0,
    max_tokens: int = 32,
) -> dict:
    """``ebplus deploy`` of ``config_path`` under open-loop load: every replica replaced, none of the requests failed.

    A config that switches autoscaling on first gets nodes for its ``max_replicas`` (the cluster
    autoscaler's part): with a replica out during the update the queue grows and Serve may ask
    for more, and a replica that cannot be placed and is then scaled away stays STOPPING in
    Ray Serve 2.60, holding the application in DEPLOYING (seen here, with 2 nodes for 3 replicas).
    """
    auto = load_config(config_path).replicas.autoscaling
    if auto is not None:
        ensure_nodes(local, "ebplus-replica", auto.max_replicas)
    replicas = cluster.running_replicas()
    snap0 = healthy_fleet(dep, cluster, replicas)
    ping0 = cluster.ping()
    with BackgroundLoad(
        dep, rate_per_s=rate_per_s, duration_s=1800, concurrency=32, max_tokens=max_tokens, max_retries=2
    ) as load:
        time.sleep(3)
        t0 = time.monotonic()
        deploy_s = ebplus_deploy(dep, config_path)

        def all_replaced() -> dict | None:
            snap = healthy_fleet(dep, cluster, replicas, timeout_s=30)
            return snap if not set(snap["replicas"]) & set(snap0["replicas"]) else None

        snap1 = wait_until("every replica to be replaced and converged", all_replaced, timeout_s=600, every_s=1.0)
        converged_s = time.monotonic() - t0
        time.sleep(3)
        load.stop.set()
    result = load.join()
    return {
        "config": config_path.name,
        "load": result.summary(),
        "failures": _failures(result),
        "deploy_s": round(deploy_s, 1),
        "converged_s": round(converged_s, 1),
        "replicas_before": sorted(snap0["replicas"]),
        "replicas_after": sorted(snap1["replicas"]),
        "controller_kept": cluster.ping()["pid"] == ping0["pid"],
        "version_before": snap0["version"],
        "version_after": snap1["version"],
    }


def previous_release_state(replicas: list[str], version: int) -> dict:
    """:data:`PREVIOUS_STATE`, with its replicas and version counter those of the live fleet: what the
    previous release's controller would have persisted had it been running this fleet."""
    state = json.loads(PREVIOUS_STATE.read_text())
    saved = list(state["replicas"].values())
    state["replicas"] = {rid: saved[i % len(saved)] for i, rid in enumerate(replicas)}
    state["version"] = version
    return state


def _controller_log(cluster: Cluster, needle: str) -> str | None:
    """The first line of the cluster's worker logs that holds ``needle`` (the controller logs there)."""
    for path in sorted(cluster.session_logs().glob("worker-*")):
        for line in path.read_text(errors="replace").splitlines():
            if needle in line:
                return line.strip()
    return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs on this machine (a zombie has stopped running)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _replace_controller(cluster: Cluster, dep: Deployment, state: dict) -> dict:
    """The running controller gone for good, ``state`` in its store, a new controller started as
    ``build()`` starts one on a deploy; returns the new controller's ping."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_put

    from ebplus.controller.actor import get_controller
    from ebplus.controller.lifecycle import ensure_controller
    from ebplus.controller.state_store import STATE_KEY

    if dep.config.controller.state_dir is not None:
        raise HarnessError("this scenario writes the state into Ray's KV store; the config names a state_dir")
    pid = cluster.ping()["pid"]
    ray.kill(cluster.controller(), no_restart=True)
    wait_until("the old controller to go away", lambda: get_controller() is None, timeout_s=60)
    # The GCS frees the name before the raylet has killed the process, and a periodic persist
    # still running there would overwrite the plant (seen: the new controller restored the
    # live state, not the planted one). Every node of these clusters runs on this machine.
    wait_until(f"the old controller's process {pid} to exit", lambda: not _alive(pid), timeout_s=60)
    _internal_kv_put(STATE_KEY, json.dumps(state).encode(), overwrite=True)
    ensure_controller(dep.config.controller)
    return cluster.wait_controller(timeout_s=120, pid_not=pid)


def scenario_controller_upgrade(dep: Deployment, cluster: Cluster, *, rate_per_s: float = 2.0) -> dict:
    """A new controller that finds the previous release's state, under load."""
    replicas = cluster.running_replicas()
    snap0 = healthy_fleet(dep, cluster, replicas)
    planted = previous_release_state(sorted(snap0["replicas"]), snap0["version"] + 1)
    with BackgroundLoad(
        dep, rate_per_s=rate_per_s, duration_s=600, concurrency=32, max_tokens=32, max_retries=2
    ) as load:
        time.sleep(3)
        t0 = time.monotonic()
        ping = _replace_controller(cluster, dep, planted)
        restart_s = time.monotonic() - t0
        first: dict[str, dict] = {}  # each replica as the controller first shows it: what it got when it registered

        def all_registered() -> bool:
            snap = cluster.snapshot()
            first.setdefault("estimate", {"value": snap["estimate"]})
            for rid, r in snap["replicas"].items():
                first.setdefault(rid, r)
            return len(first) - 1 >= replicas

        wait_until("the replicas to register with the new controller", all_registered, timeout_s=60, every_s=0.05)
        snap1 = healthy_fleet(dep, cluster, replicas, timeout_s=120)
        converge_s = time.monotonic() - t0
        time.sleep(3)
        load.stop.set()
    result = load.join()
    planted_plans = {rid: [r["last_plan"]["k"], r["last_plan"]["n_cap"], r["last_plan"]["active"]]
                     for rid, r in planted["replicas"].items()}  # fmt: skip
    estimate = first.pop("estimate")["value"]
    # what each replica's registration answered (a re-plan may follow it before the first poll)
    registered = {rid: r["registered"] for rid, r in first.items()}
    resumed = {rid: _plan(g) for rid, g in registered.items()
               if g["origin"] == "saved" and g["version"] == planted["version"]}  # fmt: skip
    return {
        "load": result.summary(),
        "failures": _failures(result),
        "schema_found": planted["schema_version"],
        "restored": bool(ping["restored"]),
        "migration_logged": _controller_log(cluster, "from a schema-1 state (migrated to schema 2)"),
        "restart_s": round(restart_s, 1),
        "converged_s": round(converge_s, 1),
        "version_planted": planted["version"],
        "version_after": snap1["version"],
        "estimate_kept": estimate is not None,
        "resumed_plans": resumed,
        "planted_plans": planted_plans,
        "cold_replicas": sorted(rid for rid, r in snap1["replicas"].items() if r["n_star"] is None),
        "registered": registered,
    }


def scenario_newer_state(dep: Deployment, cluster: Cluster, *, watch_s: float = 10.0) -> dict:
    """A rollback: the store holds a state of a newer schema. Logged, kept aside, served cold; no crash loop."""
    from ray.experimental.internal_kv import _internal_kv_get

    from ebplus.controller import persistence
    from ebplus.controller.state_store import STATE_KEY

    current = json.loads(_internal_kv_get(STATE_KEY))
    newer = {**current, "schema_version": persistence.SCHEMA_VERSION + 1}
    ping = _replace_controller(cluster, dep, newer)
    pids = {ping["pid"]}
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:  # a crash loop would show as new pids (or no answer)
        pids.add(cluster.ping()["pid"])
        time.sleep(0.5)
    kept = _internal_kv_get(STATE_KEY + b".rejected")
    return {
        "restored": bool(ping["restored"]),
        "pids_seen": len(pids),
        "kept_aside": kept is not None and json.loads(kept) == newer,
        "logged": _controller_log(cluster, f"newer than this controller's {persistence.SCHEMA_VERSION}"),
    }
