"""The controller actor's worker thread: pushes answered while a re-plan runs, nothing lost, published at once.

``small_fleet=0`` puts a few replicas on the path a 256-replica fleet takes: a push that
arrives while a round of the worker runs is answered with the thresholds in force and its
telemetry held for the next round. A :class:`Gate` stops the worker thread at a chosen
point (inside the re-plan, inside the write of its snapshot), so what the event loop does
meanwhile is checked by what it answers and absorbs, not by how long anything takes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from factories import batch, registration

from ebplus.controller import fleet_worker, persistence
from ebplus.controller.actor import ControllerActor
from ebplus.controller.config import ControllerConfig
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (
    CompletionRecord,
    FinishReason,
    StepRecord,
    TelemetryBatch,
    ThresholdUpdate,
    decode,
    encode,
)
from ebplus.controller.state_store import StateStore

REPLICAS = ("r0", "r1", "r2")
#: No periodic update: the tests ask for every re-plan.
QUIET = {"update_every": 10**6, "first_update": 10**6}


def make_actor(tmp_path: Path, **config: Any) -> tuple[ControllerActor, list[int]]:
    """An actor on the large-fleet path whose store records the version of every state it writes, in order."""
    cfg = ControllerConfig(**{"update_every": 60, "first_update": 60, "min_samples": 10, **config},
                           state_dir=str(tmp_path))  # fmt: skip
    actor = ControllerActor(cfg, housekeeping=False, small_fleet=0)
    saved: list[int] = []
    save = actor.store.save

    def recording(state: persistence.ControllerState) -> None:
        save(state)
        saved.append(state.version)

    actor.store.save = recording  # type: ignore[method-assign]
    return actor, saved


def telemetry(rid: str, rng: np.random.Generator, n: int = 30, sent: int | None = None) -> Any:
    comps = [CompletionRecord(200, int(o), FinishReason.STOP) for o in rng.geometric(1 / 80, n)]
    steps = [StepRecord(0, 400, 400, 100, 0.02 + 1e-4 * i) for i in range(n)]
    cursors = {} if sent is None else {"completions_from": sent, "steps_from": sent}
    return TelemetryBatch(replica_id=rid, completions=comps, steps=steps, **cursors)


def push(rid: str, rng: np.random.Generator, n: int = 30) -> bytes:
    return encode(telemetry(rid, rng, n))


class Gate:
    """Wraps ``fn``: the worker thread that calls it waits there until the test opens the gate."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        if not self.opened.wait(30):
            raise TimeoutError("the test never opened the gate")
        return self.fn(*args, **kwargs)

    async def reached(self) -> None:
        for _ in range(30_000):
            if self.entered.is_set():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("the worker never reached the gate")


async def held_replan(actor: ControllerActor, obj: Any = None, name: str = "recompute") -> tuple[Gate, asyncio.Future]:
    """An operator's re-plan, started, with the worker thread held at ``obj.name`` (the fleet's re-plan)."""
    obj = actor.fleet if obj is None else obj
    gate = Gate(getattr(obj, name))
    setattr(obj, name, gate)
    replan = asyncio.ensure_future(actor.recompute())
    await gate.reached()
    return gate, replan


async def waiting(call: asyncio.Future) -> bool:
    """Whether ``call`` is still unanswered after the loop has had every chance to answer it."""
    done, _ = await asyncio.wait({call}, timeout=0.05)
    return not done


async def answered(call: Any) -> ThresholdUpdate:
    """A push's reply; a push that is not answered while the worker is held fails here rather than hanging."""
    return decode(await asyncio.wait_for(call, 10), ThresholdUpdate)


async def start(actor: ControllerActor, rng: np.random.Generator, pushes: int = 9) -> None:
    for rid in REPLICAS:
        await actor.register(encode(registration(rid, kv_capacity_tokens=500_000, max_num_seqs=512)))
    for i in range(pushes):
        await actor.ingest(push(REPLICAS[i % 3], rng))
    await actor.worker.idle()


def test_a_push_during_a_replan_is_answered_while_it_runs_and_absorbed_after(tmp_path: Path) -> None:
    actor, saved = make_actor(tmp_path, **QUIET)
    rng = np.random.default_rng(1)

    async def scenario() -> None:
        await start(actor, rng)
        await actor.recompute()
        before, received = actor.fleet.version, actor.fleet.received["completions"]
        gate, replan = await held_replan(actor)
        reply = await answered(actor.ingest(push("r1", rng)))  # the worker is inside the re-plan meanwhile
        assert not replan.done() and reply.version == before
        assert actor.fleet.received["completions"] == received  # held: the fleet is the worker's until it is done
        gate.opened.set()
        result = json.loads(await replan)
        assert result["version"] == before + 1 == actor.fleet.version == saved[-1]
        await actor.worker.idle()
        assert actor.fleet.received["completions"] == received + 30  # absorbed by the next round
        assert (await answered(actor.ingest(push("r2", rng)))).version == before + 1

    asyncio.run(scenario())


def test_the_published_plan_is_the_synchronous_one_on_the_same_inputs(tmp_path: Path) -> None:
    """The worker's re-plan is ``FleetController.recompute`` on the state when it started; what arrived
    meanwhile is absorbed after it, in order: a plain controller fed the same, in that order, is the same."""
    actor, _ = make_actor(tmp_path, **QUIET)
    config = actor.config
    actor.fleet = FleetController(config, clock=lambda: 1000.0)
    reference = FleetController(config, clock=lambda: 1000.0)
    rng = np.random.default_rng(5)
    sent = dict.fromkeys(REPLICAS, 0)

    def next_batch(rid: str) -> Any:
        b = telemetry(rid, rng, n=int(rng.integers(5, 40)), sent=sent[rid])
        sent[rid] += len(b.completions)
        return b

    async def scenario() -> None:
        for rid in REPLICAS:
            reg = registration(rid, kv_capacity_tokens=400_000, max_num_seqs=256)
            await actor.register(encode(reg))
            reference.register(reg)
        for round_ in range(3):
            for i in range(12):
                b = next_batch(REPLICAS[i % 3])
                await actor.ingest(encode(b))
                reference.ingest(encode(b))
            gate, replan = await held_replan(actor)
            during = [next_batch(REPLICAS[(round_ + i) % 3]) for i in range(4)]
            for b in during:
                await answered(actor.ingest(encode(b)))
            gate.opened.set()
            await replan
            del actor.fleet.recompute
            await actor.worker.idle()
            reference.recompute("operator")
            for b in during:
                reference.ingest(encode(b))
            for rid in REPLICAS:
                assert actor.fleet.replicas[rid].current == reference.replicas[rid].current

    asyncio.run(scenario())
    ours, theirs = (f.state().model_dump(mode="json") for f in (actor.fleet, reference))
    for state in (ours, theirs):
        state.pop("update_seconds")  # how long the re-plans took
    assert ours["version"] == 3 and ours["received"]["completions"] == sum(sent.values())
    assert ours == theirs


def test_a_new_version_is_published_to_every_replica_at_once_once_it_is_persisted(tmp_path: Path) -> None:
    actor, saved = make_actor(tmp_path, **QUIET)
    rng = np.random.default_rng(2)

    async def scenario() -> None:
        await start(actor, rng)
        await actor.recompute()
        before = actor.fleet.version
        gate, replan = await held_replan(actor, actor.store, "save")  # planned, not persisted yet
        assert all(r.current.version == before + 1 for r in actor.fleet.replicas.values())
        for rid in REPLICAS:
            assert (await answered(actor.ingest(push(rid, rng, n=1)))).version == before
        gate.opened.set()
        await replan
        assert saved[-1] == before + 1
        for rid in REPLICAS:
            assert (await answered(actor.ingest(push(rid, rng, n=1)))).version == before + 1

    asyncio.run(scenario())


def test_pushes_beyond_the_held_limit_wait_for_the_next_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_worker, "MAX_HELD", 2)
    actor, _ = make_actor(tmp_path, **QUIET)
    rng = np.random.default_rng(3)

    async def scenario() -> None:
        await start(actor, rng)
        received = actor.fleet.received["completions"]
        gate, replan = await held_replan(actor)
        for rid in ("r0", "r1"):
            await answered(actor.ingest(push(rid, rng)))
        third = asyncio.ensure_future(actor.ingest(push("r2", rng)))
        assert await waiting(third)  # two held: the third waits for a round to take them
        gate.opened.set()
        await replan
        await answered(third)
        await actor.worker.idle()
        assert actor.fleet.received["completions"] == received + 90

    asyncio.run(scenario())


def test_what_a_push_during_a_round_is_refused_for_is_counted_and_a_bad_batch_costs_only_itself(
    tmp_path: Path,
) -> None:
    actor, _ = make_actor(tmp_path, **QUIET)
    rng = np.random.default_rng(4)

    async def scenario() -> None:
        await start(actor, rng)
        received = actor.fleet.received["completions"]
        absorb = actor.fleet.absorb_checked

        def absorb_but_r1(b: Any) -> Any:
            if b.replica_id == "r1":
                raise RuntimeError("a bug in ingestion")
            return absorb(b)

        actor.fleet.absorb_checked = absorb_but_r1  # type: ignore[method-assign]
        gate, replan = await held_replan(actor)
        assert await actor.ingest(msgspec.msgpack.encode({"wire": 2, "replica_id": "r0"})) is None
        assert await actor.ingest(batch("nobody", [CompletionRecord(10, 3, FinishReason.STOP)])) is None
        for rid in REPLICAS:
            await answered(actor.ingest(push(rid, rng)))
        gate.opened.set()
        await replan
        await actor.worker.idle()
        fleet = actor.fleet
        assert fleet.received["completions"] == received + 60  # r0's and r2's
        assert (fleet.rejected["bad_batch"], fleet.rejected["unknown_replica"], fleet.rejected["bad_version"]) == (1, 1, 1)
        # start's nine, the other wire version (counted on the loop meanwhile), r0's, r2's and nobody's
        assert fleet.received["batches"] == 9 + 1 + 3

    asyncio.run(scenario())


def test_operator_changes_wait_for_a_replan_and_are_persisted_before_they_are_answered(tmp_path: Path) -> None:
    actor, saved = make_actor(tmp_path, **QUIET)
    rng = np.random.default_rng(6)

    async def scenario() -> None:
        await start(actor, rng)
        gate, replan = await held_replan(actor)
        override = asyncio.ensure_future(actor.set_override("r2", k=3))
        assert await waiting(override)  # it waits for the re-plan
        gate.opened.set()
        result = json.loads(await override)
        assert replan.done() and result["version"] == actor.fleet.version == saved[-1]
        reply = await answered(actor.ingest(push("r2", rng)))
        assert reply.k == 3 and reply.version == result["version"]
        cleared = json.loads(await actor.clear_override("r2"))
        assert cleared["removed"] and cleared["version"] == saved[-1]

    asyncio.run(scenario())


def test_pushes_hear_only_persisted_versions_and_due_updates_coalesce(tmp_path: Path) -> None:
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
        await actor.worker.idle()
        heard.append(decode(await actor.ingest(push(REPLICAS[0], rng, n=1)), ThresholdUpdate).version)
        await actor.worker.idle()
        return heard

    heard = asyncio.run(scenario())
    # how many re-plans run depends on the machine's speed: at least the first and one more
    assert actor.fleet.updates >= 2 and heard[-1] == actor.fleet.version
    assert heard[1] == 0  # the push that made the first update due was answered before it was planned
    assert saved == sorted(saved) and saved[-1] == actor.fleet.version
    assert actor.fleet.received["completions"] == 60 * 30 + 1  # every push absorbed
    stored = persistence.parse(StateStore(str(tmp_path)).load())
    assert stored.version == actor.fleet.version and set(stored.replicas) == set(REPLICAS)


def test_in_a_small_fleet_a_push_held_during_a_round_hears_what_the_round_published(tmp_path: Path) -> None:
    actor, _ = make_actor(tmp_path, **QUIET)
    actor.small_fleet = 8
    rng = np.random.default_rng(7)

    async def scenario() -> None:
        await start(actor, rng)
        gate, replan = await held_replan(actor)
        held = asyncio.ensure_future(actor.ingest(push("r0", rng)))
        assert await waiting(held)
        gate.opened.set()
        version = json.loads(await replan)["version"]
        assert (await answered(held)).version == version

    asyncio.run(scenario())


def test_a_synchronous_view_during_a_round_is_the_last_one_taken(tmp_path: Path) -> None:
    """The plain-vLLM plugin's scrape reads the controller on its own loop, while the worker may have the fleet."""
    actor, _ = make_actor(tmp_path, **QUIET)
    rng = np.random.default_rng(9)

    async def scenario() -> None:
        await start(actor, rng)
        before = actor.view()
        assert before is not None and before.version == actor.fleet.version
        gate, replan = await held_replan(actor, name="state")  # re-planned, persisting
        assert actor.view() is before
        gate.opened.set()
        await replan
        after = actor.view()
        assert after is not None and after.version == before.version + 1

    asyncio.run(scenario())


def test_the_switch_interval_is_short_while_a_round_runs_and_restored_after(tmp_path: Path) -> None:
    actor, _ = make_actor(tmp_path, **QUIET)
    rng = np.random.default_rng(8)
    normal = sys.getswitchinterval()
    seen: list[float] = []

    async def scenario() -> None:
        await start(actor, rng)
        recompute = actor.fleet.recompute
        actor.fleet.recompute = lambda cause: (seen.append(sys.getswitchinterval()), recompute(cause))[1]  # type: ignore[method-assign]
        await actor.recompute()

    asyncio.run(scenario())
    assert seen == [pytest.approx(min(normal, fleet_worker.SWITCH_INTERVAL_S))]
    assert sys.getswitchinterval() == normal


def test_a_restarted_controller_resumes_a_large_fleet_where_it_was(tmp_path: Path) -> None:
    actor, _ = make_actor(tmp_path)
    rng = np.random.default_rng(3)

    async def feed(a: ControllerActor) -> None:
        for rid in REPLICAS:
            await a.register(encode(registration(rid, kv_capacity_tokens=500_000, max_num_seqs=512)))
        for i in range(30):
            await a.ingest(push(REPLICAS[i % 3], rng))
            await asyncio.sleep(0)
        await a.worker.idle()

    asyncio.run(feed(actor))
    assert actor.fleet.version > 0
    restarted, _ = make_actor(tmp_path)
    assert restarted.restored and restarted.fleet.version == actor.fleet.version

    async def again() -> ThresholdUpdate:
        await restarted.register(encode(registration("r0", kv_capacity_tokens=500_000, max_num_seqs=512)))
        return decode(await restarted.ingest(push("r0", rng)), ThresholdUpdate)

    reply = asyncio.run(again())
    current = actor.fleet.replicas["r0"].current
    assert (reply.version, reply.k, reply.n) == (actor.fleet.version, current.k, current.n)


def test_an_in_process_controller_does_not_import_ray() -> None:
    """Ray's modules are ~30k long-lived objects that every full collection of the controller's process walks."""
    code = (
        "import sys; from ebplus.controller.actor import ControllerActor; ControllerActor(housekeeping=False); "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
