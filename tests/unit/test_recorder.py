"""The scheduler's telemetry buffers and step timing (replicas.recorder), with a fake clock."""

from __future__ import annotations

import pytest

from ebplus.controller.messages import (
    CompletionRecord,
    DrainReport,
    EngineFacts,
    EngineStats,
    FinishReason,
    Mode,
    StepKind,
    StepRecord,
    ThresholdUpdate,
    decode,
    encode,
)
from ebplus.replicas.recorder import TelemetryRecorder, TokenTimes

FACTS = EngineFacts(kv_capacity_tokens=1000, max_num_seqs=8, device="cpu")
APPLIED = ThresholdUpdate(mode=Mode.MB, k=1, n=8)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def recorder(capacity: int = 100, warmup: int = 0) -> tuple[TelemetryRecorder, Clock]:
    clock = Clock()
    return TelemetryRecorder(capacity, warmup_steps=warmup, clock=clock), clock


@pytest.mark.parametrize(("p", "d", "kind"), [(5, 0, "prefill"), (0, 3, "decode"), (5, 3, "mixed"), (0, 0, "idle")])
def test_step_kind(p: int, d: int, kind: str) -> None:
    assert StepKind.of(p, d) == kind


def test_sync_steps_are_timed_from_schedule_exit_to_update() -> None:
    rec, clock = recorder()
    for i, (p, d) in enumerate([(64, 0), (0, 8), (10, 7)]):
        key = object()
        clock.t = 10.0 * i
        rec.scheduled(key, p, d, running=8, waiting=2, preempted=0, t_exit=clock.t + 0.001)
        clock.t += 0.5
        rec.updated(key)
    out = drain(rec)
    assert [(s.prefill_tokens, s.decode_tokens, s.running, s.waiting, s.kind) for s in out.steps] == [
        (64, 0, 8, 2, "prefill"),
        (0, 8, 8, 2, "decode"),
        (10, 7, 8, 2, "mixed"),
    ]
    assert [s.seconds for s in out.steps] == [pytest.approx(0.499)] * 3
    assert (out.stats.steps_prefill, out.stats.steps_decode, out.stats.steps_mixed) == (1, 1, 1)


def test_step_rows_carry_the_kv_the_decodes_read() -> None:
    rec, clock = recorder()
    key = object()
    rec.scheduled(key, 0, 4, running=4, waiting=0, preempted=0, t_exit=0.0, kv_tokens=4 * 700)
    clock.t = 0.02
    rec.updated(key)
    assert drain(rec).steps == [StepRecord(0, 4, 4, 0, pytest.approx(0.02), 2800)]


def test_batch_queue_overlap_starts_a_step_at_the_previous_update() -> None:
    # async scheduling: step 2 is scheduled (t=0.1) while step 1 runs until t=1.0
    rec, clock = recorder()
    a, b = object(), object()
    rec.scheduled(a, 0, 4, 4, 0, 0, t_exit=0.0)
    rec.scheduled(b, 0, 4, 4, 0, 0, t_exit=0.1)
    clock.t = 1.0
    rec.updated(a)
    clock.t = 1.8
    rec.updated(b)
    secs = [s.seconds for s in drain(rec).steps]
    assert secs == [pytest.approx(1.0), pytest.approx(0.8)]


def test_empty_steps_are_counted_not_recorded() -> None:
    rec, _ = recorder()
    idle, busy = object(), object()
    rec.scheduled(idle, 0, 0, running=0, waiting=0, preempted=0, t_exit=0.0)
    rec.updated(idle)
    rec.scheduled(busy, 0, 0, running=3, waiting=2, preempted=1, t_exit=0.0)
    rec.updated(busy)
    out = drain(rec)
    assert out.steps == []
    assert out.stats.steps_idle == 2
    assert out.stats.steps_empty_busy == 1
    assert out.stats.preemptions == 1


def test_warmup_steps_are_withheld_and_counted() -> None:
    rec, clock = recorder(warmup=2)
    for _ in range(5):
        key = object()
        rec.scheduled(key, 0, 0, 0, 0, 0, t_exit=clock.t)  # empty steps do not use up the warm-up
        rec.updated(key)
    for _ in range(3):
        key = object()
        rec.scheduled(key, 0, 2, 2, 0, 0, t_exit=clock.t)
        clock.t += 1.0
        rec.updated(key)
    out = drain(rec)
    assert len(out.steps) == 1
    assert out.stats.steps_warmup == 2
    assert out.stats.steps_decode == 3


def test_unknown_output_is_ignored() -> None:
    rec, _ = recorder()
    key = object()
    rec.scheduled(key, 0, 1, 1, 0, 0, t_exit=0.0)
    rec.updated(object())  # not scheduled through the recorder
    rec.updated(key)
    assert len(drain(rec).steps) == 1


def test_bounded_buffers_drop_oldest_and_count() -> None:
    rec, _ = recorder(capacity=3)
    for i in range(5):
        rec.finished(CompletionRecord(10 + i, 5, FinishReason.STOP))
        key = object()
        rec.scheduled(key, i + 1, 0, 1, 0, 0, t_exit=0.0)
        rec.updated(key)
    out = drain(rec)
    assert [c.input_len for c in out.completions] == [12, 13, 14]
    assert [s.prefill_tokens for s in out.steps] == [3, 4, 5]
    assert (out.dropped_completions, out.dropped_steps) == (2, 2)
    again = drain(rec)
    assert again.completions == again.steps == []
    assert again.dropped_completions == again.dropped_steps == 0
    assert again.stats.steps_prefill == 5  # counters are cumulative


def test_drain_report_round_trips_the_wire() -> None:
    """What the scheduler hands its replica crosses vLLM's IPC as bytes and comes back the same."""
    rec, _ = recorder()
    rec.finished(CompletionRecord(7, 3, FinishReason.LENGTH, seq=4, max_tokens=3, cached_tokens=2))
    out = rec.drain(FACTS, APPLIED, counters={"phase_switches": 5})
    assert decode(encode(out), DrainReport) == out
    assert out.completions == [CompletionRecord(7, 3, FinishReason.LENGTH, seq=4, max_tokens=3, cached_tokens=2)]
    assert out.stats == EngineStats(phase_switches=5)
    assert (out.facts, out.applied) == (FACTS, APPLIED)


def drain(rec: TelemetryRecorder) -> DrainReport:
    return rec.drain(FACTS, APPLIED)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        TelemetryRecorder(0)


def test_token_times_give_each_request_its_ttft_and_longest_stall() -> None:
    now = [100.0]
    times = TokenTimes(clock=lambda: now[0])
    for t, emitted in ((100.5, ["a"]), (100.6, ["a", "b"]), (101.6, ["a", "b"]), (101.7, ["b"])):
        now[0] = t
        times.emitted(emitted)
    assert times.pop("a", arrival=100.0) == pytest.approx((0.5, 1.0))  # first token 0.5 s in; 100.6 -> 101.6
    assert times.pop("b", arrival=100.2) == pytest.approx((0.4, 1.0))
    assert times.pop("never-ran", arrival=100.0) == (0.0, 0.0)  # aborted before its first token
    assert times.pop("a", arrival=100.0) == (0.0, 0.0)  # forgotten once popped
