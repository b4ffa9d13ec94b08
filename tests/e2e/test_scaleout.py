"""Scale-out on a multi-node Ray cluster: node loss, a rolling update, autoscaling, controller upgrades.

One local cluster for the module (``tests/harness/nodes.py``: a head and two 1-CPU
worker raylets, each worker holding one model replica and able to hold the controller)
and one deployment joined to it through ``ray.address`` (``tests/e2e/multinode.yaml``,
port 18200). The tests run in order on that deployment, each under open-loop load, at
the CI's sizes: one node kill, one rolling update, one autoscaling cycle, one controller
upgrade; ``python -m benchmarks.scaleout_bench`` runs more of each and writes the table
of docs/benchmarks/scaleout.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import harness as rel
from ebplus.deploy.config import load_config
from harness import nodeloss, rollout
from harness.multinode import MULTINODE_CONFIG, rollout_config, start_cluster
from harness.nodes import LocalCluster

#: In ``make test``: about 10.5 minutes on this 2-core machine, quiet (cluster and deployment 1.9, node
#: loss 1.5, rolling update 2.7, autoscaling cycle 3.9, the two controller starts 0.4).
pytestmark = [pytest.mark.e2e]

ADMIN_TOKEN = "scaleout-admin-token-3f7a"


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    with start_cluster(ADMIN_TOKEN) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dep(local: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rel.Deployment]:
    log_path = tmp_path_factory.mktemp("scaleout") / "serve.log"
    with rel.deployed(MULTINODE_CONFIG, log_path, ADMIN_TOKEN, ray_address=local.address) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def cluster(dep: rel.Deployment) -> Iterator[rel.Cluster]:
    with rel.Cluster(dep, auth_mode=LocalCluster.AUTH_MODE) as c:
        yield c


def show(name: str, figures: dict) -> None:
    print(f"\n{name}: {json.dumps(figures, default=str)[:6000]}")


@pytest.mark.timeout(900)
def test_losing_the_controllers_node_under_load(dep: rel.Deployment, cluster: rel.Cluster, local: LocalCluster) -> None:
    """The worker node holding the controller and a replica is killed: requests in flight there end with a
    clear error within 30 s, the others succeed, nothing is cut silently; the controller comes back with its
    state, Serve runs a replacement, the fleet converges."""
    out = nodeloss.scenario_node_loss(dep, cluster, local, target="controller", rate_per_s=2.0, load_s=60.0)
    show("node loss", out)
    assert out["lost"]["controller"] and out["lost"]["replicas"], out["lost"]  # both kinds of loss in one kill
    assert out["silently_truncated"] == 0, out["failed_in_flight_on_lost_node"]
    assert out["failed_other"] == [], out["failed_other"]
    assert out["in_flight_at_kill"] > 0, "the kill must land under load"
    assert out["in_flight_ended_within_s"] <= nodeloss.END_WITHIN_S, out["slowest"]
    assert out["longest_request_s"] <= nodeloss.END_WITHIN_S + 10, out["slowest"]
    assert out["controller_restored"] is True
    assert out["converged_after_serving_s"] <= 60, out
    assert not set(out["lost"]["replicas"]) & set(out["replicas_after"])


@pytest.mark.timeout(1200)
def test_rolling_update_under_load(dep: rel.Deployment, cluster: rel.Cluster, local: LocalCluster, tmp_path: Path) -> None:
    """`ebplus deploy` with a new engine argument (and autoscaling switched on): every replica replaced
    one at a time, each old one draining; no request fails; the controller stays."""
    config = rollout_config(tmp_path, 1)
    # 1 request/s: what one replica serves here while the other is replaced, so the queue does not ask
    # the autoscaling this update switches on for a third engine start beside the update's two
    out = rollout.scenario_rolling_update(dep, cluster, config, local, rate_per_s=1.0)
    show("rolling update", out)
    assert out["load"]["failed"] == 0 and out["load"]["sent"] > 20, out["failures"]
    assert not set(out["replicas_after"]) & set(out["replicas_before"])
    assert out["controller_kept"], "an engine change must not restart the controller"
    dep.config = load_config(config)  # what runs now (autoscaling) is what the next tests read


@pytest.mark.timeout(1200)
def test_autoscaling_cycle(dep: rel.Deployment, cluster: rel.Cluster, local: LocalCluster) -> None:
    """A load ramp adds a replica, its end removes it: the new one starts on the fleet's plan at its first
    push, the removed one is forgotten, no request fails during the drain."""
    auto = dep.config.replicas.autoscaling
    assert auto is not None, "test_rolling_update_under_load switches autoscaling on"
    assert len(local.nodes) - 1 >= auto.max_replicas, "the rolling update made room for max_replicas"
    out = rollout.scenario_autoscale(dep, cluster)
    show("autoscaling", out)
    assert out["load"]["failed"] == 0, out["failures"]
    assert out["new"] and out["removed"], out
    for rid, seeded in out["seeded"].items():
        assert seeded["on_fleet_plan"], (rid, seeded)


@pytest.mark.timeout(600)
def test_controller_upgrade_resumes_the_previous_releases_state(dep: rel.Deployment, cluster: rel.Cluster) -> None:
    """A new controller finds what the previous release persisted (schema 1, the old layout): it migrates
    it and resumes every replica's plan and the workload estimate; no request fails."""
    out = rollout.scenario_controller_upgrade(dep, cluster)
    show("controller upgrade", out)
    assert out["load"]["failed"] == 0, out["failures"]
    assert out["restored"] and out["migration_logged"], out
    assert out["estimate_kept"] and out["version_after"] >= out["version_planted"]
    assert out["resumed_plans"], "no replica resumed at the planted version"
    for rid, plan in out["resumed_plans"].items():
        assert plan == out["planted_plans"][rid], (rid, plan)
    assert out["cold_replicas"] == []


@pytest.mark.timeout(300)
def test_a_newer_state_is_refused_without_a_crash_loop(dep: rel.Deployment, cluster: rel.Cluster) -> None:
    out = rollout.scenario_newer_state(dep, cluster)
    show("newer state", out)
    assert not out["restored"] and out["pids_seen"] == 1, out
    assert out["kept_aside"] and out["logged"], out
