"""The multi-node deployment of the scale-out tests and benchmark: the cluster's layout and the config updates.

``tests/e2e/multinode.yaml`` describes the deployment; this module the cluster it
joins, in KubeRay's terms: a head (the ingress, Serve's controller, a proxy; no model
replica) and 1-CPU workers, each a "pod" that holds one model replica
(``ebplus-replica``) and may hold the EB+ controller (``ebplus-controller``; the test
config puts it there, not on the head as recommended, so a worker's loss can take it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from harness.deployment import ROOT
from harness.nodes import LocalCluster, NodeSpec
from harness.rollout import variant

MULTINODE_CONFIG = ROOT / "tests" / "e2e" / "multinode.yaml"

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
    """The head and ``workers`` worker nodes; every node's processes get the admin token (a Secret on KubeRay)."""
    specs = [NodeSpec(f"w{i + 1}", WORKER.num_cpus, dict(WORKER.resources)) for i in range(workers)]
    with LocalCluster(HEAD, specs, env={"EBPLUS_ADMIN_TOKEN": admin_token}) as cluster:
        yield cluster


def rollout_config(dest_dir: Path, number: int) -> Path:
    """The config after the ``number``-th rolling update (1-based): each update on top of the previous ones."""
    path = MULTINODE_CONFIG
    for i in range(number):
        path = variant(path, dest_dir / f"multinode-rollout{i + 1}.yaml", **ROLLOUTS[i % len(ROLLOUTS)])
    return path
