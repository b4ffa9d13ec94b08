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

Fleet scale. A small fleet (:data:`INLINE_RECOMPUTE_REPLICAS`) is re-planned inside the push
that makes an update due. A large one is re-planned in the background: a push only
absorbs its telemetry and answers with the thresholds in force, while one re-plan at a
time runs between pushes, a piece at a time (:meth:`FleetController.recompute_pieces`),
yielding the event loop every :data:`SLICE_S`; updates due meanwhile are coalesced into
the next one. Its snapshot is built the same way (:class:`persistence.SnapshotWriter`)
and written from a thread, before any replica hears of the new version. At 256 replicas a
re-plan is ~50-100 ms of work: inline, every push queued behind it waited that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import Any

from ebplus.controller import lifecycle, persistence
from ebplus.controller.client import ControllerUnavailable
from ebplus.controller.config import HEAD_NODE_RESOURCE, ControllerConfig
from ebplus.controller.fleet import FleetController, Stage
from ebplus.controller.messages import Registration, WireError, decode, encode
from ebplus.controller.overrides import OverrideError
from ebplus.controller.telemetry import intake
from ebplus.controller.views import ClearResult, ControllerInfo, OverrideResult, Ping, RecomputeResult

ACTOR_NAME = "ebplus-controller"
#: Fleets of at most this many replicas are re-planned inside the push that makes an update due, whose reply
#: then carries the new thresholds (a re-plan of 8 replicas is a few milliseconds). Larger ones are re-planned in
#: the background, between pushes: a push is never held up by a re-plan, its reply carries the last one finished.
INLINE_RECOMPUTE_REPLICAS = 8
#: Longest run of background work (re-plan, snapshot) before the event loop serves pushes again.
SLICE_S = 0.0001
#: Turns of the event loop background work gives pushes at each pause (:func:`let_pushes_through`).
YIELD_TURNS = 3
NAMESPACE = "ebplus"
STATE_KEY = b"ebplus-controller-state"

logger = logging.getLogger("ebplus.controller")


class StateStore:
    """Where the controller's snapshot lives: a file in ``state_dir``, else Ray's internal KV.

    Outside a Ray cluster with no ``state_dir`` (a controller run in-process) there is
    nowhere to keep it: the state lives in memory only, and that is logged once.
    """

    def __init__(self, state_dir: str | None, key: bytes = STATE_KEY) -> None:
        self.path = None if state_dir is None else Path(state_dir) / "controller-state.json"
        self.key = key
        self.memory_only = self.path is None and not _ray_connected()
        if self.memory_only:
            logger.warning("no controller.state_dir and no Ray cluster: the controller's state is not persisted")

    def load(self) -> dict | None:
        """The stored state as decoded JSON, ``None`` if there is none (or it is unreadable: logged)."""
        if self.memory_only:
            return None
        try:
            if self.path is not None:
                return json.loads(self.path.read_text()) if self.path.exists() else None
            from ray.experimental.internal_kv import _internal_kv_get

            raw = _internal_kv_get(self.key)
            return None if raw is None else json.loads(raw)
        except (OSError, ValueError) as exc:
            logger.warning("ignoring unreadable controller state: %s", exc)
            return None

    def save(self, state: persistence.ControllerState) -> None:
        self.save_bytes(state.model_dump_json().encode())

    def save_bytes(self, data: bytes) -> None:
        """Store a state already serialised as UTF-8 JSON (:class:`~ebplus.controller.persistence.SnapshotWriter`).

        Holds the GIL for no more than a few system calls, so a thread can do it while the
        event loop serves pushes (a thread that held it to encode a megabyte of text, and
        was then descheduled on a busy machine, stalled the loop for half a second).
        """
        if not self.memory_only:
            self._write(self.path, self.key, data)

    def set_aside(self, raw: dict) -> str | None:
        """Keep a state this controller cannot resume from beside the live one; returns where.

        A state of a newer schema (a rollback after an upgrade) would otherwise be
        overwritten by the first snapshot of the controller that refused it.
        """
        if self.memory_only:
            return None
        path = None if self.path is None else self.path.with_name("controller-state.rejected.json")
        key = self.key + b".rejected"
        self._write(path, key, json.dumps(raw).encode())
        return str(path) if path is not None else f"Ray internal KV key {key.decode()}"

    @staticmethod
    def _write(path: Path | None, key: bytes, data: bytes) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # write-then-rename: a crash mid-write never leaves a torn file
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".controller-state.")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
            return
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key, data, overwrite=True)

    def clear(self) -> None:
        if self.memory_only:
            return
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            return
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(self.key)


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


async def let_pushes_through() -> None:
    """Pause background work for :data:`YIELD_TURNS` turns of the event loop.

    A push that arrived meanwhile is not one callback but a chain, each link queued by the
    one before it for the next turn: under Ray, the RPC thread's callback starts the call's
    task, whose first step runs the method; a timer-driven caller (the benchmark's open-loop
    pushes) adds one more link, the timer waking the task that starts the push. With two
    turns a three-link push waited for the next piece as well (~0.3 ms at 256 replicas); a
    turn with nothing ready costs a few microseconds.
    """
    for _ in range(YIELD_TURNS):
        await asyncio.sleep(0)


def _ray_connected() -> bool:
    ray = _loaded_ray()
    return ray is not None and ray.is_initialized()


class ControllerActor:
    """The controller service (a Ray actor body, or used in-process).

    Args:
        config: the ``controller:`` section of the deployment config.
        housekeeping: run the background persist/forget loop (off when driven by tests).
        inline_replicas: fleets up to this size are re-planned on the push path (see the module docstring).
    """

    def __init__(
        self,
        config: ControllerConfig | None = None,
        housekeeping: bool = True,
        inline_replicas: int = INLINE_RECOMPUTE_REPLICAS,
    ) -> None:
        self.config = config or ControllerConfig()
        self.inline_replicas = inline_replicas
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
        self._housekeeping: asyncio.Task | None = None
        # background work of a large fleet (see the module docstring): one at a time, under _exclusive
        self._exclusive = asyncio.Lock()
        self._replanner: asyncio.Task | None = None
        self._replan_cause: str | None = None  # a re-plan asked for and not started yet
        self._writer = persistence.SnapshotWriter()
        if _in_ray_actor():  # a process of its own (in-process, the host's garbage is not ours to freeze)
            freeze_startup_objects()

    def _inline(self) -> bool:
        """Whether the fleet is re-planned on the push path (small, and no background work pending)."""
        idle = not self._exclusive.locked() and (self._replanner is None or self._replanner.done())
        return idle and len(self.fleet.replicas) <= self.inline_replicas

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
                if late > 1.0:
                    # We were not running (process stopped, machine starved): the replicas'
                    # pushes queued up unanswered, so that silence is ours, not theirs.
                    logger.warning("controller was paused for %.1f s; replicas are not blamed for it", late)
                    self.fleet.grace(late)
                if self._inline():
                    self._forget_stale()
                    self.persist()
                else:
                    async with self._exclusive:
                        self._forget_stale()
                        # pushes do not expire overrides here (they never publish): an expired one
                        # publishes now, persisted before any push is answered
                        self.fleet.expire_overrides()
                        self._persist_new_version()
                        await self._persist_pieces()
            except Exception:  # keep the loop alive whatever happens
                logger.exception("controller housekeeping failed")

    def _forget_stale(self) -> None:
        for rid in self.fleet.forget_stale(self.config.stale_replica_s):
            logger.info("forgot silent replica %s", rid)
            self._dirty = True

    def persist(self, force: bool = False) -> None:
        if force or self._dirty or self.fleet.version != self._persisted_version:
            self.store.save(self.fleet.state())
            self._persisted_version = self.fleet.version
            self._dirty = False

    async def _persist_pieces(self) -> None:
        """:meth:`persist`, serialised a piece at a time and written from a thread.

        Runs under ``_exclusive`` (no re-plan meanwhile). A snapshot overtaken by a new
        version (an operator's override persists its own) is dropped, never written over it.
        """
        if not (self._dirty or self.fleet.version != self._persisted_version):
            return
        version = self.fleet.version
        data = await self._drive(self._writer.pieces(self.fleet))
        if self.fleet.version != version:
            return
        await let_pushes_through()  # the snapshot's last piece, and encoding it, are a slice each
        encoded = data.encode()
        await let_pushes_through()
        await asyncio.to_thread(self.store.save_bytes, encoded)
        if self.fleet.version == version:
            self._persisted_version, self._dirty = version, False

    async def _drive(self, steps: Generator[Any, None, Any]) -> Any:
        """Run a piece-at-a-time generator to its end, yielding the event loop every :data:`SLICE_S`;
        at :attr:`Stage.PLANNED` (a re-plan) persist before it goes on to publish."""
        mark = time.perf_counter()
        while True:
            try:
                stage = next(steps)
            except StopIteration as done:
                return done.value
            if stage is Stage.PLANNED:
                try:
                    await self._persist_pieces()
                except Exception:  # the store is down: serve on, the housekeeping loop retries
                    logger.exception("could not persist the controller state")
            if time.perf_counter() - mark >= SLICE_S:
                await let_pushes_through()
                mark = time.perf_counter()

    async def _replan(self, cause: str) -> int:
        """One re-plan of the whole fleet in the background (see the module docstring)."""
        async with self._exclusive:
            return await self._drive(self.fleet.recompute_pieces(cause))

    def _replan_soon(self, cause: str) -> None:
        """Ask for a background re-plan; those asked for while one runs make one more after it."""
        self._replan_cause = self._replan_cause or cause
        if self._replanner is None or self._replanner.done():
            self._replanner = asyncio.get_running_loop().create_task(self._replans())

    async def _replans(self) -> None:
        while self._replan_cause is not None:
            cause, self._replan_cause = self._replan_cause, None
            try:
                await self._replan(cause)
            except Exception:
                logger.exception("background re-plan failed")

    def _persist_new_version(self) -> None:
        """A new decision is persisted before any replica hears of it: a restart then never
        re-issues a published version number with different thresholds."""
        if self.fleet.version != self._persisted_version:
            try:
                self.persist()
            except Exception:  # the store is down: serve on, the housekeeping loop retries
                logger.exception("could not persist the controller state")

    # -- replica-facing (msgpack bytes) -------------------------------------

    async def register(self, payload: bytes) -> bytes | None:
        """Add a replica (a :class:`Registration`); returns its thresholds, ``None`` if unreadable."""
        self._ensure_housekeeping()
        try:
            registration = decode(payload, Registration)
            if self._inline():
                update = self.fleet.register(registration)
                self._persist_new_version()
            else:  # not in the middle of a re-plan: its new version may not be persisted yet
                async with self._exclusive:
                    update = self.fleet.register(registration)
        except (WireError, ValueError) as exc:
            logger.warning("refused a replica registration: %s", exc)
            self.fleet.rejected[getattr(exc, "reason", "bad_batch")] += 1
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
        try:
            inline = self._inline()
            if inline:
                update = self.fleet.ingest(payload)
            else:  # a large fleet: absorb only; a re-plan due runs in the background
                replica, due = self.fleet.absorb(payload)
                if due is not None:
                    self._replan_soon(due)
                update = None if replica is None else replica.current
        except Exception:
            logger.exception("rejected a telemetry batch that could not be ingested")
            self.fleet.rejected["bad_batch"] += 1
            batch = intake(payload, Counter())  # the sender, read again (the intake itself never raises)
            rid = None if batch is None else batch.replica_id
            inline = self._inline()
            update = self.fleet.thresholds(rid) if isinstance(rid, str) and inline else None
            if isinstance(rid, str) and not inline and rid in self.fleet.replicas:
                update = self.fleet.replicas[rid].current
        self._dirty = True
        if inline:
            self._persist_new_version()
        return None if update is None else encode(update)

    async def leave(self, replica_id: str) -> bool:
        """A replica shutting down on purpose (scale-down, rolling update) is forgotten at once, not after
        ``stale_replica_s`` of silence; its state is set aside like any forgotten replica's."""
        if not isinstance(replica_id, str) or not self.fleet.forget(replica_id):
            return False
        logger.info("replica %s left", replica_id)
        self._dirty = True
        return True

    # -- operator-facing (JSON) ------------------------------------------------

    async def snapshot(self) -> str:
        self._ensure_housekeeping()
        snap = self.fleet.snapshot()
        info = ControllerInfo(started_at=self.started_at, restored=self.restored)
        return snap.model_copy(update={"controller": info}).model_dump_json()

    async def history(self, limit: int | None = None) -> str:
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
        async with self._between_replans():
            try:
                version = self.fleet.set_override(replica, mode=mode, k=k, n=n, ttl_s=ttl_s, force=force)
            except OverrideError as exc:
                return OverrideResult(error=exc.field, message=exc.message).model_dump_json()
            self.persist(force=True)  # published already: persisted before any push is answered
        return OverrideResult(version=version, override=self.fleet.overrides.items[replica]).model_dump_json()

    async def clear_override(self, replica: str) -> str:
        async with self._between_replans():
            removed = self.fleet.clear_override(replica)
            if removed:
                self.persist(force=True)
        return ClearResult(removed=removed, version=self.fleet.version).model_dump_json()

    async def recompute(self) -> str:
        if self._inline():
            version = self.fleet.recompute("operator")
            self.persist(force=True)
        else:
            version = await self._replan("operator")
        return RecomputeResult(version=version, estimate=self.fleet.workload.estimate).model_dump_json()

    def _between_replans(self) -> contextlib.AbstractAsyncContextManager:
        """An operator's change waits for a background re-plan or snapshot to finish (nothing to wait for inline)."""
        return contextlib.nullcontext() if self._inline() else self._exclusive

    async def identity(self) -> str:
        """The code and configuration this controller runs (:func:`ebplus.controller.lifecycle.identity`)."""
        return self._identity

    async def checkpoint(self) -> int:
        """Persist the state now (an upgrade stops this controller next); returns the version persisted."""
        async with self._between_replans():
            self.persist(force=True)
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
            return await asyncio.wait_for(ref, timeout_s)
        except (TimeoutError, RayError) as exc:
            self._handle = None  # look it up again next time
            raise ControllerUnavailable(f"{type(exc).__name__}: {exc}".splitlines()[0]) from None
