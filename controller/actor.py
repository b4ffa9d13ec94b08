"""The controller as a service: one per deployment, a named Ray actor or in-process.

:class:`ControllerActor` wraps the pure :class:`~ebplus.controller.fleet.FleetController`
with persistence and housekeeping. Under Ray Serve it runs as the detached,
restartable actor ``ebplus-controller`` (namespace ``ebplus``; :func:`start_controller`);
under plain ``vllm serve`` the plugin runs it in the API server's event loop.
Either way callers reach it through :class:`~ebplus.controller.client.ControllerClient`.

Its methods speak wire formats only - replica messages as msgpack bytes
(:mod:`ebplus.controller.messages`), views as JSON (:mod:`ebplus.controller.views`) -
so an ingress, a replica and a controller of different code versions (a rolling
update) still understand each other, and nothing a caller sends can make a method
raise: a bad batch is counted and answered, a bad override is answered with the
field at fault.

The state (:mod:`ebplus.controller.persistence`) is kept in Ray's internal KV store,
or a file in ``state_dir``, so a restart (``max_restarts``) resumes without a cold
start.

Fleet scale. Re-plans, operator changes and the snapshots that persist them run in a
worker thread (:mod:`ebplus.controller.fleet_worker`); a push that arrives meanwhile is
answered at once with the thresholds in force and its telemetry absorbed by the worker's
next round. In a small fleet (:data:`SMALL_FLEET`) a push is answered after the work it
caused, so the push that makes a re-plan due hears of it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import os
import sys
import time
from collections import deque
from typing import Any

from ebplus.controller import lifecycle, persistence, scaling, views
from ebplus.controller.client import ControllerUnavailable
from ebplus.controller.config import HEAD_NODE_RESOURCE, ControllerConfig
from ebplus.controller.fleet import FleetController
from ebplus.controller.fleet_worker import FleetWorker
from ebplus.controller.messages import Registration, WireError, decode, encode
from ebplus.controller.overrides import OverrideError
from ebplus.controller.state_store import StateStore, StoreError
from ebplus.controller.telemetry import intake
from ebplus.controller.views import ClearResult, ControllerInfo, FleetSnapshot, OverrideResult, Ping, RecomputeResult

ACTOR_NAME = "ebplus-controller"
#: In fleets of at most this many replicas a push is answered after the work it caused (its telemetry absorbed,
#: the re-plan it made due published: a few milliseconds), so its reply carries the thresholds that work set.
#: In larger ones a push never waits for a re-plan: its reply carries the last one published.
SMALL_FLEET = 8
NAMESPACE = "ebplus"
#: How long an operator's read (``/metrics`` scrapes, ``/admin`` reads) may reuse the fleet's last snapshot, while
#: no decision changed it: at 256 replicas a snapshot is milliseconds of the event loop that answers the pushes,
#: and Prometheus, dashboards and scripts together may ask for one many times a second. Four a second at most,
#: and what a read shows (counters, last_seen, applied versions) is at most this old.
SNAPSHOT_TTL_S = 0.25
#: Scaling decisions kept for ``/admin/history``.
SCALING_HISTORY = 200
#: Policy-first autoscaling re-plans the fleet at most this often when the policy is the lever.
SCALING_REPLAN_S = 10.0

logger = logging.getLogger("ebplus.controller")


def _loaded_ray() -> Any:
    """The ``ray`` module if this process imported it, else ``None``.

    A process that never imported Ray is neither a Ray worker nor connected to a cluster, and
    importing Ray only to ask would cost an in-process controller (the plain-vLLM plugin, the
    simulator, tests) ~1 s and ~30k long-lived objects that every full garbage collection then
    walks: a 20-30 ms pause of the event loop that answers telemetry.
    """
    return sys.modules.get("ray")


def _in_ray_actor() -> bool:
    ray = _loaded_ray()
    try:
        return ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # not a worker
        return False


def freeze_startup_objects() -> None:
    """Take the objects that exist now (modules, the restored state) out of the garbage collector's passes.

    A full collection walks every tracked object: ~60k of them once numpy, scipy, pydantic
    and msgspec are imported, a 30-90 ms pause of the event loop that answers telemetry,
    every few hundred re-plans (whose decisions and plans are what fills the old
    generation). They are module-level and live as long as the process: frozen, a full
    collection walks only what the controller made since. Garbage is collected first, so
    nothing unreachable is kept.
    """
    gc.collect()
    gc.freeze()


class ControllerActor:
    """The controller service (a Ray actor body, or used in-process).

    Args:
        config: the ``controller:`` section of the deployment config.
        housekeeping: run the background persist/forget loop (off when driven by tests).
        small_fleet: fleets up to this size answer a push after the work it caused (see :data:`SMALL_FLEET`).
    """

    def __init__(
        self,
        config: ControllerConfig | None = None,
        housekeeping: bool = True,
        small_fleet: int = SMALL_FLEET,
    ) -> None:
        self.config = config or ControllerConfig()
        self.small_fleet = small_fleet
        self.fleet = FleetController(self.config)
        self.housekeeping = housekeeping
        self.store = StateStore(self.config.state_dir)
        self.started_at = time.time()
        self.restored = False
        self._identity = lifecycle.identity(self.config)
        saved = self.store.load()
        if saved is not None:
            try:
                self.fleet.restore(persistence.parse(saved))
                self.restored = True
                found = saved.get("schema_version", 0)
                if found == persistence.SCHEMA_VERSION:
                    logger.info("controller resumed at version %d", self.fleet.version)
                else:  # an upgrade: worth a line in any log level
                    logger.warning(
                        "controller resumed at version %d from a schema-%s state (migrated to schema %d)",
                        self.fleet.version, found, persistence.SCHEMA_VERSION,
                    )  # fmt: skip
            except persistence.StateError as exc:
                try:  # never a crash loop: the constructor must not raise on a bad state
                    where = self.store.set_aside(saved)
                except Exception as aside:
                    where = f"nowhere ({aside})"
                logger.error("controller state not restorable, starting cold: %s; the state is kept in %s", exc, where)
                self.fleet = FleetController(self.config)
        self._dirty = False
        self._persisted_version = self.fleet.version
        self.persist_error: str | None = None  # why the last write failed, until one succeeds
        #: policy-first autoscaling's decisions (``/admin/history``), and when one last re-planned the fleet
        self.scaling_history: deque[scaling.ScalingDecision] = deque(maxlen=SCALING_HISTORY)
        self._scaling_replan_at = -math.inf
        self._housekeeping: asyncio.Task | None = None
        self.worker = FleetWorker(lambda: self.fleet, self._persist_changed)
        self._view: FleetSnapshot | None = None
        self._view_taken = self._stamp()  # see _stamp; _view is None until the first read
        self._snapshot_json: tuple[tuple[tuple[int, int, int], float], str] | None = None  # (_stamp, JSON)
        if _in_ray_actor():  # a process of its own (in-process, the host's garbage is not ours to freeze)
            freeze_startup_objects()

    def _small(self) -> bool:
        return len(self.fleet.replicas) <= self.small_fleet

    def _ensure_housekeeping(self) -> None:
        # started lazily: the actor's event loop is not running in __init__
        if self.housekeeping and (self._housekeeping is None or self._housekeeping.done()):
            self._housekeeping = asyncio.get_running_loop().create_task(self._housekeep())

    async def _housekeep(self) -> None:
        every = self.config.persist_every_s
        last = time.monotonic()
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            late, last = now - last - every, now
            try:
                async with self.worker.lock:
                    if late > 1.0:
                        # We were not running (process stopped, machine starved): the replicas'
                        # pushes queued up unanswered, so that silence is ours, not theirs.
                        logger.warning("controller was paused for %.1f s; replicas are not blamed for it", late)
                        self.fleet.grace(late)
                    self._forget_stale()
                    await self.worker.run(self.fleet.expire_overrides, force=self._dirty)
            except Exception:  # keep the loop alive whatever happens
                logger.exception("controller housekeeping failed")

    def _forget_stale(self) -> None:
        for rid in self.fleet.forget_stale(self.config.stale_replica_s):
            logger.info("forgot silent replica %s", rid)
            self._dirty = True

    def persist(self, force: bool = False) -> bool:
        """Persist the state now if it changed (or ``force``), from the calling thread: for callers
        outside the actor's event loop (shutdown, tests); the actor's own go through its worker.

        Returns whether the store holds the current state. A store that fails (a full
        disk) is reported once, when it starts failing and when it recovers: what was
        decided is applied and served meanwhile, and housekeeping tries again.
        """
        if force or self._dirty or self.fleet.version != self._persisted_version:
            version = self.fleet.version
            try:
                self.store.save(self.fleet.state())
            except StoreError as exc:
                if str(exc) != self.persist_error:
                    logger.error("controller state not persisted (serving on, retrying): %s", exc)
                self.persist_error = str(exc)
                return False
            if self.persist_error is not None:
                logger.warning("controller state persisted again (it failed with: %s)", self.persist_error)
                self.persist_error = None
            self._persisted_version = version
            self._dirty = False
        return self.persist_error is None

    def _persist_changed(self, force: bool) -> None:
        """In the worker thread, after a change: persisted if it moved the version (or ``force``). A new
        version is persisted before any replica hears of it: a restart then never re-issues a published
        version number with other thresholds."""
        if force or self.fleet.version != self._persisted_version:
            self.persist(force=True)

    # -- replica-facing (msgpack bytes) -------------------------------------

    async def register(self, payload: bytes) -> bytes | None:
        """Add a replica (a :class:`Registration`); returns its thresholds, ``None`` if unreadable."""
        self._ensure_housekeeping()
        try:
            registration = decode(payload, Registration)
            async with self.worker.lock:
                update = self.fleet.register(registration)
        except (WireError, ValueError) as exc:
            logger.warning("refused a replica registration: %s", exc)
            self.worker.counters()[1][getattr(exc, "reason", "bad_batch")] += 1
            return None
        self._dirty = True
        return encode(update)

    async def ingest(self, payload: bytes) -> bytes | None:
        """Absorb a :class:`TelemetryBatch`; returns the sender's thresholds, ``None`` if it is unknown.

        Never raises: a replica keeps a batch whose push failed and sends it again,
        so a batch that made ``ingest`` raise would block that replica's telemetry
        for good. Such a batch is counted (``bad_batch``) and dropped.
        """
        self._ensure_housekeeping()
        received, rejected = self.worker.counters()
        rid = None
        try:
            batch = intake(payload, rejected)
            if batch is None:  # an unreadable envelope: counted by reason
                received["batches"] += 1
                return None
            rid = batch.replica_id
            self._dirty = True
            if self.worker.busy:  # the worker has the fleet: its next round absorbs this, in order
                answer = self.worker.answer(rid)
                held = await self.worker.hold(batch)
                if answer is not None and self._small():
                    await held
                    answer = self.worker.answer(rid)
            else:
                replica, due = self.fleet.absorb_checked(batch)
                answer = None if replica is None else replica.current
                if due is not None:
                    replanned = self.worker.replan_soon(due)
                    if answer is not None and self._small():
                        await replanned
                        answer = self.worker.answer(rid)
        except Exception:
            logger.exception("rejected a telemetry batch that could not be ingested")
            self.worker.counters()[1]["bad_batch"] += 1
            answer = self.worker.answer(rid) if isinstance(rid, str) else None
        return None if answer is None else encode(answer)

    async def leave(self, replica_id: str) -> bool:
        """A replica shutting down on purpose (scale-down, rolling update) is forgotten at once, not after
        ``stale_replica_s`` of silence; its state is set aside like any forgotten replica's."""
        if not isinstance(replica_id, str):
            return False
        async with self.worker.lock:
            if not self.fleet.forget(replica_id):
                return False
        logger.info("replica %s left", replica_id)
        self._dirty = True
        return True

    # -- operator-facing (JSON) ------------------------------------------------
    # Reads and changes wait for a running round of the worker: a view is of one state, a change
    # is persisted before it is answered.

    def view(self) -> FleetSnapshot | None:
        """The fleet's snapshot for a synchronous reader on the actor's event loop (the plain-vLLM plugin's
        ``/metrics``): taken now, or while a round of the worker runs, the last one taken (``None``: none yet)."""
        if not self.worker.running and not (self._view is not None and self._fresh(self._view_taken)):
            self._view, self._view_taken = self.fleet.snapshot(), self._stamp()
        return self._view

    def _stamp(self) -> tuple[tuple[int, int, int], float]:
        """What a snapshot taken now is of (decisions, registrations, replicas) and when (monotonic)."""
        return (self.fleet.version, self.fleet.registrations, len(self.fleet.replicas)), time.monotonic()

    def _fresh(self, taken: tuple[tuple[int, int, int], float]) -> bool:
        """Whether a snapshot stamped ``taken`` may answer a read now: nothing decided, registered or
        departed since, and younger than :data:`SNAPSHOT_TTL_S`."""
        key, at = self._stamp()
        return taken[0] == key and at - taken[1] < SNAPSHOT_TTL_S

    async def snapshot(self) -> str:
        """The fleet's snapshot as JSON; the last one again within :data:`SNAPSHOT_TTL_S` if no decision came since."""
        self._ensure_housekeeping()
        if self._snapshot_json is not None and self._fresh(self._snapshot_json[0]):
            return self._snapshot_json[1]
        async with self.worker.lock:
            await self.worker.run(self.fleet.expire_overrides)
            snap = self.fleet.snapshot()
        info = ControllerInfo(started_at=self.started_at, restored=self.restored, persist_error=self.persist_error)
        text = snap.model_copy(update={"controller": info}).model_dump_json()
        self._snapshot_json = (self._stamp(), text)
        return text

    async def scaling(self, model: str, replicas: int, utilization: float, down: float) -> str:
        """Policy-first autoscaling's question (:mod:`ebplus.deploy.autoscaling`): how many replicas ``model``
        needs with ``replicas`` running (:func:`ebplus.controller.scaling.decide`, as JSON). When the policy is
        the lever the fleet is re-planned now, not at its next ``update_every`` completions (at most every
        :data:`SCALING_REPLAN_S`): the answer does not wait for that."""
        async with self.worker.lock:
            caps = scaling.capacities(self.fleet, model)
        decision = scaling.decide(caps, replicas, utilization=utilization, down=down, model=model, at=time.time())
        self.scaling_history.append(decision)
        if decision.action == "policy" and time.monotonic() - self._scaling_replan_at > SCALING_REPLAN_S:
            self._scaling_replan_at = time.monotonic()
            self.worker.replan_soon("scaling")
        return json.dumps(decision.as_dict())

    async def scaling_decisions(self, limit: int | None = None) -> str:
        """The newest ``limit`` scaling decisions, oldest first, as JSON."""
        items = list(self.scaling_history)
        return json.dumps([d.as_dict() for d in (items[-limit:] if limit else items)])

    async def routing_hints(self) -> bytes:
        """:class:`~ebplus.controller.messages.RoutingHints` (wire bytes): what the routers' boards take from the
        controller (the board actor asks about once a second)."""
        async with self.worker.lock:
            return encode(views.routing_hints(self.fleet))

    async def history(self, limit: int | None = None) -> str:
        async with self.worker.lock:
            decisions = self.fleet.history_view(limit)
        return "[" + ",".join(d.model_dump_json() for d in decisions) + "]"

    async def set_override(
        self,
        replica: str,
        mode: str | None = None,
        k: int | None = None,
        n: int | None = None,
        ttl_s: float | None = None,
        force: bool = False,
    ) -> str:
        def change() -> int:
            return self.fleet.set_override(replica, mode=mode, k=k, n=n, ttl_s=ttl_s, force=force)

        async with self.worker.lock:
            try:
                version = await self.worker.run(change)
            except OverrideError as exc:
                return OverrideResult(error=exc.field, message=exc.message).model_dump_json()
            override = self.fleet.overrides.items[replica]
        return OverrideResult(version=version, override=override, **self._persisted()).model_dump_json()

    async def clear_override(self, replica: str) -> str:
        async with self.worker.lock:
            removed = await self.worker.run(lambda: self.fleet.clear_override(replica))
            version = self.fleet.version
        return ClearResult(removed=removed, version=version, **self._persisted()).model_dump_json()

    async def recompute(self) -> str:
        """Re-plan the fleet now, after the telemetry received so far; answered once it is published."""
        version = await self.worker.replan_soon("operator")
        return RecomputeResult(
            version=version, estimate=self.fleet.workload.estimate, **self._persisted()
        ).model_dump_json()

    def _persisted(self) -> dict[str, Any]:
        """What an operator's change answers about the store: applied and persisted, or applied only."""
        if self.persist_error is None:
            return {"persisted": True}
        return {"persisted": False, "message": f"applied, but not persisted: {self.persist_error}"}

    async def identity(self) -> str:
        """The code and configuration this controller runs (:func:`ebplus.controller.lifecycle.identity`)."""
        return self._identity

    async def checkpoint(self) -> int:
        """Persist the state now (an upgrade stops this controller next); returns the version persisted."""
        async with self.worker.lock:
            await self.worker.run(lambda: None, force=True)
            return self.fleet.version

    async def ping(self) -> str:
        return Ping(
            version=self.fleet.version, replicas=len(self.fleet.replicas), restored=self.restored, pid=os.getpid()
        ).model_dump_json()


def controller_options(config: ControllerConfig) -> dict[str, Any]:
    """Ray actor options of the controller: named, detached, restartable, tiny, placed as configured."""
    resources = dict(config.resources)
    if config.placement == "head":
        resources.setdefault(HEAD_NODE_RESOURCE, 0.001)
    return {
        "name": ACTOR_NAME,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
        "max_restarts": config.max_restarts,
        "max_task_retries": 0,  # a replica's next push is the retry; never double-ingest
        "num_cpus": 0,
        "resources": resources,
        "max_concurrency": 64,
    }


def start_controller(config: ControllerConfig):
    """Create the controller actor, or return the running one (``get_if_exists``)."""
    import ray

    cls = ray.remote(ControllerActor)
    return cls.options(**controller_options(config)).remote(config)


def get_controller():
    """Handle to the running controller, or ``None`` if it does not exist (yet)."""
    import ray

    try:
        return ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


class RayTransport:
    """The named controller actor; looked up lazily and again after any failure."""

    def __init__(self) -> None:
        self._handle: Any = None

    async def call(self, method: str, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        from ray.exceptions import RayError

        if self._handle is None:
            # a GCS round trip: off the event loop that streams responses
            self._handle = await asyncio.to_thread(get_controller)
            if self._handle is None:
                raise ControllerUnavailable("controller actor not found")
        try:
            ref = getattr(self._handle, method).remote(*args, **kwargs)
            async with asyncio.timeout(timeout_s):  # not wait_for, which drops a cancellation landing with the answer
                return await ref
        except (TimeoutError, RayError) as exc:
            self._handle = None  # look it up again next time
            raise ControllerUnavailable(f"{type(exc).__name__}: {exc}".splitlines()[0]) from None
