"""The controller as a Ray actor: one named, restartable actor per deployment.

``ebplus-controller`` in the Ray namespace ``ebplus`` wraps the pure
:class:`~controller.fleet.FleetController`. Replicas push telemetry with
``ingest`` and get their thresholds back in the reply; the ingress reads
``snapshot``/``history`` for ``/admin`` and ``/metrics`` and forwards operator
overrides. The actor persists its state (Ray's internal KV store, or a file in
``state_dir``) so that a restart (``max_restarts``) resumes without a cold start.

Every method returns plain data (dicts), never raises to the caller for bad
input: errors come back as ``{"error": field, "message": ...}`` so the ingress
can answer 422 without unpacking Ray exceptions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ebplus.controller.cost_model import CostModel
from ebplus.controller.fleet import ControllerConfig, FleetController, OverrideError
from ebplus.controller.telemetry import TelemetryBatch

ACTOR_NAME = "ebplus-controller"
NAMESPACE = "ebplus"
STATE_KEY = b"ebplus-controller-state"

logger = logging.getLogger("ebplus.controller")


class StateStore:
    """Where the controller's snapshot lives: a file in ``state_dir``, else Ray's internal KV."""

    def __init__(self, state_dir: str | None, key: bytes = STATE_KEY) -> None:
        self.path = None if state_dir is None else Path(state_dir) / "controller-state.json"
        self.key = key

    def load(self) -> dict | None:
        try:
            if self.path is not None:
                return json.loads(self.path.read_text()) if self.path.exists() else None
            from ray.experimental.internal_kv import _internal_kv_get

            raw = _internal_kv_get(self.key)
            return None if raw is None else json.loads(raw)
        except (OSError, ValueError) as exc:
            logger.warning("ignoring unreadable controller state: %s", exc)
            return None

    def save(self, state: dict) -> None:
        data = json.dumps(state, separators=(",", ":"))
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # write-then-rename: a crash mid-write never leaves a torn file
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".controller-state.")
            with os.fdopen(fd, "w") as fh:
                fh.write(data)
            os.replace(tmp, self.path)
            return
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(self.key, data.encode(), overwrite=True)

    def clear(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            return
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(self.key)


class ControllerActor:
    """Ray actor body (decorated by :func:`start_controller`).

    Args:
        config: the ``controller:`` section of the deployment config, as a dict.
        state_dir: see :class:`StateStore`.
        stale_replica_s: replicas silent this long are forgotten.
        persist_every_s: minimum interval between snapshots.
        housekeeping: run the background persist/forget loop (off when driven in-process by tests).
    """

    def __init__(
        self,
        config: dict | None = None,
        state_dir: str | None = None,
        stale_replica_s: float = 60.0,
        persist_every_s: float = 2.0,
        housekeeping: bool = True,
    ) -> None:
        self.fleet = FleetController(ControllerConfig.model_validate(config or {}))
        self.housekeeping = housekeeping
        self.store = StateStore(state_dir)
        self.stale_replica_s = stale_replica_s
        self.persist_every_s = persist_every_s
        self.started_at = time.time()
        self.restored = False
        saved = self.store.load()
        if saved is not None:
            try:
                self.fleet.restore(saved)
                self.restored = True
                logger.info("controller resumed at version %d", self.fleet.version)
            except (KeyError, TypeError, ValueError) as exc:
                logger.warning("controller state not restorable, starting cold: %s", exc)
                self.fleet = FleetController(self.fleet.config)
        self._dirty = False
        self._persisted_version = self.fleet.version
        self._housekeeping: asyncio.Task | None = None

    def _ensure_housekeeping(self) -> None:
        # started lazily: the actor's event loop is not running in __init__
        if self.housekeeping and (self._housekeeping is None or self._housekeeping.done()):
            self._housekeeping = asyncio.get_running_loop().create_task(self._housekeep())

    async def _housekeep(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.persist_every_s)
            now = time.monotonic()
            late, last = now - last - self.persist_every_s, now
            try:
                if late > 1.0:
                    # We were not running (process stopped, machine starved): the replicas'
                    # pushes queued up unanswered, so that silence is ours, not theirs.
                    logger.warning("controller was paused for %.1f s; replicas are not blamed for it", late)
                    self.fleet.grace(late)
                for rid in self.fleet.forget_stale(self.stale_replica_s):
                    logger.info("forgot silent replica %s", rid)
                    self._dirty = True
                self.persist()
            except Exception:  # keep the loop alive whatever happens
                logger.exception("controller housekeeping failed")

    def persist(self, force: bool = False) -> None:
        if force or self._dirty or self.fleet.version != self._persisted_version:
            self.store.save(self.fleet.state())
            self._persisted_version = self.fleet.version
            self._dirty = False

    # -- replica-facing ----------------------------------------------------

    async def register(
        self,
        replica_id: str,
        mode: str,
        kv_capacity_tokens: int,
        max_num_seqs: int,
        prior: dict,
        device: str = "",
    ) -> dict:
        """Add a replica; returns the thresholds it should apply (``ThresholdUpdate.as_dict``)."""
        self._ensure_housekeeping()
        update = self.fleet.register(
            replica_id, mode, int(kv_capacity_tokens), int(max_num_seqs), CostModel.model_validate(prior), device
        )
        self._dirty = True
        return update.as_dict()

    async def ingest(self, batch: TelemetryBatch) -> dict | None:
        """Absorb a telemetry batch; returns the sender's thresholds, or ``None`` if unknown.

        Never raises: a replica keeps a batch whose push failed and sends it again,
        so a batch that made ``ingest`` raise would block that replica's telemetry
        for good. Such a batch is counted (``bad_batch``) and dropped.
        """
        self._ensure_housekeeping()
        try:
            update = self.fleet.ingest(batch)
        except Exception:
            logger.exception("rejected a telemetry batch that could not be ingested")
            self.fleet.rejected["bad_batch"] += 1
            rid = getattr(batch, "replica_id", None)
            update = self.fleet.thresholds(rid) if isinstance(rid, str) else None
        self._dirty = True
        if self.fleet.version != self._persisted_version:
            # A new decision is persisted before any replica hears of it: a restart then
            # never re-issues a published version number with different thresholds.
            # (One snapshot per re-estimation, every update_every completions: cheap.)
            try:
                self.persist()
            except Exception:  # the store is down: serve on, the housekeeping loop retries
                logger.exception("could not persist the controller state")
        return None if update is None else update.as_dict()

    # -- operator-facing ---------------------------------------------------

    async def snapshot(self) -> dict:
        self._ensure_housekeeping()
        snap = self.fleet.snapshot()
        snap["controller"] = {"started_at": self.started_at, "restored": self.restored}
        return snap

    async def history(self, limit: int | None = None) -> list[dict]:
        return self.fleet.history_view(limit)

    async def set_override(
        self,
        replica: str,
        mode: str | None = None,
        k: int | None = None,
        n: int | None = None,
        ttl_s: float | None = None,
        force: bool = False,
    ) -> dict[str, Any]:
        try:
            version = self.fleet.set_override(replica, mode=mode, k=k, n=n, ttl_s=ttl_s, force=force)
        except OverrideError as exc:
            return {"error": exc.field, "message": exc.message}
        self.persist(force=True)
        return {"version": version, "override": self.fleet.overrides[replica].as_dict()}

    async def clear_override(self, replica: str) -> dict[str, Any]:
        removed = self.fleet.clear_override(replica)
        if removed:
            self.persist(force=True)
        return {"removed": removed, "version": self.fleet.version}

    async def recompute(self) -> dict[str, Any]:
        version = self.fleet.recompute("operator")
        self.persist(force=True)
        return {"version": version, "estimate": self.fleet.snapshot()["estimate"]}

    async def ping(self) -> dict[str, Any]:
        """Liveness: version, known replicas, whether state was resumed, and the actor's pid
        (fault-injection tests stop and continue that process)."""
        return {
            "version": self.fleet.version,
            "replicas": len(self.fleet.replicas),
            "restored": self.restored,
            "pid": os.getpid(),
        }


def controller_options(max_restarts: int = -1) -> dict[str, Any]:
    """Ray actor options of the controller: named, detached, restartable, tiny."""
    return {
        "name": ACTOR_NAME,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
        "max_restarts": max_restarts,
        "max_task_retries": 0,  # a replica's next push is the retry; never double-ingest
        "num_cpus": 0,
        "max_concurrency": 64,
    }


def start_controller(
    config: dict | None = None,
    state_dir: str | None = None,
    stale_replica_s: float = 60.0,
    persist_every_s: float = 2.0,
    max_restarts: int = -1,
):
    """Create the controller actor, or return the running one (``get_if_exists``)."""
    import ray

    cls = ray.remote(ControllerActor)
    return cls.options(**controller_options(max_restarts)).remote(
        config, state_dir, stale_replica_s, persist_every_s
    )


def get_controller():
    """Handle to the running controller, or ``None`` if it does not exist (yet)."""
    import ray

    try:
        return ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return None
