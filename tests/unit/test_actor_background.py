"""The controller actor of a large fleet: pushes answered while a re-plan runs, new versions persisted first.

``inline_replicas=0`` puts a three-replica fleet on the path a 256-replica one
takes: a push only absorbs its telemetry; re-plans run on the event loop in pieces,
between pushes; every version a replica hears of was persisted before.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
from factories import batch, registration

from ebplus.controller import persistence
from ebplus.controller.actor import ControllerActor, StateStore
from ebplus.controller.config import ControllerConfig
from ebplus.controller.messages import CompletionRecord, FinishReason, StepRecord, ThresholdUpdate, decode, encode

REPLICAS = ("r0", "r1", "r2")


def make_actor(tmp_path: Path, **config: object) -> tuple[ControllerActor, list[int]]:
    """An actor whose store records the version of every state it writes, in order."""
    cfg = ControllerConfig(update_every=60, first_update=60, min_samples=10, state_dir=str(tmp_path), **config)
    actor = ControllerActor(cfg, housekeeping=False, inline_replicas=0)
    saved: list[int] = []
    save = actor.store.save_bytes

    def recording(data: bytes) -> None:
        save(data)
        saved.append(json.loads(data)["version"])

    actor.store.save_bytes = recording  # type: ignore[method-assign]
    return actor, saved


def push(rid: str, rng: np.random.Generator, n: int = 30) -> bytes:
    comps = [CompletionRecord(200, int(o), FinishReason.STOP) for o in rng.geometric(1 / 80, n)]
    steps = [StepRecord(0, 400, 400, 100, 0.02 + 1e-4 * i) for i in range(n)]
    return batch(rid, comps, steps)


async def settle(actor: ControllerActor) -> None:
    """Wait for the background re-plans to finish."""
    while actor._replanner is not None and not actor._replanner.done():
        await asyncio.sleep(0)


def test_pushes_are_answered_at_once_and_hear_only_persisted_versions(tmp_path: Path) -> None:
    actor, saved = make_actor(tmp_path)
    rng = np.random.default_rng(0)

    async def scenario() -> list[int]:
        for rid in REPLICAS:
            await actor.register(encode(registration(rid, kv_capacity_tokens=500_000, max_num_seqs=512)))
        heard = []
        for i in range(60):
            reply = decode(await actor.ingest(push(REPLICAS[i % 3], rng)), ThresholdUpdate)
            # a replica only ever hears of a version that is stored: a restart cannot re-issue it
            assert reply.version == 0 or reply.version <= max(saved, default=0)
            heard.append(reply.version)
            await asyncio.sleep(0)  # one turn of the loop between pushes, as separate calls arrive
        await settle(actor)
        # after the re-plans: the next push hears the newest stored version (on a fast machine all
        # 60 pushes above can be answered before the first background re-plan is stored)
        heard.append(decode(await actor.ingest(push(REPLICAS[0], rng, n=1)), ThresholdUpdate).version)
        await settle(actor)
        return heard

    heard = asyncio.run(scenario())
    # updates due while a re-plan runs coalesce into the next: how many re-plans run depends on the
    # machine's speed, but the first one's and at least one more (the coalesced ones) always do
    assert actor.fleet.updates >= 2 and heard[-1] > 0
    assert heard[1] == 0  # the push that made the first update due was answered before it was planned
    assert saved == sorted(saved) and saved[-1] == actor.fleet.version
    stored = persistence.parse(StateStore(str(tmp_path)).load())
    assert stored.version == actor.fleet.version and set(stored.replicas) == set(REPLICAS)


def test_a_push_during_a_replan_is_absorbed_and_answered_before_the_replan_ends(tmp_path: Path) -> None:
    actor, saved = make_actor(tmp_path)
    rng = np.random.default_rng(1)

    async def scenario() -> None:
        for rid in REPLICAS:
            await actor.register(encode(registration(rid, kv_capacity_tokens=500_000, max_num_seqs=512)))
        for i in range(9):
            await actor.ingest(push(REPLICAS[i % 3], rng))
        await settle(actor)
        before = actor.fleet.version
        replan = asyncio.ensure_future(actor.recompute())
        while not actor._exclusive.locked():
            await asyncio.sleep(0)
        received = actor.fleet.received["completions"]
        assert actor.fleet.version == before  # still planning: the version moves when every replica is planned
        reply = decode(await actor.ingest(push("r1", rng)), ThresholdUpdate)
        assert not replan.done() and actor._exclusive.locked()  # answered in the middle of the re-plan
        assert actor.fleet.received["completions"] == received + 30 and reply.version == before
        result = json.loads(await replan)
        assert result["version"] == before + 1 == actor.fleet.version == saved[-1]

    asyncio.run(scenario())


def test_operator_changes_wait_for_a_replan_and_are_persisted_before_they_are_answered(tmp_path: Path) -> None:
    actor, saved = make_actor(tmp_path)
    rng = np.random.default_rng(2)

    async def scenario() -> None:
        for rid in REPLICAS:
            await actor.register(encode(registration(rid, kv_capacity_tokens=500_000, max_num_seqs=512)))
        for i in range(9):
            await actor.ingest(push(REPLICAS[i % 3], rng))
        replan = asyncio.ensure_future(actor.recompute())
        while not actor._exclusive.locked():
            await asyncio.sleep(0)
        override = json.loads(await actor.set_override("r2", k=3))
        assert replan.done()  # it waited for the re-plan to finish
        assert override["version"] == actor.fleet.version == saved[-1]
        reply = decode(await actor.ingest(push("r2", rng)), ThresholdUpdate)
        assert reply.k == 3 and reply.version == override["version"]
        cleared = json.loads(await actor.clear_override("r2"))
        assert cleared["removed"] and cleared["version"] == saved[-1]

    asyncio.run(scenario())


def test_a_restarted_controller_resumes_a_background_fleet_where_it_was(tmp_path: Path) -> None:
    actor, _ = make_actor(tmp_path)
    rng = np.random.default_rng(3)

    async def feed(a: ControllerActor) -> None:
        for rid in REPLICAS:
            await a.register(encode(registration(rid, kv_capacity_tokens=500_000, max_num_seqs=512)))
        for i in range(30):
            await a.ingest(push(REPLICAS[i % 3], rng))
            await asyncio.sleep(0)
        await settle(a)

    asyncio.run(feed(actor))
    restarted, _ = make_actor(tmp_path)
    assert restarted.restored and restarted.fleet.version == actor.fleet.version

    async def again() -> ThresholdUpdate:
        await restarted.register(encode(registration("r0", kv_capacity_tokens=500_000, max_num_seqs=512)))
        return decode(await restarted.ingest(push("r0", rng)), ThresholdUpdate)

    reply = asyncio.run(again())
    assert (reply.version, reply.k, reply.n) == (actor.fleet.version, *(actor.fleet.replicas["r0"].current.k,
                                                                       actor.fleet.replicas["r0"].current.n))  # fmt: skip
