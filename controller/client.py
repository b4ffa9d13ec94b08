"""Typed calls to the controller, wherever it runs.

:class:`ControllerClient` turns the controller service's wire methods
(:class:`~ebplus.controller.actor.ControllerActor`: msgpack bytes for replicas,
JSON for views) back into typed objects. Its transport is either the named Ray
actor (:class:`~ebplus.controller.actor.RayTransport`: resolved lazily, every call
under a timeout, a restart is transparent) or an in-process service
(:class:`LocalTransport`: the plain-vLLM plugin, tests). Pure: no Ray import. Replicas, the admin API and ``ebplus`` tools all talk
to the controller through it, so each wire format is parsed in one place.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import TypeAdapter

from ebplus.controller.messages import (
    Registration,
    RoutingHints,
    TelemetryBatch,
    ThresholdUpdate,
    WireError,
    decode,
    encode,
)
from ebplus.controller.scaling import ScalingDecision
from ebplus.controller.views import ClearResult, Decision, FleetSnapshot, OverrideResult, Ping, RecomputeResult

#: Seconds an operator-facing call may take (the admin API answers 503 after it).
CALL_TIMEOUT_S = 5.0

_DECISIONS = TypeAdapter(list[Decision])
_SCALING = TypeAdapter(list[ScalingDecision])


class ControllerUnavailable(Exception):
    """The controller did not answer (restarting, or gone)."""


class Transport(Protocol):
    async def call(self, method: str, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """The result of ``method`` on the controller; :class:`ControllerUnavailable` if it does not answer."""
        ...


class LocalTransport:
    """An in-process :class:`~ebplus.controller.actor.ControllerActor`."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def call(self, method: str, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        return await getattr(self.actor, method)(*args, **kwargs)


class ControllerClient:
    """Typed controller calls over a :class:`Transport`.

    Args:
        transport: where the controller is.
        timeout_s: limit of operator-facing calls (replica-facing ones take theirs per call).
    """

    def __init__(self, transport: Transport, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.transport = transport
        self.timeout_s = timeout_s

    async def _call(self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        return await self.transport.call(method, *args, timeout_s=timeout_s or self.timeout_s, **kwargs)

    # -- replicas

    async def register(self, registration: Registration, timeout_s: float) -> ThresholdUpdate | None:
        reply = await self._call("register", encode(registration), timeout_s=timeout_s)
        return None if reply is None else _update(reply)

    async def ingest(self, batch: TelemetryBatch, timeout_s: float) -> ThresholdUpdate | None:
        """The sender's thresholds; ``None`` when the controller does not know the replica (register again)."""
        reply = await self._call("ingest", encode(batch), timeout_s=timeout_s)
        return None if reply is None else _update(reply)

    async def leave(self, replica_id: str, timeout_s: float) -> bool:
        """A replica going away on purpose: the controller forgets it now; whether it knew it."""
        return bool(await self._call("leave", replica_id, timeout_s=timeout_s))

    async def routing_hints(self) -> RoutingHints:
        """What the routers' phase boards take from the controller (:class:`RoutingHints`)."""
        try:
            return decode(await self._call("routing_hints"), RoutingHints)
        except WireError as exc:
            raise ControllerUnavailable(f"unreadable reply: {exc}") from None

    # -- operators

    async def snapshot(self) -> FleetSnapshot:
        return FleetSnapshot.model_validate_json(await self._call("snapshot"))

    async def history(self, limit: int | None = None) -> list[Decision]:
        return _DECISIONS.validate_json(await self._call("history", limit))

    async def scaling_decisions(self, limit: int | None = None) -> list[ScalingDecision]:
        """Policy-first autoscaling's newest decisions, oldest first."""
        return _SCALING.validate_json(await self._call("scaling_decisions", limit))

    async def set_override(self, replica: str, **fields: Any) -> OverrideResult:
        return OverrideResult.model_validate_json(await self._call("set_override", replica, **fields))

    async def clear_override(self, replica: str) -> ClearResult:
        return ClearResult.model_validate_json(await self._call("clear_override", replica))

    async def recompute(self) -> RecomputeResult:
        return RecomputeResult.model_validate_json(await self._call("recompute"))

    async def ping(self) -> Ping:
        return Ping.model_validate_json(await self._call("ping"))


def _update(reply: bytes) -> ThresholdUpdate:
    try:
        return decode(reply, ThresholdUpdate)
    except WireError as exc:
        raise ControllerUnavailable(f"unreadable reply: {exc}") from None
