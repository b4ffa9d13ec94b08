"""The replica side of the control loop, once: drain -> batch -> push -> apply.

Every host of an EB+ engine runs the same cycle: take the scheduler's telemetry
(:class:`~ebplus.controller.messages.DrainReport`), add it to a bounded outbox,
push it to the controller (registering first, and again whenever the controller
does not know this replica - it restarted or forgot us), and apply the thresholds
the reply carries if they differ from what the scheduler runs. The Ray Serve
replica, the plain-vLLM plugin, the engine benchmark and the simulator all run
:meth:`TelemetryPump.cycle`.

The cycle is written once, without I/O: it is a generator that *yields* the calls
it needs (:class:`Drain`, :class:`Register`, :class:`Ingest`, :class:`Apply`) and
is sent their results. :func:`run` drives it synchronously (the simulator, an
in-process engine), :func:`arun` with ``await`` (a replica's event loop). A
controller that does not answer raises :class:`ControllerUnavailable` into the
cycle: the records stay in the outbox for the next push and the scheduler keeps
its thresholds - serving never waits on the controller.

Pure: no vLLM or Ray import.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from ebplus.controller.client import ControllerClient, ControllerUnavailable
from ebplus.controller.cost_model import CostModel
from ebplus.controller.messages import (
    CompletionRecord,
    DrainReport,
    EngineFacts,
    EngineStats,
    Mode,
    Registration,
    RunningRequest,
    StepRecord,
    TelemetryBatch,
    ThresholdUpdate,
)
from ebplus.replicas.sampling import ALL, Sampling, TelemetrySampler


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

    def add(self, report: DrainReport) -> None:
        for kind, items in (("completions", report.completions), ("steps", report.steps)):
            buf: deque = getattr(self, kind)
            overflow = max(0, len(buf) + len(items) - (buf.maxlen or 0))
            setattr(self, f"dropped_{kind}", getattr(self, f"dropped_{kind}") + overflow)
            setattr(self, f"{kind}_from", getattr(self, f"{kind}_from") + overflow)
            buf.extend(items)
        self.dropped_completions += report.dropped_completions
        self.dropped_steps += report.dropped_steps

    def batch(
        self,
        replica_id: str,
        applied_version: int,
        stats: EngineStats | None,
        running: list[RunningRequest] | None = None,
        running_total: int = -1,
        sent_at: float = 0.0,
        sampling: Sampling = ALL,
    ) -> TelemetryBatch:
        return TelemetryBatch(
            replica_id=replica_id,
            completions=list(self.completions),
            steps=list(self.steps),
            running=running or [],
            running_total=running_total if running is not None else -1,
            applied_version=applied_version,
            dropped_completions=self.dropped_completions,
            dropped_steps=self.dropped_steps,
            sent_at=sent_at,
            stats=stats,
            completions_from=self.completions_from,
            steps_from=self.steps_from,
            request_rate=sampling.requests,
            step_rate=sampling.steps,
        )

    def clear(self) -> None:
        """The controller has the batch: forget it (drop counters were reported with it)."""
        self.completions_from += len(self.completions)
        self.steps_from += len(self.steps)
        self.completions.clear()
        self.steps.clear()
        self.dropped_completions = 0
        self.dropped_steps = 0


# --------------------------------------------------------------------------- the calls a cycle makes


@dataclass(frozen=True)
class Drain:
    """Take the scheduler's telemetry: answered with a :class:`DrainReport`."""


@dataclass(frozen=True)
class Apply:
    """Install thresholds in the scheduler: answered with what it applied."""

    update: ThresholdUpdate


@dataclass(frozen=True)
class Register:
    """Introduce this replica to the controller: answered with its thresholds (``None``: refused)."""

    registration: Registration


@dataclass(frozen=True)
class Ingest:
    """Push a batch: answered with thresholds, or ``None`` if the controller does not know us."""

    batch: TelemetryBatch


Call = Drain | Apply | Register | Ingest
Cycle = Generator[Call, Any, None]


class TelemetryPump:
    """One replica's telemetry state and its push cycle.

    Args:
        replica_id: unique and stable for the life of the engine.
        mode: the configured mode (``auto``, ``mb``...), sent when registering.
        prior: the prior cost model for a device name (a replica picks it for its GPU).
        capacity: records the outbox holds per kind while the controller is away.
        clock: stamps batches (``sent_at``).
        model: the model the engine serves (sent when registering).
        sampling: the share of its requests and engine cycles it reports (:mod:`ebplus.replicas.sampling`).
    """

    def __init__(
        self,
        replica_id: str,
        mode: Mode,
        prior: Callable[[str], CostModel],
        capacity: int,
        clock: Callable[[], float] = time.time,
        sampling: Sampling = ALL,
        model: str = "",
    ) -> None:
        self.replica_id = replica_id
        self.model = model
        self.sampler = TelemetrySampler(sampling)
        self.mode = mode
        self.prior = prior
        self.clock = clock
        self.outbox = TelemetryOutbox(capacity)
        self.registered = False
        self.applied: ThresholdUpdate | None = None
        #: the thresholds of the first registration reply (a new replica of a running fleet gets its plan, not a cold one)
        self.first_update: ThresholdUpdate | None = None
        self.facts: EngineFacts | None = None
        self.report: DrainReport | None = None  # the newest drain (running/waiting, counters)
        self.pushes = 0
        self.push_failures = 0
        self.last_error = ""

    def cycle(self) -> Cycle:
        """One push: drain, (register,) ingest, apply. Drive it with :func:`run` or :func:`arun`."""
        report = yield Drain()
        self.report, self.facts, self.applied = report, report.facts, report.applied
        sampler = self.sampler
        if sampler.sampling != ALL:
            report = msgspec.structs.replace(
                report, completions=sampler.completions(report.completions), steps=sampler.steps(report.steps)
            )
        self.outbox.add(report)
        try:
            if not self.registered:
                yield from self._register()
            reply = yield Ingest(self._batch())
            if reply is None:
                # The controller does not know us: it restarted (our saved state waits for us
                # to register) or forgot us. Register and send the same records again now, so
                # they are not lost and we converge within this push, not the next one.
                yield from self._register()
                reply = yield Ingest(self._batch())
        except ControllerUnavailable as exc:  # slow, restarting or gone: keep the records, keep serving
            self.push_failures += 1
            self.last_error = str(exc)
            return
        if reply is None:  # still unknown: keep the records, register again next time
            self.registered = False
            return
        self.pushes += 1
        self.outbox.clear()
        yield from self._apply(reply)

    def _register(self) -> Cycle:
        assert self.facts is not None
        registration = Registration(
            replica_id=self.replica_id,
            mode=self.mode,
            facts=self.facts,
            prior=self.prior(self.facts.device),
            model=self.model,
            completions_from=self.outbox.completions_from,
            steps_from=self.outbox.steps_from,
        )
        update = yield Register(registration)
        if update is None:
            raise ControllerUnavailable("registration refused")
        self.registered = True
        if self.first_update is None:
            self.first_update = update
        yield from self._apply(update)

    def _apply(self, update: ThresholdUpdate) -> Cycle:
        if update != self.applied:
            self.applied = yield Apply(update)

    def _batch(self) -> TelemetryBatch:
        report = self.report
        assert report is not None and self.applied is not None
        running, total = self.sampler.running(report.running, report.running_total)
        return self.outbox.batch(
            self.replica_id,
            self.applied.version,
            report.stats,
            running=running,
            running_total=total,
            sent_at=self.clock(),
            sampling=self.sampler.sampling,
        )


# --------------------------------------------------------------------------- drivers


class AsyncEngine(Protocol):
    async def drain(self) -> DrainReport: ...
    async def apply(self, update: ThresholdUpdate) -> ThresholdUpdate: ...


async def arun(cycle: Cycle, engine: AsyncEngine, controller: ControllerClient, timeout_s: float) -> None:
    """Drive one cycle to its end on an event loop; every controller call under ``timeout_s``."""
    reply: Any = None
    failure: ControllerUnavailable | None = None
    while True:
        try:
            call = cycle.throw(failure) if failure is not None else cycle.send(reply)
        except StopIteration:
            return
        reply, failure = None, None
        if isinstance(call, Drain):
            reply = await engine.drain()
        elif isinstance(call, Apply):
            reply = await engine.apply(call.update)
        else:
            try:
                if isinstance(call, Register):
                    reply = await controller.register(call.registration, timeout_s)
                else:
                    reply = await controller.ingest(call.batch, timeout_s)
            except ControllerUnavailable as exc:
                failure = exc


async def arun_forever(
    pump: TelemetryPump,
    engine: AsyncEngine,
    controller: ControllerClient,
    interval_s: float,
    timeout_s: float,
    log: logging.Logger,
    engine_stopped: Callable[[], bool] = lambda: False,
) -> None:
    """A replica's telemetry task: :meth:`TelemetryPump.cycle` every ``interval_s`` until cancelled.

    Nothing a cycle meets ends the task (serving must not depend on it): an error is
    logged and the next cycle runs; an unreachable controller is logged as a warning.
    The one exception: a cycle that fails once ``engine_stopped()`` says the engine is
    gone (shutting down, or dead - the server reports that itself) ends the task quietly.
    """
    while True:
        failures = pump.push_failures
        try:
            await arun(pump.cycle(), engine, controller, timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # never let telemetry kill the replica
            if engine_stopped():
                log.info("engine stopped: the telemetry of replica %s stops", pump.replica_id)
                return
            log.exception("telemetry push failed on replica %s", pump.replica_id)
        if pump.push_failures > failures:
            log.warning("controller unreachable from %s: %s", pump.replica_id, pump.last_error)
        await asyncio.sleep(interval_s)
