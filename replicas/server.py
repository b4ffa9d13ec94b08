"""The EB+ replica: Ray Serve LLM's ``LLMServer`` plus the telemetry/threshold loop.

``LLMServer`` is a shim over vLLM's ``AsyncLLM``; we add one background task per
replica that runs :meth:`~ebplus.replicas.pump.TelemetryPump.cycle` every
``telemetry_interval_s``: drain the scheduler (an engine-core utility call,
:mod:`ebplus.replicas.control`), push to the controller actor, apply the
thresholds of the reply if they changed.

Request handling never waits on this loop: the loop is its own asyncio task,
every controller call has a timeout, and a failed push keeps its records in a
bounded outbox (oldest dropped and counted) for the next try. If the controller
is down the scheduler keeps its last thresholds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ray.serve.llm import LLMServer
from ray.serve.llm.openai_api_models import ErrorResponse

from ebplus.controller.actor import RayTransport
from ebplus.controller.client import ControllerClient
from ebplus.controller.messages import Mode
from ebplus.controller.views import ThresholdsView
from ebplus.replicas import board, niceness
from ebplus.replicas.budget import OutputBudget
from ebplus.replicas.cancellation import guard_add_request, read_when_read
from ebplus.replicas.config import ReplicaSection
from ebplus.replicas.control import EngineControl
from ebplus.replicas.heartbeat import with_heartbeats
from ebplus.replicas.lora import AdapterLoader
from ebplus.replicas.profiles import prior_for_device
from ebplus.replicas.pump import TelemetryPump, arun, arun_forever

# a child of Ray Serve's logger, so lines land in the replica's log with its id
logger = logging.getLogger("ray.serve.ebplus")

PUSH_TIMEOUT_S = 2.0


class EBPlusServer(LLMServer):
    """``LLMServer`` whose engine runs the EB+ scheduler under the controller.

    Args:
        llm_config: Ray Serve LLM's config (engine kwargs select our scheduler).
        replicas: the deployment config's ``replicas`` section.
        mode: the configured scheduler mode (registered with the controller).
    """

    async def __init__(
        self,
        llm_config: Any,
        *,
        replicas: ReplicaSection,
        mode: Mode,
        prepare_model: Callable[[], Path] | None = None,
        **kwargs: Any,
    ) -> None:
        if prepare_model is not None:  # a model to build on this node first (the app builder says which)
            path = await asyncio.to_thread(prepare_model)
            llm_config.model_loading_config.model_source = str(path)
        self._section = replicas
        self._pump = TelemetryPump(
            _replica_id(),
            mode,
            prior=lambda device: prior_for_device(replicas, device),
            capacity=replicas.telemetry_buffer,
            sampling=replicas.telemetry_sampling.sampling(),
            model=llm_config.model_id,
        )
        self._control: EngineControl | None = None
        self._controller = ControllerClient(RayTransport())
        self._loop_task: asyncio.Task | None = None
        self._board_task: asyncio.Task | None = None
        self._budget = OutputBudget(0, 0)  # set at start(), from the engine
        kwargs.setdefault("model_downloader", AdapterLoader)  # adapters from a local directory, too
        await super().__init__(llm_config, **kwargs)

    async def start(self) -> None:
        with niceness.while_starting(self._section.engine_niceness, self._section.accelerator):
            await super().start()
        client = self.engine._engine_client
        guard_add_request(client)  # a client gone while its request is added leaves no work behind
        self._budget = OutputBudget.for_engine(client.vllm_config, self._section.max_request_output)
        self._control = EngineControl(client)
        loop = asyncio.get_running_loop()
        self._loop_task = loop.create_task(self._telemetry_loop())
        routing = self._section.routing
        if routing.uses_board:  # a router reads this replica's phase board
            publish = board.publish_forever(self._pump.replica_id, self._control.board, routing.board_interval_s)
            self._board_task = loop.create_task(publish)

    async def _telemetry_loop(self) -> None:
        assert self._control is not None
        interval = self._section.telemetry_interval_s
        await arun_forever(self._pump, self._control, self._controller, interval, PUSH_TIMEOUT_S, logger)

    async def __del__(self) -> None:
        """Serve's graceful shutdown (a scale-down, a rolling update), after the replica drained.

        The last telemetry is pushed and the controller is told this replica is
        leaving, so it forgets it now rather than after ``stale_replica_s`` of
        silence. A controller that does not answer changes nothing: it forgets the
        replica when it falls silent, as it does one that crashed.
        """
        for task in (self._loop_task, self._board_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._loop_task = self._board_task = None
        if self._section.routing.uses_board:
            await board.leave(self._pump.replica_id)
        if self._control is not None:
            try:
                await arun(self._pump.cycle(), self._control, self._controller, PUSH_TIMEOUT_S)
                await self._controller.leave(self._pump.replica_id, PUSH_TIMEOUT_S)
            except Exception as exc:  # never let the goodbye block the shutdown
                logger.warning("replica %s could not say goodbye to the controller: %s", self._pump.replica_id, exc)
        await super().__del__()

    # -- callable through the deployment handle ------------------------------

    async def chat(self, request: Any, raw_request_info: Any = None) -> Any:
        """``LLMServer.chat`` for a request within the output budget; a 400 naming the limit otherwise."""
        refused = self._refuse(request)
        return refused if refused is not None else await super().chat(request, raw_request_info)

    async def completions(self, request: Any, raw_request_info: Any = None) -> Any:
        """``LLMServer.completions`` within the output budget, as :meth:`chat`."""
        refused = self._refuse(request)
        return refused if refused is not None else await super().completions(request, raw_request_info)

    def _batch_output_stream(self, generator: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Ray Serve LLM's batched stream, made when first read (:func:`~ebplus.replicas.cancellation.read_when_read`)."""
        return read_when_read(super()._batch_output_stream, generator)

    def _refuse(self, request: Any) -> AsyncIterator[Any] | None:
        problem = self._budget.problem(lambda name: getattr(request, name, None))
        if problem is None:
            return None
        error = ErrorResponse(error={"message": problem, "type": "BadRequestError", "code": 400})

        async def answer() -> AsyncIterator[Any]:
            yield error

        return answer()

    async def chat_with_heartbeats(self, request: Any, raw_request_info: Any = None) -> Any:
        """``chat`` with :data:`~ebplus.replicas.heartbeat.HEARTBEAT` items while it has nothing to send
        (the EB+ ingress asks for them, to notice a lost replica within its stall deadline)."""
        return with_heartbeats(await self.chat(request, raw_request_info), self._section.heartbeat_s)

    async def completions_with_heartbeats(self, request: Any, raw_request_info: Any = None) -> Any:
        """``completions`` with heartbeats, as :meth:`chat_with_heartbeats`."""
        return with_heartbeats(await self.completions(request, raw_request_info), self._section.heartbeat_s)

    async def ebplus_status(self) -> dict[str, Any]:
        """What this replica runs and how its telemetry channel is doing (JSON-able)."""
        assert self._control is not None
        pump = self._pump
        report = pump.report
        applied = await self._control.applied()
        return {
            "replica_id": pump.replica_id,
            "applied": ThresholdsView.of(applied).model_dump(mode="json"),
            "first_update": None
            if pump.first_update is None
            else ThresholdsView.of(pump.first_update).model_dump(mode="json"),
            "registered": pump.registered,
            "running": 0 if report is None else report.running_total,
            "waiting": 0 if report is None else report.waiting_total,
            "pushes": pump.pushes,
            "push_failures": pump.push_failures,
            "outbox": {"completions": len(pump.outbox.completions), "steps": len(pump.outbox.steps)},
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
