"""A multi-node Ray cluster on this one machine: a head and worker nodes, each its own raylet.

What a KubeRay cluster is (a head pod, worker pods), at the scale of a laptop:
every node is a separate raylet with its own CPUs and custom resources, started
with ``ray.cluster_utils.Cluster`` (Ray's own helper for multi-node tests). The
deployment joins it through ``ray.address`` as it would join a real cluster.

:meth:`LocalCluster.kill` is a node loss: SIGKILL of the node's raylet and of every
process it started (Serve replicas and proxies, vLLM engines, the controller
actor if it lives there), all at once, as when a machine powers off. The
operator's part (KubeRay recreating a lost pod) is :meth:`LocalCluster.add` with
the same :class:`NodeSpec`.

NOTE: the processes run on loopback, so a killed process's TCP peers see a reset
at once; a real machine loss can leave connections silent until a timeout. The
deployment's own stall deadline (``http.stall_timeout_s``) bounds both cases.

The cluster lives in a private temp dir (``RAY_TMPDIR``): Ray records the address
of the last cluster started in ``<tmp>/ray_current_cluster``, and a plain
``ray.init()`` elsewhere on the machine would otherwise join this cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebplus.deploy.cli import ray_start_timed_out
from harness.waiting import HarnessError


@dataclass(frozen=True)
class NodeSpec:
    """One node: a name (the harness's), its logical CPUs and custom resources."""

    name: str
    num_cpus: int = 1
    resources: dict[str, float] = field(default_factory=dict)


@dataclass
class LiveNode:
    spec: NodeSpec
    node: Any  # ray._private.node.Node
    node_id: str
    started_at: float


@dataclass(frozen=True)
class KilledNode:
    """What a node loss took down."""

    name: str
    node_id: str
    pids: tuple[int, ...]
    at: float  # time.monotonic() of the kill


#: Tries to start the cluster. On 2 cores still busy with the previous deployment's shutdown a start
#: can miss one of Ray's startup waits (:data:`ebplus.deploy.cli.RAY_START_TIMEOUTS`: a raylet's
#: registration, or the GCS's port, seen in CI); the next try, on a quieter machine, starts. Any
#: other error is raised at once.
START_ATTEMPTS = 3
#: Seconds the GCS gets to publish its port (Ray's default is 30 s for the in-memory store): the
#: harness's heads start on a machine shared with engines, so a slow start is waited for first.
GCS_PORT_WAIT_S = 90
GCS_PORT_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"  # Ray's own name for it, read by the driver


class LocalCluster:
    """Head and worker raylets on this machine.

    Args:
        head: the head node (GCS, Serve's controller, a Serve proxy).
        workers: worker nodes started with the head.
        system_config: Ray's ``_system_config`` for the head (None: Ray's defaults, as a
            KubeRay cluster has them).
        env: environment of every node's processes (the deployment's secrets: a KubeRay pod
            gets them from a Secret; Serve's actors inherit them from their node).
    """

    #: Ray authentication of every node (``RAY_AUTH_MODE``); a driver joining must use the same
    #: (:class:`harness.cluster.Cluster`'s ``auth_mode``).
    AUTH_MODE = "disabled"

    def __init__(
        self,
        head: NodeSpec,
        workers: Sequence[NodeSpec],
        system_config: dict | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.head_spec = head
        self.worker_specs = list(workers)
        self.system_config = system_config
        self.env = dict(env or {})
        # short: Ray's socket paths under it must stay below the 107-byte limit of AF_UNIX
        self.tmpdir = Path(tempfile.mkdtemp(prefix="ebmn-", dir="/tmp"))  # RAY_TMPDIR
        self.temp_dir = self.tmpdir / "ray"  # Ray's temp dir, as /tmp/ray is by default
        self.temp_dir.mkdir()
        self.nodes: dict[str, LiveNode] = {}
        self.killed: list[KilledNode] = []
        self._cluster: Any = None
        self._saved_tmpdir: str | None = None

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self.start()
                return self
            except Exception as exc:  # Ray raises a bare Exception when a node does not come up
                with contextlib.suppress(Exception):
                    self.shutdown()  # a head left running would hold ports and cores for the next try
                if attempt == START_ATTEMPTS or not ray_start_timed_out(exc):
                    raise
                print(f"[cluster] a node did not start in time ({exc}); starting again ({attempt + 1} of "
                      f"{START_ATTEMPTS})", flush=True)  # fmt: skip
                time.sleep(5)
        raise AssertionError("unreachable")

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @contextlib.contextmanager
    def _node_env(self) -> Iterator[None]:
        """The environment every node of this cluster starts (and stops) in.

        ``RAY_TMPDIR``: this cluster's own dir for Ray's address file. ``RAY_AUTH_MODE``
        disabled, for every node alike: a node started in token mode (a driver in this
        process turns it on to join clusters that use it) refuses the GCS's calls to a
        head started without it, and a lost node's replacement would never take work.
        """
        wanted = {
            GCS_PORT_WAIT_ENV: str(GCS_PORT_WAIT_S),
            **self.env,
            "RAY_TMPDIR": str(self.tmpdir),
            "RAY_AUTH_MODE": self.AUTH_MODE,
        }
        saved = {name: os.environ.get(name) for name in wanted}
        os.environ.update(wanted)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def start(self) -> str:
        from ray.cluster_utils import Cluster

        head_args: dict[str, Any] = {
            "num_cpus": self.head_spec.num_cpus,
            "resources": dict(self.head_spec.resources),
            "temp_dir": str(self.temp_dir),
            "include_dashboard": False,
        }
        if self.system_config:
            head_args["_system_config"] = dict(self.system_config)
        with self._node_env():
            self._cluster = Cluster(initialize_head=True, head_node_args=head_args)
        head = self._cluster.head_node
        self.nodes[self.head_spec.name] = LiveNode(self.head_spec, head, head.node_id, time.monotonic())
        for spec in self.worker_specs:
            self.add(spec)
        return self.address

    @property
    def address(self) -> str:
        """The GCS address (``ray.address`` of the deployment config)."""
        return self._cluster.address

    def add(self, spec: NodeSpec) -> LiveNode:
        """Start a worker node (a new one, or the replacement of a lost one: KubeRay's part)."""
        if spec.name in self.nodes:
            raise HarnessError(f"node {spec.name!r} is already running")
        with self._node_env():
            node = self._cluster.add_node(
                num_cpus=spec.num_cpus, resources=dict(spec.resources), temp_dir=str(self.temp_dir)
            )
        live = self.nodes[spec.name] = LiveNode(spec, node, node.node_id, time.monotonic())
        return live

    def kill(self, name: str) -> KilledNode:
        """A node loss: SIGKILL the node's raylet and every process under it at once."""
        import psutil

        if name == self.head_spec.name:
            raise HarnessError("the head node holds the GCS: losing it loses the cluster (see GCS fault tolerance)")
        live = self.nodes.pop(name)
        procs = [p.process for plist in live.node.all_processes.values() for p in plist]
        tree: list[psutil.Process] = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(proc.pid)
                tree += [root, *root.children(recursive=True)]
        at = time.monotonic()
        pids = []
        for p in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
                pids.append(p.pid)
        # the bookkeeping (and a wait for the zombies): everything is dead already
        self._cluster.remove_node(live.node, allow_graceful=False)
        killed = KilledNode(name, live.node_id, tuple(pids), at)
        self.killed.append(killed)
        return killed

    def shutdown(self) -> None:
        if self._cluster is None:
            return
        try:
            with self._node_env():
                self._cluster.shutdown()
        finally:
            self._cluster = None
            self.nodes.clear()

    # -- where things run ------------------------------------------------------------

    def name_of(self, node_id: str) -> str | None:
        """The harness's name of a live node, from Ray's node id."""
        return next((name for name, live in self.nodes.items() if live.node_id == node_id), None)

    def pid_nodes(self) -> dict[int, str]:
        """pid -> node name, for every process under each live node's raylet."""
        import psutil

        out: dict[int, str] = {}
        for name, live in self.nodes.items():
            for plist in live.node.all_processes.values():
                for p in plist:
                    with contextlib.suppress(psutil.Error):
                        root = psutil.Process(p.process.pid)
                        for q in [root, *root.children(recursive=True)]:
                            out[q.pid] = name
        return out
