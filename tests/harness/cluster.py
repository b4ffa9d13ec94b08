"""The Ray driver of the harness: it joins the deployment's cluster to inject faults and read replica state.

Every fault is real and every one goes through :class:`Cluster`: the controller
actor is killed with ``ray.kill`` (Ray restarts it) or stopped with SIGSTOP; a
model replica's process gets SIGKILL. The scenarios (:mod:`.faults`) only call
these methods, so a new kind of fault is a method here plus a scenario there.

NOTE: processes are signalled with ``os.kill``: every Ray node of the cluster runs
on this machine (a multi-node cluster of several raylets on loopback qualifies).
Node-level faults (losing a whole node) are :class:`.nodes.LocalCluster`'s, which
owns the nodes; this driver says where things run (:meth:`Cluster.replica_nodes`,
:meth:`Cluster.controller_node`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from harness.deployment import Deployment
from harness.waiting import HarnessError, wait_until


def _set_auth_mode(mode: str | None) -> None:
    """``RAY_AUTH_MODE`` for this process's next Ray connection (unset: Ray's default)."""
    if mode is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = mode
    from ray._raylet import Config

    Config.initialize("")  # the C++ config was read at import: read it again


def _forget_serve_client() -> None:
    """Drop Ray Serve's cached controller handle. Serve keeps it in the process across
    ``ray.shutdown()`` and trusts it while the job id matches, and job ids repeat across
    clusters (this driver is the second job of each deployment's cluster): the previous
    cluster's handle was taken for the next one's ("Can't find actor ... from a different
    cluster", seen when the scale-out module ran after the reliability module)."""
    from ray.serve import context

    context._disconnect()  # Ray 2.60 (pinned): forgets the handle, leaves Serve running


class Cluster:
    """A Ray driver attached to the deployment's cluster, for fault injection and replica introspection."""

    def __init__(self, dep: Deployment, auth_mode: str | None = None) -> None:
        """``auth_mode``: the cluster's Ray authentication (``RAY_AUTH_MODE``); ``None`` for a cluster
        that ``ebplus serve`` started on this machine (this process's ``RAY_AUTH_MODE`` if set, else
        token mode when Ray's token file exists)."""
        self.dep = dep
        self.namespace = dep.config.ray.namespace
        self.auth_mode = auth_mode
        self._saved_auth: str | None = None
        self._handles: dict[str, Any] = {}  # deployment name -> this driver's handle to it

    def __enter__(self) -> Cluster:
        import ray

        # NOTE: a local `ray.init()` turns on Ray's token authentication and keeps the
        # token in ~/.ray/auth_token; a driver joining by address must opt in to send it.
        # The driver's mode must be the cluster's both ways: in token mode its own RPC
        # server refuses the raylets' token-less calls, and an object it owns that lives
        # in another node's store (a large actor reply) then fails with OwnerDiedError.
        self._saved_auth = os.environ.get("RAY_AUTH_MODE")
        mode = self.auth_mode or self._saved_auth
        if mode is None and (Path.home() / ".ray" / "auth_token").exists():
            mode = "token"
        _set_auth_mode(mode)
        ray.init(address=self.dep.ray_address, namespace=self.namespace, log_to_driver=False)
        _forget_serve_client()
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        # A handle's router pushes metrics from its own thread every second, and after
        # ray.shutdown() that push's Ray call auto-started a fresh local Ray inside this
        # process (seen in CI: the next test's engine then ran beside a stray cluster).
        for handle in self._handles.values():
            with contextlib.suppress(Exception):
                handle.shutdown()
        self._handles.clear()
        _forget_serve_client()
        ray.shutdown()
        _set_auth_mode(self._saved_auth)

    # -- the controller ----------------------------------------------------------

    def controller(self) -> Any:
        from ebplus.controller.actor import get_controller

        handle = get_controller()
        if handle is None:
            raise HarnessError("no controller actor")
        return handle

    def ping(self, timeout_s: float = 5.0) -> dict:
        """The controller's ping, as the JSON document it answers (see ``views.Ping``)."""
        import ray

        return json.loads(ray.get(self.controller().ping.remote(), timeout=timeout_s))

    def call(self, method: str, *args: object, timeout_s: float = 10.0) -> str:
        """A controller method's answer as it comes (JSON text for the views)."""
        import ray

        return ray.get(getattr(self.controller(), method).remote(*args), timeout=timeout_s)

    def snapshot(self, timeout_s: float = 10.0) -> dict:
        """The controller's full snapshot as JSON (``views.FleetSnapshot``: per replica last_seen,
        drops, engine counters...)."""
        import ray

        return json.loads(ray.get(self.controller().snapshot.remote(), timeout=timeout_s))

    def wait_controller(self, timeout_s: float = 60.0, pid_not: int | None = None) -> dict:
        """The ping of a live controller (a new process when ``pid_not`` is given)."""

        def alive() -> dict | None:
            ping = self.ping(timeout_s=2.0)
            return ping if pid_not is None or ping["pid"] != pid_not else None

        return wait_until("the controller to answer", alive, timeout_s)

    # -- the model replicas ------------------------------------------------------

    def llm_deployment(self) -> str:
        from ray import serve

        app = serve.status().applications["ebplus"]
        return next(name for name in app.deployments if name.startswith("EBPlusServer"))

    def replica_states(self) -> dict[str, int]:
        """Serve's count of model replicas in each state (``STARTING``, ``RUNNING``, ``STOPPING``...)."""
        from ray import serve

        app = serve.status().applications["ebplus"]
        states = app.deployments[self.llm_deployment()].replica_states
        return {str(getattr(state, "value", state)): int(n) for state, n in states.items()}  # keys: str enums

    def running_replicas(self) -> int:
        return self.replica_states().get("RUNNING", 0)

    def replica_actors(self, deployment: str = "EBPlusServer") -> dict[str, str]:
        """Serve replica id -> named actor of every replica of ``deployment`` (default: the model's; starting
        ones included)."""
        import ray

        out = {}
        for actor in ray.util.list_named_actors(all_namespaces=True):
            name = actor["name"]
            if name.startswith(f"SERVE_REPLICA::ebplus#{deployment}"):
                out[name.rsplit("#", 1)[1]] = name
        return out

    def actor_pid(self, name: str, namespace: str = "serve") -> int:
        return int(self._actor_info(name, namespace)["Pid"])

    def _actor_info(self, name: str, namespace: str) -> dict:
        import ray
        from ray._private import state

        return state.actors(ray.get_actor(name, namespace=namespace)._actor_id.hex())

    def replica_nodes(self, deployment: str = "EBPlusServer") -> dict[str, str]:
        """Serve replica id -> Ray node id of every replica of ``deployment`` (default: the model's) that has a
        node (started or starting)."""
        out = {}
        for rid, name in self.replica_actors(deployment).items():
            with contextlib.suppress(Exception):  # a replica being removed
                node = self._actor_info(name, "serve")["Address"]["NodeID"]
                if node:
                    out[rid] = node
        return out

    def ingress_nodes(self) -> list[str]:
        """Ray node ids of the HTTP ingress replicas (started or starting)."""
        return list(self.replica_nodes("EBPlusIngress").values())

    def controller_node(self) -> str:
        """Ray node id of the controller actor."""
        from ebplus.controller.actor import ACTOR_NAME, NAMESPACE

        return self._actor_info(ACTOR_NAME, NAMESPACE)["Address"]["NodeID"]

    def replica_status(self, replicas: int, want: Iterable[str] = (), timeout_s: float = 120.0) -> dict[str, dict]:
        """``ebplus_status`` of the model replicas, by replica id, once ``replicas`` of them and every
        one in ``want`` answered (or at ``timeout_s``). The router picks the replica, so calls go
        in threes until each answered; under load a call waits for a free slot like any request
        (CI: 20 s did not reach a new replica while requests took up to 30 s)."""
        from ray import serve

        name = self.llm_deployment()
        if name not in self._handles:
            self._handles[name] = serve.get_deployment_handle(name, app_name="ebplus")
        handle, wanted = self._handles[name], set(want)
        out: dict[str, dict] = {}
        deadline = time.monotonic() + timeout_s
        while (len(out) < replicas or not wanted <= out.keys()) and time.monotonic() < deadline:
            for response in [handle.ebplus_status.remote() for _ in range(3)]:
                with contextlib.suppress(Exception):
                    status = response.result(timeout_s=max(1.0, deadline - time.monotonic()))
                    out[status["replica_id"]] = status
        return out

    def session_logs(self) -> Path:
        """The cluster's log directory (Ray's session dir on this machine)."""
        import ray

        return Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"

    # -- faults (each one real) --------------------------------------------------

    def kill_controller(self) -> dict:
        """``ray.kill`` the controller with restarts allowed; returns the ping before the kill."""
        import ray

        before = self.ping()
        ray.kill(self.controller(), no_restart=False)
        return before

    @contextlib.contextmanager
    def controller_stopped(self) -> Iterator[int]:
        """SIGSTOP the controller's process for the duration of the block (SIGCONT always follows)."""
        pid = self.ping()["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            yield pid
        finally:
            with contextlib.suppress(ProcessLookupError):  # the block may have killed it
                os.kill(pid, signal.SIGCONT)

    def kill_replica(self, replica_id: str) -> int:
        """SIGKILL a model replica's process (a crash: no shutdown hook runs); returns the pid."""
        pid = self.actor_pid(self.replica_actors()[replica_id])
        os.kill(pid, signal.SIGKILL)
        return pid
