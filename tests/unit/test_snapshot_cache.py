"""Operator reads of the controller (``/metrics`` scrapes, ``/admin`` reads) share one snapshot for a short while.

Each read was a fresh ``FleetController.snapshot()`` on the event loop that answers replica pushes;
now a read within ``SNAPSHOT_TTL_S`` of the last one, with no decision, registration or departure
between, gets the same snapshot.
"""

from __future__ import annotations

import asyncio

import pytest
from factories import registration

from ebplus.controller import actor as actor_module
from ebplus.controller.actor import ControllerActor
from ebplus.controller.config import ControllerConfig
from ebplus.controller.messages import encode


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> tuple[ControllerActor, list[float], list[int]]:
    actor = ControllerActor(ControllerConfig(), housekeeping=False)
    now, taken = [100.0], [0]
    monkeypatch.setattr(actor_module.time, "monotonic", lambda: now[0])
    snapshot = actor.fleet.snapshot

    def counting():
        taken[0] += 1
        return snapshot()

    monkeypatch.setattr(actor.fleet, "snapshot", counting)
    return actor, now, taken


def test_reads_within_the_ttl_share_a_snapshot(counted) -> None:
    actor, now, taken = counted
    first = asyncio.run(actor.snapshot())
    assert [asyncio.run(actor.snapshot()) for _ in range(20)] == [first] * 20 and taken[0] == 1
    actor.view(), actor.view()
    assert taken[0] == 2  # the plugin's synchronous reader keeps its own
    now[0] += actor_module.SNAPSHOT_TTL_S
    asyncio.run(actor.snapshot())
    assert taken[0] == 3


def test_a_decision_or_a_registration_is_seen_at_once(counted) -> None:
    actor, _, taken = counted
    asyncio.run(actor.snapshot())
    asyncio.run(actor.register(encode(registration("r0"))))
    assert '"r0"' in asyncio.run(actor.snapshot()) and taken[0] == 2
    asyncio.run(actor.set_override("r0", k=2))
    assert '"k":2' in asyncio.run(actor.snapshot()).replace(" ", "") and taken[0] == 3
