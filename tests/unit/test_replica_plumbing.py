"""Replica-side plumbing that needs no engine: the telemetry outbox, the prior profile choice, the push protocol."""

from __future__ import annotations

import asyncio

import pytest
from ebplus.controller.actor import ControllerActor
from ebplus.controller.cost_model import CostModel
from ebplus.controller.telemetry import CompletionRecord, FinishReason, StepRecord
from ebplus.replicas.control import to_completion, to_step
from ebplus.replicas.profiles import profile_for_device
from ebplus.replicas.server import EBPlusServer, TelemetryOutbox


def test_outbox_is_bounded_and_counts_drops() -> None:
    box = TelemetryOutbox(capacity=3)
    box.add([CompletionRecord(1, i + 1, FinishReason.STOP) for i in range(5)], [], dropped_completions=2)
    assert [c.output_len for c in box.completions] == [3, 4, 5]
    assert box.dropped_completions == 2 + 2
    batch = box.batch("r", applied_version=7, engine_stats={"steps_decode": 1})
    assert batch.dropped_completions == 4 and batch.applied_version == 7 and len(batch.completions) == 3
    box.clear()
    assert not box.completions and box.dropped_completions == 0


def test_failed_push_keeps_records_for_the_next_try() -> None:
    box = TelemetryOutbox(capacity=10)
    box.add([], [StepRecord(1, 0, 1, 0, 0.1, "prefill")])
    box.batch("r", 0, {})  # push failed: nothing cleared
    box.add([], [StepRecord(0, 1, 1, 0, 0.1, "decode")])
    assert len(box.batch("r", 0, {}).steps) == 2


def test_rows_from_the_scheduler() -> None:
    assert to_completion([12, 5, "length"]) == CompletionRecord(12, 5, FinishReason.LENGTH)
    assert to_step([8, 0, 1, 3, 0.25, "prefill"]) == StepRecord(8, 0, 1, 3, 0.25, "prefill")
    assert to_step([0, 4, 4, 0, 0.02, "decode", 2048]) == StepRecord(0, 4, 4, 0, 0.02, "decode", kv_tokens=2048)
    with pytest.raises(ValueError):
        to_completion([1, 1, "exploded"])


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
    settings = {
        "profile": "default",
        "profiles": {"H200": "h200", "H200 NVL": "h200-nvl", "L40S": "l40s", "RTX PRO 6000": "rtx-pro-6000"},
    }
    assert profile_for_device(settings, device) == expected


# -- the push protocol against a real in-process controller (issue #7) ---------------

PRIOR = CostModel(alpha_p=1e-3, beta_p=1e-5, alpha_d=1e-2, beta_d=1e-5, beta_mb=(1e-5, 0.0, 0.0))


class _Remote:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class ActorHandle:
    """An in-process ControllerActor behind the ``.method.remote()`` calling convention."""

    def __init__(self, actor: ControllerActor) -> None:
        self.actor = actor

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(getattr(self.actor, name))


class EngineStub:
    """Stands in for the engine-core utility channel: hands out queued telemetry, records applies."""

    def __init__(self) -> None:
        self.pending: list = []
        self.applied = {"mode": "auto", "active": "mb", "k": 1, "n": 16, "version": 0}

    async def drain(self) -> dict:
        rows, self.pending = self.pending, []
        return {
            "completions": rows,
            "steps": [],
            "dropped_completions": 0,
            "dropped_steps": 0,
            "stats": {},
            "kv_capacity_tokens": 100_000,
            "max_num_seqs": 16,
            "device": "cpu",
        }

    async def apply(self, update: dict) -> dict:
        self.applied = {**self.applied, **update}
        return self.applied

    async def applied(self) -> dict:
        return self.applied


class LoopOnly(EBPlusServer):
    """The replica's telemetry loop without an engine (LLMServer's async __del__ has nothing to close)."""

    def __del__(self) -> None:
        pass


def make_server(handle: ActorHandle) -> tuple[EBPlusServer, EngineStub]:
    server = object.__new__(LoopOnly)
    engine = EngineStub()
    server._ebplus = {"replicas": {"telemetry_buffer": 1024, "profile": "cpu-smollm2", "profiles": {}},
                      "scheduler": {"mode": "auto"}}  # fmt: skip
    server._replica_id = "rep-A"
    server._outbox = TelemetryOutbox(1024)
    server._control = engine
    server._registered = False
    server._applied = {}
    server._controller = handle
    server._pushes = server._push_failures = 0
    return server, engine


def test_records_survive_a_controller_that_no_longer_knows_the_replica(tmp_path) -> None:
    """A restarted (or forgetful) controller answers None: the replica registers and re-sends at once."""

    async def scenario() -> None:
        actor = ControllerActor({"update_every": 1000}, state_dir=str(tmp_path), housekeeping=False)
        server, engine = make_server(ActorHandle(actor))
        engine.pending = [[10, 5, "stop"]] * 7
        await server._push_once()
        assert actor.fleet.received["completions"] == 7 and server._registered
        actor.persist(force=True)
        restarted = ControllerActor({"update_every": 1000}, state_dir=str(tmp_path), housekeeping=False)
        server._controller = ActorHandle(restarted)
        engine.pending = [[10, 6, "stop"]] * 3
        await server._push_once()  # unknown replica -> register -> the same records again
        snap = await restarted.snapshot()
        assert snap["received"]["completions"] == 7 + 3 and snap["rejected"].get("duplicate", 0) == 0
        assert "rep-A" in snap["replicas"] and not server._outbox.completions
        assert engine.applied["version"] == snap["version"]

    asyncio.run(scenario())


def test_forgotten_replica_resumes_instead_of_cold_starting() -> None:
    from ebplus.controller.fleet import ControllerConfig, FleetController
    from ebplus.controller.telemetry import TelemetryBatch

    now = [1000.0]
    fc = FleetController(ControllerConfig(update_every=20, first_update=20, min_samples=20), clock=lambda: now[0])
    fc.register("a", "auto", 100_000, 64, PRIOR)
    comps = tuple(CompletionRecord(50, 1 + i % 30, FinishReason.STOP) for i in range(40))
    fc.ingest(TelemetryBatch("a", comps, (StepRecord(0, 30, 30, 10, 0.02),) * 5, completions_from=0))
    before = fc.thresholds("a")
    assert fc.replicas["a"].planner.last is not None
    now[0] += 3
    fc.grace(10.0)  # the controller was paused: no replica is stale for it
    assert fc.forget_stale(5.0) == []
    now[0] += 10
    assert fc.forget_stale(5.0) == ["a"] and "a" not in fc.snapshot()["replicas"]
    again = fc.register("a", "auto", 100_000, 64, PRIOR)
    assert (again.k, again.n, again.active) == (before.k, before.n, before.active)
    assert fc.replicas["a"].next_completion == 40  # and its cursors: no duplicates on re-send
    restored = FleetController(fc.config)
    fc.forget("a")
    restored.restore(fc.state())  # set-aside replicas are persisted too
    assert restored.register("a", "auto", 100_000, 64, PRIOR).n == before.n
