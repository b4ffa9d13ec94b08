"""The EB+ replica: Ray Serve LLM's ``LLMServer`` plus the telemetry/threshold loop.

``LLMServer`` is a shim over vLLM's ``AsyncLLM``; we add one background task per
replica that, every ``telemetry_interval_s``:

1. drains the scheduler's telemetry (an engine-core utility call, see
   :mod:`replicas.control`),
2. pushes it to the controller actor and gets the replica's thresholds back,
3. applies them to the scheduler if their version changed.

Request handling never waits on this loop: the loop is its own asyncio task,
every controller call has a timeout, and a failed push keeps its records in a
bounded buffer (oldest dropped and counted) for the next try. If the controller
is down the scheduler keeps its last thresholds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from ebplus.controller.cost_model import CostModel
from ebplus.controller.telemetry import CompletionRecord, StepRecord, TelemetryBatch
from ebplus.replicas.control import EngineControl, to_completion, to_step
from ebplus.replicas.profiles import prior_for_device
from ray.serve.llm import LLMServer

# a child of Ray Serve's logger, so lines land in the replica's log with its id
logger = logging.getLogger("ray.serve.ebplus")

PUSH_TIMEOUT_S = 2.0


class TelemetryOutbox:
    """Records waiting to reach the controller, bounded; overflow drops the oldest and counts.

    Each record has a running index in this replica's stream of its kind;
    ``*_from`` is the index of the oldest record held. A batch carries it, so a
    controller that receives a timed-out push late skips what it already has.
    """

    def __init__(self, capacity: int) -> None:
        self.completions: deque[CompletionRecord] = deque(maxlen=capacity)
        self.steps: deque[StepRecord] = deque(maxlen=capacity)
        self.dropped_completions = 0
        self.dropped_steps = 0
        self.completions_from = 0
        self.steps_from = 0

    def add(self, completions: list, steps: list, dropped_completions: int = 0, dropped_steps: int = 0) -> None:
        for buf, items, kind in ((self.completions, completions, "completions"), (self.steps, steps, "steps")):
            overflow = max(0, len(buf) + len(items) - buf.maxlen)
            setattr(self, f"dropped_{kind}", getattr(self, f"dropped_{kind}") + overflow)
            setattr(self, f"{kind}_from", getattr(self, f"{kind}_from") + overflow)
            buf.extend(items)
        self.dropped_completions += dropped_completions
        self.dropped_steps += dropped_steps

    def batch(self, replica_id: str, applied_version: int, engine_stats: dict) -> TelemetryBatch:
        return TelemetryBatch(
            replica_id=replica_id,
            completions=tuple(self.completions),
            steps=tuple(self.steps),
            applied_version=applied_version,
            dropped_completions=self.dropped_completions,
            dropped_steps=self.dropped_steps,
            sent_at=time.time(),
            extra={"engine_stats": engine_stats},
            completions_from=self.completions_from,
            steps_from=self.steps_from,
        )

    def clear(self) -> None:
        """The controller has the batch: forget it (drop counters were reported with it)."""
        self.completions_from += len(self.completions)
        self.steps_from += len(self.steps)
        self.completions.clear()
        self.steps.clear()
        self.dropped_completions = 0
        self.dropped_steps = 0


class EBPlusServer(LLMServer):
    """``LLMServer`` whose engine runs the EB+ scheduler under the controller.

    Args:
        llm_config: Ray Serve LLM's config (engine kwargs select our scheduler).
        ebplus: our settings (``deploy.app.replica_settings``).
    """

    async def __init__(self, llm_config: Any, *, ebplus: dict, **kwargs: Any) -> None:
        self._ebplus = ebplus
        self._replica_id = _replica_id()
        self._outbox = TelemetryOutbox(int(ebplus["replicas"]["telemetry_buffer"]))
        self._control: EngineControl | None = None
        self._registered = False
        self._applied: dict = {}
        self._controller: Any = None
        self._loop_task: asyncio.Task | None = None
        self._pushes = 0
        self._push_failures = 0
        self._queue = (0, 0)  # (running, waiting) after the newest engine step seen
        await super().__init__(llm_config, **kwargs)

    async def start(self) -> None:
        await super().start()
        self._control = EngineControl(self.engine._engine_client)
        self._applied = await self._control.applied()
        self._loop_task = asyncio.get_running_loop().create_task(self._telemetry_loop())

    # -- the loop ------------------------------------------------------------

    async def _telemetry_loop(self) -> None:
        interval = float(self._ebplus["replicas"]["telemetry_interval_s"])
        while True:
            try:
                await self._push_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let telemetry kill the replica
                logger.exception("telemetry push failed on replica %s", self._replica_id)
            await asyncio.sleep(interval)

    async def _push_once(self) -> None:
        assert self._control is not None
        drained = await self._control.drain()
        steps = drained["steps"]
        self._queue = (int(steps[-1][2]), int(steps[-1][3])) if steps else (0, 0)
        self._outbox.add(
            [to_completion(c) for c in drained["completions"]],
            [to_step(s) for s in drained["steps"]],
            drained["dropped_completions"],
            drained["dropped_steps"],
        )
        controller = await self._controller_handle()
        if controller is None:
            return
        try:
            if not self._registered:
                await self._register(controller, drained)
            reply = await self._ingest(controller, drained)
            if reply is None:
                # The controller does not know us: it restarted (our saved state waits for us
                # to register) or forgot us. Register and send the same records again now, so
                # they are not lost and we converge within this push, not the next one.
                await self._register(controller, drained)
                reply = await self._ingest(controller, drained)
        except Exception as exc:  # controller restarting or slow: keep the records, keep serving
            self._push_failures += 1
            self._controller = None
            logger.warning("controller unreachable from %s: %s", self._replica_id, exc)
            return
        if reply is None:  # still unknown: keep the records, register again next time
            self._registered = False
            return
        self._pushes += 1
        self._outbox.clear()
        await self._apply(reply)

    async def _ingest(self, controller: Any, drained: dict) -> dict | None:
        batch = self._outbox.batch(self._replica_id, self._applied.get("version", 0), drained["stats"])
        return await asyncio.wait_for(controller.ingest.remote(batch), PUSH_TIMEOUT_S)

    async def _register(self, controller: Any, drained: dict) -> None:
        settings = self._ebplus
        prior: CostModel = prior_for_device(settings["replicas"], drained["device"])
        reply = await asyncio.wait_for(
            controller.register.remote(
                self._replica_id,
                settings["scheduler"]["mode"],
                drained["kv_capacity_tokens"],
                drained["max_num_seqs"],
                prior.model_dump(),
                drained["device"],
            ),
            PUSH_TIMEOUT_S,
        )
        self._registered = True
        await self._apply(reply)

    async def _apply(self, update: dict) -> None:
        if update == {key: self._applied.get(key) for key in update}:
            return  # already running exactly this
        assert self._control is not None
        self._applied = await self._control.apply(update)

    async def _controller_handle(self) -> Any:
        if self._controller is None:
            from ebplus.controller.actor import get_controller

            # a GCS round trip: off the event loop that streams responses
            self._controller = await asyncio.to_thread(get_controller)
        return self._controller

    # -- callable through the deployment handle ------------------------------

    async def ebplus_status(self) -> dict:
        """What this replica runs and how its telemetry channel is doing."""
        assert self._control is not None
        return {
            "replica_id": self._replica_id,
            "applied": await self._control.applied(),
            "registered": self._registered,
            "running": self._queue[0],
            "waiting": self._queue[1],
            "pushes": self._pushes,
            "push_failures": self._push_failures,
            "outbox": {"completions": len(self._outbox.completions), "steps": len(self._outbox.steps)},
        }


def _replica_id() -> str:
    """Serve's unique replica id, stable for the life of the replica actor."""
    from ray import serve

    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (tests): a process-unique id
        import os
        import uuid

        return f"local-{os.getpid()}-{uuid.uuid4().hex[:6]}"
