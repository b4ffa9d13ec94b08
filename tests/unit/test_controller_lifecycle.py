"""The controller's life across changes: upgraded only when its code or config changed; replicas that leave are forgotten at once."""

from __future__ import annotations

import asyncio

from factories import registration

from ebplus.controller.actor import ControllerActor
from ebplus.controller.client import ControllerClient, LocalTransport
from ebplus.controller.config import ControllerConfig
from ebplus.controller.lifecycle import identity


def test_a_controller_is_upgraded_only_when_its_code_or_config_changed() -> None:
    assert identity(ControllerConfig()) == identity(ControllerConfig())
    assert identity(ControllerConfig()) != identity(ControllerConfig(update_every=50))
    assert identity(ControllerConfig()) != identity(ControllerConfig(placement="any"))


def test_a_replica_that_leaves_is_forgotten_at_once_and_set_aside(tmp_path) -> None:
    """Scale-down and rolling updates: the draining replica says goodbye instead of going silent for
    stale_replica_s; its plan is kept aside like any forgotten replica's."""
    actor = ControllerActor(ControllerConfig(state_dir=str(tmp_path), stale_replica_s=600), housekeeping=False)
    actor.fleet.register(registration("r1"))
    actor.fleet.register(registration("r2"))
    client = ControllerClient(LocalTransport(actor))

    async def run() -> list:
        return [await client.leave("r1", 1.0), await client.leave("r1", 1.0), await client.leave("nobody", 1.0)]

    assert asyncio.run(run()) == [True, False, False]
    assert sorted(actor.fleet.replicas) == ["r2"] and "r1" in actor.fleet.saved
    assert asyncio.run(actor.leave(None)) is False  # type: ignore[arg-type]  # nothing a caller sends raises
