"""The control loop in one process: an in-process :class:`FleetController` driven synchronously.

The simulator, the profiler's and the benchmarks' in-process engines and the tests run the
replica's own :class:`~ebplus.replicas.pump.TelemetryPump` cycle against a controller in
the same process. Serving never does (a replica talks to the controller actor through
:func:`ebplus.replicas.pump.arun`), so these drivers live with the simulator.
"""

from __future__ import annotations

from typing import Any, Protocol

from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import DrainReport, Registration, TelemetryBatch, ThresholdUpdate, decode, encode
from ebplus.replicas.pump import Apply, Cycle, Drain, Register


class SyncEngine(Protocol):
    def drain(self) -> DrainReport: ...
    def apply(self, update: ThresholdUpdate) -> ThresholdUpdate: ...


class LocalController:
    """An in-process :class:`FleetController` as the cycle's controller (simulator, engine benchmark).

    Nothing can time out, but every message crosses the codec as it does between a
    replica and the controller actor, so the controller checks what it hears by the
    same rules, and the simulator measures the loop as deployed.
    """

    def __init__(self, fleet: FleetController) -> None:
        self.fleet = fleet

    def register(self, registration: Registration) -> ThresholdUpdate | None:
        return _reply(self.fleet.register(decode(encode(registration), Registration)))

    def ingest(self, batch: TelemetryBatch) -> ThresholdUpdate | None:
        return _reply(self.fleet.ingest(encode(batch)))


def _reply(update: ThresholdUpdate | None) -> ThresholdUpdate | None:
    return None if update is None else decode(encode(update), ThresholdUpdate)


def run(cycle: Cycle, engine: SyncEngine, controller: LocalController) -> None:
    """Drive one cycle to its end, synchronously."""
    reply: Any = None
    while True:
        try:
            call = cycle.send(reply)
        except StopIteration:
            return
        if isinstance(call, Drain):
            reply = engine.drain()
        elif isinstance(call, Apply):
            reply = engine.apply(call.update)
        elif isinstance(call, Register):
            reply = controller.register(call.registration)
        else:
            reply = controller.ingest(call.batch)
