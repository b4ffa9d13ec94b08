"""Hostile telemetry at the controller: nothing a batch holds makes ingestion raise; late duplicates are skipped.

Pre-existing: per-record rejection reasons (tests/unit/test_fleet.py::test_bad_records_are_rejected_and_counted)
and the outbox bound (tests/unit/test_replica_plumbing.py). Here: batch-level garbage (fuzzed), the actor's
never-raise contract, and the running record indices that make a late delivery of a timed-out push harmless.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from ebplus.controller.actor import ControllerActor
from ebplus.controller.cost_model import CostModel
from ebplus.controller.fleet import ControllerConfig, FleetController
from ebplus.controller.telemetry import REJECT_REASONS, CompletionRecord, FinishReason, StepRecord, TelemetryBatch
from ebplus.replicas.phases import Mode
from ebplus.replicas.server import TelemetryOutbox
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PRIOR = CostModel(alpha_p=1e-3, beta_p=1e-5, alpha_d=1e-2, beta_d=1e-5, beta_mb=(1e-5, 0.0, 0.0))


def make_fleet() -> FleetController:
    fc = FleetController(ControllerConfig(update_every=10, first_update=10, min_samples=10))
    fc.register("r0", Mode.AUTO, 100_000, 64, PRIOR)
    return fc


def comps(n: int, start: int = 0) -> tuple[CompletionRecord, ...]:
    return tuple(CompletionRecord(10 + i, 1 + (start + i) % 50, FinishReason.STOP) for i in range(n))


# anything pickle can carry
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
record_fields = st.sampled_from(
    ["input_len", "output_len", "finish", "prefill_tokens", "decode_tokens", "running", "waiting", "seconds", "kv_tokens"]
)
records = st.one_of(
    values,
    st.dictionaries(record_fields, values, max_size=9),
    st.builds(CompletionRecord, values, values, values),
    st.builds(StepRecord, values, values, values, values, values, values, values),
)
batches = st.one_of(
    values,
    st.builds(
        TelemetryBatch,
        replica_id=st.one_of(st.just("r0"), values),
        completions=st.one_of(st.lists(records, max_size=6).map(tuple), values),
        steps=st.one_of(st.lists(records, max_size=6).map(tuple), values),
        applied_version=values,
        dropped_completions=values,
        dropped_steps=values,
        sent_at=values,
        extra=st.one_of(values, st.fixed_dictionaries({"engine_stats": values})),
        completions_from=values,
        steps_from=values,
    ),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batches, min_size=1, max_size=5))
def test_fuzzed_batches_never_raise_and_leave_the_controller_sane(hostile: list) -> None:
    fc = make_fleet()
    for batch in hostile:
        fc.ingest(batch)
    # the controller still works: a good batch lands and the numbers it exports are finite
    good = fc.ingest(TelemetryBatch("r0", comps(20), (StepRecord(0, 8, 8, 2, 0.01),)))
    assert good is not None and 1 <= good.k <= good.n
    snap = fc.snapshot()
    rep = snap["replicas"]["r0"]
    assert all(isinstance(v, int) and 0 <= v < 2**63 for v in rep["dropped"].values())
    assert all(math.isfinite(v) and v >= 0 for v in rep["engine_stats"].values())
    assert 0 <= rep["applied_version"] < 2**63 or rep["applied_version"] == -1
    assert set(snap["rejected"]) <= set(REJECT_REASONS)


@pytest.mark.parametrize(
    ("batch", "reason"),
    [
        (TelemetryBatch("r0", completions=5), "bad_batch"),  # records not a sequence
        (TelemetryBatch("r0", steps="abc"), "bad_batch"),
        (TelemetryBatch("r0", dropped_completions="abc"), "bad_batch"),
        (TelemetryBatch("r0", dropped_steps=float("nan")), "bad_batch"),
        (TelemetryBatch("r0", dropped_completions=float("inf")), "bad_batch"),
        (TelemetryBatch("r0", dropped_completions=-4), "bad_batch"),
        (TelemetryBatch("r0", dropped_completions=10**30), "bad_batch"),  # absurd
        (TelemetryBatch("r0", extra={"engine_stats": {"preemptions": float("inf")}}), "bad_engine_stats"),
        (TelemetryBatch(["unhashable"]), "unknown_replica"),  # wrong replica id
        (TelemetryBatch("r1"), "unknown_replica"),
        ("not a batch", "unknown_replica"),
    ],
)
def test_malformed_batch_fields_are_counted(batch: object, reason: str) -> None:
    fc = make_fleet()
    fc.ingest(batch)
    assert fc.rejected[reason] == 1
    assert fc.replicas["r0"].dropped_completions == 0 and fc.replicas["r0"].engine_stats == {}


def test_late_duplicate_of_a_timed_out_push_is_skipped() -> None:
    """A hung controller works off its queue on resume: the batch that timed out, then its re-send with more."""
    box = TelemetryOutbox(capacity=64)
    box.add(list(comps(30)), [])
    first = box.batch("r0", 0, {})  # times out at the replica: records kept
    box.add(list(comps(20, start=30)), [])
    second = box.batch("r0", 0, {})  # holds the 30 again plus 20 new
    assert (first.completions_from, len(first.completions)) == (0, 30)
    assert (second.completions_from, len(second.completions)) == (0, 50)
    fc = make_fleet()
    fc.ingest(first)
    fc.ingest(second)  # both delivered once the controller resumes
    assert fc.received["completions"] == 50 and fc.rejected["duplicate"] == 30
    box.clear()  # the replica saw the second succeed
    box.add(list(comps(5, start=50)), [])
    third = box.batch("r0", 0, {})
    assert third.completions_from == 50
    fc.ingest(third)
    assert fc.received["completions"] == 55 and fc.rejected["duplicate"] == 30


def test_outbox_overflow_advances_the_index() -> None:
    box = TelemetryOutbox(capacity=4)
    box.add(list(comps(6)), [])
    batch = box.batch("r0", 0, {})
    assert batch.completions_from == 2 and batch.dropped_completions == 2 and len(batch.completions) == 4
    fc = make_fleet()
    fc.ingest(batch)
    assert fc.received["completions"] == 4 and fc.rejected["duplicate"] == 0
    assert fc.replicas["r0"].dropped_completions == 2


def test_cursors_survive_a_controller_restart() -> None:
    fc = make_fleet()
    fc.ingest(TelemetryBatch("r0", comps(30), completions_from=0))
    resumed = FleetController(fc.config)
    resumed.restore(fc.state())
    resumed.register("r0", Mode.AUTO, 100_000, 64, PRIOR)
    resumed.ingest(TelemetryBatch("r0", comps(40), completions_from=0))  # 30 old, 10 new
    assert resumed.rejected["duplicate"] == 30
    assert resumed.received["completions"] == 30 + 10


def test_actor_ingest_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Even a bug in ingestion answers with thresholds and counts the batch, never an exception."""
    actor = ControllerActor({"update_every": 10}, state_dir=str(tmp_path), housekeeping=False)
    asyncio.run(actor.register("r0", "auto", 100_000, 64, PRIOR.model_dump(), "cpu"))

    def explode(batch: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(actor.fleet, "ingest", explode)
    reply = asyncio.run(actor.ingest(TelemetryBatch("r0", comps(3))))
    assert reply is not None and reply["n"] >= 1
    assert actor.fleet.rejected["bad_batch"] == 1


def test_a_new_version_is_persisted_before_it_is_published(tmp_path) -> None:
    """Found by killing the live controller: a restart from a snapshot older than the last decision
    re-issued that decision's version number with other thresholds."""
    from ebplus.controller.actor import StateStore

    actor = ControllerActor({"update_every": 10, "first_update": 10, "min_samples": 10}, state_dir=str(tmp_path), housekeeping=False)
    asyncio.run(actor.register("r0", "auto", 100_000, 64, PRIOR.model_dump(), "cpu"))
    reply = asyncio.run(actor.ingest(TelemetryBatch("r0", comps(12), completions_from=0)))
    assert reply["version"] == 1
    saved = StateStore(str(tmp_path)).load()
    assert saved["version"] == 1 and saved["replicas"]["r0"]["last_plan"]["k"] == reply["k"]
