"""Hostile telemetry at the controller: nothing a batch holds makes ingestion raise; late duplicates are skipped.

Pre-existing: per-record rejection reasons (tests/unit/test_fleet.py::test_bad_records_are_rejected_and_counted)
and the outbox bound (tests/unit/test_replica_plumbing.py). Here: batch-level garbage (fuzzed), the actor's
never-raise contract, and the running record indices that make a late delivery of a timed-out push harmless.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import msgspec
import pytest
from factories import batch, registration
from factories import completions as comps
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebplus.controller.actor import ControllerActor
from ebplus.controller.config import ControllerConfig
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (
    CompletionRecord,
    EngineFacts,
    EngineStats,
    FinishReason,
    Mode,
    RunningRequest,
    StepRecord,
    TelemetryBatch,
    ThresholdUpdate,
    decode,
    encode,
)
from ebplus.controller.telemetry import REJECT_REASONS, intake
from ebplus.replicas.pump import TelemetryOutbox


def make_fleet() -> FleetController:
    fc = FleetController(ControllerConfig(update_every=10, first_update=10, min_samples=10))
    fc.register(registration("r0"))
    return fc


# anything the codec can carry (a replica's batches reach the controller encoded, FleetController.ingest included)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
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
    st.builds(CompletionRecord, values, values, values, values, values, values),
    st.builds(StepRecord, values, values, values, values, values, values),
)
batches = st.one_of(
    values,
    st.builds(
        TelemetryBatch,
        replica_id=st.one_of(st.just("r0"), values),
        completions=st.one_of(st.lists(records, max_size=6), values),
        steps=st.one_of(st.lists(records, max_size=6), values),
        running=st.one_of(st.lists(records, max_size=3), values),
        running_total=values,
        applied_version=values,
        dropped_completions=values,
        dropped_steps=values,
        sent_at=values,
        stats=st.one_of(st.none(), values, st.builds(EngineStats, preemptions=values, schedule_seconds=values)),
        completions_from=values,
        steps_from=values,
    ),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batches, min_size=1, max_size=5))
def test_fuzzed_batches_never_raise_and_leave_the_controller_sane(hostile: list) -> None:
    fc = make_fleet()
    for b in hostile:
        fc.ingest(encode(b))
    # the controller still works: a good batch lands and the numbers it exports are finite
    good = fc.ingest(batch("r0", comps(20), [StepRecord(0, 8, 8, 2, 0.01)]))
    assert good is not None and 1 <= good.k <= good.n
    snap = fc.snapshot()
    rep = snap.replicas["r0"]
    assert 0 <= rep.dropped.completions < 2**63 and 0 <= rep.dropped.steps < 2**63
    assert all(math.isfinite(v) and v >= 0 for v in rep.engine_stats.values())
    assert 0 <= rep.applied_version < 2**63 or rep.applied_version == -1
    assert set(snap.rejected) <= set(REJECT_REASONS)
    snap.model_dump_json()  # and the admin API can serialise what it holds


@pytest.mark.parametrize(
    ("hostile", "reason"),
    [
        (batch("r0", completions=5), "bad_batch"),  # records not a sequence
        (batch("r0", steps="abc"), "bad_batch"),
        (batch("r0", dropped_completions="abc"), "bad_batch"),
        (batch("r0", dropped_steps=float("nan")), "bad_batch"),
        (batch("r0", dropped_completions=float("inf")), "bad_batch"),
        (batch("r0", dropped_completions=-4), "bad_batch"),
        (batch("r0", dropped_completions=2**63), "bad_batch"),  # absurd
        (batch("r0", running_total="many"), "bad_batch"),
        (batch("r0", stats=EngineStats(preemptions=float("inf"))), "bad_engine_stats"),  # type: ignore[arg-type]
        (batch("r0", stats={"preemptions": "three"}), "bad_engine_stats"),
        (batch("r0", stats=[1, 2]), "bad_engine_stats"),
        (batch(["unhashable"]), "unknown_replica"),  # type: ignore[arg-type]  # wrong replica id
        (batch("r1"), "unknown_replica"),
        (encode("not a batch"), "bad_batch"),  # type: ignore[arg-type]
        (b"\xc1", "bad_batch"),  # not msgpack
    ],
)
def test_malformed_batch_fields_are_counted(hostile: bytes, reason: str) -> None:
    fc = make_fleet()
    fc.ingest(hostile)
    assert fc.rejected[reason] == 1
    assert fc.replicas["r0"].dropped_completions == 0 and fc.replicas["r0"].engine_stats is None


wire_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=6)),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=16,
)
wire_fields = st.sampled_from(["wire", "replica_id", "completions", "steps", "running", "running_total",
                               "applied_version", "dropped_completions", "stats", "completions_from"])  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=64), st.dictionaries(wire_fields, wire_values, max_size=8).map(msgspec.msgpack.encode)))
def test_fuzzed_wire_payloads_never_raise(payload: bytes) -> None:
    """Whatever bytes reach the controller actor's ingest: an answer or None, never an exception."""
    actor = ControllerActor(ControllerConfig(update_every=10, state_dir="/nonexistent/never-written"), housekeeping=False)
    actor.fleet.register(registration("r0"))
    reply = asyncio.run(actor.ingest(payload))
    assert reply is None or decode(reply, ThresholdUpdate).n >= 1
    assert set(actor.fleet.rejected) <= set(REJECT_REASONS)


def test_one_bad_record_does_not_cost_the_rest_of_its_batch() -> None:
    """A NaN where a count belongs makes the strict decode fail; the lenient one keeps the good records."""
    actor = ControllerActor(ControllerConfig(update_every=1000), housekeeping=False)
    actor.fleet.register(registration("r0"))
    payload = msgspec.msgpack.encode(
        {"wire": 1, "replica_id": "r0", "completions": [[10, 4, "stop"], [float("nan"), 4, "stop"], [12, 5, "length"],
                                                         [3, 4, "exploded"], [3]]}
    )
    assert asyncio.run(actor.ingest(payload)) is not None
    assert actor.fleet.received["completions"] == 2
    assert (actor.fleet.rejected["bad_type"], actor.fleet.rejected["bad_finish_reason"]) == (1, 1)
    assert actor.fleet.rejected["missing_field"] == 1


STOP = CompletionRecord(10, 5, FinishReason.STOP, 1, 20, 2, 0.5, 0.1)
STEP = StepRecord(100, 50, 50, 3, 0.02, 700)
RUNNING = RunningRequest(4, 10, 3, 20, 2)


@pytest.mark.parametrize(
    ("good", "field", "value", "reason"),
    [
        (STOP, "input_len", 0, "out_of_range"),  # a request has a prompt
        (STOP, "input_len", -1, "negative"),
        (STOP, "input_len", 10**7 + 1, "absurd_value"),
        (STOP, "input_len", True, "bad_type"),
        (STOP, "input_len", 2.0, "bad_type"),  # a count is an integer
        (STOP, "input_len", None, "missing_field"),
        (STOP, "output_len", 0, "out_of_range"),  # a natural stop produced a token
        (STOP, "finish", "nope", "bad_finish_reason"),
        (STOP, "finish", 3, "bad_finish_reason"),
        (STOP, "seq", -2, "negative"),  # -1: unknown
        (STOP, "seq", 2**62 + 1, "absurd_value"),
        (STOP, "ttft_s", math.inf, "not_finite"),
        (STOP, "stall_s", -0.5, "negative"),
        (STOP, "ttft_s", 86_401.0, "absurd_value"),
        (STOP, "ttft_s", "x", "bad_type"),
        (STEP, "seconds", 0.0, "out_of_range"),
        (STEP, "seconds", 600.5, "absurd_value"),
        (STEP, "seconds", math.nan, "not_finite"),
        (STEP, "kv_tokens", 10**11 + 1, "absurd_value"),
        (StepRecord(0, 50, 50, 3, 0.02), "decode_tokens", 0, "empty_step"),
        (RUNNING, "seq", -1, "negative"),  # a running request has its admission number
        (RUNNING, "input_len", 0, "out_of_range"),
        (RUNNING, "age", 10**7 + 1, "absurd_value"),
    ],
)
def test_each_rule_has_its_reason(good: object, field: str, value: object, reason: str) -> None:
    """One bad field among good records: that record alone is refused, counted under the reason its type gives."""
    kind = {CompletionRecord: "completions", StepRecord: "steps", RunningRequest: "running"}[type(good)]
    rejected: Counter[str] = Counter()
    bad = msgspec.structs.replace(good, **{field: value})
    received = intake(batch("r0", **{kind: [good, bad, good]}), rejected)
    assert received is not None and getattr(received, kind) == [good, good]
    assert rejected == {reason: 1}


def test_an_abort_may_leave_without_output() -> None:
    rejected: Counter[str] = Counter()
    aborted = [msgspec.structs.replace(STOP, output_len=0, finish=f) for f in (FinishReason.ABORT, FinishReason.ERROR)]
    received = intake(batch("r0", aborted), rejected)
    assert received is not None and received.completions == aborted and not rejected


def test_a_batch_of_another_wire_version_is_refused_and_counted() -> None:
    actor = ControllerActor(ControllerConfig(update_every=1000), housekeeping=False)
    actor.fleet.register(registration("r0"))
    assert asyncio.run(actor.ingest(msgspec.msgpack.encode({"wire": 2, "replica_id": "r0"}))) is None
    assert actor.fleet.rejected["bad_version"] == 1


def test_late_duplicate_of_a_timed_out_push_is_skipped() -> None:
    """A hung controller works off its queue on resume: the batch that timed out, then its re-send with more."""
    box = TelemetryOutbox(capacity=64)
    box.add(drained(comps(30)))
    first = box.batch("r0", 0, None)  # times out at the replica: records kept
    box.add(drained(comps(20, start=30)))
    second = box.batch("r0", 0, None)  # holds the 30 again plus 20 new
    assert (first.completions_from, len(first.completions)) == (0, 30)
    assert (second.completions_from, len(second.completions)) == (0, 50)
    fc = make_fleet()
    fc.ingest(encode(first))
    fc.ingest(encode(second))  # both delivered once the controller resumes
    assert fc.received["completions"] == 50 and fc.rejected["duplicate"] == 30
    box.clear()  # the replica saw the second succeed
    box.add(drained(comps(5, start=50)))
    third = box.batch("r0", 0, None)
    assert third.completions_from == 50
    fc.ingest(encode(third))
    assert fc.received["completions"] == 55 and fc.rejected["duplicate"] == 30


def test_outbox_overflow_advances_the_index() -> None:
    box = TelemetryOutbox(capacity=4)
    box.add(drained(comps(6)))
    b = box.batch("r0", 0, None)
    assert b.completions_from == 2 and b.dropped_completions == 2 and len(b.completions) == 4
    fc = make_fleet()
    fc.ingest(encode(b))
    assert fc.received["completions"] == 4 and fc.rejected["duplicate"] == 0
    assert fc.replicas["r0"].dropped_completions == 2


def test_cursors_survive_a_controller_restart() -> None:
    fc = make_fleet()
    fc.ingest(batch("r0", comps(30), completions_from=0))
    resumed = FleetController(fc.config)
    resumed.restore(fc.state())
    resumed.register(registration("r0"))
    resumed.ingest(batch("r0", comps(40), completions_from=0))  # 30 old, 10 new
    assert resumed.rejected["duplicate"] == 30
    assert resumed.received["completions"] == 30 + 10


def test_a_forged_index_is_rejected_and_does_not_mute_the_replica() -> None:
    """One batch claiming index 2**61 used to move the cursor there: the next 100 real records were duplicates."""
    fc = make_fleet()
    fc.ingest(batch("r0", comps(10), completions_from=0))
    fc.ingest(batch("r0", comps(3), completions_from=2**61))
    assert fc.rejected["cursor_jump"] == 3 and fc.replicas["r0"].next_completion == 10
    fc.ingest(batch("r0", comps(100, start=10), completions_from=10))
    assert fc.received["completions"] == 110 and fc.rejected["duplicate"] == 0


def test_a_gap_the_replica_reports_as_dropped_is_not_a_jump() -> None:
    box = TelemetryOutbox(capacity=4)
    fc = make_fleet()
    box.add(drained(comps(4)))
    fc.ingest(encode(box.batch("r0", 0, None)))
    box.clear()
    box.add(drained(comps(7, start=4)))  # 3 lost to the full outbox: the index skips them, and says so
    b = box.batch("r0", 0, None)
    assert (b.completions_from, b.dropped_completions) == (7, 3)
    fc.ingest(encode(b))
    assert fc.received["completions"] == 8 and fc.rejected["cursor_jump"] == 0


def test_a_replica_restarted_under_the_same_id_is_heard_again() -> None:
    """Its new process counts from 0 and registers saying so; the controller's cursor follows it down."""
    fc = make_fleet()
    fc.ingest(batch("r0", comps(500), completions_from=0))
    fc.register(msgspec.structs.replace(registration("r0"), completions_from=0, steps_from=0))
    fc.ingest(batch("r0", comps(100), completions_from=0))
    assert fc.received["completions"] == 600 and fc.rejected["duplicate"] == 0



def test_a_controller_restored_from_older_state_follows_the_replica_up() -> None:
    """Restored state ends before what the replica delivered since: its next batch is not a jump."""
    fc = make_fleet()
    fc.ingest(batch("r0", comps(30), completions_from=0))
    state = fc.state()  # persisted here...
    fc.ingest(batch("r0", comps(20, start=30), completions_from=30))  # ...then 20 more delivered, not persisted
    resumed = FleetController(fc.config)
    resumed.restore(state)
    resumed.register(msgspec.structs.replace(registration("r0"), completions_from=50))
    resumed.ingest(batch("r0", comps(5, start=50), completions_from=50))
    assert resumed.received["completions"] == 30 + 5 and resumed.rejected["cursor_jump"] == 0


def test_records_beyond_what_was_declared_are_rejected_as_implausible() -> None:
    """Plausibility was absolute only: output_len 9,999,999 with max_tokens = 5 was taken as a sample."""
    fc = FleetController(ControllerConfig(update_every=10, first_update=10, min_samples=10))
    reg = registration("r0")
    fc.register(msgspec.structs.replace(reg, facts=msgspec.structs.replace(reg.facts, max_model_len=2048)))
    ok = CompletionRecord(100, 5, FinishReason.LENGTH, 0, 5)
    fc.ingest(batch("r0", [
        ok,
        msgspec.structs.replace(ok, output_len=9_999_999),  # more than its max_tokens
        msgspec.structs.replace(ok, cached_tokens=101),  # more cached than its prompt
        CompletionRecord(2000, 100, FinishReason.STOP, 1),  # longer than the model's length
    ]))  # fmt: skip
    assert fc.received["completions"] == 1 and fc.rejected["implausible"] == 3


def test_actor_ingest_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Even a bug in ingestion answers with thresholds and counts the batch, never an exception."""
    actor = ControllerActor(ControllerConfig(update_every=10, state_dir=str(tmp_path)), housekeeping=False)
    asyncio.run(actor.register(encode(registration("r0"))))

    def explode(b: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(actor.fleet, "absorb_checked", explode)
    reply = asyncio.run(actor.ingest(batch("r0", comps(3))))
    assert reply is not None and decode(reply, ThresholdUpdate).n >= 1
    assert actor.fleet.rejected["bad_batch"] == 1


def test_a_new_version_is_persisted_before_it_is_published(tmp_path) -> None:
    """Found by killing the live controller: a restart from a snapshot older than the last decision
    re-issued that decision's version number with other thresholds."""
    from ebplus.controller.state_store import StateStore

    config = ControllerConfig(update_every=10, first_update=10, min_samples=10, state_dir=str(tmp_path))
    actor = ControllerActor(config, housekeeping=False)
    asyncio.run(actor.register(encode(registration("r0"))))
    reply = decode(asyncio.run(actor.ingest(batch("r0", comps(12), completions_from=0))), ThresholdUpdate)
    assert reply.version == 1
    saved = StateStore(str(tmp_path)).load()
    assert saved is not None and saved["version"] == 1 and saved["replicas"]["r0"]["last_plan"]["k"] == reply.k


def drained(records: list[CompletionRecord]):
    from ebplus.controller.messages import DrainReport

    facts = EngineFacts(kv_capacity_tokens=100_000, max_num_seqs=64)
    return DrainReport(completions=records, facts=facts, applied=ThresholdUpdate(mode=Mode.AUTO, k=1, n=64))


def test_running_reports_are_validated_like_the_rest() -> None:
    """Bad running-request entries are rejected and counted by reason; the good ones reach the estimator."""
    fc = make_fleet()
    good = [RunningRequest(seq=i, input_len=50, age=10 + i, max_tokens=200) for i in range(5)]
    bad = [
        RunningRequest(seq=-1, input_len=50, age=3),  # a running request always has its admission number
        RunningRequest(seq=7, input_len=0, age=3),
        RunningRequest(seq=8, input_len=50, age=-2),
        RunningRequest(seq=9, input_len=50, age=float("nan")),  # type: ignore[arg-type]  # a float: not a count
        RunningRequest(seq=10, input_len=50, age=3, max_tokens=10**12),
        "not a request",
    ]
    fc.ingest(batch("r0", running=good + bad, running_total=40))  # type: ignore[arg-type]
    assert fc.rejected == {"negative": 2, "out_of_range": 1, "absurd_value": 1, "bad_type": 2}
    window = fc.workload.sample()
    assert window.size == 5 and window.weights.sum() == pytest.approx(40)
    fc.ingest(batch("r0", running_total=-5))  # a count that is not one
    assert fc.rejected["bad_batch"] == 1
