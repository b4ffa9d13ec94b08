"""Replica-side plumbing that needs no engine: the outbox, the prior profile choice, the push cycle."""

from __future__ import annotations

import asyncio

import pytest
from factories import PRIOR, batch, completions, registration

from ebplus.controller.actor import ControllerActor
from ebplus.controller.client import ControllerClient, ControllerUnavailable, LocalTransport
from ebplus.controller.config import ControllerConfig
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (
    CompletionRecord,
    DrainReport,
    EngineFacts,
    FinishReason,
    Mode,
    StepRecord,
    ThresholdUpdate,
    encode,
)
from ebplus.replicas.config import ReplicaSection
from ebplus.replicas.control import drained
from ebplus.replicas.profiles import profile_for_device
from ebplus.replicas.pump import TelemetryOutbox, TelemetryPump, arun
from ebplus.simulator.local import LocalController, run

FACTS = EngineFacts(kv_capacity_tokens=100_000, max_num_seqs=16, device="cpu")


def report(comps: list | None = None, steps: list | None = None, dropped: int = 0, applied=None) -> DrainReport:
    return DrainReport(
        completions=comps or [],
        steps=steps or [],
        dropped_completions=dropped,
        facts=FACTS,
        applied=applied or ThresholdUpdate(mode=Mode.AUTO, k=1, n=16),
    )


def test_outbox_is_bounded_and_counts_drops() -> None:
    box = TelemetryOutbox(capacity=3)
    box.add(report([CompletionRecord(1, i + 1, FinishReason.STOP) for i in range(5)], dropped=2))
    assert [c.output_len for c in box.completions] == [3, 4, 5]
    assert box.dropped_completions == 2 + 2
    b = box.batch("r", applied_version=7, stats=None)
    assert b.dropped_completions == 4 and b.applied_version == 7 and len(b.completions) == 3
    box.clear()
    assert not box.completions and box.dropped_completions == 0


def test_failed_push_keeps_records_for_the_next_try() -> None:
    box = TelemetryOutbox(capacity=10)
    box.add(report(steps=[StepRecord(1, 0, 1, 0, 0.1)]))
    box.batch("r", 0, None)  # push failed: nothing cleared
    box.add(report(steps=[StepRecord(0, 1, 1, 0, 0.1)]))
    assert len(box.batch("r", 0, None).steps) == 2


def test_a_drain_keeps_its_records_around_one_outside_the_wire_limits(caplog: pytest.LogCaptureFixture) -> None:
    """The scheduler builds records unchecked: a step that spanned a long stall must not cost the whole drain."""
    good = [StepRecord(0, 4, 4, 0, 0.01), StepRecord(0, 5, 5, 0, 0.02)]
    stalled = StepRecord(0, 4, 4, 0, 900.0)  # longer than MAX_STEP_SECONDS
    payload = encode(report(completions(3), [good[0], stalled, good[1]]))
    with caplog.at_level("WARNING"):
        got = drained(payload)
    assert got.steps == good and len(got.completions) == 3 and got.facts == FACTS
    assert "absurd_value" in caplog.text
    assert drained(encode(report(completions(3), good))) == report(completions(3), good)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA RTX PRO 6000 Blackwell", "rtx-pro-6000"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("cpu", "default"),
    ],
)
def test_profile_for_device(device: str, expected: str) -> None:
    section = ReplicaSection(
        profile="default",
        profiles={"H200": "h200", "H200 NVL": "h200-nvl", "L40S": "l40s", "RTX PRO 6000": "rtx-pro-6000"},
    )
    assert profile_for_device(section, device) == expected


# -- the push cycle against a real in-process controller ----------------------------


class EngineStub:
    """Stands in for the engine-core utility channel: hands out queued telemetry, records applies."""

    def __init__(self) -> None:
        self.pending: list[CompletionRecord] = []
        self.applied = ThresholdUpdate(mode=Mode.AUTO, k=1, n=16)
        self.applies = 0

    def drain(self) -> DrainReport:
        comps, self.pending = self.pending, []
        return report(comps, applied=self.applied)

    def apply(self, update: ThresholdUpdate) -> ThresholdUpdate:
        self.applied, self.applies = update, self.applies + 1
        return update


class AsyncEngineStub(EngineStub):
    async def drain(self) -> DrainReport:  # type: ignore[override]
        return EngineStub.drain(self)

    async def apply(self, update: ThresholdUpdate) -> ThresholdUpdate:  # type: ignore[override]
        return EngineStub.apply(self, update)


def pump() -> TelemetryPump:
    return TelemetryPump("rep-A", Mode.AUTO, prior=lambda _: PRIOR, capacity=1024)


def test_records_survive_a_controller_that_no_longer_knows_the_replica(tmp_path) -> None:
    """A restarted (or forgetful) controller answers None: the replica registers and re-sends at once."""

    async def scenario() -> None:
        config = ControllerConfig(update_every=1000, state_dir=str(tmp_path))
        actor = ControllerActor(config, housekeeping=False)
        p, engine = pump(), AsyncEngineStub()
        engine.pending = [CompletionRecord(10, 5, FinishReason.STOP)] * 7
        await arun(p.cycle(), engine, ControllerClient(LocalTransport(actor)), timeout_s=2)
        assert actor.fleet.received["completions"] == 7 and p.registered
        actor.persist(force=True)
        restarted = ControllerActor(config, housekeeping=False)
        client = ControllerClient(LocalTransport(restarted))
        engine.pending = [CompletionRecord(10, 6, FinishReason.STOP)] * 3
        await arun(p.cycle(), engine, client, timeout_s=2)  # unknown replica -> register -> the same records again
        snap = await client.snapshot()
        assert snap.received["completions"] == 7 + 3 and snap.rejected.get("duplicate", 0) == 0
        assert "rep-A" in snap.replicas and not p.outbox.completions
        assert engine.applied.version == snap.version

    asyncio.run(scenario())


class DownController:
    """A controller that never answers."""

    async def register(self, registration, timeout_s: float):
        raise ControllerUnavailable("timed out")

    async def ingest(self, batch, timeout_s: float):
        raise ControllerUnavailable("timed out")


def test_an_unreachable_controller_keeps_records_and_thresholds() -> None:
    p, engine = pump(), AsyncEngineStub()
    engine.pending = completions(5)
    asyncio.run(arun(p.cycle(), engine, DownController(), timeout_s=0.1))  # type: ignore[arg-type]
    assert (p.push_failures, p.pushes, len(p.outbox.completions)) == (1, 0, 5)
    assert engine.applies == 0 and not p.registered and "timed out" in p.last_error
    fleet = FleetController(ControllerConfig(update_every=1000))
    run(p.cycle(), EngineStub(), LocalController(fleet))  # the controller is back: everything arrives once
    assert fleet.received["completions"] == 5 and p.pushes == 1 and not p.outbox.completions


def test_thresholds_are_applied_only_when_they_change() -> None:
    p, engine = pump(), EngineStub()
    engine.applied = ThresholdUpdate(mode=Mode.AUTO, k=5, n=16)  # the scheduler's own start-up k
    controller = LocalController(FleetController(ControllerConfig(update_every=1000)))
    for _ in range(3):
        run(p.cycle(), engine, controller)
    assert engine.applies == 1 and p.pushes == 3  # the controller's cold thresholds, once
    assert engine.applied.k == 1


def test_forgotten_replica_resumes_instead_of_cold_starting() -> None:
    now = [1000.0]
    fc = FleetController(ControllerConfig(update_every=20, first_update=20, min_samples=20), clock=lambda: now[0])
    fc.register(registration("a"))
    comps = [CompletionRecord(50, 1 + i % 30, FinishReason.STOP) for i in range(40)]
    fc.ingest(batch("a", comps, [StepRecord(0, 30, 30, 10, 0.02)] * 5, completions_from=0))
    before = fc.thresholds("a")
    assert fc.replicas["a"].planner.last is not None
    now[0] += 3
    fc.grace(10.0)  # the controller was paused: no replica is stale for it
    assert fc.forget_stale(5.0) == []
    now[0] += 10
    assert fc.forget_stale(5.0) == ["a"] and "a" not in fc.snapshot().replicas
    again = fc.register(registration("a"))
    assert (again.k, again.n, again.active) == (before.k, before.n, before.active)
    assert fc.replicas["a"].next_completion == 40  # and its cursors: no duplicates on re-send
    restored = FleetController(fc.config)
    fc.forget("a")
    restored.restore(fc.state())  # set-aside replicas are persisted too
    assert restored.register(registration("a")).n == before.n
