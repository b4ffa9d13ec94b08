"""Node loss under the default placement (issue 23): nothing pinned, a proxy on every node.

``tests/e2e/test_scaleout.py`` pins the ingress to the head and runs one proxy there.
A user who pins nothing gets Serve's placement instead, as on a KubeRay cluster whose
head takes no work: the ingress and the model replicas on the workers, wherever Ray
puts them, and a proxy on every node (``proxy_location: EveryNode``; the raylets share
127.0.0.1:18200 through SO_REUSEPORT and the kernel spreads connections over the
proxies, as a Service spreads them over the nodes). Its own small cluster
(:func:`harness.multinode.start_default_cluster`: a 0-CPU head and two 2-CPU workers)
and deployment (``tests/e2e/multinode-default.yaml``, two ingress replicas, which Serve
spreads over the workers): an ingress replica shares a worker with a model replica, and that worker is
killed under open-loop load, taking an ingress, a replica and a proxy at once, the worst
single node to lose there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import harness as rel
from harness import nodeloss
from harness.multinode import DEFAULT_PLACEMENT_CONFIG, deployed_on, start_default_cluster
from harness.nodes import LocalCluster

#: In ``make test``: about 2.2 minutes on this 2-core machine, quiet (130 s: cluster and deployment 1.0, the node
#: loss until the replacement replica serves 1.0, the stop 0.1); 174 and 168 s with another deployment beside it.
pytestmark = [pytest.mark.e2e]

ADMIN_TOKEN = "scaleout-default-admin-token-81c2"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, rel.Deployment, rel.Cluster]]:
    log_path = tmp_path_factory.mktemp("scaleout-default") / "serve.log"
    with deployed_on(start_default_cluster(ADMIN_TOKEN), DEFAULT_PLACEMENT_CONFIG, ADMIN_TOKEN, log_path) as stack:
        yield stack


@pytest.mark.timeout(900)
def test_losing_the_ingress_node_under_the_default_placement(
    stack: tuple[LocalCluster, rel.Deployment, rel.Cluster],
) -> None:
    """The worker holding an ingress, a model replica and a proxy is killed: every request in flight at the
    kill ends within 30 s of it (an answer, or a clear error: a stream ends with an error event and
    [DONE], or complete), nothing is cut silently, requests sent after it succeed, Serve runs a replacement."""
    local, dep, cluster = stack
    out = nodeloss.scenario_node_loss(dep, cluster, local, target="ingress", rate_per_s=2.0, load_s=45.0)
    print(f"\nnode loss, default placement: {json.dumps(out, default=str)[:6000]}")
    assert out["lost"]["replicas"] and not out["lost"]["controller"], out["lost"]
    assert out["in_flight_at_kill"] > 0, "the kill must land under load"
    assert out["silently_truncated"] == 0, out["failed_in_flight_on_lost_node"]
    assert out["failed_other"] == [], out["failed_other"]
    assert out["in_flight_ended_within_s"] <= nodeloss.END_WITHIN_S, out["slowest"]
    assert out["longest_request_s"] <= nodeloss.END_WITHIN_S + 10, out["slowest"]
    assert not set(out["lost"]["replicas"]) & set(out["replicas_after"])
