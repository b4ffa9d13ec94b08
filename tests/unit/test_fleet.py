"""FleetController: cadence, per-replica decisions, validation, overrides, persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest
from factories import batch, registration

from ebplus.controller import persistence
from ebplus.controller.config import ControllerConfig, PlannerConfig
from ebplus.controller.cost_model import CostModel, resolve_profile
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import CompletionRecord, FinishReason, Mode, StepRecord
from ebplus.controller.overrides import OverrideError

H200 = CostModel(
    alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5, beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)
)
RTX = CostModel(
    alpha_p=4.691e-3, beta_p=5.008e-5, alpha_d=1.0376e-2, beta_d=1.0388e-4, beta_mb=(6.29e-5, 1.969e-4, 9.9e-6)
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet(clock: FakeClock) -> FleetController:
    # no cold EB decision (test_cold_*): these tests count versions from the M-completion cadence
    config = ControllerConfig(update_every=100, first_update=100, planner=PlannerConfig(cold_workloads=()))
    fc = FleetController(config, clock=clock)
    fc.register(registration("h200-0", Mode.AUTO, 2_000_000, 1024, H200))
    fc.register(registration("rtx-0", Mode.AUTO, 600_000, 1024, RTX))
    return fc


def completions(n: int, seed: int = 0, mean: float = 256) -> list[CompletionRecord]:
    rng = np.random.default_rng(seed)
    return list(CompletionRecord(512, int(o), FinishReason.STOP) for o in rng.geometric(1 / mean, size=n))


def steps(n: int, running: int = 900, waiting: int = 500) -> list[StepRecord]:
    return list(StepRecord(0, running, running, waiting, 0.03) for _ in range(n))


def test_updates_every_m_completions_fleet_wide(fleet: FleetController) -> None:
    assert fleet.version == 0
    fleet.ingest(batch("h200-0", completions(60), steps(5)))
    assert fleet.version == 0
    fleet.ingest(batch("rtx-0", completions(40, seed=1), steps(5)))
    assert fleet.version == 1 and fleet.updates == 1
    fleet.ingest(batch("rtx-0", completions(99, seed=2)))
    assert fleet.version == 1
    fleet.ingest(batch("h200-0", completions(1, seed=3)))
    assert fleet.version == 2
    assert {d.replica_id for d in fleet.history if d.version == 2} == {"h200-0", "rtx-0"}


def test_decisions_are_per_replica(fleet: FleetController) -> None:
    for i in range(3):
        fleet.ingest(batch("h200-0", completions(100, seed=i), steps(20)))
        fleet.ingest(batch("rtx-0", completions(100, seed=10 + i), steps(20)))
    h, r = fleet.thresholds("h200-0"), fleet.thresholds("rtx-0")
    assert h.version == r.version == fleet.version
    # different alpha_p/alpha_d and KV capacity -> different thresholds and caps
    assert (h.k, h.n) != (r.k, r.n)
    assert r.n < h.n


def test_bad_records_are_rejected_and_counted(fleet: FleetController) -> None:
    """Records built in code are not checked: a producer can send anything, the controller's intake sorts it."""
    bad = [
        CompletionRecord(512, -3, FinishReason.STOP),
        CompletionRecord(float("nan"), 4, FinishReason.STOP),  # type: ignore[arg-type]  # a float: not a count
        CompletionRecord(4, 10**9, FinishReason.STOP),
        CompletionRecord(4, 4, "exploded"),  # type: ignore[arg-type]
        CompletionRecord("x", 4, FinishReason.STOP),  # type: ignore[arg-type]
        None,
    ]
    bad_steps = [StepRecord(0, 5, 5, 0, float("inf")), StepRecord(0, 0, 0, 0, 0.1), StepRecord(3, None, 0, 0, 0.1)]  # type: ignore[arg-type]
    fleet.ingest(batch("h200-0", bad + list(completions(2)), bad_steps))
    assert fleet.rejected == {
        "negative": 1,
        "not_finite": 1,
        "absurd_value": 1,
        "bad_finish_reason": 1,
        "bad_type": 3,
        "empty_step": 1,
        "missing_field": 1,
    }
    assert fleet.received["completions"] == 2 and fleet.workload.completions == 2
    assert fleet.ingest(batch("nobody", completions(5))) is None
    assert fleet.rejected["unknown_replica"] == 1


def test_aborted_and_capped_requests(fleet: FleetController) -> None:
    recs = (
        CompletionRecord(10, 0, FinishReason.ABORT),
        CompletionRecord(10, 50, FinishReason.LENGTH),
        CompletionRecord(10, 20, FinishReason.STOP),
        CompletionRecord(10, 7, FinishReason.ABORT),
        CompletionRecord(10, 9, FinishReason.ERROR),
    )
    fleet.ingest(batch("h200-0", recs))
    assert fleet.received["aborted"] == 3
    assert fleet.workload.n_samples == 3  # an error, and an abort before any token, say nothing of lengths
    window = fleet.workload.sample()
    assert list(window.natural) == [False, True, False]  # the cap and the abort censor the natural length
    assert list(window.capped) == [True, False, False]  # the cap is a departure; the abort is not


def test_applied_version_and_drops_tracked(fleet: FleetController) -> None:
    fleet.ingest(batch("h200-0", applied_version=0, dropped_steps=3, dropped_completions=1))
    r = fleet.replicas["h200-0"]
    assert (r.applied_version, r.dropped_steps, r.dropped_completions) == (0, 3, 1)


def test_override_applies_and_expires(fleet: FleetController, clock: FakeClock) -> None:
    v = fleet.set_override("rtx-0", mode="eb", k=7, n=300, ttl_s=60, force=True)
    t = fleet.thresholds("rtx-0")
    assert (t.mode, t.active, t.k, t.n, t.version) == (Mode.EB, Mode.EB, 7, 300, v)
    assert fleet.thresholds("h200-0").k != 7
    clock.now += 61
    t = fleet.thresholds("rtx-0")
    assert t.mode is Mode.AUTO and t.k != 7 and t.version == v + 1
    assert "rtx-0" not in fleet.overrides.items


def test_fleet_override_and_replica_precedence(fleet: FleetController) -> None:
    fleet.set_override("*", mode="mb")
    fleet.set_override("h200-0", k=3)
    h, r = fleet.thresholds("h200-0"), fleet.thresholds("rtx-0")
    assert h.active is Mode.MB and h.k == 3
    assert r.active is Mode.MB
    assert fleet.clear_override("*") and not fleet.clear_override("*")
    assert fleet.thresholds("rtx-0").mode is Mode.AUTO


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(replica_id="ghost", k=3), "replica"),
        (dict(replica_id="rtx-0", mode="turbo"), "mode"),
        (dict(replica_id="rtx-0", k=0), "k"),
        (dict(replica_id="rtx-0", k=50, n=10, force=True), "k"),
        (dict(replica_id="rtx-0", n=5000), "n"),
        (dict(replica_id="rtx-0", n=0), "n"),
        (dict(replica_id="rtx-0", ttl_s=-1, k=2), "ttl_s"),
        (dict(replica_id="rtx-0"), "mode"),
    ],
)
def test_invalid_overrides_change_nothing(fleet: FleetController, kwargs: dict, field: str) -> None:
    before = (fleet.version, dict(fleet.overrides.items), fleet.thresholds("rtx-0"))
    with pytest.raises(OverrideError) as err:
        fleet.set_override(**kwargs)
    assert err.value.field == field
    assert (fleet.version, dict(fleet.overrides.items), fleet.thresholds("rtx-0")) == before


def test_n_above_kv_safe_needs_force(fleet: FleetController) -> None:
    for i in range(2):
        fleet.ingest(batch("rtx-0", completions(100, seed=i), steps(10)))
    safe = fleet.kv_safe_n(fleet.replicas["rtx-0"])
    assert safe < 1024
    with pytest.raises(OverrideError, match="KV-safe"):
        fleet.set_override("rtx-0", n=safe + 1)
    fleet.set_override("rtx-0", n=safe + 1, force=True)
    assert fleet.thresholds("rtx-0").n == safe + 1


def test_state_round_trip_resumes_without_cold_start(fleet: FleetController, clock: FakeClock) -> None:
    for i in range(3):
        fleet.ingest(batch("h200-0", completions(100, seed=i), steps(30)))
    fleet.set_override("rtx-0", k=5)
    before = {rid: fleet.thresholds(rid) for rid in fleet.replicas}
    saved = persistence.parse(json.loads(fleet.state().model_dump_json()))  # through the store's JSON

    resumed = FleetController(ControllerConfig(update_every=100), clock=clock)
    resumed.restore(saved)
    after = {
        "h200-0": resumed.register(registration("h200-0", Mode.AUTO, 2_000_000, 1024, H200)),
        "rtx-0": resumed.register(registration("rtx-0", Mode.AUTO, 600_000, 1024, RTX)),
    }
    assert after == before
    views = resumed.snapshot().replicas
    assert {rid: (v.registered.origin, v.registered.message()) for rid, v in views.items()} == {
        rid: ("saved", update) for rid, update in after.items()
    }
    assert resumed.workload.state() == fleet.workload.state()
    assert len(resumed.history) == len(fleet.history)
    # and the next update continues the version sequence
    resumed.ingest(batch("h200-0", completions(100, seed=9)))
    assert resumed.version == fleet.version + 1


def test_new_replica_inherits_fleet_plan(fleet: FleetController) -> None:
    for i in range(2):
        fleet.ingest(batch("h200-0", completions(100, seed=i), steps(10)))
    t = fleet.register(registration("h200-1", Mode.AUTO, 2_000_000, 1024, H200))
    views = fleet.snapshot().replicas
    assert views["h200-1"].registered.origin == "fleet" and views["h200-0"].registered.origin == "cold"
    fleet.register(registration("h200-1", Mode.AUTO, 2_000_000, 1024, H200))
    assert fleet.snapshot().replicas["h200-1"].registered.origin == "known"
    assert (t.k, t.n, t.active) == (
        fleet.thresholds("h200-0").k,
        fleet.thresholds("h200-0").n,
        fleet.thresholds("h200-0").active,
    )


def test_a_new_replica_starts_from_a_replica_of_its_own_model(clock: FakeClock) -> None:
    """Several models behind one controller: a new replica's first plan is its own model's (sized for that
    model's workload and engine), and each replica's view says which model it serves."""
    fc = FleetController(ControllerConfig(update_every=100, first_update=100), clock=clock)
    fc.register(registration("a-0", Mode.AUTO, 2_000_000, 1024, H200, model="big"))
    fc.register(registration("b-0", Mode.AUTO, 600_000, 64, RTX, model="small"))
    for i in range(2):
        fc.ingest(batch("a-0", completions(100, seed=i), steps(10)))
        fc.ingest(batch("b-0", completions(100, seed=10 + i), steps(10)))
    b0 = fc.thresholds("b-0")
    assert (b0.k, b0.n) != (fc.thresholds("a-0").k, fc.thresholds("a-0").n)  # the two plans differ
    t = fc.register(registration("b-1", Mode.AUTO, 600_000, 64, RTX, model="small"))
    assert (t.k, t.n, t.active) == (b0.k, b0.n, b0.active)
    views = fc.snapshot().replicas
    assert {rid: v.model for rid, v in views.items()} == {"a-0": "big", "b-0": "small", "b-1": "small"}
    # a replica of an earlier release does not say: it starts from any replica's plan
    assert fc.register(registration("old-0", Mode.AUTO, 2_000_000, 1024, H200)) is not None
    assert fc.snapshot().replicas["old-0"].model == ""


def test_forget_stale(fleet: FleetController, clock: FakeClock) -> None:
    clock.now += 100
    fleet.ingest(batch("h200-0"))
    assert fleet.forget_stale(50) == ["rtx-0"]
    assert list(fleet.replicas) == ["h200-0"]


def test_pinned_k_follows_a_lowered_n(fleet: FleetController) -> None:
    """An override's k stays valid when the planner later lowers N below it."""
    fleet.set_override("rtx-0", k=900)
    assert fleet.thresholds("rtx-0").k == 900
    for i in range(3):  # small KV: the next plans cap N far below 900
        fleet.ingest(batch("rtx-0", completions(100, seed=i), steps(10)))
    t = fleet.thresholds("rtx-0")
    assert t.n < 900 and t.k == t.n


def test_a_failing_replan_leaves_the_replica_on_its_plan_and_the_fleet_converging(
    fleet: FleetController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One replica's re-plan raising (here: its cost fit) must not stop the others' re-plan nor
    freeze that replica on an old version: it keeps its last plan under the new version, counted."""
    fleet.ingest(batch("h200-0", completions(100), steps(10)))
    planned = {rid: fleet.replicas[rid].planner.last for rid in fleet.replicas}
    assert all(planned.values())

    def broken_fit():
        raise ValueError("fit failed")

    rtx = fleet.replicas["rtx-0"]
    rtx.cost = None  # refit at the next update, as after a controller restart
    monkeypatch.setattr(rtx.fitter, "fit", broken_fit)
    version = fleet.recompute("test")
    assert fleet.plan_errors == 1
    assert {rid: fleet.thresholds(rid).version for rid in fleet.replicas} == {"h200-0": version, "rtx-0": version}
    assert rtx.planner.last is planned["rtx-0"]  # kept
    assert fleet.replicas["h200-0"].planner.last is not planned["h200-0"]  # re-planned
    assert fleet.snapshot().plan_errors == 1
    resumed = FleetController(fleet.config)
    resumed.restore(persistence.parse(json.loads(fleet.state().model_dump_json())))
    assert resumed.plan_errors == 1


def test_cold_auto_replica_leaves_mb_when_the_prior_prefers_eb_for_any_workload(clock: FakeClock) -> None:
    """Before any estimate: an auto RTX PRO 6000 replica under a 2048-deep load switches to EB
    (cause "cold", a new version for the whole fleet); an mb-configured one and an idle one do not."""
    from ebplus.controller.cost_model import resolve_profile

    rtx = resolve_profile("rtx-pro-6000")
    fc = FleetController(ControllerConfig(concurrency_ema=1.0), clock=clock)
    fc.register(registration("busy", Mode.AUTO, rtx.kv_capacity_tokens, 2048, rtx.cost_model()))
    fc.register(registration("idle", Mode.AUTO, rtx.kv_capacity_tokens, 2048, rtx.cost_model()))
    fc.register(registration("pinned", Mode.MB, rtx.kv_capacity_tokens, 2048, rtx.cost_model()))
    fc.ingest(batch("idle", (), (StepRecord(0, 4, 4, 0, 0.05),)))
    fc.ingest(batch("pinned", (), (StepRecord(512, 0, 900, 1148, 0.1),)))
    assert fc.version == 0
    fc.ingest(batch("busy", (), (StepRecord(512, 0, 900, 1148, 0.1),)))
    assert fc.version == 1 and fc.history[-1].cause == "cold" and fc.workload.estimate is None
    current = {rid: (fc.thresholds(rid).active, fc.thresholds(rid).version) for rid in fc.replicas}
    assert current == {"busy": (Mode.EB, 1), "idle": (Mode.MB, 1), "pinned": (Mode.MB, 1)}
    fc.ingest(batch("busy", (), (StepRecord(512, 0, 900, 1148, 0.1),)))
    assert fc.version == 1  # decided once


def test_a_fleet_override_set_before_any_replica_is_checked_against_the_configured_bound() -> None:
    """set_override('*', n=1_000_000) with no replica registered was accepted unchecked."""
    fc = FleetController(ControllerConfig(planner={"max_num_seqs": 128}))
    with pytest.raises(OverrideError, match=r"n: 1000000 exceeds max_num_seqs 128 .*controller.planner.max_num_seqs"):
        fc.set_override("*", n=1_000_000)
    fc.set_override("*", n=96)
    assert fc.overrides.get("x").n == 96


def test_a_replica_registered_after_an_override_gets_an_n_it_can_run() -> None:
    """A 64-slot replica registering under a fleet pin of N = 96 ran N = 96 (the scheduler clamped it, the
    controller's KV check never saw it); now N stops at its max_num_seqs, or its KV-safe N unless forced."""
    fc = FleetController(ControllerConfig(planner={"max_num_seqs": 128}))
    fc.set_override("*", n=96, k=80)
    update = fc.register(registration("small", max_num_seqs=64))
    assert (update.n, update.k) == (64, 64)
    big = fc.register(registration("big", max_num_seqs=256))
    assert big.n == 96  # within what it declared: the pin holds


def test_an_override_n_stops_at_a_later_replicas_kv_safe_n_unless_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    fc = FleetController(ControllerConfig(planner={"max_num_seqs": 128}))
    fc.set_override("*", n=96)
    monkeypatch.setattr(fc, "kv_safe_n", lambda replica: 40)  # what its last plan found memory-safe
    assert fc.register(registration("kv", max_num_seqs=256)).n == 40
    fc.set_override("*", n=96, force=True)
    assert fc.thresholds("kv").n == 96


def test_routers_get_the_departure_chance_and_each_replicas_cost_model(fleet: FleetController) -> None:
    from ebplus.controller.views import routing_hints

    cold = routing_hints(fleet)
    assert cold.p0 is None and cold.beta_p == {"h200-0": H200.beta_p, "rtx-0": RTX.beta_p}
    assert cold.cost == {"h200-0": H200, "rtx-0": RTX}
    # a profile travels as its cost coefficients alone
    profile = resolve_profile("h200")
    assert type(profile.cost_model()) is CostModel and profile.cost_model().alpha_p == profile.alpha_p
    fleet.ingest(batch("h200-0", completions(100), steps(5)))
    warm = routing_hints(fleet)
    assert warm.p0 == fleet.workload.estimate.p0 and 1 / 512 < warm.p0 < 1 / 128  # geometric, mean 256
