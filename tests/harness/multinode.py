"""The multi-node deployment of the scale-out tests and benchmark: the cluster's layout and the config updates.

``tests/e2e/multinode.yaml`` describes the deployment; this module the cluster it
joins, in KubeRay's terms: a head (the ingress, Serve's controller, a proxy; no model
replica) and 1-CPU workers, each a "pod" that holds one model replica
(``ebplus-replica``) and may hold the EB+ controller (``ebplus-controller``; the test
config puts it there, not on the head as recommended, so a worker's loss can take it).
``tests/e2e/multinode-default.yaml`` and :func:`start_default_cluster` are the default placement
beside it: nothing pinned, a proxy on every node (issue 23).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ebplus.deploy.serve_env import NODE_HEALTH_ENV
from harness.cluster import Cluster
from harness.deployment import ROOT, Deployment, deployed
from harness.nodes import LocalCluster, NodeSpec
from harness.rollout import variant

MULTINODE_CONFIG = ROOT / "tests" / "e2e" / "multinode.yaml"
#: The same deployment with nothing pinned (issue 23): the ingress and the replicas where Serve puts them.
DEFAULT_PLACEMENT_CONFIG = ROOT / "tests" / "e2e" / "multinode-default.yaml"

HEAD = NodeSpec("head", num_cpus=1, resources={"ebplus-ingress": 1})
WORKER = NodeSpec("worker", num_cpus=1, resources={"ebplus-replica": 1, "ebplus-controller": 1})

#: The rolling updates, in order: a new engine argument (the token budget per step) each time; the
#: first also switches autoscaling on (2 to 3 replicas), so the autoscaling cycle runs after it.
ROLLOUTS = (
    {
        "engine": {"max_num_batched_tokens": 320},
        "replicas": {
            "num_replicas": None,
            "autoscaling": {
                "min_replicas": 2,
                "max_replicas": 3,
                "target_ongoing_requests": 2,
                # a queue must last 15 s to add a replica and a dip 20 s to remove one: a replica
                # out for the rolling update, or a lull, no longer starts (and kills) an engine
                "upscale_delay_s": 15,
                "downscale_delay_s": 20,
                "metrics_interval_s": 1,
                "look_back_period_s": 5,
            },
        },
    },
    {"engine": {"max_num_batched_tokens": 256}},
)


@contextlib.contextmanager
def start_cluster(admin_token: str, workers: int = 2) -> Iterator[LocalCluster]:
    """The head and ``workers`` worker nodes; every node's processes get the admin token (a Secret on KubeRay)
    and the node health checks the chart sets (:data:`ebplus.deploy.serve_env.NODE_HEALTH_ENV`)."""
    specs = [NodeSpec(f"w{i + 1}", WORKER.num_cpus, dict(WORKER.resources)) for i in range(workers)]
    with LocalCluster(HEAD, specs, env={"EBPLUS_ADMIN_TOKEN": admin_token, **NODE_HEALTH_ENV}) as cluster:
        yield cluster


#: The default placement's cluster, as on KubeRay: a head that takes no work (``num-cpus: 0``: Serve's
#: controller, a proxy, the EB+ controller, none of which reserves a CPU) and workers with no custom
#: resources. Two CPUs each: a model replica's engine bundle takes one, so the ingress (half a CPU)
#: shares a worker with a replica, the worst node to lose.
DEFAULT_HEAD = NodeSpec("head", num_cpus=0)
DEFAULT_WORKER = NodeSpec("worker", num_cpus=2)


@contextlib.contextmanager
def start_default_cluster(admin_token: str, workers: int = 2) -> Iterator[LocalCluster]:
    """The default placement's head and ``workers`` worker nodes, with the node health checks the chart sets
    (:data:`ebplus.deploy.serve_env.NODE_HEALTH_ENV`, read by the head's GCS)."""
    specs = [NodeSpec(f"w{i + 1}", DEFAULT_WORKER.num_cpus) for i in range(workers)]
    with LocalCluster(DEFAULT_HEAD, specs, env={"EBPLUS_ADMIN_TOKEN": admin_token, **NODE_HEALTH_ENV}) as cluster:
        yield cluster


@contextlib.contextmanager
def deployed_on(
    nodes: contextlib.AbstractContextManager[LocalCluster], config: Path, admin_token: str, log_path: Path
) -> Iterator[tuple[LocalCluster, Deployment, Cluster]]:
    """A local multi-node cluster (``nodes``, e.g. :func:`start_default_cluster`), ``config`` deployed onto it
    through ``ray.address`` and a handle on its Ray side: what a scale-out test module shares."""
    with (
        nodes as local,
        deployed(config, log_path, admin_token, ray_address=local.address) as dep,
        Cluster(dep, auth_mode=LocalCluster.AUTH_MODE) as cluster,
    ):
        yield local, dep, cluster


def rollout_config(dest_dir: Path, number: int) -> Path:
    """The config after the ``number``-th rolling update (1-based): each update on top of the previous ones."""
    path = MULTINODE_CONFIG
    for i in range(number):
        path = variant(path, dest_dir / f"multinode-rollout{i + 1}.yaml", **ROLLOUTS[i % len(ROLLOUTS)])
    return path
